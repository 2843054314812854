// A DeepSeek-V3-shaped model (input/tiny-v3.ini: MLA, MoE with sigmoid group-limited routing,
// the balancing bias and the balance loss, a multi-token prediction module) end to end on real
// mpirun ranks.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <regex>

#include "dstrain/ckpt/checkpoint_reader.h"
#include "dstrain/ckpt/parameter_file.h"
#include "e2e_util.h"

using namespace dstrain::e2e;

namespace {

RunOutput train_v3(int ranks, const std::string& run_dir, std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"--train.device", "cpu"});
  return train_tiny_v3(ranks, run_dir, extra);
}

// The run on one rank, once per test process.
const std::string& single_rank() {
  static std::string dir = [] {
    std::string d = scratch_dir("v3-one-rank-" + std::to_string(getpid()));
    RunOutput run = train_v3(1, d, {"--ckpt.interval", "10"});
    EXPECT_EQ(run.exit_code, 0) << run.output;
    return d;
  }();
  return dir;
}

}  // namespace

// DP 2 × PP 2 trains the same model as one rank: losses, the balance the metrics report, and the
// final parameters (the balancing biases among them, updated from the whole batch's loads).
TEST(DeepSeekV3, DataAndPipelineParallelMatchOneRank) {
  std::string dir = scratch_dir("v3-dp2-pp2");
  RunOutput run = train_v3(4, dir, {"--parallel.pp", "2"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  auto mine = train_records(dir), reference = train_records(single_rank());
  ASSERT_EQ(mine.size(), 20u);
  ASSERT_EQ(reference.size(), 20u);
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_NEAR(mine[i]["loss"].get<double>(), reference[i]["loss"].get<double>(), 1e-5) << "step " << i + 1;
    // The multi-token prediction module trains on the last stage with the embeddings the first
    // stage computed.
    ASSERT_TRUE(mine[i].contains("mtp_loss"));
    EXPECT_NEAR(mine[i]["mtp_loss"].get<double>(), reference[i]["mtp_loss"].get<double>(), 1e-5) << "step " << i + 1;
    // The balance losses of the MoE layers, on both stages, summed.
    ASSERT_TRUE(mine[i].contains("balance_loss"));
    EXPECT_NEAR(mine[i]["balance_loss"].get<double>(), reference[i]["balance_loss"].get<double>(), 1e-7)
        << "step " << i + 1;
    EXPECT_GT(reference[i]["balance_loss"].get<double>(), 0.0);
    ASSERT_TRUE(reference[i].contains("expert_load_max_over_mean"));
    // Layers 1 and 2 are MoE layers, and so is the MTP module's (layer 3).
    EXPECT_EQ(reference[i]["expert_load_max_over_mean"].size(), 3u);
    for (const char* layer : {"1", "2", "3"})
      EXPECT_GE(reference[i]["expert_load_max_over_mean"][layer].get<double>(), 1.0);
  }
  EXPECT_LT(reference.back()["loss"].get<double>(), reference.front()["loss"].get<double>() - 0.5);
  EXPECT_LT(reference.back()["mtp_loss"].get<double>(), reference.front()["mtp_loss"].get<double>() - 0.5);

  dstrain::NamedTensors a = dstrain::read_parameter_file(dir + "/final_model.h5");
  dstrain::NamedTensors b = dstrain::read_parameter_file(single_rank() + "/final_model.h5");
  ASSERT_EQ(a.size(), b.size());
  bool bias_moved = false;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].first, b[i].first);
    EXPECT_LT((a[i].second - b[i].second).abs().max().item<float>(), 1e-5) << a[i].first;
    if (a[i].first.find("e_score_correction_bias") != std::string::npos)
      bias_moved = bias_moved || a[i].second.abs().max().item<float>() > 0;
  }
  EXPECT_TRUE(bias_moved);
  // The MTP module is saved with the model, under DeepSeek-V3's names.
  EXPECT_TRUE(std::any_of(a.begin(), a.end(), [](const auto& p) { return p.first == "model.layers.3.eh_proj.weight"; }));
}

