// Batch-size ramp-up (train.batch_rampup) on real mpirun ranks: a ramped run equals, step for
// step and bitwise, runs started with each of its batch sizes at the same data positions, each
// resumed from the other's checkpoint; it resumes bitwise in the middle of its ramp; a ramp whose
// sizes do not divide over the ranks is refused naming the first; pipeline schedules follow it;
// the learning rate can count tokens instead of steps.
#include <gtest/gtest.h>

#include "e2e_util.h"

using namespace dstrain::e2e;

namespace {

std::vector<nlohmann::json> step_records(const std::string& run_dir) {
  std::vector<nlohmann::json> records;
  for (const auto& r : read_jsonl(run_dir + "/metrics.jsonl"))
    if (r.contains("loss")) records.push_back(r);
  return records;
}

std::string digest(const std::string& run_dir) { return read_json(run_dir + "/summary.json")["param_digest"]; }

}  // namespace

// 4,4,32 → 8: steps 1-8 take 4 sequences (32 samples), then 8. The same as 8 steps at 4, then a
// run at 8 resumed from their checkpoint, with the same learning-rate schedule.
TEST(BatchRampup, EqualsRunsOfEachBatchResumedFromEachOther) {
  const std::vector<std::string> common = {"--train.micro_batch", "1", "--optim.decay_steps", "12", "--log.interval", "1"};
  const std::string ramped = scratch_dir("rampup-ramped"), first = scratch_dir("rampup-first"),
                    second = scratch_dir("rampup-second");
  std::vector<std::string> args = common;
  args.insert(args.end(), {"--train.global_batch", "8", "--train.batch_rampup", "4,4,32", "--train.steps", "12"});
  RunOutput run = train_tiny(2, ramped, args);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("batch ramp-up: the global batch starts at 4 sequences"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("step  8/12 | loss"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("| batch 4 |"), std::string::npos) << run.output;  // the log line says it too
  EXPECT_NE(run.output.find("| batch 8 |"), std::string::npos) << run.output;
  args = common;
  args.insert(args.end(), {"--train.global_batch", "4", "--train.steps", "8", "--ckpt.interval", "8"});
  run = train_tiny(2, first, args);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  args = common;
  args.insert(args.end(), {"--train.global_batch", "8", "--train.steps", "12", "--ckpt.resume",
                           first + "/checkpoints/step_00000008.h5"});
  run = train_tiny(2, second, args);
  ASSERT_EQ(run.exit_code, 0) << run.output;

  const auto r = step_records(ramped), a = step_records(first), b = step_records(second);
  ASSERT_EQ(r.size(), 12u);
  ASSERT_EQ(a.size() + b.size(), 12u);
  for (size_t i = 0; i < r.size(); ++i) {
    const nlohmann::json& other = i < a.size() ? a[i] : b[i - a.size()];
    for (const char* key : {"step", "loss", "lr", "grad_norm", "consumed_samples"})
      EXPECT_EQ(r[i][key], other[key]) << key << " of step " << i + 1;
    EXPECT_EQ(r[i]["global_batch"], i < 8 ? 4 : 8) << "step " << i + 1;
  }
  EXPECT_EQ(digest(ramped), digest(second));
  EXPECT_EQ(read_json(ramped + "/summary.json")["tokens"], (8 * 4 + 4 * 8) * 32);
}

// 2,2,24 → 8 over two ranks: batches of 2, 4, 6 and 8. Stopped after the checkpoint of step 6
// (in the middle of the ramp; the same schedule, decay_steps given) and started again, it ends
// bitwise where the run that never stopped ended; resumed on one rank, it goes on with the same
// batches.
TEST(BatchRampup, ResumesBitwiseInTheMiddleOfTheRamp) {
  const std::vector<std::string> args = {"--train.micro_batch", "1", "--train.global_batch", "8",
                                         "--train.batch_rampup", "2,2,24", "--train.steps", "12",
                                         "--optim.decay_steps", "12", "--ckpt.interval", "6", "--log.interval", "1"};
  const std::string whole = scratch_dir("rampup-whole"), resumed = scratch_dir("rampup-resumed");
  RunOutput run = train_tiny(2, whole, args);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::vector<int> batches;
  for (const auto& record : step_records(whole)) batches.push_back(record["global_batch"].get<int>());
  EXPECT_EQ(batches, (std::vector<int>{2, 2, 2, 2, 4, 4, 6, 6, 8, 8, 8, 8}));
  std::vector<std::string> stopped = args;
  stopped.insert(stopped.end(), {"--train.steps", "6"});
  ASSERT_EQ(train_tiny(2, resumed, stopped).exit_code, 0);
  run = train_tiny(2, resumed, args);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("after step 6, 16 samples consumed"), std::string::npos) << run.output;
  EXPECT_EQ(digest(resumed), digest(whole));

  // On another layout (one rank) the ramp goes on from the same data position: the losses of
  // data parallelism's equivalent, within float tolerance.
  const std::string one_rank = scratch_dir("rampup-one-rank");
  std::vector<std::string> elsewhere = args;
  elsewhere.insert(elsewhere.end(), {"--ckpt.resume", whole + "/checkpoints/step_00000006.h5"});
  run = train_tiny(0, one_rank, elsewhere);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto there = step_records(whole), here = step_records(one_rank);
  ASSERT_EQ(here.size(), 6u);
  for (size_t i = 0; i < here.size(); ++i) {
    EXPECT_EQ(here[i]["global_batch"], there[i + 6]["global_batch"]);
    EXPECT_NEAR(here[i]["loss"].get<double>(), there[i + 6]["loss"].get<double>(), 1e-5) << "step " << i + 7;
  }
}

