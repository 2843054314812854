#include <gtest/gtest.h>

#include <set>

#include "dstrain/core/error.h"
#include "dstrain/dist/rank_grid.h"

using namespace dstrain;

TEST(RankGrid, DpInnermostPutsDataParallelGroupsOnConsecutiveRanks) {
  RankGrid grid(8, 4, 2);  // default order dp-pp
  // Ranks 0-3 are stage 0 (data shards 0-3), ranks 4-7 stage 1.
  for (int rank = 0; rank < 8; ++rank) {
    EXPECT_EQ(grid.coord(rank).dp, rank % 4);
    EXPECT_EQ(grid.coord(rank).pp, rank / 4);
  }
  EXPECT_EQ(grid.dp_group(5), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(grid.pp_group(5), (std::vector<int>{1, 5}));
}

TEST(RankGrid, PpInnermostOrder) {
  RankGrid grid(6, 3, 2, "pp-dp");
  EXPECT_EQ(grid.coord(1).pp, 1);
  EXPECT_EQ(grid.coord(1).dp, 0);
  EXPECT_EQ(grid.pp_group(2), (std::vector<int>{2, 3}));
  EXPECT_EQ(grid.dp_group(3), (std::vector<int>{1, 3, 5}));
}

TEST(RankGrid, GroupsPartitionTheWorldForManyShapes) {
  for (const char* order : {"dp-pp", "pp-dp"}) {
    for (int dp : {1, 2, 3, 4}) {
      for (int pp : {1, 2, 4}) {
        RankGrid grid(dp * pp, dp, pp, order);
        std::set<std::pair<int, int>> coords;
        for (int rank = 0; rank < dp * pp; ++rank) {
          GridCoord c = grid.coord(rank);
          EXPECT_EQ(grid.rank_of(c), rank);
          coords.insert({c.dp, c.pp});
          // Every member of my DP group shares my stage and has the DP index of its position.
          std::vector<int> dp_members = grid.dp_group(rank);
          ASSERT_EQ(static_cast<int>(dp_members.size()), dp);
          for (int d = 0; d < dp; ++d) {
            EXPECT_EQ(grid.coord(dp_members[d]).pp, c.pp);
            EXPECT_EQ(grid.coord(dp_members[d]).dp, d);
          }
          std::vector<int> pp_members = grid.pp_group(rank);
          ASSERT_EQ(static_cast<int>(pp_members.size()), pp);
          for (int p = 0; p < pp; ++p) {
            EXPECT_EQ(grid.coord(pp_members[p]).dp, c.dp);
            EXPECT_EQ(grid.coord(pp_members[p]).pp, p);
          }
        }
        EXPECT_EQ(static_cast<int>(coords.size()), dp * pp) << order << " dp " << dp << " pp " << pp;
      }
    }
  }
}

TEST(RankGrid, RefusesGridsThatDoNotFillTheWorld) {
  try {
    RankGrid grid(4, 3, 1);
    FAIL() << "3 × 1 ranks accepted for a world of 4";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kUsage);
    EXPECT_NE(std::string(e.what()).find("parallel.dp"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("number of ranks (4)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(RankGrid(4, 2, 2, "tp-dp"), Error);
}