// Resumed from its step-10 checkpoint, the run ends bitwise where it ended without stopping:
// the balancing biases travel in the checkpoint.
TEST(DeepSeekV3, ResumesBitwiseWithItsBalancingBias) {
  std::string dir = scratch_dir("v3-resumed");
  RunOutput run = train_v3(1, dir, {"--ckpt.resume", single_rank() + "/checkpoints/step_00000010.h5"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(read_json(dir + "/summary.json")["param_digest"], read_json(single_rank() + "/summary.json")["param_digest"]);
}

// A resumed run keeps the checkpoint's model. Settings that add or drop tensors (an MTP module,
// the balancing bias of noaux_tc) make another model, refused before a step; those that change
// what the same tensors compute are said, and the run goes on.
TEST(DeepSeekV3, ResumeRefusesAnotherModelAndSaysWhatComputesOtherwise) {
  const std::string checkpoint = single_rank() + "/checkpoints/step_00000010.h5";
  for (const auto& [key, value, difference] :
       std::vector<std::array<std::string, 3>>{{"num_nextn_predict_layers", "0", "1 there, 0 here"},
                                               {"topk_method", "group_limited_greedy",
                                                "noaux_tc there, group_limited_greedy here"}}) {
    RunOutput other = train_v3(1, scratch_dir("v3-other-" + key), {"--ckpt.resume", checkpoint, "--model." + key, value});
    EXPECT_EQ(other.exit_code, 4) << other.output;
    EXPECT_NE(other.output.find(checkpoint + ": a checkpoint of another model: model." + key + " = " + difference),
              std::string::npos)
        << other.output;
  }
  // At train.steps already: nothing to train, the check alone.
  RunOutput rope = train_v3(1, scratch_dir("v3-other-rope"),
                            {"--ckpt.resume", checkpoint, "--model.rope_interleave", "false", "--train.steps", "10"});
  EXPECT_EQ(rope.exit_code, 0) << rope.output;
  EXPECT_NE(rope.output.find("the model computes otherwise than the one " + checkpoint +
                             " was trained with (model.rope_interleave = true there, false here): its weights are "
                             "read as they are"),
            std::string::npos)
      << rope.output;
}

// bf16: the balancing bias stays fp32 (its 1e-3 steps would round away in bf16 above 0.5), and a
// step whose gradients are not finite moves neither the weights nor the bias.
TEST(DeepSeekV3, Bf16KeepsTheBiasInFp32AndASkippedStepChangesNothing) {
  std::string dir = scratch_dir("v3-bf16-skip");
  RunOutput run = train_v3(1, dir, {"--train.precision", "bf16", "--train.steps", "3", "--ckpt.interval", "1",
                                    "--optim.nonfinite", "skip", "--debug.fail_at_step", "2", "--debug.fail_mode", "nan"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  dstrain::CheckpointReader before(dir + "/checkpoints/step_00000001.h5"), after(dir + "/checkpoints/step_00000002.h5");
  int biases = 0;
  for (const dstrain::CheckpointReader::DatasetInfo& d : before.datasets()) {
    if (d.name.compare(0, 6, "model/") != 0) continue;
    const bool bias = d.name.find("e_score_correction_bias") != std::string::npos;
    biases += bias;
    EXPECT_EQ(d.dtype, bias ? torch::kFloat32 : torch::kBFloat16) << d.name;
    EXPECT_TRUE(torch::equal(before.read(d.name), after.read(d.name))) << d.name << " changed in the skipped step";
  }
  EXPECT_EQ(biases, 3);  // layers 1 and 2, and the MTP module's
  // ...and the bias did move in the steps that were taken.
  EXPECT_GT(before.read("model/model.layers.1.mlp.gate.e_score_correction_bias").abs().max().item<float>(), 0);
}

// dstrain model info: the counts of the configuration, and memory per rank that follows the layout.
TEST(ModelInfo, ReportsCountsFlopsAndMemoryPerRank) {
  const std::string v3 = std::string(DSTRAIN_SOURCE_DIR) + "/input/deepseek-v3.ini";
  auto info = [&](const std::string& zero) {
    RunOutput run = run_dstrain(0, {"model", "info", "--config", v3, "--json", "--ranks", "16", "--parallel.pp", "2",
                                    "--optim.zero", zero, "--train.precision", "bf16"});
    EXPECT_EQ(run.exit_code, 0) << run.output;
    return nlohmann::json::parse(run.output);
  };
  const nlohmann::json plain = info("0"), sharded = info("1");
  EXPECT_NEAR(plain["total_params"].get<double>() / 671e9, 1.0, 0.005);
  EXPECT_NEAR(plain["active_params"].get<double>() / 37e9, 1.0, 0.03);
  EXPECT_GT(plain["flops_per_token"].get<double>(), 6.0 * plain["active_params"].get<double>() * 0.9);
  EXPECT_EQ(plain["layout"]["dp"], 8);
  // bf16 parameters, fp32 gradients, fp32 masters and moments; ZeRO-1 divides the last by dp.
  const nlohmann::json& m = plain["memory_per_rank"];
  EXPECT_DOUBLE_EQ(m["gradients"].get<double>(), 2 * m["parameters"].get<double>());
  EXPECT_DOUBLE_EQ(m["optimizer_state"].get<double>(), 6 * m["parameters"].get<double>());
  EXPECT_DOUBLE_EQ(sharded["memory_per_rank"]["optimizer_state"].get<double>(), m["optimizer_state"].get<double>() / 8);
  // One stage holds about half the model.
  EXPECT_NEAR(m["parameters"].get<double>() / (2 * plain["total_params"].get<double>()), 0.5, 0.05);

  RunOutput text = run_dstrain(0, {"model", "info", "--config", v3});
  EXPECT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("671.03B total, 36.63B activated per token"), std::string::npos) << text.output;
  RunOutput bad = run_dstrain(0, {"model", "info", "--config", v3, "--model.n_group", "7"});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("model.n_group = 7: must divide model.n_routed_experts = 256"), std::string::npos) << bad.output;
  // noaux_tc scores a group by its two best experts: groups of one are refused before any step.
  RunOutput single = run_dstrain(0, {"model", "info", "--config", v3, "--model.n_group", "256"});
  EXPECT_EQ(single.exit_code, 2) << single.output;
  EXPECT_NE(single.output.find("model.n_group = 256: model.topk_method = noaux_tc ranks each group by its two best "
                               "experts, and 256 routed experts in 256 groups leave one a group; at most 128 groups"),
            std::string::npos)
      << single.output;
}

// Every configuration shipped under input/ is planned as it is: no --ranks (the fewest its layout
// runs on), no corpus, no train.steps (a preset's warm-up may be longer than the default run).
// Parameters of a one-stage layout are the precision's bytes for each of them, MTP modules
// included; the text prints each figure in a unit that keeps it readable (MiB for the small).
TEST(ModelInfo, PlansEveryShippedConfigurationAsItIs) {
  int configurations = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(DSTRAIN_SOURCE_DIR) + "/input")) {
    if (entry.path().extension() != ".ini") continue;
    ++configurations;
    const std::string config = entry.path().string();
    SCOPED_TRACE(config);
    RunOutput run = run_dstrain(0, {"model", "info", "--config", config, "--json"});
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const nlohmann::json plan = nlohmann::json::parse(run.output);
    const nlohmann::json& layout = plan["layout"];
    EXPECT_EQ(layout["ranks"].get<int>(), layout["tp"].get<int>() * layout["cp"].get<int>() *
                                              layout["pp"].get<int>() * layout["dp"].get<int>());
    // The fewest ranks: one expert-parallel group spans a stage's tp × cp × dp.
    EXPECT_EQ(layout["tp"].get<int>() * layout["cp"].get<int>() * layout["dp"].get<int>(), layout["ep"].get<int>());
    const double parameter_bytes = plan["memory_per_rank"]["parameters"].get<double>();
    if (layout["pp"] == 1) {
      const double element = plan["precision"] == "fp32" ? 4 : 2;
      EXPECT_DOUBLE_EQ(parameter_bytes,
                       element * (plan["total_params"].get<double>() + plan["mtp_params"].get<double>()));
    }
    RunOutput text = run_dstrain(0, {"model", "info", "--config", config});
    ASSERT_EQ(text.exit_code, 0) << text.output;
    std::smatch printed;
    ASSERT_TRUE(std::regex_search(text.output, printed, std::regex("parameters ([0-9.]+) (MiB|GiB)"))) << text.output;
    const double unit = printed[2] == "GiB" ? 1024.0 * 1024 * 1024 : 1024.0 * 1024;
    EXPECT_NEAR(std::stod(printed[1]), parameter_bytes / unit, 0.005) << text.output;
    EXPECT_GE(std::stod(printed[1]), printed[2] == "GiB" ? 1.0 : 0.01) << text.output;
  }
  EXPECT_GE(configurations, 9);
}

