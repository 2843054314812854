// The presets in input/ have the published sizes: parameter counts computed from each
// configuration against the figures DeepSeek and the Hugging Face model cards give.
#include <gtest/gtest.h>

#include <cmath>

#include "dstrain/model/flops.h"
#include "dstrain/train/train_config.h"

using namespace dstrain;

namespace {

ModelConfig preset(const std::string& name) {
  OptionTable table = train_option_table();
  ParsedCommandLine parsed =
      parse_command_line(table, {"--config", std::string(DSTRAIN_SOURCE_DIR) + "/input/" + name + ".ini"});
  return read_model_config(parsed.options);
}

void expect_within(double value, double published, double relative, const std::string& what) {
  EXPECT_LT(std::abs(value / published - 1.0), relative) << what << ": " << value / 1e9 << "B, published " << published / 1e9 << "B";
}

}  // namespace

// Totals within 0.5%. DeepSeek states activated parameters to two significant digits (2.4B,
// 21B, 37B), so those are checked within 3%: the input embedding left out, as DeepSeek counts.
TEST(Presets, ParameterCountsAreThePublishedOnes) {
  expect_within(count_parameters(preset("deepseek-llm-7b")).total, 6.91e9, 0.005, "DeepSeek-LLM 7B");
  expect_within(count_parameters(preset("deepseek-llm-67b")).total, 67.4e9, 0.005, "DeepSeek-LLM 67B");
  const ParameterCounts lite = count_parameters(preset("deepseek-v2-lite"));
  expect_within(lite.total, 15.7e9, 0.005, "DeepSeek-V2-Lite total");
  expect_within(lite.active, 2.4e9, 0.03, "DeepSeek-V2-Lite activated");
  const ParameterCounts v2 = count_parameters(preset("deepseek-v2"));
  expect_within(v2.total, 236e9, 0.005, "DeepSeek-V2 total");
  expect_within(v2.active, 21e9, 0.03, "DeepSeek-V2 activated");
  const ModelConfig v3_config = preset("deepseek-v3");
  const ParameterCounts v3 = count_parameters(v3_config);
  expect_within(v3.total, 671e9, 0.005, "DeepSeek-V3 main model");
  expect_within(v3.active, 37e9, 0.03, "DeepSeek-V3 activated");
  // The Hugging Face checkpoint (685B) also stores the MTP module with copies of the embedding
  // and head it shares.
  expect_within(v3.total + v3.mtp + 2.0 * v3_config.vocab_size * v3_config.hidden_size, 685e9, 0.005,
                "DeepSeek-V3 with its MTP module, as stored");
  // Dense models: every parameter but the input embedding is activated.
  const ParameterCounts dense = count_parameters(preset("deepseek-llm-7b"));
  EXPECT_EQ(dense.active, dense.total - dense.embedding);
}

// FLOPs per token: 6 × activated matmul parameters + the attention term, for MLA with its
// separate query/key and value head dimensions.
TEST(Presets, TrainingFlopsCountActivatedParametersAndAttention) {
  const ModelConfig v3 = preset("deepseek-v3");
  const ParameterCounts counts = count_parameters(v3);
  const double attention = 6.0 * v3.num_layers * v3.num_heads * (192 + 128) * 4096.0;
  // Its MTP module, from V3's published shapes: eh_proj, an MoE layer (MLA: q_a, q_b, kv_a,
  // kv_b, o; the router; 8 routed + 1 shared experts of width 2048), the shared head again.
  const double h = 7168, mla = h * 1536 + 1536 * 128 * 192.0 + h * (512 + 64) + 512 * 128 * 256.0 + 128 * 128 * h;
  const double mtp_matmul = 2 * h * h + mla + 256 * h + 9 * 3 * h * 2048 + 129280 * h;
  const double mtp = 6.0 * mtp_matmul + 6.0 * 128 * (192 + 128) * 4096.0;
  EXPECT_DOUBLE_EQ(mtp_training_flops_per_token(v3, 4096), mtp);
  EXPECT_DOUBLE_EQ(training_flops_per_token(v3, 4096), 6.0 * counts.matmul + attention + mtp);
  // The matmul weights are the activated parameters but the norms (two per layer, MLA's two
  // latent norms, the final norm).
  EXPECT_EQ(counts.active - counts.matmul, v3.num_layers * (2 * v3.hidden_size + v3.q_lora_rank + v3.kv_lora_rank) + v3.hidden_size);
}
