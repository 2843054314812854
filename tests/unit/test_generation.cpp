// Generation with a KV cache against the model's own full forward pass, and the sampling rules.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <limits>
#include <set>

#include "dstrain/model/generation.h"

using namespace dstrain;

namespace {

CausalLM random_model(bool interleave, int64_t kv_heads) {
  ModelConfig c;
  c.vocab_size = 50;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = kv_heads;
  c.rope_interleave = interleave;
  c.max_seq_len = 24;
  c.init_std = 0.5;  // sharp distributions: a wrong cache changes the tokens, not just the digits
  CausalLM model(c, LayerSlice::whole(c));
  initialize_parameters(*model, c, 7);
  return model;
}

// DeepSeek-V2/V3 in small (input/tiny-v3.ini's shape): Multi-head Latent Attention, with or
// without the query's low-rank bottleneck, YaRN rope scaling (tables and softmax scale), and
// DeepSeekMoE from layer 1 on. With q_lora_rank, V3's routing (sigmoid, noaux_tc with its bias,
// groups); without, V2's (softmax, group_limited_greedy).
ModelConfig latent_moe_config(int64_t q_lora_rank) {
  ModelConfig c;
  c.vocab_size = 50;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 3;
  c.num_heads = 4;
  c.max_seq_len = 24;
  c.rope_interleave = true;
  c.init_std = 0.3;
  c.q_lora_rank = q_lora_rank;
  c.kv_lora_rank = 16;
  c.qk_nope_head_dim = 8;
  c.qk_rope_head_dim = 4;
  c.v_head_dim = 8;
  c.rope_scaling_factor = 4;
  c.rope_original_max_seq_len = 8;  // the ramp falls within the tiny context
  c.rope_beta_fast = 4;
  c.rope_beta_slow = 1;
  c.rope_mscale = 1.0;
  c.rope_mscale_all_dim = 0.5;  // tables scaled by mscale(4, 1) / mscale(4, 0.5), softmax by mscale(4, 0.5)^2
  c.n_routed_experts = 8;
  c.n_shared_experts = 1;
  c.moe_intermediate_size = 16;
  c.num_experts_per_tok = 2;
  c.n_group = 4;
  c.topk_group = 2;
  c.first_k_dense_replace = 1;
  c.routed_scaling_factor = 2.5;
  c.aux_loss_alpha = 0.001;
  if (q_lora_rank > 0) {
    c.scoring_func = dstrain::ScoringFunction::kSigmoid;
    c.topk_method = dstrain::TopkMethod::kNoauxTc;
    c.norm_topk_prob = true;
  } else {
    c.scoring_func = dstrain::ScoringFunction::kSoftmax;
    c.topk_method = dstrain::TopkMethod::kGroupLimitedGreedy;
  }
  return c;
}

CausalLM latent_moe_model(int64_t q_lora_rank) {
  const ModelConfig c = latent_moe_config(q_lora_rank);
  CausalLM model(c, LayerSlice::whole(c));
  initialize_parameters(*model, c, 11);
  torch::NoGradGuard no_grad;
  for (auto& [layer, moe] : model->moe_layers())  // a trained balancing bias steers the choice
    if (moe->bias().defined())
      moe->bias().copy_(torch::randn({c.n_routed_experts}, torch::dtype(torch::kFloat32)) * 0.1);
  return model;
}

// Greedy decoding without a cache: the whole sequence through the model at every step.
std::vector<int64_t> greedy_without_cache(CausalLM& model, std::vector<int64_t> ids, int64_t new_tokens) {
  torch::NoGradGuard no_grad;
  std::vector<int64_t> out;
  for (int64_t i = 0; i < new_tokens; ++i) {
    torch::Tensor logits = model->forward(torch::tensor(ids, torch::kLong).unsqueeze(0));
    const int64_t token = logits[0][-1].argmax().item<int64_t>();
    out.push_back(token);
    ids.push_back(token);
  }
  return out;
}

// Greedy decoding with the cache gives the tokens of decoding without it, and the same tokens twice.
void expect_greedy_matches_decoding_without_cache(CausalLM model) {
  CachedDecoder decoder(model);
  const std::vector<int64_t> prompt = {3, 14, 15, 9, 26};
  SamplingOptions greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 12;
  const std::vector<int64_t> tokens = generate(decoder, prompt, greedy);
  EXPECT_EQ(tokens, greedy_without_cache(model, prompt, 12));
  EXPECT_EQ(tokens, generate(decoder, prompt, greedy));
}

}  // namespace

