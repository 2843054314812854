// The [parallel] section: how many ranks form each dimension of the grid and in which order.
#pragma once

#include <string>

#include "dstrain/core/config.h"

namespace dstrain {

struct ParallelConfig {
  int dp = 1;
  int pp = 1;
  std::string order = "dp-pp";
};

void add_parallel_options(OptionTable& table);
// Resolves parallel.dp = 0 to world / pp (recording the result in `options`) and checks that the
// grid fills the world. Throws Error(kUsage) naming the key.
ParallelConfig read_parallel_config(Options& options, int world_size);

}  // namespace dstrain
