// Tensor and sequence parallelism (parallel.tp, parallel.sequence_parallel) on real mpirun ranks,
// against the same training on one rank: input/tiny.ini with grouped-query attention (8 query
// heads, 4 key-value heads) and input/tiny-v3.ini (MLA, MoE with a shared expert, multi-token
// prediction), with data, pipeline and expert parallelism beside, and checkpoints moved between
// layouts.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "dstrain/ckpt/checkpoint_reader.h"
#include "e2e_util.h"

using namespace dstrain::e2e;

namespace {

constexpr int kSteps = 6;
const std::vector<std::string> kDenseLosses = {"loss", "grad_norm"};
// (V3's gradient norm, which clipping acts on at every step here, differs by a few 1e-6 relative
// from the order of fp32 sums, more than 1e-5 of its absolute value: the parameters show it.)
const std::vector<std::string> kV3Losses = {"loss", "mtp_loss", "balance_loss"};

RunOutput train_dense(int ranks, const std::string& dir, std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"--train.device", "cpu", "--train.steps", std::to_string(kSteps), "--model.num_heads",
                               "8", "--model.num_kv_heads", "4", "--train.micro_batch", "1", "--train.global_batch",
                               "4", "--ckpt.interval", "0", "--ckpt.save_final", "true"});
  return train_tiny(ranks, dir, extra);
}

RunOutput train_v3(int ranks, const std::string& dir, std::vector<std::string> extra) {
  extra.insert(extra.begin(),
               {"--train.device", "cpu", "--train.steps", std::to_string(kSteps), "--ckpt.interval", "3"});
  return train_tiny_v3(ranks, dir, extra);
}

// A row-parallel weight's dataset, written by tp 2 as two blocks of columns: each rank's block
// reads back alone (CheckpointReader::read_columns), as the whole dataset has it, and with a byte
// of one block damaged the other still reads (its pieces alone are read) while the damaged one is
// refused.
void expect_each_block_of_columns_read_alone(const std::string& checkpoint, const std::string& dataset) {
  const std::string damaged = scratch_dir("tp-block-damaged") + "/damaged.h5";
  std::filesystem::copy_file(checkpoint, damaged);
  flip_a_byte(damaged, "/" + dataset);
  dstrain::CheckpointReader intact(checkpoint), reader(damaged);
  const torch::Tensor whole = intact.read(dataset);
  ASSERT_EQ(whole.dim(), 2);
  const int64_t width = whole.size(1) / 2;
  // flip_a_byte's byte is the middle one: the element at half the dataset.
  const int64_t damaged_column = (whole.numel() / 2) % whole.size(1);
  for (int64_t block : {0, 1}) {
    SCOPED_TRACE("block " + std::to_string(block));
    const torch::Tensor expected = whole.narrow(1, block * width, width);
    EXPECT_TRUE(torch::equal(intact.read_columns(dataset, block * width, width), expected));
    if (damaged_column / width == block)
      EXPECT_THROW(reader.read_columns(dataset, block * width, width), dstrain::Error);
    else
      EXPECT_TRUE(torch::equal(reader.read_columns(dataset, block * width, width), expected));
  }
}

}  // namespace

// tp 2 and tp 4, with and without sequence parallelism, and tp 2 × pp 2 × dp 2 on 8 ranks: every
// step's loss and gradient norm, and every final parameter by name, within 1e-5 of one rank's.
TEST(TensorParallel, DenseLayoutsMatchOneRank) {
  expect_layouts_match_one_rank(train_dense, "tp-dense", kSteps, kDenseLosses,
                                {{2, {"--parallel.tp", "2"}},
                                 {4, {"--parallel.tp", "4"}},
                                 {2, {"--parallel.tp", "2", "--parallel.sequence_parallel", "false"}},
                                 {4, {"--parallel.tp", "4", "--parallel.sequence_parallel", "false"}},
                                 {8, {"--parallel.tp", "2", "--parallel.pp", "2"}}});
}

// The same for MLA split by heads, the MoE (each rank routing its own tokens, the shared expert
// split) and multi-token prediction; with the expert grid over the tp ranks (tp 2 × ep 2 × dp 2
// on 4 ranks: each expert-parallel group is a tp group), with ZeRO-1, and with a zero-bubble
// schedule over recomputed layers.
TEST(TensorParallel, DeepSeekV3LayoutsMatchOneRank) {
  expect_layouts_match_one_rank(train_v3, "tp-v3", kSteps, kV3Losses,
                                {{2, {"--parallel.tp", "2"}},
                                 {4, {"--parallel.tp", "4"}},
                                 {2, {"--parallel.tp", "2", "--parallel.sequence_parallel", "false"}},
                                 {4, {"--parallel.tp", "4", "--parallel.sequence_parallel", "false"}},
                                 {4, {"--parallel.tp", "2", "--parallel.ep", "2"}},
                                 {4, {"--parallel.tp", "2", "--optim.zero", "1"}},
                                 {4,
                                  {"--parallel.tp", "2", "--parallel.pp", "2", "--parallel.schedule", "zb-h1",
                                   "--train.recompute", "full"}}});
}