// Cached and full passes multiply matrices of other shapes, so in other summation orders: in
// fp32 their logits differ by up to ~5e-5 (seen over hundreds of random prompts), while a cache
// that loses or misplaces a position changes them by orders of magnitude more.
constexpr double kCachedLogitsTolerance = 1e-4;

TEST(Generation, CachedLogitsEqualTheFullForwardPass) {
  torch::manual_seed(21);  // the prompts: LibTorch seeds its default generator at random
  for (bool interleave : {false, true}) {
    for (int64_t kv_heads : {4, 2}) {
      CausalLM model = random_model(interleave, kv_heads);
      CachedDecoder decoder(model);
      const torch::Tensor ids = torch::randint(0, 50, {1, 12}, torch::kLong);
      torch::Tensor full;
      {
        torch::NoGradGuard no_grad;
        full = model->forward(ids);
      }
      // The prompt in one piece, then one token at a time, then two at a time.
      KvCache cache = decoder.empty_cache();
      std::vector<torch::Tensor> pieces = {decoder.forward(ids.narrow(1, 0, 5), cache)};
      for (int64_t i = 5; i < 9; ++i) pieces.push_back(decoder.forward(ids.narrow(1, i, 1), cache));
      pieces.push_back(decoder.forward(ids.narrow(1, 9, 3), cache));
      EXPECT_EQ(cache.length, 12);
      EXPECT_TRUE(torch::allclose(torch::cat(pieces, 1), full, 1e-4, kCachedLogitsTolerance))
          << "interleave " << interleave << ", kv heads " << kv_heads << ": max difference "
          << (torch::cat(pieces, 1) - full).abs().max().item<double>();
    }
  }
}

TEST(Generation, GreedyMatchesDecodingWithoutCacheAndIsDeterministic) {
  expect_greedy_matches_decoding_without_cache(random_model(false, 2));
}

TEST(Generation, StopsAtTheStopTokenAndAtMaxSeqLen) {
  CausalLM model = random_model(false, 2);
  CachedDecoder decoder(model);
  SamplingOptions greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 100;
  const std::vector<int64_t> prompt = {1, 2, 3};
  const std::vector<int64_t> all = generate(decoder, prompt, greedy);
  EXPECT_EQ(all.size(), 24u - 3u + 1u);  // positions up to max_seq_len - 1 read, one more predicted
  greedy.stop_token = all[4];
  const std::vector<int64_t> stopped = generate(decoder, prompt, greedy);
  ASSERT_LE(stopped.size(), 5u);
  EXPECT_EQ(stopped.back(), all[4]);
}

TEST(Sampling, SeedsTopKAndTopP) {
  const torch::Tensor logits = torch::tensor({1.0, 3.0, 2.5, -1.0, 0.0, 2.9});
  auto draws = [&](SamplingOptions options, int n) {
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(options.seed);
    std::vector<int64_t> out;
    for (int i = 0; i < n; ++i) out.push_back(sample_token(logits, options, generator));
    return out;
  };
  SamplingOptions options;
  options.seed = 5;
  EXPECT_EQ(draws(options, 50), draws(options, 50));  // same seed, same draws
  SamplingOptions other = options;
  other.seed = 6;
  EXPECT_NE(draws(options, 50), draws(other, 50));
  // temperature 0, top_k 1 and a tiny top_p all give the most likely token (1).
  SamplingOptions greedy;
  greedy.temperature = 0;
  EXPECT_EQ(draws(greedy, 1)[0], 1);
  SamplingOptions top1 = options;
  top1.top_k = 1;
  for (int64_t token : draws(top1, 30)) EXPECT_EQ(token, 1);
  SamplingOptions nucleus = options;
  nucleus.top_p = 1e-6;
  for (int64_t token : draws(nucleus, 30)) EXPECT_EQ(token, 1);
  // top_k 3 keeps tokens 1, 5, 2 (logits 3.0, 2.9, 2.5) and never draws the others.
  SamplingOptions top3 = options;
  top3.top_k = 3;
  std::set<int64_t> seen;
  for (int64_t token : draws(top3, 300)) seen.insert(token);
  EXPECT_EQ(seen, (std::set<int64_t>{1, 2, 5}));
  // top_p: probabilities (softmax) sorted 1: .368, 5: .333, 2: .223, ...: p = 0.6 keeps 1 and 5.
  SamplingOptions top_p = options;
  top_p.top_p = 0.6;
  seen.clear();
  for (int64_t token : draws(top_p, 300)) seen.insert(token);
  EXPECT_EQ(seen, (std::set<int64_t>{1, 5}));
}

