// One grid of any number of named dimensions (parallel/rank_grid.h) against the grid written out
// by counting: every rank's coordinates and groups, in any order of unequal sizes; and the orders
// and sizes it refuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>

#include "dstrain/core/error.h"
#include "dstrain/parallel/rank_grid.h"
#include "grid_counting.h"

using namespace dstrain;
using namespace dstrain::test;

namespace {

// Every rank's coordinates and groups against the counted table, and each dimension set's groups
// partition the world, in order of their lowest rank.
void check_against_counting(const RankGrid& grid, const std::vector<std::pair<std::string, int>>& dimensions,
                            const std::vector<std::string>& group_names) {
  const std::vector<Coordinates> table = count_out(dimensions);
  ASSERT_EQ(static_cast<int>(table.size()), grid.world());
  for (int rank = 0; rank < grid.world(); ++rank) {
    for (const auto& [d, size] : dimensions) {
      EXPECT_EQ(grid.size(d), size);
      EXPECT_EQ(grid.coordinate(rank, d), table[rank].at(d)) << "rank " << rank << " " << d;
    }
    for (const std::string& names : group_names)
      EXPECT_EQ(grid.group(rank, names), expected_group(table, rank, names)) << "rank " << rank << " " << names;
  }
  for (const std::string& names : group_names) {
    std::vector<int> seen;
    int previous_lowest = -1;
    for (const std::vector<int>& members : grid.groups(names)) {
      const int lowest = *std::min_element(members.begin(), members.end());
      EXPECT_GT(lowest, previous_lowest) << names;
      previous_lowest = lowest;
      EXPECT_EQ(grid.group(lowest, names), members) << names;
      seen.insert(seen.end(), members.begin(), members.end());
    }
    std::sort(seen.begin(), seen.end());
    std::vector<int> world(grid.world());
    for (int rank = 0; rank < grid.world(); ++rank) world[rank] = rank;
    EXPECT_EQ(seen, world) << names << ": every rank in exactly one group";
  }
}

void expect_usage_error(const std::function<void()>& make, const std::string& option, const std::string& detail) {
  try {
    make();
    ADD_FAILURE() << "accepted; expected an error naming " << option;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kUsage) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind(option + " = ", 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find(detail), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(RankGrid, ThreeDimensionsEpDpPp) {
  RankGrid grid(12, "ep-dp-pp", {{"ep", 2}, {"dp", 3}, {"pp", 2}});
  EXPECT_EQ(grid.dimensions(), (std::vector<std::string>{"ep", "dp", "pp"}));
  EXPECT_EQ(grid.order(), "ep-dp-pp");
  EXPECT_EQ(grid.world(), 12);
  EXPECT_EQ(grid.size("dp"), 3);
  EXPECT_EQ(grid.size("pp"), 2);
  EXPECT_EQ(grid.size("tp"), 1);  // not in the grid
  // Strides ep 1, dp 2 (= ep), pp 6 (= ep × dp): rank = ep + 2 dp + 6 pp.
  // Rank 7 = 1 + 2·0 + 6·1: ep 1, dp 0, pp 1.
  EXPECT_EQ(grid.coordinate(7, "ep"), 1);
  EXPECT_EQ(grid.coordinate(7, "dp"), 0);
  EXPECT_EQ(grid.coordinate(7, "pp"), 1);
  EXPECT_EQ(grid.coordinate(7, "tp"), 0);
  EXPECT_EQ(grid.group(7, "ep"), (std::vector<int>{6, 7}));       // 1 + 6 - 1·1, + ep·1
  EXPECT_EQ(grid.group(7, "dp"), (std::vector<int>{7, 9, 11}));   // 1 + 6, + dp·2
  EXPECT_EQ(grid.group(7, "pp"), (std::vector<int>{1, 7}));       // 1, + pp·6
  EXPECT_EQ(grid.group(7, "tp"), (std::vector<int>{7}));          // not in the grid: alone
  // ep-dp: stage 1's six ranks 6 + ep + 2 dp, ep running fastest; dp-ep: dp running fastest.
  EXPECT_EQ(grid.group(7, "ep-dp"), (std::vector<int>{6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(grid.group(7, "dp-ep"), (std::vector<int>{6, 8, 10, 7, 9, 11}));
  // Rank 4 = 0 + 2·2: ep 0, dp 2, pp 0.
  EXPECT_EQ(grid.group(4, "ep"), (std::vector<int>{4, 5}));
  EXPECT_EQ(grid.group(4, "dp"), (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(grid.group(4, "pp"), (std::vector<int>{4, 10}));
  EXPECT_EQ(grid.coordinate(4, "dp"), 2);
  EXPECT_EQ(grid.coordinate(4, "pp"), 0);
  EXPECT_EQ(grid.groups("ep"),
            (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}}));
  EXPECT_EQ(grid.groups("dp"), (std::vector<std::vector<int>>{{0, 2, 4}, {1, 3, 5}, {6, 8, 10}, {7, 9, 11}}));
  EXPECT_EQ(grid.groups("pp"), (std::vector<std::vector<int>>{{0, 6}, {1, 7}, {2, 8}, {3, 9}, {4, 10}, {5, 11}}));
  EXPECT_EQ(grid.groups("ep-dp"), (std::vector<std::vector<int>>{{0, 1, 2, 3, 4, 5}, {6, 7, 8, 9, 10, 11}}));
  EXPECT_EQ(grid.groups("dp-pp"), (std::vector<std::vector<int>>{{0, 2, 4, 6, 8, 10}, {1, 3, 5, 7, 9, 11}}));
  EXPECT_EQ(grid.groups("ep-dp-pp").size(), 1u);
  check_against_counting(grid, {{"ep", 2}, {"dp", 3}, {"pp", 2}},
                         {"ep", "dp", "pp", "ep-dp", "dp-ep", "dp-pp", "pp-ep", "ep-dp-pp", "pp-dp-ep"});
}

TEST(RankGrid, FourDimensionsTpEpDpPp) {
  RankGrid grid(16, "tp-ep-dp-pp", {{"tp", 2}, {"ep", 2}, {"dp", 2}, {"pp", 2}});
  EXPECT_EQ(grid.dimensions(), (std::vector<std::string>{"tp", "ep", "dp", "pp"}));
  // Strides tp 1, ep 2, dp 4, pp 8: the coordinates are rank's bits, tp the lowest.
  // Rank 5 = 0b0101: tp 1, ep 0, dp 1, pp 0. Each group flips one bit (or several):
  EXPECT_EQ(grid.group(5, "tp"), (std::vector<int>{4, 5}));   // bit 0
  EXPECT_EQ(grid.group(5, "ep"), (std::vector<int>{5, 7}));   // bit 1
  EXPECT_EQ(grid.group(5, "dp"), (std::vector<int>{1, 5}));   // bit 2
  EXPECT_EQ(grid.group(5, "pp"), (std::vector<int>{5, 13}));  // bit 3
  // ep-dp: bits 1 and 2 over the rest 0b0001 = 1, ep (bit 1) fastest: 1, 3, 5, 7 in order of
  // (dp, ep) = (0,0) (0,1) (1,0) (1,1) - not {5, 7, 1, 3}, which would start from rank 5 itself.
  EXPECT_EQ(grid.group(5, "ep-dp"), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(grid.group(5, "dp-ep"), (std::vector<int>{1, 5, 3, 7}));
  EXPECT_EQ(grid.group(5, "tp-ep-dp"), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  // Rank 10 = 0b1010: tp 0, ep 1, dp 0, pp 1.
  EXPECT_EQ(grid.group(10, "tp"), (std::vector<int>{10, 11}));
  EXPECT_EQ(grid.group(10, "ep"), (std::vector<int>{8, 10}));
  EXPECT_EQ(grid.group(10, "dp"), (std::vector<int>{10, 14}));
  EXPECT_EQ(grid.group(10, "pp"), (std::vector<int>{2, 10}));
  EXPECT_EQ(grid.group(10, "ep-dp"), (std::vector<int>{8, 10, 12, 14}));
  EXPECT_EQ(grid.group(10, "tp-pp"), (std::vector<int>{2, 3, 10, 11}));
  // Rank 13 = 0b1101: tp 1, ep 0, dp 1, pp 1.
  EXPECT_EQ(grid.coordinate(13, "tp"), 1);
  EXPECT_EQ(grid.coordinate(13, "ep"), 0);
  EXPECT_EQ(grid.coordinate(13, "dp"), 1);
  EXPECT_EQ(grid.coordinate(13, "pp"), 1);
  EXPECT_EQ(grid.groups("ep-dp"),
            (std::vector<std::vector<int>>{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(grid.groups("pp"), (std::vector<std::vector<int>>{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13},
                                                              {6, 14}, {7, 15}}));
  check_against_counting(grid, {{"tp", 2}, {"ep", 2}, {"dp", 2}, {"pp", 2}},
                         {"tp", "ep", "dp", "pp", "ep-dp", "dp-ep", "tp-ep", "tp-pp", "pp-tp", "tp-ep-dp",
                          "tp-ep-dp-pp"});
}

TEST(RankGrid, UnequalSizesInAnyOrderMatchCounting) {
  // Sizes that differ from each other catch a stride taken from the wrong dimension.
  const std::vector<std::pair<std::string, int>> dims = {{"pp", 3}, {"tp", 2}, {"dp", 5}, {"ep", 1}};
  RankGrid grid(30, "pp-tp-dp-ep", {{"pp", 3}, {"tp", 2}, {"dp", 5}});  // ep named, no size: 1
  EXPECT_EQ(grid.size("ep"), 1);
  check_against_counting(grid, dims, {"pp", "tp", "dp", "ep", "dp-tp", "tp-dp", "pp-dp", "ep-pp-dp"});
  for (int rank = 0; rank < 30; ++rank)  // strides pp 1, tp 3, dp 6
    EXPECT_EQ(grid.coordinate(rank, "pp") + 3 * grid.coordinate(rank, "tp") + 6 * grid.coordinate(rank, "dp"), rank);
}

TEST(RankGrid, RefusesBadOrdersAndSizes) {
  const std::map<std::string, int> sizes = {{"ep", 2}, {"dp", 3}, {"pp", 2}};
  expect_usage_error([&] { RankGrid(12, "ep-dp-dp-pp", sizes); }, "parallel.order", "dp twice");
  expect_usage_error([&] { RankGrid(12, "ep-dp", sizes); }, "parallel.order", "lacks pp, which has size 2");
  expect_usage_error([&] { RankGrid(12, "", sizes); }, "parallel.order", "lower-case letters");
  for (const char* bad : {"ep--dp-pp", "ep-dp-pp-", "EP-dp-pp", "ep_dp-pp", "ep-dp-pp2", "ep dp pp"})
    expect_usage_error([&] { RankGrid(12, bad, sizes); }, "parallel.order", "lower-case letters");
  expect_usage_error([] { RankGrid(12, "ep-dp-pp", {{"ep", 0}, {"dp", 3}, {"pp", 2}}); }, "parallel.ep",
                     "expected at least 1");
  expect_usage_error([] { RankGrid(12, "ep-dp-pp", {{"ep", 2}, {"dp", 3}, {"pp", -1}}); }, "parallel.pp",
                     "expected at least 1");
  expect_usage_error([] { RankGrid(12, "ep-dp-pp", {{"ep", 2}, {"dp", 3}, {"pp", 3}}); }, "parallel.dp",
                     "dp × ep × pp = 3 × 2 × 3 = 18 must equal the number of ranks (12)");
  expect_usage_error([] { RankGrid(8, "tp-ep", {{"tp", 2}, {"ep", 2}}); }, "parallel.tp",
                     "ep × tp = 2 × 2 = 4 must equal the number of ranks (8)");
  // A size-1 dimension may stay out of the order.
  EXPECT_EQ(RankGrid(4, "dp", {{"dp", 4}, {"pp", 1}}).size("pp"), 1);
  expect_usage_error(
      [] {
        RankGrid(6, "dp-pp", {{"dp", 2}, {"pp", 2}});
      },
      "parallel.dp", "dp × pp = 2 × 2 = 4 must equal the number of ranks (6)");
  expect_usage_error([] { RankGrid(4, "dp-pp", {{"dp", 0}, {"pp", 4}}); }, "parallel.dp", "expected at least 1");
}
