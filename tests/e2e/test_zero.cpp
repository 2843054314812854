// ZeRO-1 end to end on real mpirun ranks: sharding the optimizer state over the data-parallel
// ranks changes no number of the run, leaves each rank 1/dp of the state, and writes checkpoints
// that verify and resume on any layout, sharded or not.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "dstrain/ckpt/checkpoint_reader.h"
#include "dstrain/ckpt/parameter_file.h"
#include "dstrain/core/files.h"
#include "e2e_util.h"

using namespace dstrain::e2e;

namespace {

// input/tiny.ini with 4 layers, 8 sequences per step; small buckets, so that parameters are
// split between the ranks' shards; a checkpoint at step 10.
const std::vector<std::string> kRun = {"--train.device", "cpu", "--model.num_layers", "4", "--train.micro_batch", "1",
                                       "--train.global_batch", "8", "--comm.bucket_mb", "0.02", "--ckpt.interval",
                                       "10", "--ckpt.save_final", "true"};

RunOutput train(int dp, int pp, int zero, const std::string& run_dir, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = kRun;
  args.insert(args.end(), {"--parallel.pp", std::to_string(pp), "--optim.zero", std::to_string(zero)});
  args.insert(args.end(), extra.begin(), extra.end());
  return train_tiny(dp * pp, run_dir, args);
}

std::string checkpoint(const std::string& run_dir, int step) {
  char name[32];
  std::snprintf(name, sizeof name, "/checkpoints/step_%08d.h5", step);
  return run_dir + name;
}

// The losses of `run` at the steps it logged equal those of `reference` at the same steps.
void expect_same_losses(const std::string& reference, const std::string& run, size_t first_step) {
  auto a = train_records(reference), b = train_records(run);
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 21 - first_step);
  for (size_t i = 0; i < b.size(); ++i) {
    ASSERT_EQ(b[i]["step"], a[i + first_step - 1]["step"]);
    EXPECT_NEAR(b[i]["loss"].get<double>(), a[i + first_step - 1]["loss"].get<double>(), 1e-5)
        << run << " at step " << b[i]["step"];
  }
}

// The unsharded run on one rank, once per test process.
const std::string& unsharded() {
  static std::string dir = [] {
    std::string d = scratch_dir("zero-reference-" + std::to_string(getpid()));
    RunOutput run = train(1, 1, 0, d);
    EXPECT_EQ(run.exit_code, 0) << run.output;
    return d;
  }();
  return dir;
}

}  // namespace

// The same losses and final parameters as unsharded AdamW on every layout, with the optimizer
// state divided by dp.
TEST(Zero, ShardedOptimizerEqualsUnshardedAdamW) {
  const int64_t whole_state = read_json(unsharded() + "/summary.json")["optimizer_state_bytes"];
  for (auto [dp, pp] : {std::pair{2, 1}, std::pair{4, 1}, std::pair{2, 2}}) {
    std::string dir = scratch_dir("zero-dp" + std::to_string(dp) + "-pp" + std::to_string(pp));
    RunOutput run = train(dp, pp, 1, dir);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find("sharded over the data-parallel ranks (ZeRO-1)"), std::string::npos) << run.output;
    expect_same_losses(unsharded(), dir, 1);
    expect_same_parameters(unsharded(), dir);
    if (pp == 1) {  // rank 0 holds the whole model's parameters, and 1/dp of their state
      const int64_t mine = read_json(dir + "/summary.json")["optimizer_state_bytes"];
      EXPECT_NEAR(static_cast<double>(mine) / whole_state, 1.0 / dp, 0.01) << "dp " << dp;
    }
  }
}

// A sharded run's checkpoint holds whole tensors, written in pieces and checksummed piece by
// piece; it verifies, a damaged piece is named, and it resumes unsharded on other layouts; an
// unsharded checkpoint resumes sharded.
TEST(Zero, CheckpointsVerifyAndResumeOnAnyLayout) {
  std::string sharded = scratch_dir("zero-ckpt-dp2-pp2");
  RunOutput run = train(2, 2, 1, sharded);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::string ckpt = checkpoint(sharded, 10);
  const std::string exp_avg = "optim/model.layers.1.mlp.up_proj.weight/exp_avg";
  {
    dstrain::CheckpointReader reader(ckpt);
    const dstrain::CheckpointReader::DatasetInfo* info = reader.find(exp_avg);
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->shape, (std::vector<int64_t>{64, 32}));
    EXPECT_NE(info->checksum.find(','), std::string::npos) << info->checksum;  // pieces of two ranks
    EXPECT_EQ(info->checksum.rfind("0+", 0), 0u) << info->checksum;
  }
  RunOutput verify = run_dstrain(0, {"ckpt", "verify", ckpt});
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
  EXPECT_NE(verify.output.find("datasets match their checksums"), std::string::npos) << verify.output;

  std::string flipped = scratch_dir("zero-ckpt-flipped") + "/flipped.h5";
  { std::ifstream in(ckpt, std::ios::binary); std::ofstream out(flipped, std::ios::binary); out << in.rdbuf(); }
  flip_a_byte(flipped, "/" + exp_avg);
  RunOutput damaged = run_dstrain(0, {"ckpt", "verify", flipped});
  EXPECT_EQ(damaged.exit_code, 4) << damaged.output;
  EXPECT_NE(damaged.output.find("/" + exp_avg + ": the data do not match the checksum (elements "), std::string::npos)
      << damaged.output;
  {
    // A rank resuming its shard reads only the pieces that hold it: the undamaged piece reads
    // back as written, the damaged one is refused.
    dstrain::CheckpointReader intact(ckpt), reader(flipped);
    const torch::Tensor written = intact.read(exp_avg).reshape({-1});
    std::string problem;
    const auto pieces = dstrain::checksum_pieces(reader.find(exp_avg)->checksum, written.numel(), &problem);
    ASSERT_GE(pieces.size(), 2u) << problem;
    const int64_t damaged_element = written.numel() / 2;  // flip_a_byte's byte: the middle one
    for (const dstrain::ChecksumPiece& piece : pieces) {
      const bool holds_damage = piece.offset <= damaged_element && damaged_element < piece.offset + piece.count;
      const int64_t from = piece.offset + piece.count / 3, count = piece.count / 3;  // inside the piece
      if (holds_damage) {
        EXPECT_THROW(reader.read_range(exp_avg, from, count), dstrain::Error);
      } else {
        torch::Tensor part = reader.read_range(exp_avg, from, count);
        EXPECT_TRUE(torch::equal(part, written.narrow(0, from, count))) << piece.offset << "+" << piece.count;
      }
    }
    EXPECT_TRUE(torch::equal(intact.read_range(exp_avg, 5, written.numel() - 7), written.narrow(0, 5, written.numel() - 7)));
  }

  // Sharded → unsharded, on 4 data-parallel ranks and on one.
  for (int dp : {4, 1}) {
    std::string dir = scratch_dir("zero-resume-dp" + std::to_string(dp));
    RunOutput resumed = train(dp, 1, 0, dir, {"--ckpt.resume", ckpt});
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("continuing on this layout"), std::string::npos) << resumed.output;
    expect_same_losses(unsharded(), dir, 11);
    expect_same_parameters(unsharded(), dir);
  }
  // Unsharded → sharded over 4 ranks.
  std::string dir = scratch_dir("zero-resume-sharded");
  RunOutput resumed = train(4, 1, 1, dir, {"--ckpt.resume", checkpoint(unsharded(), 10)});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  expect_same_losses(unsharded(), dir, 11);
  expect_same_parameters(unsharded(), dir);
}
