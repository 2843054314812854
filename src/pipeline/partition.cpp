#include "dstrain/pipeline/partition.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <string>

#include "dstrain/core/error.h"
#include "dstrain/model/flops.h"

namespace dstrain {
namespace {

std::vector<LayerSlice> slices_from_counts(const std::vector<int64_t>& counts) {
  std::vector<LayerSlice> slices;
  int64_t first = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    slices.push_back({first, first + counts[i], i == 0, i + 1 == counts.size()});
    first += counts[i];
  }
  return slices;
}

std::string join(const std::vector<int64_t>& values) {
  std::string text;
  for (int64_t v : values) text += (text.empty() ? "" : ",") + std::to_string(v);
  return text;
}

// Contiguous split of `layers` equal layers into `stages` non-empty parts, the last part also
// paying `head` (in units of one layer), minimising the most expensive part (dynamic programming;
// ties go to the earlier stages having fewer layers, so that the head's stage is not starved).
std::vector<int64_t> balanced_counts(int64_t layers, int stages, double head) {
  const double inf = std::numeric_limits<double>::infinity();
  // best[k][n]: the lowest maximum cost of splitting the first n layers into k parts.
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(layers + 1, inf));
  std::vector<std::vector<int64_t>> cut(stages + 1, std::vector<int64_t>(layers + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= stages; ++k) {
    for (int64_t n = k; n <= layers; ++n) {
      for (int64_t first = k - 1; first < n; ++first) {
        double part = static_cast<double>(n - first) + (k == stages && n == layers ? head : 0.0);
        double cost = std::max(best[k - 1][first], part);
        if (cost < best[k][n]) {
          best[k][n] = cost;
          cut[k][n] = first;
        }
      }
    }
  }
  std::vector<int64_t> counts(stages);
  for (int64_t n = layers, k = stages; k > 0; --k) {
    counts[k - 1] = n - cut[k][n];
    n = cut[k][n];
  }
  return counts;
}

}  // namespace

std::vector<LayerSlice> partition_layers(const ModelConfig& model, int64_t seq_len, int stages,
                                         const std::vector<int64_t>& counts) {
  if (!counts.empty()) {
    const int64_t sum = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    const bool positive = std::all_of(counts.begin(), counts.end(), [](int64_t c) { return c > 0; });
    if (static_cast<int>(counts.size()) != stages || sum != model.num_layers || !positive)
      throw config_error("parallel.stage_layers", join(counts),
                         "expected " + std::to_string(stages) +
                             " positive layer counts (parallel.pp × parallel.virtual_stages) adding up to "
                             "model.num_layers = " + std::to_string(model.num_layers));
    return slices_from_counts(counts);
  }
  if (stages > model.num_layers)
    throw config_error("parallel.pp × parallel.virtual_stages", std::to_string(stages),
                       "more pipeline stages than model.num_layers = " + std::to_string(model.num_layers) +
                           "; every stage needs at least one layer");
  // The last stage also computes the multi-token prediction modules.
  const double head = (head_training_flops_per_token(model) + mtp_training_flops_per_token(model, seq_len)) /
                      layer_training_flops_per_token(model, seq_len);
  return slices_from_counts(balanced_counts(model.num_layers, stages, head));
}

}  // namespace dstrain