// Under pipeline parallelism the schedule follows the ramp: each step's micro-batches make its
// schedule (1F1B, and zb-h1 with its split backward pass), and dp 2 × pp 2 trains what one rank
// trains, step by step.
TEST(BatchRampup, PipelineSchedulesFollowTheRamp) {
  const std::vector<std::string> args = {"--train.micro_batch", "1", "--train.global_batch", "8", "--train.batch_rampup",
                                         "4,4,32", "--train.steps", "12", "--log.interval", "1"};
  const std::string one_rank = scratch_dir("rampup-pp-one-rank");
  RunOutput run = train_tiny(0, one_rank, args);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto expected = step_records(one_rank);
  ASSERT_EQ(expected.size(), 12u);
  for (const char* schedule : {"1f1b", "zb-h1"}) {
    const std::string dir = scratch_dir(std::string("rampup-pp-") + schedule);
    std::vector<std::string> piped = args;
    piped.insert(piped.end(), {"--parallel.pp", "2", "--parallel.schedule", schedule});
    run = train_tiny(4, dir, piped);
    ASSERT_EQ(run.exit_code, 0) << schedule << ":\n" << run.output;
    const auto records = step_records(dir);
    ASSERT_EQ(records.size(), expected.size()) << schedule;
    for (size_t i = 0; i < records.size(); ++i) {
      EXPECT_EQ(records[i]["global_batch"], i < 8 ? 4 : 8) << schedule << ", step " << i + 1;
      for (const char* key : {"loss", "grad_norm"})
        EXPECT_NEAR(records[i][key].get<double>(), expected[i][key].get<double>(), 1e-5)
            << schedule << ": " << key << " of step " << i + 1;
    }
  }
}

TEST(BatchRampup, ASizeThatDoesNotDivideOverTheRanksIsRefused) {
  RunOutput run = train_tiny(2, scratch_dir("rampup-refused"), {"--train.micro_batch", "2", "--train.global_batch", "8",
                                                                "--train.batch_rampup", "2,2,100"});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("train.batch_rampup = 2,2,100: its global batch of 2 sequences is not a multiple of "
                            "train.micro_batch × parallel.dp = 2 × 2 = 4"),
            std::string::npos) << run.output;
  for (const char* bad : {"4,x,10", "4,4", "8,4,10", "2,4,10"}) {
    run = train_tiny(0, scratch_dir("rampup-malformed"), {"--train.global_batch", "8", "--train.batch_rampup", bad});
    EXPECT_EQ(run.exit_code, 2) << bad << ": " << run.output;
    EXPECT_NE(run.output.find("train.batch_rampup"), std::string::npos) << run.output;
  }
}

// optim.schedule_unit = tokens: the schedule advances by the tokens a step took, in steps of the
// full batch: the first step of a ramp from 4 to 8 is half a step, at half of warmup's first rate.
TEST(BatchRampup, TheScheduleCanCountTokens) {
  const std::string dir = scratch_dir("rampup-tokens");
  RunOutput run = train_tiny(0, dir, {"--train.micro_batch", "1", "--train.global_batch", "8", "--train.batch_rampup",
                                      "4,4,32", "--train.steps", "12", "--optim.schedule_unit", "tokens",
                                      "--optim.lr", "0.004", "--optim.warmup_steps", "4", "--log.interval", "1"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto records = step_records(dir);
  ASSERT_GE(records.size(), 10u);
  EXPECT_DOUBLE_EQ(records[0]["lr"].get<double>(), 0.004 * 0.5 / 4);
  EXPECT_DOUBLE_EQ(records[1]["lr"].get<double>(), 0.004 * 1.0 / 4);
  EXPECT_DOUBLE_EQ(records[7]["lr"].get<double>(), 0.004);  // 32 samples: four full steps, warmup's end
}
