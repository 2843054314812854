// Generation with a KV cache against the model's own full forward pass, and the sampling rules.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

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

}  // namespace

TEST(Generation, CachedLogitsEqualTheFullForwardPass) {
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
      EXPECT_TRUE(torch::allclose(torch::cat(pieces, 1), full, 1e-4, 1e-5))
          << "interleave " << interleave << ", kv heads " << kv_heads << ": max difference "
          << (torch::cat(pieces, 1) - full).abs().max().item<double>();
    }
  }
}

TEST(Generation, GreedyMatchesDecodingWithoutCacheAndIsDeterministic) {
  CausalLM model = random_model(false, 2);
  CachedDecoder decoder(model);
  const std::vector<int64_t> prompt = {3, 14, 15, 9, 26};
  SamplingOptions greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 12;
  const std::vector<int64_t> tokens = generate(decoder, prompt, greedy);
  EXPECT_EQ(tokens, greedy_without_cache(model, prompt, 12));
  EXPECT_EQ(tokens, generate(decoder, prompt, greedy));
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