TEST(Generation, LatentAttentionAndMoECachedLogitsEqualTheFullForwardPass) {
  torch::manual_seed(22);
  for (int64_t q_lora_rank : {0, 24}) {
    CausalLM model = latent_moe_model(q_lora_rank);
    const ModelConfig& c = model->config();
    CachedDecoder decoder(model);  // puts the model in eval mode
    ASSERT_FALSE(model->is_training());
    const torch::Tensor ids = torch::randint(0, c.vocab_size, {1, 20}, torch::kLong);
    torch::Tensor full;
    {
      torch::NoGradGuard no_grad;
      full = model->forward(ids);
    }
    KvCache cache = decoder.empty_cache();
    // What MLA caches: the normalised latent and the rotated RoPE key, kv_lora_rank +
    // qk_rope_head_dim numbers a position, and no per-head keys or values.
    ASSERT_EQ(cache.layers.size(), static_cast<size_t>(c.num_layers));
    for (const AttentionCache& layer : cache.layers) {
      EXPECT_EQ(layer.latent.sizes(), (std::vector<int64_t>{1, c.max_seq_len, c.kv_lora_rank}));
      EXPECT_EQ(layer.rope_key.sizes(), (std::vector<int64_t>{1, c.max_seq_len, c.qk_rope_head_dim}));
      EXPECT_FALSE(layer.keys.defined());
      EXPECT_FALSE(layer.values.defined());
    }
    // The prompt in one piece, then token by token, then three at a time.
    std::vector<torch::Tensor> pieces = {decoder.forward(ids.narrow(1, 0, 6), cache)};
    for (int64_t i = 6; i < 17; ++i) pieces.push_back(decoder.forward(ids.narrow(1, i, 1), cache));
    pieces.push_back(decoder.forward(ids.narrow(1, 17, 3), cache));
    EXPECT_EQ(cache.length, 20);
    const torch::Tensor cached = torch::cat(pieces, 1);
    ASSERT_EQ(cached.sizes(), full.sizes());
    for (int64_t position = 0; position < 20; ++position)
      EXPECT_TRUE(torch::allclose(cached[0][position], full[0][position], 1e-4, kCachedLogitsTolerance))
          << "q_lora_rank " << q_lora_rank << ", position " << position << ": max difference "
          << (cached[0][position] - full[0][position]).abs().max().item<double>();
    // Eval mode: decoding counted no expert load (which would move the balancing bias).
    for (auto& [layer, moe] : model->moe_layers()) EXPECT_EQ(moe->expert_load().sum().item<double>(), 0.0) << layer;
  }
}

TEST(Generation, LatentAttentionAndMoEGreedyMatchesDecodingWithoutCache) {
  expect_greedy_matches_decoding_without_cache(latent_moe_model(24));
}

// A model with a multi-token prediction module decodes with its main layers only: the module's
// weights (NaN here) change nothing, and the cache has no room for it.
TEST(Generation, MultiTokenPredictionModulesTakeNoPart) {
  ModelConfig c = latent_moe_config(24);
  c.num_nextn_predict_layers = 1;
  CausalLM model(c, LayerSlice::whole(c));
  initialize_parameters(*model, c, 11);
  {
    torch::NoGradGuard no_grad;
    const std::string prefix = "model.layers." + std::to_string(c.num_layers) + ".";
    int64_t poisoned = 0;
    for (auto& [name, param] : sorted_parameters(*model))
      if (name.rfind(prefix, 0) == 0) {
        param.fill_(std::numeric_limits<float>::quiet_NaN());
        ++poisoned;
      }
    ASSERT_GT(poisoned, 0);
  }
  CachedDecoder decoder(model);
  torch::manual_seed(23);
  const torch::Tensor ids = torch::randint(0, c.vocab_size, {1, 8}, torch::kLong);
  KvCache cache = decoder.empty_cache();
  EXPECT_EQ(cache.layers.size(), static_cast<size_t>(c.num_layers));
  const torch::Tensor cached = decoder.forward(ids, cache);
  EXPECT_TRUE(cached.isfinite().all().item<bool>());
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::allclose(cached, model->forward(ids), 1e-4, 1e-5));
}