// With parallel.ep the routed experts (256 of 3 × 7168 × 2048 in each of the 58 MoE layers and
// the MTP module's) are split over ep ranks and the rest stays whole on each; ZeRO-1 shards the
// experts' optimizer state over the dp / ep ranks holding the same ones. 8 ranks, one stage.
TEST(ModelInfo, ExpertParallelismSplitsTheRoutedExperts) {
  const std::string v3 = std::string(DSTRAIN_SOURCE_DIR) + "/input/deepseek-v3.ini";
  auto info = [&](const std::string& ep) {
    RunOutput run = run_dstrain(0, {"model", "info", "--config", v3, "--json", "--ranks", "8", "--parallel.ep", ep,
                                    "--optim.zero", "1", "--train.precision", "bf16"});
    EXPECT_EQ(run.exit_code, 0) << run.output;
    return nlohmann::json::parse(run.output);
  };
  const nlohmann::json whole = info("1"), split = info("8");
  EXPECT_EQ(whole["layout"]["ep"], 1);
  EXPECT_EQ(split["layout"]["ep"], 8);
  const double experts = 59.0 * 256 * 3 * 7168 * 2048;
  const double rest = whole["total_params"].get<double>() + whole["mtp_params"].get<double>() - experts;
  const nlohmann::json &m1 = whole["memory_per_rank"], &m8 = split["memory_per_rank"];
  EXPECT_DOUBLE_EQ(m1["parameters"].get<double>(), 2 * (rest + experts));
  EXPECT_DOUBLE_EQ(m8["parameters"].get<double>(), 2 * (rest + experts / 8));
  EXPECT_DOUBLE_EQ(m8["gradients"].get<double>(), 4 * (rest + experts / 8));
  EXPECT_DOUBLE_EQ(m1["optimizer_state"].get<double>(), 12 * (rest + experts) / 8);
  EXPECT_DOUBLE_EQ(m8["optimizer_state"].get<double>(), 12 * (rest / 8 + experts / 8 / 1));
  // The exchange keeps each routed copy (8 per token) twice more: 2 × 7168 bf16 values, 59 MoE
  // layers, 4096 tokens, one micro-batch in flight without a pipeline.
  const double exchanged = 59.0 * 8 * 2 * 7168 * 2 * 4096;
  const double none1 = m1["activations_by_recompute"]["none"].get<double>();
  EXPECT_NEAR(m8["activations_by_recompute"]["none"].get<double>() - none1, exchanged, 1e-12 * none1);

  RunOutput text = run_dstrain(0, {"model", "info", "--config", v3, "--ranks", "16", "--parallel.ep", "16"});
  EXPECT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("16 rank(s): dp 16 x pp 1, ep 16, fp32"), std::string::npos) << text.output;
  RunOutput uneven = run_dstrain(0, {"model", "info", "--config", v3, "--ranks", "8", "--parallel.ep", "3"});
  EXPECT_EQ(uneven.exit_code, 2) << uneven.output;
  EXPECT_NE(uneven.output.find("parallel.ep = 3: must divide parallel.tp × cp × dp = 8"), std::string::npos)
      << uneven.output;
  RunOutput experts_left = run_dstrain(0, {"model", "info", "--config", v3, "--ranks", "24", "--parallel.ep", "3"});
  EXPECT_EQ(experts_left.exit_code, 2) << experts_left.output;
  EXPECT_NE(experts_left.output.find("parallel.ep = 3: must divide model.n_routed_experts = 256"), std::string::npos)
      << experts_left.output;
}

