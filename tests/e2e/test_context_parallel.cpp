// Context parallelism (parallel.cp, parallel.cp_mla) on real mpirun ranks, against the same
// training on one rank: input/tiny.ini with grouped-query attention (8 query heads, 4 key-value
// heads) and input/tiny-v3.ini (MLA, MoE with a shared expert, with and without its multi-token
// prediction module), seq_len 32 cut into 2 × cp chunks, with data, pipeline, tensor and expert
// parallelism beside, and checkpoints moved between layouts.
#include <gtest/gtest.h>

#include "e2e_util.h"

using namespace dstrain::e2e;

namespace {

constexpr int kSteps = 6;
const std::vector<std::string> kDenseLosses = {"loss", "grad_norm"};
const std::vector<std::string> kV3Losses = {"loss", "balance_loss"};
const std::vector<std::string> kMtpLosses = {"loss", "mtp_loss", "balance_loss"};

RunOutput train_dense(int ranks, const std::string& dir, std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"--train.device", "cpu", "--train.steps", std::to_string(kSteps), "--model.num_heads",
                               "8", "--model.num_kv_heads", "4", "--train.micro_batch", "1", "--train.global_batch",
                               "4", "--ckpt.interval", "3", "--ckpt.save_final", "true"});
  return train_tiny(ranks, dir, extra);
}

RunOutput train_v3(int ranks, const std::string& dir, std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"--train.device", "cpu", "--train.steps", std::to_string(kSteps), "--ckpt.interval", "0",
                               "--model.num_nextn_predict_layers", "0"});
  return train_tiny_v3(ranks, dir, extra);
}

RunOutput train_v3_with_mtp(int ranks, const std::string& dir, std::vector<std::string> extra) {
  extra.insert(extra.begin(),
               {"--train.device", "cpu", "--train.steps", std::to_string(kSteps), "--ckpt.interval", "0"});
  return train_tiny_v3(ranks, dir, extra);
}

double ring_bytes(const std::string& dir) { return train_records(dir).front()["cp_ring_bytes"].get<double>(); }

}  // namespace

// cp 2 and cp 4 (8 chunks of 4 tokens), cp 2 × dp 2 × pp 2 on 8 ranks and cp 2 × tp 2: every
// step's loss and gradient norm, and every final parameter by name, within 1e-5 of one rank's.
TEST(ContextParallel, DenseLayoutsMatchOneRank) {
  expect_layouts_match_one_rank(train_dense, "cp-dense", kSteps, kDenseLosses,
                                {{2, {"--parallel.cp", "2"}},
                                 {4, {"--parallel.cp", "4"}},
                                 {8, {"--parallel.cp", "2", "--parallel.pp", "2"}},
                                 {4, {"--parallel.cp", "2", "--parallel.tp", "2"}}});
}

// MLA passing its latents and, as cp_mla = heads, its keys and values; with the routed experts
// over the cp ranks (cp 2 × ep 2) and with tensor parallelism. The latents are the smaller passes.
TEST(ContextParallel, DeepSeekV3LayoutsMatchOneRank) {
  const std::vector<std::string> dirs =
      expect_layouts_match_one_rank(train_v3, "cp-v3", kSteps, kV3Losses,
                                    {{2, {"--parallel.cp", "2"}},
                                     {2, {"--parallel.cp", "2", "--parallel.cp_mla", "heads"}},
                                     {4, {"--parallel.cp", "4"}},
                                     {4, {"--parallel.cp", "2", "--parallel.ep", "2"}},
                                     {4, {"--parallel.cp", "2", "--parallel.tp", "2"}}});
  // tiny-v3: a token's latent and rope key are 16 + 4 values, its keys and values 4 heads × (12 + 8).
  const double latent = ring_bytes(dirs[0]), heads = ring_bytes(dirs[1]);
  EXPECT_GT(latent, 0.0);
  EXPECT_NEAR(heads / latent, 80.0 / 20.0, 1e-9);
}

// The multi-token prediction module (an MoE layer) on the ring, its last position without a
// target and unrouted: on cp 2 and cp 4 (chunks of 4 positions), with the embeddings carried
// through a pipeline, with tensor and with expert parallelism, its loss and every parameter,
// the balancing bias included, as on one rank.
TEST(ContextParallel, MultiTokenPredictionMatchesOneRank) {
  expect_layouts_match_one_rank(train_v3_with_mtp, "cp-mtp", kSteps, kMtpLosses,
                                {{2, {"--parallel.cp", "2"}},
                                 {4, {"--parallel.cp", "4"}},
                                 {4, {"--parallel.cp", "2", "--parallel.pp", "2"}},
                                 {4, {"--parallel.cp", "2", "--parallel.tp", "2"}},
                                 {4, {"--parallel.cp", "2", "--parallel.ep", "2"}}});
}

// A checkpoint of cp 2 resumes on one rank and as cp 4 with the same losses.
TEST(ContextParallel, CheckpointsResumeOnAnyLayout) {
  const std::string cp2 = scratch_dir("cp2-dense");
  RunOutput run = train_dense(2, cp2, {"--parallel.cp", "2"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  for (int ranks : {1, 4}) {
    const std::string dir = scratch_dir("cp2-resumed-on-" + std::to_string(ranks));
    run = train_dense(ranks, dir, {"--parallel.cp", std::to_string(ranks), "--ckpt.resume", checkpoint_file(cp2, 3)});
    ASSERT_EQ(run.exit_code, 0) << run.output;
    expect_same_losses(dir, cp2, kSteps - 3, kDenseLosses);
    expect_same_parameters(dir, cp2);
  }
}

// A sequence that does not split into 2 × cp chunks, or whose chunks are shorter than the
// multi-token prediction depths: exit code 2, naming the option and the numbers.
TEST(ContextParallel, RefusesWhatItCannotSplit) {
  RunOutput run = train_dense(2, scratch_dir("cp-refused"), {"--parallel.cp", "2", "--train.seq_len", "30"});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("parallel.cp"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("train.seq_len = 30 must split into 2 × cp = 4 chunks"), std::string::npos) << run.output;
  run = train_tiny_v3(4, scratch_dir("cp-refused-mtp"),
                      {"--train.device", "cpu", "--parallel.cp", "4", "--train.seq_len", "8",
                       "--model.num_nextn_predict_layers", "2"});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("parallel.cp"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("train.seq_len / (2 × cp) = 1 positions must be at least "
                            "model.num_nextn_predict_layers = 2"),
            std::string::npos)
      << run.output;
}
