// Multi-token prediction: its losses against a direct computation of DeepSeek-V3's equations
// (shifted embeddings, the order of the concatenation, the shared head, the mean over depths),
// its Hugging Face names, and pipeline slices that carry the embeddings to the last stage.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>

#include "dstrain/model/flops.h"
#include "dstrain/model/transformer.h"

using namespace dstrain;

namespace {

ModelConfig mtp_config(int64_t depths) {
  ModelConfig c;
  c.vocab_size = 40;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_layers = 2;
  c.num_heads = 2;
  c.num_kv_heads = 2;
  c.max_seq_len = 16;
  c.num_nextn_predict_layers = depths;
  c.mtp_loss_weight = 0.3;
  return c;
}

std::map<std::string, torch::Tensor> by_name(torch::nn::Module& model) {
  std::map<std::string, torch::Tensor> params;
  for (auto& [name, p] : sorted_parameters(model)) params[name] = p;
  return params;
}

// Norm weights away from one, so that exchanging enorm and hnorm (or the halves of the
// concatenation) changes the result; drawn from the name, so that every slice of a model gets
// the same values.
void randomize_norms(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : sorted_parameters(model)) {
    if (name.find("norm") == std::string::npos) continue;
    torch::manual_seed(std::hash<std::string>{}(name));
    p.uniform_(0.5, 1.5);
  }
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  return x / (x.pow(2).mean(-1, true) + eps).sqrt() * w;
}

// Mean cross-entropy of logits [B, n, V] against targets [B, n], position by position.
double cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  double sum = 0;
  int64_t count = 0;
  for (int64_t b = 0; b < logits.size(0); ++b)
    for (int64_t i = 0; i < logits.size(1); ++i, ++count) {
      torch::Tensor row = logits[b][i].to(torch::kFloat64);
      sum += (row.exp().sum().log() - row[targets[b][i].item<int64_t>()]).item<double>();
    }
  return sum / static_cast<double>(count);
}

torch::Tensor random_tokens(const ModelConfig& c, int64_t batch, int64_t seq) {
  torch::manual_seed(11);
  return torch::randint(c.vocab_size, {batch, seq + 1}, torch::kLong);
}

}  // namespace

TEST(MultiTokenPrediction, LossesEqualTheDirectComputation) {
  const ModelConfig c = mtp_config(2);
  CausalLM model(c, LayerSlice::whole(c));
  initialize_parameters(*model, c, 3);
  randomize_norms(*model);
  model->eval();
  const int64_t batch = 2, seq = 9;
  const torch::Tensor tokens = random_tokens(c, batch, seq);
  const LanguageModelLosses losses = model->losses(tokens.narrow(1, 0, seq), tokens, /*with_mtp=*/true);

  auto w = by_name(*model);
  torch::NoGradGuard no_grad;
  auto& stack = *model->named_children()["model"]->as<DecoderStackImpl>();
  // h^0: the main model's final, normalised hidden states.
  torch::Tensor previous = stack.forward(tokens.narrow(1, 0, seq));
  EXPECT_NEAR(losses.next_token.item<double>(),
              cross_entropy(torch::matmul(previous, w.at("lm_head.weight").t()), tokens.narrow(1, 1, seq)), 1e-5);
  const RopeTables rope = make_rope_tables(c.max_seq_len, c.rope_dim(), c.rope_theta, c.rope_interleave, YarnScaling{});
  double sum = 0;
  for (int64_t k = 1; k <= 2; ++k) {
    const std::string p = "model.layers." + std::to_string(c.num_layers + k - 1) + ".";
    const int64_t n = seq - k;
    // Position i: the embedding of t_{i+k}, the previous depth's h_i; the target t_{i+k+1}.
    torch::Tensor embedded = w.at("model.embed_tokens.weight").index_select(0, tokens.narrow(1, k, n).reshape(-1))
                                 .view({batch, n, c.hidden_size});
    torch::Tensor joined = torch::cat({rms_norm(embedded, w.at(p + "enorm.weight"), c.rms_norm_eps),
                                       rms_norm(previous.narrow(1, 0, n), w.at(p + "hnorm.weight"), c.rms_norm_eps)},
                                      -1);
    torch::Tensor projected = torch::matmul(joined, w.at(p + "eh_proj.weight").t());
    // The module's decoder layer (the layer itself is checked by the model's tests).
    MultiTokenPrediction module = stack.mtp_modules().at(static_cast<size_t>(k - 1));
    torch::Tensor hidden = module->forward(projected, rope);
    torch::Tensor logits =
        torch::matmul(rms_norm(hidden, w.at(p + "shared_head.norm.weight"), c.rms_norm_eps), w.at("lm_head.weight").t());
    sum += cross_entropy(logits, tokens.narrow(1, k + 1, n));
    previous = hidden;
  }
  ASSERT_TRUE(losses.mtp.defined());
  EXPECT_NEAR(losses.mtp.item<double>(), sum / 2, 1e-5);
  EXPECT_NEAR(losses.total(0.3).item<double>(), losses.next_token.item<double>() + 0.3 * sum / 2, 1e-5);
  // Evaluation measures the next token only.
  EXPECT_FALSE(model->losses(tokens.narrow(1, 0, seq), tokens, /*with_mtp=*/false).mtp.defined());
}