// Continuous batching: rows at different positions decode side by side, each row's logits those
// of its sequence decoded alone with the full forward pass; a row whose sequence ends makes room
// for another, which starts from its own prompt while the others go on.
void expect_batched_decoding_equals_each_sequence_alone(CausalLM model, const std::string& what) {
  const ModelConfig& c = model->config();
  CachedDecoder decoder(model);
  torch::manual_seed(23);
  const std::vector<int64_t> prompt_lengths = {3, 9, 1, 6};  // rows 0..2 start together; 3 takes row 1's place
  std::vector<torch::Tensor> sequences;
  for (int64_t length : prompt_lengths) sequences.push_back(torch::randint(0, c.vocab_size, {1, length + 8}, torch::kLong));
  KvCache cache = decoder.empty_cache(3);
  // Row r's prompt read through a view of row r: the rows share the batched cache.
  auto prefill = [&](int64_t row, const torch::Tensor& prompt) {
    KvCache view = cache_row(cache, row);
    decoder.forward(prompt, view);
  };
  std::vector<int64_t> of_row = {0, 1, 2};  // which sequence each row decodes
  for (int64_t row = 0; row < 3; ++row) prefill(row, sequences[row].narrow(1, 0, prompt_lengths[row]));
  std::vector<int64_t> position = {prompt_lengths[0], prompt_lengths[1], prompt_lengths[2]};
  for (int step = 0; step < 8; ++step) {
    if (step == 3) {  // row 1's sequence stops; sequence 3 takes its row
      of_row[1] = 3;
      prefill(1, sequences[3].narrow(1, 0, prompt_lengths[3]));
      position[1] = prompt_lengths[3];
    }
    std::vector<torch::Tensor> ids;
    for (int64_t row = 0; row < 3; ++row) ids.push_back(sequences[of_row[row]].narrow(1, position[row], 1));
    const torch::Tensor logits = decoder.decode(torch::cat(ids, 0), cache, position);
    ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{3, 1, c.vocab_size}));
    for (int64_t row = 0; row < 3; ++row) {
      torch::NoGradGuard no_grad;
      const torch::Tensor alone = model->forward(sequences[of_row[row]].narrow(1, 0, position[row] + 1))[0][-1];
      EXPECT_TRUE(torch::allclose(logits[row][0], alone, 1e-4, kCachedLogitsTolerance))
          << what << ", step " << step << ", row " << row << ": max difference "
          << (logits[row][0] - alone).abs().max().item<double>();
      ++position[row];
    }
  }
}

TEST(Generation, BatchedDecodingEqualsEachSequenceAlone) {
  expect_batched_decoding_equals_each_sequence_alone(random_model(false, 2), "grouped-query attention");
  expect_batched_decoding_equals_each_sequence_alone(random_model(true, 4), "multi-head attention");
  expect_batched_decoding_equals_each_sequence_alone(latent_moe_model(24), "MLA and MoE");
  expect_batched_decoding_equals_each_sequence_alone(latent_moe_model(0), "MLA without q_lora_rank");
}

TEST(Generation, BatchedDecodingRefusesPositionsPastTheContextAndMoreRowsThanTheCache) {
  CausalLM model = random_model(false, 2);
  CachedDecoder decoder(model);
  KvCache cache = decoder.empty_cache(2);
  const torch::Tensor two = torch::zeros({2, 1}, torch::kLong);
  EXPECT_THROW(decoder.decode(two, cache, {0, model->config().max_seq_len}), std::out_of_range);
  EXPECT_THROW(decoder.decode(torch::zeros({3, 1}, torch::kLong), cache, {0, 1, 2}), std::invalid_argument);
  EXPECT_THROW(decoder.decode(two, cache, {0}), std::invalid_argument);
}
