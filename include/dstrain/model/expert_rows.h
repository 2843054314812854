// Rows sorted by expert (grouped_projection.h): the first counts[0] rows are expert 0's, the next
// counts[1] expert 1's, and so on.
#pragma once

#include <cstdint>
#include <vector>

namespace dstrain {

// each(e, first row, rows) for every expert e with rows.
template <typename Each>
void for_each_expert_with_rows(const std::vector<int64_t>& counts, Each each) {
  int64_t start = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    if (counts[e] > 0) each(static_cast<int64_t>(e), start, counts[e]);
    start += counts[e];
  }
}

}  // namespace dstrain
