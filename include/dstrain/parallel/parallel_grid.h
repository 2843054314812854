// Where every rank sits in every parallel dimension: two grids over the same ranks, as
// Megatron-Core's RankGenerator builds them for a model's dense and expert layers,
//
//   dense   tp × cp × dp × pp    attention, dense MLPs, embeddings, norms, the head
//   expert  ep × edp × pp        the routed experts (not split by tp: DeepSeek's choice)
//
// with ep × edp = tp × cp × dp: at every pipeline stage the ranks the dense grid spreads a batch
// over hold, in the expert grid, ep parts of the experts, edp copies of each. parallel.order
// names tp, cp, ep, dp and pp once each, innermost (consecutive ranks) first, and orders both
// grids: the dense grid takes tp, cp, dp and pp in that sequence, the expert grid ep, dp (which
// stands for edp there) and pp. The default, tp-cp-ep-dp-pp, keeps each tensor-parallel group,
// then each expert-parallel group, on neighbouring ranks, the pipeline stages furthest apart.
//
// Every rank must have one pipeline stage in both grids: pp first or last always gives it;
// elsewhere the product of the sizes inside pp must be the same in both. An order may leave
// names out: each then stands just inside the first of those after it in tp-cp-ep-dp ("dp-pp" is
// tp-cp-ep-dp-pp, "pp-dp" pp-tp-cp-ep-dp: what these orders meant before the grid had more
// dimensions, ep the innermost part of dp).
//
// Every group the code uses is one of Group, by name: the ranks that differ from a rank only
// along its dimensions. Nothing here calls MPI; ParallelContext builds the communicators.
#pragma once

#include <string>
#include <vector>

#include "dstrain/core/config.h"
#include "dstrain/parallel/parallel_config.h"
#include "dstrain/parallel/rank_grid.h"

namespace dstrain {

enum class Group {
  kTp,    // tensor parallelism (dense grid)
  kCp,    // context parallelism (dense grid)
  kDp,    // data parallelism: the ranks of one stage that hold the same model pieces, and other data
  kPp,    // the pipeline: one rank of each stage
  kDpCp,  // the ranks holding a copy of the same dense parameters: their gradients are averaged over it
  kEp,    // expert parallelism: the ranks holding the parts of one copy of the experts (expert grid)
  kEdp,   // the ranks holding a copy of the same experts: their gradients are averaged over it
};
// Their names in logs and errors: tp, cp, dp, pp, dp-cp, ep, edp; each is also the group's grid
// dimensions, innermost first.
const EnumNames<Group>& group_names();
// Every kind, in that order.
const std::vector<Group>& every_group();

class ParallelGrid {
 public:
  // Throws Error(kUsage) naming parallel.order or the size at fault. `config`'s sizes are the
  // resolved ones (parallel.dp given or derived).
  explicit ParallelGrid(const ParallelConfig& config);

  int world() const { return dense_.world(); }
  // The order with every name, innermost first ("tp-cp-ep-dp-pp").
  const std::string& order() const { return order_; }

  int size(Group group) const;
  // The world ranks of `rank`'s group of kind `group`, ordered so that a member's place is its
  // rank in the group.
  std::vector<int> members(Group group, int rank) const;
  // `rank`'s place in its group of kind `group`.
  int rank_in(Group group, int rank) const;
  // Every group of the kind once, in order of their lowest rank.
  std::vector<std::vector<int>> all(Group group) const;
  // Whether every rank has the same place in every group in both (orders that differ only where
  // dimensions of size 1 stand give the same grid).
  bool same_places(const ParallelGrid& other) const;

  // `order` with the names it leaves out put in (see above), innermost first. Throws Error(kUsage)
  // naming parallel.order when it names something else, or a name twice.
  static std::string complete_order(const std::string& order);

 private:
  const RankGrid& grid_of(Group group) const;

  std::string order_;
  RankGrid dense_, expert_;
};

}  // namespace dstrain