TEST(MultiTokenPrediction, ModulesHaveDeepSeekV3Names) {
  ModelConfig c = mtp_config(1);
  c.n_routed_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 8;
  c.first_k_dense_replace = 1;
  CausalLM model(c, LayerSlice::whole(c));
  auto w = by_name(*model);
  for (const char* name : {"enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight",
                           "input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
                           "mlp.gate.weight", "mlp.experts.3.down_proj.weight"})
    EXPECT_TRUE(w.count(std::string("model.layers.2.") + name)) << name;
  EXPECT_EQ(w.at("model.layers.2.eh_proj.weight").sizes(), torch::IntArrayRef({16, 32}));
  // The embedding and head are shared: no copies under the module's name.
  for (const auto& [name, p] : w) EXPECT_EQ(name.find("model.layers.2.embed_tokens"), std::string::npos) << name;
  EXPECT_EQ(w.count("model.layers.2.shared_head.head.weight"), 0u);
  // Its MoE layer counts among the model's, by its index.
  auto moe = model->moe_layers();
  ASSERT_EQ(moe.size(), 2u);
  EXPECT_EQ(moe[0].first, 1);
  EXPECT_EQ(moe[1].first, 2);
  // Parameters counted apart from the main model: the ones the module holds.
  int64_t held = 0;
  for (const auto& [name, p] : w)
    if (name.rfind("model.layers.2.", 0) == 0) held += p.numel();
  EXPECT_EQ(count_parameters(c).mtp, held);
}

// Three pipeline slices: the first sends [hidden; embeddings], the middle carries the embeddings
// through untouched, the last computes the same losses and sends back the same embedding
// gradient as the whole model.
TEST(MultiTokenPrediction, PipelineSlicesCarryTheEmbeddingsToTheLastStage) {
  ModelConfig c = mtp_config(1);
  c.num_layers = 3;
  CausalLM whole(c, LayerSlice::whole(c));
  CausalLM first(c, LayerSlice{0, 1, true, false}), middle(c, LayerSlice{1, 2, false, false}),
      last(c, LayerSlice{2, 3, false, true});
  for (CausalLM* m : {&whole, &first, &middle, &last}) {
    initialize_parameters(**m, c, 5);
    randomize_norms(**m);
  }
  EXPECT_EQ(CausalLMImpl::stage_activation_width(c, 3), 2 * c.hidden_size);
  EXPECT_EQ(CausalLMImpl::stage_activation_width(c, 1), c.hidden_size);
  const int64_t seq = 8;
  const torch::Tensor tokens = random_tokens(c, 2, seq), ids = tokens.narrow(1, 0, seq);

  torch::Tensor sent = first->forward(ids);
  ASSERT_EQ(sent.sizes(), torch::IntArrayRef({2, seq, 2 * c.hidden_size}));
  torch::Tensor received = sent.detach().requires_grad_(true);
  torch::Tensor passed = middle->forward(received);
  EXPECT_TRUE(torch::equal(passed.narrow(-1, c.hidden_size, c.hidden_size), sent.narrow(-1, c.hidden_size, c.hidden_size)));
  torch::Tensor at_last = passed.detach().requires_grad_(true);
  const LanguageModelLosses piecewise = last->losses(at_last, tokens, true);
  const LanguageModelLosses reference = whole->losses(ids, tokens, true);
  EXPECT_NEAR(piecewise.next_token.item<double>(), reference.next_token.item<double>(), 1e-6);
  EXPECT_NEAR(piecewise.mtp.item<double>(), reference.mtp.item<double>(), 1e-6);

  // Backward through the three slices as the pipeline runs it, against the whole model's.
  piecewise.total(c.mtp_loss_weight).backward();
  passed.backward(at_last.grad());
  sent.backward(received.grad());
  reference.total(c.mtp_loss_weight).backward();
  std::map<std::string, torch::Tensor> whole_params;  // as the modules hold them, with gradients
  for (auto& [name, p] : module_parameters(*whole)) whole_params[name] = p;
  for (CausalLM* slice : {&first, &middle, &last})
    for (auto& [name, p] : module_parameters(**slice)) {
      ASSERT_TRUE(p.grad().defined()) << name;
      EXPECT_TRUE(torch::allclose(p.grad(), whole_params.at(name).grad(), 1e-5, 1e-6)) << name;
    }
}
