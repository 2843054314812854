#include "dstrain/dist/rank_grid.h"

#include "dstrain/core/error.h"

namespace dstrain {

RankGrid::RankGrid(int world, int dp, int pp, const std::string& order)
    : dp_(dp), pp_(pp), order_(order) {
  if (order == "dp-pp") {
    dp_innermost_ = true;
  } else if (order == "pp-dp") {
    dp_innermost_ = false;
  } else {
    throw config_error("parallel.order", order, "expected dp-pp (DP innermost) or pp-dp");
  }
  if (dp < 1) throw config_error("parallel.dp", std::to_string(dp), "expected at least 1");
  if (pp < 1) throw config_error("parallel.pp", std::to_string(pp), "expected at least 1");
  if (dp * pp != world) {
    throw config_error("parallel.dp", std::to_string(dp),
                       "dp × pp = " + std::to_string(dp) + " × " + std::to_string(pp) + " = " +
                           std::to_string(dp * pp) + " must equal the number of ranks (" +
                           std::to_string(world) + ")");
  }
}

GridCoord RankGrid::coord(int rank) const {
  if (dp_innermost_) return {rank % dp_, rank / dp_};
  return {rank / pp_, rank % pp_};
}

int RankGrid::rank_of(GridCoord c) const {
  return dp_innermost_ ? c.pp * dp_ + c.dp : c.dp * pp_ + c.pp;
}

std::vector<int> RankGrid::dp_group(int rank) const {
  GridCoord me = coord(rank);
  std::vector<int> members;
  for (int d = 0; d < dp_; ++d) members.push_back(rank_of({d, me.pp}));
  return members;
}

std::vector<int> RankGrid::pp_group(int rank) const {
  GridCoord me = coord(rank);
  std::vector<int> members;
  for (int p = 0; p < pp_; ++p) members.push_back(rank_of({me.dp, p}));
  return members;
}

}  // namespace dstrain
