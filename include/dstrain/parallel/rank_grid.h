// The rank grid: where each rank sits along each parallel dimension (dp, pp, later ep, tp, ...),
// computed from an order string and the sizes alone (no MPI), so that it can be reasoned about
// and tested for any world size.
//
// As Megatron-Core's RankGenerator does, the order string names the dimensions from innermost
// (consecutive ranks) to outermost, joined by '-': "dp-pp" (the default), "pp-dp", "ep-dp-pp",
// "tp-ep-dp-pp". A dimension's stride is the product of the sizes of those before it, and
// rank = Σ coordinate × stride. With "dp-pp" the ranks of a DP group sit next to each other, so
// gradient all-reduces stay inside a node, and pipeline stages further apart.
//
// A dimension the grid does not have has size 1 and coordinate 0 everywhere: a grid without tp is
// a grid whose tp groups are single ranks, so code can ask for size("tp") before tp is configured.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace dstrain {

struct GridCoord {
  int dp = 0;  // index within the DP group = data shard
  int pp = 0;  // pipeline stage
};

class RankGrid {
 public:
  // The data-parallel × pipeline-parallel grid; `order` is "dp-pp" or "pp-dp". Throws
  // Error(kUsage) when dp × pp ≠ world, a size is below 1, or the order is another one.
  RankGrid(int world, int dp, int pp, const std::string& order = "dp-pp");
  // Any dimensions: `order` names each once, innermost first (names of lower-case letters); a
  // named dimension missing from `sizes` has size 1, a dimension of size above 1 must be named.
  // Throws Error(kUsage) naming parallel.order or parallel.<dimension>, or when the product of
  // the sizes ≠ world.
  RankGrid(int world, const std::string& order, const std::map<std::string, int>& sizes);

  int world() const { return world_; }
  int dp() const { return size("dp"); }
  int pp() const { return size("pp"); }
  const std::string& order() const { return order_; }
  const std::vector<std::string>& dimensions() const { return dimensions_; }  // innermost first
  int size(const std::string& dimension) const;  // 1 for a dimension not in the grid

  int coordinate(int rank, const std::string& dimension) const;  // 0 for one not in the grid
  GridCoord coord(int rank) const;
  int rank_of(GridCoord coord) const;

  // The world ranks that differ from `rank` only along the named dimension(s): "dp", or several
  // joined by '-' ("ep-dp") for one combined group. Ordered by their coordinates, the first-named
  // dimension innermost, so a member's position is its rank within the group.
  std::vector<int> group(int rank, const std::string& dimensions) const;
  // Every such group once, in order of their lowest rank.
  std::vector<std::vector<int>> groups(const std::string& dimensions) const;
  // The DP group (same stage, in order of DP index) and PP group (same data shard, by stage).
  std::vector<int> dp_group(int rank) const { return group(rank, "dp"); }
  std::vector<int> pp_group(int rank) const { return group(rank, "pp"); }

 private:
  int stride(const std::string& dimension) const;

  int world_;
  std::string order_;
  std::vector<std::string> dimensions_;          // innermost first
  std::map<std::string, int> sizes_, strides_;  // of the dimensions in the order
};

}  // namespace dstrain
