// The dense and expert grids over the same ranks (parallel/parallel_grid.h): their groups against
// the grids written out by counting, for every order of the five names; which orders are refused
// (exactly those that would give a rank two pipeline stages); what the orders that leave names out
// mean; and the sizes that make no grid.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "dstrain/core/error.h"
#include "dstrain/parallel/parallel_grid.h"
#include "grid_counting.h"

using namespace dstrain;
using namespace dstrain::test;

namespace {

ParallelConfig layout(int tp, int cp, int dp, int pp, int ep, const std::string& order) {
  ParallelConfig c;
  c.tp = tp;
  c.cp = cp;
  c.dp = dp;
  c.pp = pp;
  c.ep = ep;
  c.order = order;
  return c;
}

std::string joined(const std::vector<std::string>& names) {
  std::string order;
  for (const std::string& name : names) order += (order.empty() ? "" : "-") + name;
  return order;
}

// The dimensions of `order` that `keep` names, with their sizes, in the order's sequence.
std::vector<std::pair<std::string, int>> dimensions(const std::vector<std::string>& order,
                                                    const std::map<std::string, int>& keep) {
  std::vector<std::pair<std::string, int>> kept;
  for (const std::string& name : order)
    if (keep.count(name)) kept.emplace_back(name, keep.at(name));
  return kept;
}

// The two grids of `c` by counting: the dense one over tp, cp, dp, pp, the expert one over ep,
// edp (the order's dp), pp.
struct CountedGrids {
  std::vector<Coordinates> dense, expert;
};
CountedGrids count_grids(const ParallelConfig& c, const std::vector<std::string>& order) {
  std::vector<std::pair<std::string, int>> expert =
      dimensions(order, {{"ep", c.ep}, {"dp", c.tp * c.cp * c.dp / c.ep}, {"pp", c.pp}});
  for (auto& [name, size] : expert)
    if (name == "dp") name = "edp";
  return {count_out(dimensions(order, {{"tp", c.tp}, {"cp", c.cp}, {"dp", c.dp}, {"pp", c.pp}})), count_out(expert)};
}

void expect_usage_error(const ParallelConfig& c, const std::string& option, const std::string& detail) {
  try {
    ParallelGrid grid(c);
    ADD_FAILURE() << c.order << " accepted; expected an error naming " << option;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kUsage) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind(option + " = ", 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find(detail), std::string::npos) << e.what();
  }
}

using Groups = std::vector<std::vector<int>>;

}  // namespace