// DeepSeek's own layout (docs/models.md): 2048 ranks, pp 16, ep 64, ZeRO-1, bf16, seq 4096, micro-batch 1
// plans within 60 GiB per rank with full recomputation, and far beyond it without.
TEST(ModelInfo, DeepSeekV3OnItsOwnLayoutFitsWithFullRecomputation) {
  RunOutput run = run_dstrain(0, {"model", "info", "--config", std::string(DSTRAIN_SOURCE_DIR) + "/input/deepseek-v3.ini",
                                  "--json", "--ranks", "2048", "--parallel.pp", "16", "--parallel.ep", "64",
                                  "--optim.zero", "1", "--train.precision", "bf16", "--train.recompute", "full"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const nlohmann::json plan = nlohmann::json::parse(run.output);
  EXPECT_EQ(plan["seq_len"], 4096);
  const nlohmann::json& m = plan["memory_per_rank"];
  const double gib = 1024.0 * 1024 * 1024, state = m["total"].get<double>() - m["activations"].get<double>();
  EXPECT_LE(m["total"].get<double>(), 60 * gib);
  EXPECT_GT(state + m["activations_by_recompute"]["none"].get<double>(), 60 * gib);
}

// The long-context stage as shipped (cp 16 beside V3's pp 16 and ep 64) at 128K tokens on 2048
// ranks: within 80 GB a GPU with full recomputation, as the ring attention keeps no scores; beyond
// it without, and within it again without recomputation on cp 128, where a rank's share of the
// sequence is 1,024 tokens.
TEST(ModelInfo, DeepSeekV3At128KTokensFitsWithContextParallelism) {
  const std::string stage = std::string(DSTRAIN_SOURCE_DIR) + "/input/deepseek-v3-long-context.ini";
  auto plan_of = [&](std::vector<std::string> options) {
    std::vector<std::string> args = {"model", "info", "--config", stage, "--json", "--ranks", "2048",
                                     "--train.seq_len", "131072", "--train.global_batch", "480"};
    args.insert(args.end(), options.begin(), options.end());
    RunOutput run = run_dstrain(0, args);
    EXPECT_EQ(run.exit_code, 0) << run.output;
    return nlohmann::json::parse(run.output);
  };
  const double gb = 1e9;
  const nlohmann::json shipped = plan_of({});
  EXPECT_EQ(shipped["layout"]["cp"], 16);
  EXPECT_EQ(shipped["seq_len"], 131072);
  const nlohmann::json& m = shipped["memory_per_rank"];
  EXPECT_LE(m["total"].get<double>(), 80 * gb);
  const double state = m["total"].get<double>() - m["activations"].get<double>();
  EXPECT_GT(state + m["activations_by_recompute"]["none"].get<double>(), 80 * gb);
  const nlohmann::json wide = plan_of({"--parallel.cp", "128", "--train.recompute", "none"});
  EXPECT_LE(wide["memory_per_rank"]["total"].get<double>(), 80 * gb);
  // With V3's multi-token prediction module trained on the ring too: more, and still within.
  const nlohmann::json with_module = plan_of({"--model.num_nextn_predict_layers", "1"});
  EXPECT_GT(with_module["memory_per_rank"]["total"].get<double>(), m["total"].get<double>());
  EXPECT_LE(with_module["memory_per_rank"]["total"].get<double>(), 80 * gb);
}
