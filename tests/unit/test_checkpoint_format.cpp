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
  EXPECT_EQ(checkpoints_to_remove(present, {2, 0}),
            (std::vector<std::string>{"step_00000015.h5", "step_00000010.h5", "step_00000005.h5"}));
  EXPECT_EQ(checkpoints_to_remove(present, {2, 10}), (std::vector<std::string>{"step_00000015.h5", "step_00000005.h5"}));
  EXPECT_TRUE(checkpoints_to_remove(present, {0, 0}).empty());  // keep all
  EXPECT_EQ(checkpoints_to_remove(present, {1, 0}).size(), 4u);
}
