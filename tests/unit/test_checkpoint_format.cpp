#include <gtest/gtest.h>

#include "dstrain/ckpt/checkpoint_writer.h"
#include "dstrain/ckpt/format.h"

using namespace dstrain;

TEST(CheckpointFormat, FileNamesCarryTheStep) {
  EXPECT_EQ(checkpoint_file_name(120), "step_00000120.h5");
  EXPECT_EQ(step_of_checkpoint_file("step_00000120.h5"), 120);
  EXPECT_EQ(step_of_checkpoint_file("step_00000120.h5.tmp"), -1);
  EXPECT_EQ(step_of_checkpoint_file("latest"), -1);
  EXPECT_EQ(step_of_checkpoint_file("step_0000012x.h5"), -1);
}

// The newest keep_last stay, and milestones (multiples of keep_every) stay for good.
TEST(CheckpointFormat, RetentionKeepsTheNewestAndTheMilestones) {
  std::vector<std::string> present = {"latest", "step_00000005.h5", "step_00000010.h5", "step_00000015.h5",
                                      "step_00000020.h5", "step_00000025.h5", "step_00000030.h5.tmp"};
  EXPECT_EQ(checkpoints_to_remove(present, {2, 0}, 25),
            (std::vector<std::string>{"step_00000015.h5", "step_00000010.h5", "step_00000005.h5"}));
  EXPECT_EQ(checkpoints_to_remove(present, {2, 10}, 25),
            (std::vector<std::string>{"step_00000015.h5", "step_00000005.h5"}));
  EXPECT_TRUE(checkpoints_to_remove(present, {0, 0}, 25).empty());  // keep all
  EXPECT_EQ(checkpoints_to_remove(present, {1, 0}, 25).size(), 4u);
  // A run resumed from step 10 writes step 15: the later 20 and 25 of the first run stay, are
  // not counted, and 15 (which `latest` now names) is kept even by keep_last = 1.
  EXPECT_EQ(checkpoints_to_remove(present, {1, 0}, 15),
            (std::vector<std::string>{"step_00000010.h5", "step_00000005.h5"}));
}