// bf16 (gradients in an fp32 buffer, parameters cast) under tp 2 with ZeRO-1 trains what one bf16
// rank trains, within bf16's rounding of sums split otherwise (1e-4 measured; bf16 and fp32
// differ by 5e-4 on this model).
TEST(TensorParallel, Bf16MatchesOneRankWithinItsRounding) {
  const std::string one = scratch_dir("tp-bf16-one"), split = scratch_dir("tp-bf16-tp2");
  RunOutput run = train_v3(1, one, {"--train.precision", "bf16"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  run = train_v3(4, split, {"--train.precision", "bf16", "--parallel.tp", "2", "--optim.zero", "1"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  expect_same_losses(split, one, kSteps, kV3Losses, 3e-4);
}

// FP8 (DeepSeek-V3's blockwise recipe, emulated on the CPU) under tp 2 with sequence
// parallelism trains what one FP8 rank trains, within FP8's rounding: this tiny model's widths are
// below a 128-wide block, so the split quantizes other blocks than one rank does (1e-3 measured;
// where the split falls on block boundaries the products are the whole ones: the MPI test
// TensorParallel.Fp8ProductsSplitOnBlockBoundaries*).
TEST(TensorParallel, Fp8MatchesOneRankWithinItsRounding) {
  const std::string one = scratch_dir("tp-fp8-one"), split = scratch_dir("tp-fp8-tp2");
  const std::vector<std::string> fp8 = {"--train.precision", "bf16", "--train.fp8", "blockwise"};
  RunOutput run = train_v3(1, one, fp8);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::vector<std::string> layout = fp8;
  layout.insert(layout.end(), {"--parallel.tp", "2"});
  run = train_v3(2, split, layout);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  expect_same_losses(split, one, kSteps, kV3Losses, 2e-3);
}

// Checkpoints hold whole tensors by name: one of tp 2 × pp 2 resumes on one rank, as dp 4 and as
// tp 4 with the same losses, and as tp 2 × pp 2 ends bitwise where the run ended without stopping;
// `dstrain eval` splits a model by tp too.
TEST(TensorParallel, CheckpointsResumeOnAnyLayout) {
  const std::string split = scratch_dir("tp2-pp2");
  RunOutput run = train_v3(4, split, {"--parallel.tp", "2", "--parallel.pp", "2"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::string middle = checkpoint_file(split, 3);
  EXPECT_TRUE(dstrain::CheckpointReader(middle).verify().empty());
  expect_each_block_of_columns_read_alone(middle, "optim/model.layers.0.self_attn.o_proj.weight/exp_avg");
  const RunOutput inspect = run_dstrain(0, {"ckpt", "inspect", middle});
  EXPECT_NE(inspect.output.find("written by 4 ranks: tp 2 x dp 1 x pp 2"), std::string::npos) << inspect.output;

  // Evaluated split again, by tp 2 with sequence parallelism, the final model gives one rank's loss.
  double eval_loss[2] = {0, 0};
  for (int tp : {1, 2}) {
    const std::string json = scratch_dir("tp-eval-" + std::to_string(tp)) + "/eval.json";
    const RunOutput eval = run_dstrain(tp == 1 ? 0 : tp, {"eval", "--ckpt", split + "/final_model.h5", "--data",
                                                          test_corpus().valid, "--json", json, "--parallel.tp",
                                                          std::to_string(tp)});
    ASSERT_EQ(eval.exit_code, 0) << eval.output;
    eval_loss[tp - 1] = read_json(json)["loss"].get<double>();
  }
  EXPECT_NEAR(eval_loss[1], eval_loss[0], 1e-5);
  EXPECT_GT(eval_loss[0], 0.0);

  const std::string again = scratch_dir("tp2-pp2-resumed");
  run = train_v3(4, again, {"--parallel.tp", "2", "--parallel.pp", "2", "--ckpt.resume", middle});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(read_json(again + "/summary.json")["param_digest"], read_json(split + "/summary.json")["param_digest"]);
  for (const RankLayout& layout : std::vector<RankLayout>{{1, {}}, {4, {}}, {4, {"--parallel.tp", "4"}}}) {
    const std::string dir = scratch_dir("tp2-pp2-resumed-on-" + std::to_string(layout.ranks) +
                                        (layout.options.empty() ? "" : "-tp4"));
    std::vector<std::string> options = layout.options;
    options.insert(options.end(), {"--ckpt.resume", middle});
    run = train_v3(layout.ranks, dir, options);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    expect_same_losses(dir, split, kSteps - 3, kV3Losses);
    expect_same_parameters(dir, split);
  }
}

// A tp that does not divide what it splits: exit code 2, naming the option and the number.
TEST(TensorParallel, RefusesSizesThatDoNotDivide) {
  struct Case {
    int ranks;
    std::vector<std::string> options;
    std::string message;
  };
  const std::vector<Case> cases = {
      {3, {"--parallel.tp", "3"}, "must divide model.num_heads = 4"},
      {4, {"--parallel.tp", "4"}, "must divide model.num_kv_heads = 2"},
      {2, {"--parallel.tp", "2", "--model.vocab_size", "265"}, "must divide model.vocab_size = 265"},
      {2, {"--parallel.tp", "2", "--train.seq_len", "31"}, "must divide train.seq_len = 31"}};
  for (const Case& c : cases) {
    std::vector<std::string> options = c.options;
    options.insert(options.end(), {"--train.device", "cpu", "--train.steps", "1"});
    const RunOutput run = train_tiny(c.ranks, scratch_dir("tp-refused"), options);
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_NE(run.output.find("parallel.tp"), std::string::npos) << run.output;
    EXPECT_NE(run.output.find(c.message), std::string::npos) << run.output;
  }
}
