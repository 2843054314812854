// dstrain plot: valid PNG files (checked by tests/tools/check_png.py, standard-library Python),
// one run or several overlaid.
#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>

#include "dstrain/core/files.h"
#include "e2e_util.h"

using namespace dstrain::e2e;

namespace {

// "WIDTH HEIGHT DISTINCT_ROWS" of each file, or the checker's complaint.
std::string check_png(const std::vector<std::string>& files, int* exit_code) {
  std::string command = std::string(PYTHON3) + " " + DSTRAIN_SOURCE_DIR + "/tests/tools/check_png.py";
  for (const std::string& f : files) command += " '" + f + "'";
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, n);
  *exit_code = pclose(pipe);
  return output;
}

}  // namespace

TEST(Plot, WritesValidPngChartsForOneRunAndForSeveralOverlaid) {
  const std::string a = scratch_dir("plot-a"), b = scratch_dir("plot-b"), out = scratch_dir("plot-out");
  const RunOutput with_peak = train_tiny(1, a, {"--train.device", "cpu", "--train.peak_tflops", "0.01"});
  ASSERT_EQ(with_peak.exit_code, 0) << with_peak.output;
  EXPECT_NE(with_peak.output.find("MFU peak: 0.01 TFLOP/s per device (train.peak_tflops)"), std::string::npos)
      << with_peak.output;
  const RunOutput without_peak = train_tiny(1, b, {"--train.device", "cpu", "--optim.lr", "1e-3"});
  ASSERT_EQ(without_peak.exit_code, 0) << without_peak.output;
  EXPECT_NE(without_peak.output.find("MFU peak: none: no data-sheet peak is known for cpu; train.peak_tflops sets one"),
            std::string::npos)
      << without_peak.output;

  RunOutput one = run_dstrain(0, {"plot", a, "--width", "640", "--height", "400"});
  ASSERT_EQ(one.exit_code, 0) << one.output;
  std::vector<std::string> pngs;
  for (const char* name : {"loss.png", "lr.png", "throughput.png", "mfu.png"}) pngs.push_back(a + "/" + name);
  int code = -1;
  std::string checked = check_png(pngs, &code);
  ASSERT_EQ(code, 0) << checked;
  std::istringstream lines(checked);
  for (const std::string& png : pngs) {
    int width = 0, height = 0, distinct_rows = 0;
    lines >> width >> height >> distinct_rows;
    EXPECT_EQ(width, 640) << png;
    EXPECT_EQ(height, 400) << png;
    EXPECT_GT(distinct_rows, 20) << png << ": a chart, not a blank image";
  }

  // Two runs overlaid; b has no MFU (no peak known on the CPU), a has: the chart is drawn.
  RunOutput both = run_dstrain(0, {"plot", a, b, "--output", out});
  ASSERT_EQ(both.exit_code, 0) << both.output;
  checked = check_png({out + "/loss.png", out + "/lr.png", out + "/throughput.png", out + "/mfu.png"}, &code);
  EXPECT_EQ(code, 0) << checked;
  // Runs without MFU at all: no mfu.png.
  const std::string out_b = scratch_dir("plot-out-b");
  ASSERT_EQ(run_dstrain(0, {"plot", b, "--output", out_b}).exit_code, 0);
  EXPECT_TRUE(dstrain::files::exists(out_b + "/loss.png"));
  EXPECT_FALSE(dstrain::files::exists(out_b + "/mfu.png"));
}

TEST(Plot, NotARunDirectoryIsAClearError) {
  const std::string empty = scratch_dir("plot-empty");
  RunOutput run = run_dstrain(0, {"plot", empty});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find(empty), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("metrics.jsonl"), std::string::npos) << run.output;
  // A mistyped run directory is not created by the attempt.
  RunOutput missing = run_dstrain(0, {"plot", empty + "/no-such-run"});
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_FALSE(dstrain::files::exists(empty + "/no-such-run"));
}
