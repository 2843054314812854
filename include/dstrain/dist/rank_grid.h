// The data-parallel × pipeline-parallel rank grid, computed from an order string alone (no MPI),
// so that it can be reasoned about and tested for any world size.
//
// The order string names the dimensions from innermost (consecutive ranks) to outermost, as
// Megatron-Core does: "dp-pp" (the default) puts the ranks of a DP group next to each other, so
// gradient all-reduces stay inside a node, and pipeline stages further apart.
#pragma once

#include <string>
#include <vector>

namespace dstrain {

struct GridCoord {
  int dp = 0;  // index within the DP group = data shard
  int pp = 0;  // pipeline stage
};

class RankGrid {
 public:
  // Throws Error(kUsage) when dp × pp ≠ world or the order string is not "dp-pp" or "pp-dp".
  RankGrid(int world, int dp, int pp, const std::string& order = "dp-pp");

  int world() const { return dp_ * pp_; }
  int dp() const { return dp_; }
  int pp() const { return pp_; }
  const std::string& order() const { return order_; }

  GridCoord coord(int rank) const;
  int rank_of(GridCoord coord) const;
  // World ranks of the DP group (same stage) and of the PP group (same data shard) of `rank`,
  // in order of their DP index and stage respectively.
  std::vector<int> dp_group(int rank) const;
  std::vector<int> pp_group(int rank) const;

 private:
  int dp_, pp_;
  bool dp_innermost_;
  std::string order_;
};

}  // namespace dstrain