// dp 4 × ep 2 × pp 2 on 8 ranks in the default order: data-parallel groups on consecutive ranks,
// each expert-parallel group two neighbours within one, the copies of an expert one apart.
TEST(ParallelGrid, TheDefaultOrderKeepsExpertParallelGroupsOnNeighbours) {
  const ParallelGrid grid(layout(1, 1, 4, 2, 2, "tp-cp-ep-dp-pp"));
  EXPECT_EQ(grid.world(), 8);
  EXPECT_EQ(grid.order(), "tp-cp-ep-dp-pp");
  EXPECT_EQ(grid.all(Group::kDp), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(grid.all(Group::kPp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(grid.all(Group::kDpCp), grid.all(Group::kDp));
  EXPECT_EQ(grid.all(Group::kTp), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(grid.all(Group::kCp), grid.all(Group::kTp));
  EXPECT_EQ(grid.all(Group::kEp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(grid.all(Group::kEdp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(grid.size(Group::kEp), 2);
  EXPECT_EQ(grid.size(Group::kEdp), 2);
  EXPECT_EQ(grid.members(Group::kEdp, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(grid.rank_in(Group::kEdp, 7), 1);
  EXPECT_EQ(grid.rank_in(Group::kDp, 6), 2);
}

// Without ep and the dimensions not built yet, an order means what the two-dimensional grid's
// orders meant: ep the innermost part of dp (the rank of a data shard d in its expert-parallel
// group d mod ep, its copy d / ep), tp and cp inside that. With pp first they stand after it, so
// that such an order stays one with tp and cp above 1.
TEST(ParallelGrid, OrdersThatLeaveNamesOutMeanWhatTheyMeantBefore) {
  EXPECT_EQ(ParallelGrid::complete_order("dp-pp"), "tp-cp-ep-dp-pp");
  EXPECT_EQ(ParallelGrid::complete_order("pp-dp"), "pp-tp-cp-ep-dp");
  EXPECT_EQ(ParallelGrid::complete_order("cp-pp-dp"), "tp-cp-pp-ep-dp");  // tp inside cp, wherever it is
  EXPECT_EQ(ParallelGrid::complete_order("ep-dp-pp"), "tp-cp-ep-dp-pp");
  EXPECT_EQ(ParallelGrid::complete_order("dp-pp-ep-cp"), "tp-dp-pp-ep-cp");
  for (const char* order : {"dp-pp", "pp-dp"}) {
    const ParallelGrid grid(layout(1, 1, 4, 2, 2, order));
    for (int rank = 0; rank < 8; ++rank) {
      const int shard = grid.rank_in(Group::kDp, rank), stage = grid.rank_in(Group::kPp, rank);
      EXPECT_EQ(shard, std::string(order) == "dp-pp" ? rank % 4 : rank / 2) << order << " rank " << rank;
      EXPECT_EQ(stage, std::string(order) == "dp-pp" ? rank / 4 : rank % 2) << order << " rank " << rank;
      EXPECT_EQ(grid.rank_in(Group::kEp, rank), shard % 2) << order << " rank " << rank;
      EXPECT_EQ(grid.rank_in(Group::kEdp, rank), shard / 2) << order << " rank " << rank;
      for (int member : grid.members(Group::kEp, rank)) EXPECT_EQ(grid.rank_in(Group::kPp, member), stage);
    }
  }
}

// Every permutation of the five names, on a layout with every dimension above 1 (tp 2 × cp 2 ×
// dp 2 × pp 2, ep 4: 16 ranks) and on dp 4 × ep 2 × pp 2: accepted exactly when both grids give
// every rank the same stage, and then every group equals the counted one, every expert-parallel
// group lies within one stage, and with ep × edp = tp × cp × dp each stage's ranks are one copy of
// the experts' holders.
TEST(ParallelGrid, EveryOrderMatchesCountingAndOnlyOrdersGivingOneStageAreTaken) {
  for (const ParallelConfig& sizes : {layout(2, 2, 2, 2, 4, ""), layout(1, 1, 4, 2, 2, "")}) {
    std::vector<std::string> names = {"cp", "dp", "ep", "pp", "tp"};
    int legal = 0;
    std::set<std::vector<Groups>> distinct;
    do {
      ParallelConfig c = sizes;
      c.order = joined(names);
      const CountedGrids counted = count_grids(c, names);
      bool one_stage = true;
      for (size_t rank = 0; rank < counted.dense.size(); ++rank)
        one_stage = one_stage && counted.dense[rank].at("pp") == counted.expert[rank].at("pp");
      if (!one_stage) {
        expect_usage_error(c, "parallel.order", "put pp first or last");
        continue;
      }
      ++legal;
      const ParallelGrid grid(c);
      std::vector<Groups> every;
      for (Group kind : every_group()) every.push_back(grid.all(kind));
      distinct.insert(every);
      const std::pair<Group, const char*> dense[] = {
          {Group::kTp, "tp"}, {Group::kCp, "cp"}, {Group::kDp, "dp"}, {Group::kPp, "pp"}, {Group::kDpCp, "dp-cp"}};
      for (int rank = 0; rank < grid.world(); ++rank) {
        for (const auto& [kind, dims] : dense)
          EXPECT_EQ(grid.members(kind, rank), expected_group(counted.dense, rank, dims)) << c.order << " " << dims;
        EXPECT_EQ(grid.members(Group::kEp, rank), expected_group(counted.expert, rank, "ep")) << c.order;
        EXPECT_EQ(grid.members(Group::kEdp, rank), expected_group(counted.expert, rank, "edp")) << c.order;
        for (int member : grid.members(Group::kEp, rank))
          EXPECT_EQ(counted.dense[member].at("pp"), counted.dense[rank].at("pp")) << c.order << ": ep across stages";
      }
      EXPECT_EQ(grid.size(Group::kEp) * grid.size(Group::kEdp), c.tp * c.cp * c.dp);
    } while (std::next_permutation(names.begin(), names.end()));
    if (sizes.tp > 1) {
      // pp first or last, the other four in any order (48), and those with as many ranks inside pp
      // in both grids (dp-pp-..., where edp and dp both have 2).
      EXPECT_GT(legal, 48);
      continue;
    }
    // tp and cp (size 1) anywhere; ep, dp and pp with pp first or last: 4 of their 6 orders, 80 of
    // 120, making four different grids: those of ep-dp-pp, dp-ep-pp, pp-ep-dp and pp-dp-ep.
    EXPECT_EQ(legal, 80);
    EXPECT_EQ(distinct.size(), 4u);
  }
}

TEST(ParallelGrid, LeftOutNamesNeverMakeAnOrderThatNamesPpFirstOrLastIllegal) {
  for (const char* order : {"pp-dp", "dp-pp", "pp-ep-dp", "pp-dp-ep", "ep-dp-pp", "dp-ep-pp"})
    EXPECT_NO_THROW(ParallelGrid(layout(2, 2, 2, 2, 4, order))) << order;
}

TEST(ParallelGrid, OrdersThatGiveTheSameGroupsAreTheSameLayout) {
  const ParallelGrid given(layout(1, 1, 4, 2, 2, "dp-pp")), full(layout(1, 1, 4, 2, 2, "cp-tp-ep-dp-pp"));
  EXPECT_TRUE(given.same_places(full));
  EXPECT_FALSE(given.same_places(ParallelGrid(layout(1, 1, 4, 2, 2, "dp-ep-pp"))));
  EXPECT_FALSE(given.same_places(ParallelGrid(layout(1, 1, 4, 2, 1, "dp-pp"))));
  EXPECT_FALSE(given.same_places(ParallelGrid(layout(1, 1, 2, 2, 2, "dp-pp"))));
}

TEST(ParallelGrid, RefusesWhatMakesNoGrid) {
  expect_usage_error(layout(1, 1, 4, 2, 3, "dp-pp"), "parallel.ep", "must divide parallel.tp × cp × dp = 4");
  expect_usage_error(layout(2, 1, 2, 1, 8, "dp-pp"), "parallel.ep", "must divide parallel.tp × cp × dp = 4");
  expect_usage_error(layout(1, 1, 4, 2, 1, "xp-dp-pp"), "parallel.order", "expected the names tp, cp, ep, dp and pp");
  expect_usage_error(layout(1, 1, 4, 2, 1, "dp-dp-pp"), "parallel.order", "names dp twice");
  expect_usage_error(layout(1, 1, 4, 2, 1, "tp-cp-ep"), "parallel.order", "must name dp and pp");
  expect_usage_error(layout(1, 1, 4, 2, 1, ""), "parallel.order", "expected the names");
  expect_usage_error(layout(1, 1, 0, 2, 1, "dp-pp"), "parallel.dp", "expected at least 1");
  // pp between the expert grid's ep and dp: stage 1 would be the odd ranks densely (pp innermost
  // there) but 2, 3, 6 and 7 for the experts.
  expect_usage_error(layout(1, 1, 4, 2, 2, "ep-pp-dp"), "parallel.order",
                     "puts rank 1 on pipeline stage 1 of the dense grid (tp, cp, dp, pp) but on stage 0 of the expert "
                     "grid (ep, dp, pp)");
}
