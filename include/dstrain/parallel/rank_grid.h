// One rank grid: where each rank sits along each of any number of named dimensions, computed from
// an order string and the sizes alone (no MPI), so that it can be reasoned about and tested for
// any world size. parallel_grid.h builds dstrain's two (dense and expert) from it.
//
// As Megatron-Core's RankGenerator does, the order string names the dimensions from innermost
// (consecutive ranks) to outermost, joined by '-': "tp-cp-dp-pp", "ep-edp-pp", ... A dimension's
// stride is the product of the sizes of those before it, and rank = Σ coordinate × stride. With
// dp before pp the ranks of a DP group sit next to each other, so gradient all-reduces stay inside
// a node, and pipeline stages further apart.
//
// A dimension the grid does not have has size 1 and coordinate 0 everywhere.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace dstrain {

// "ep-dp-pp" as {"ep", "dp", "pp"}; an empty text as {""}, which no grid takes.
std::vector<std::string> split_order(const std::string& order);

class RankGrid {
 public:
  // Any dimensions: `order` names each once, innermost first (names of lower-case letters); a
  // named dimension missing from `sizes` has size 1, a dimension of size above 1 must be named.
  // Throws Error(kUsage) naming parallel.order or parallel.<dimension>, or when the product of
  // the sizes ≠ world.
  RankGrid(int world, const std::string& order, const std::map<std::string, int>& sizes);

  int world() const { return world_; }
  const std::string& order() const { return order_; }
  const std::vector<std::string>& dimensions() const { return dimensions_; }  // innermost first
  int size(const std::string& dimension) const;  // 1 for a dimension not in the grid

  int coordinate(int rank, const std::string& dimension) const;  // 0 for one not in the grid

  // The world ranks that differ from `rank` only along the named dimension(s): "dp", or several
  // joined by '-' ("ep-dp") for one combined group. Ordered by their coordinates, the first-named
  // dimension innermost, so a member's position is its rank within the group.
  std::vector<int> group(int rank, const std::string& dimensions) const;
  // Every such group once, in order of their lowest rank.
  std::vector<std::vector<int>> groups(const std::string& dimensions) const;

 private:
  int stride(const std::string& dimension) const;

  int world_;
  std::string order_;
  std::vector<std::string> dimensions_;          // innermost first
  std::map<std::string, int> sizes_, strides_;  // of the dimensions in the order
};

}  // namespace dstrain
