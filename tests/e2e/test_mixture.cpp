// Training on a mixture of corpora: deterministic, stopped by a signal and resumed bitwise, and a
// checkpoint refuses another mixture.
#include <gtest/gtest.h>

#include "e2e_util.h"

using namespace dstrain::e2e;

namespace {

std::string second_corpus() {
  static std::string path = [] {
    std::string dir = scratch_dir("mixture-corpus-" + std::to_string(getpid()));
    RunOutput prep = run_dstrain(0, {"prep", "--output", dir + "/copyrights.h5", "--input",
                                     "/usr/share/doc/bash/copyright", "/usr/share/doc/gcc-12-base/copyright",
                                     "/usr/share/doc/libc6/copyright", "/usr/share/doc/perl/copyright"});
    EXPECT_EQ(prep.exit_code, 0) << prep.output;
    return dir + "/copyrights.h5";
  }();
  return path;
}

RunOutput train_mixture(const std::string& run_dir, const std::string& weights, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--train.device", "cpu", "--train.steps", "12", "--ckpt.interval", "4",
                                   "--data.train", test_corpus().train + ":" + weights + "," + second_corpus() + ":1"};
  args.insert(args.end(), extra.begin(), extra.end());
  return train_tiny(2, run_dir, args);
}

std::string digest(const std::string& run_dir) { return read_json(run_dir + "/summary.json")["param_digest"]; }

}  // namespace

TEST(Mixture, TrainsDeterministicallyAndResumesBitwise) {
  const std::string whole = scratch_dir("mixture-whole"), again = scratch_dir("mixture-again"),
                    stopped = scratch_dir("mixture-stopped"), other = scratch_dir("mixture-other");
  RunOutput run = train_mixture(whole, "3");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  // The start says what each corpus gives the run.
  EXPECT_NE(run.output.find(test_corpus().train + ": 75.0% of the samples, "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find(second_corpus() + ": 25.0% of the samples, "), std::string::npos) << run.output;
  ASSERT_EQ(train_mixture(again, "3").exit_code, 0);
  EXPECT_EQ(digest(whole), digest(again));
  ASSERT_EQ(train_mixture(other, "1").exit_code, 0);
  EXPECT_NE(digest(whole), digest(other)) << "other weights, other data";

  RunOutput signalled = train_mixture(stopped, "3", {"--debug.fail_at_step", "6", "--debug.fail_rank", "1",
                                                     "--debug.fail_mode", "sigterm"});
  ASSERT_EQ(signalled.exit_code, 75) << signalled.output;
  RunOutput resumed = train_mixture(stopped, "3");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(digest(stopped), digest(whole));

  RunOutput foreign = train_mixture(stopped, "1", {"--ckpt.resume", stopped + "/checkpoints"});
  EXPECT_EQ(foreign.exit_code, 4) << foreign.output;
  EXPECT_NE(foreign.output.find("not the corpus"), std::string::npos) << foreign.output;
}
