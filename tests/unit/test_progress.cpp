#include <gtest/gtest.h>

#include "dstrain/report/progress.h"

using namespace dstrain;

TEST(Progress, LineShowsBarStepsThroughputAndEta) {
  EXPECT_EQ(progress_text(5, 20, 1234.4, 75, 8), "[##------]  5/20 | 1,234 tok/s | ETA 1m 15s");
  EXPECT_EQ(progress_text(20, 20, 999, 0, 4), "[####] 20/20 | 999 tok/s | ETA 0s");
  EXPECT_EQ(progress_text(0, 3, 0, 10, 3), "[---] 0/3 | 0 tok/s | ETA 10s");
}
