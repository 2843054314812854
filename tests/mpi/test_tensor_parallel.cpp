// Tensor parallelism's pieces (model/tensor_parallel.h over parallel/tensor_parallel_collectives.h)
// on real ranks, against the unsplit computation in fp64 on every rank: the vocabulary-parallel
// loss against the full softmax, a column- then row-parallel MLP against the whole MLP, and the
// same with sequence parallelism, forward and backward; and whole models split over the group.
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>

#include "dstrain/model/parameter_shapes.h"
#include "dstrain/model/tensor_parallel.h"
#include "dstrain/model/transformer.h"
#include "dstrain/parallel/mpi_communicator.h"
#include "dstrain/parallel/tensor_parallel_collectives.h"
#include "world_communicator.h"

using namespace dstrain;

namespace {

// Every rank of the world as one tensor-parallel group.
struct WorldGroup {
  std::unique_ptr<MpiCommunicator> communicator = world_communicator();
  std::unique_ptr<TensorParallelCollectives> group = std::make_unique<TensorParallelCollectives>(*communicator);
};

constexpr double kFp64 = 1e-12;

void expect_near(const torch::Tensor& actual, const torch::Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  EXPECT_TRUE(torch::allclose(actual, expected, kFp64, kFp64))
      << what << ": max difference " << (actual - expected).abs().max().item<double>();
}

}  // namespace

TEST(TensorParallel, VocabParallelLossEqualsTheFullSoftmaxInFp64) {
  WorldGroup world;
  TensorParallelGroup& tp = *world.group;
  const int64_t shard = 5, vocab = shard * tp.size(), positions = 9;
  torch::manual_seed(31);  // the same logits and targets on every rank
  torch::Tensor logits = torch::randn({positions, vocab}, torch::kFloat64) * 4;
  logits[3] += 1e4;  // a row whose exponentials overflow without the shift by the group's max
  torch::Tensor targets = torch::randint(0, vocab, {positions}, torch::kLong);
  targets[2] = -100;  // ignored positions
  targets[7] = -100;
  targets[4] = vocab - 1;  // the last shard's last id
  targets[5] = 0;

  torch::Tensor full = logits.clone().requires_grad_();
  const torch::Tensor kept = targets != -100;
  const torch::Tensor log_probs = torch::log_softmax(full, 1);
  const torch::Tensor expected = -log_probs.index({kept}).gather(1, targets.index({kept}).unsqueeze(1)).mean();
  expected.backward();

  torch::Tensor mine = logits.narrow(1, tp.rank() * shard, shard).clone().requires_grad_();
  const torch::Tensor loss = vocab_parallel_cross_entropy(mine, targets, tp);
  loss.backward();
  EXPECT_NEAR(loss.item<double>(), expected.item<double>(), kFp64);
  expect_near(mine.grad(), full.grad().narrow(1, tp.rank() * shard, shard), "this shard's gradient");

  // Every position ignored: a loss of 0 and no gradient.
  torch::Tensor none = logits.narrow(1, tp.rank() * shard, shard).clone().requires_grad_();
  const torch::Tensor nothing = vocab_parallel_cross_entropy(none, torch::full({positions}, -100, torch::kLong), tp);
  nothing.backward();
  EXPECT_EQ(nothing.item<double>(), 0.0);
  EXPECT_EQ(none.grad().abs().sum().item<double>(), 0.0);
}

// silu(x W1ᵀ) W2ᵀ with W1's rows (FFN features) and W2's columns split over the group: each rank
// computes a partial sum of the output, and the group's sum is the whole MLP's output. With
// sequence parallelism each rank starts from its part of the sequence and ends with its part of
// the output.
void expect_split_mlp_equals_the_whole(bool sequence_parallel) {
  WorldGroup world;
  TensorParallelGroup& tp = *world.group;
  const int64_t T = tp.size(), r = tp.rank(), batch = 2, seq = 3 * T, hidden = 4, ffn_shard = 3, ffn = ffn_shard * T;
  torch::manual_seed(41);
  const torch::Tensor x = torch::randn({batch, seq, hidden}, torch::kFloat64);
  const torch::Tensor w1 = torch::randn({ffn, hidden}, torch::kFloat64);
  const torch::Tensor w2 = torch::randn({hidden, ffn}, torch::kFloat64);
  const torch::Tensor upstream = torch::randn({batch, seq, hidden}, torch::kFloat64);

  torch::Tensor x_all = x.clone().requires_grad_(), w1_all = w1.clone().requires_grad_(),
                w2_all = w2.clone().requires_grad_();
  const torch::Tensor y_all = torch::silu(torch::matmul(x_all, w1_all.t())).matmul(w2_all.t());
  (y_all * upstream).sum().backward();

  const int64_t part = seq / T;
  torch::Tensor x_mine = (sequence_parallel ? x.narrow(1, r * part, part) : x).clone().requires_grad_();
  torch::Tensor w1_mine = w1.narrow(0, r * ffn_shard, ffn_shard).clone().requires_grad_();
  torch::Tensor w2_mine = w2.narrow(1, r * ffn_shard, ffn_shard).clone().requires_grad_();
  const torch::Tensor input =
      sequence_parallel ? gather_from_sequence_parallel(x_mine, tp, 1) : copy_to_tensor_parallel(x_mine, tp);
  const torch::Tensor partial = torch::silu(torch::matmul(input, w1_mine.t())).matmul(w2_mine.t());
  const torch::Tensor y = sequence_parallel ? scatter_to_sequence_parallel(partial, tp, 1)
                                            : reduce_from_tensor_parallel(partial, tp);
  const torch::Tensor my_upstream = sequence_parallel ? upstream.narrow(1, r * part, part) : upstream;
  (y * my_upstream).sum().backward();

  expect_near(y, sequence_parallel ? y_all.narrow(1, r * part, part) : y_all, "output");
  expect_near(x_mine.grad(), sequence_parallel ? x_all.grad().narrow(1, r * part, part) : x_all.grad(),
              "the input's gradient");
  expect_near(w1_mine.grad(), w1_all.grad().narrow(0, r * ffn_shard, ffn_shard), "the column-parallel weight's gradient");
  expect_near(w2_mine.grad(), w2_all.grad().narrow(1, r * ffn_shard, ffn_shard), "the row-parallel weight's gradient");
}

TEST(TensorParallel, ColumnThenRowParallelMlpEqualsTheWholeMlp) { expect_split_mlp_equals_the_whole(false); }

TEST(TensorParallel, SequenceParallelMlpEqualsTheWholeMlpOnEachPartOfTheSequence) {
  expect_split_mlp_equals_the_whole(true);
}

TEST(TensorParallel, ReduceScatterRefusesADimensionThatDoesNotSplit) {
  WorldGroup world;
  if (world.group->size() == 1) GTEST_SKIP() << "one rank: every dimension splits into one";
  EXPECT_THROW(world.group->reduce_scatter(torch::zeros({2, world.group->size() + 1}), 1), std::invalid_argument);
}

// A whole model split by tensor parallelism: each rank builds its shards from the whole model's
// parameters (tensor_parallel_split) and the split model's losses and gradients are the whole
// model's, shard by shard.
namespace {

ModelConfig dense_config(int64_t tp) {
  ModelConfig c;
  c.vocab_size = 24 * tp;
  c.hidden_size = 16 * tp;  // heads of 8
  c.intermediate_size = 12 * tp;
  c.num_layers = 2;
  c.num_heads = 2 * tp;
  c.num_kv_heads = tp;  // grouped-query: two query heads a key/value head
  c.max_seq_len = 16;
  c.init_std = 0.2;
  return c;
}

// DeepSeek-V3 in small: MLA with the query's low-rank bottleneck, DeepSeekMoE from layer 1 with a
// shared expert, one multi-token prediction module.
ModelConfig latent_moe_config(int64_t tp) {
  ModelConfig c = dense_config(tp);
  c.num_heads = 2 * tp;
  c.num_kv_heads = c.num_heads;
  c.q_lora_rank = 12;
  c.kv_lora_rank = 16;
  c.qk_nope_head_dim = 8;
  c.qk_rope_head_dim = 4;
  c.v_head_dim = 8;
  c.rope_interleave = true;
  c.n_routed_experts = 4;
  c.n_shared_experts = 1;
  c.moe_intermediate_size = 4 * tp;
  c.num_experts_per_tok = 2;
  c.first_k_dense_replace = 1;
  c.scoring_func = ScoringFunction::kSigmoid;
  c.topk_method = TopkMethod::kNoauxTc;
  c.norm_topk_prob = true;
  c.n_group = 1;
  c.topk_group = 1;
  c.num_nextn_predict_layers = 1;
  c.aux_loss_alpha = 0.01;  // the sequence-wise balance loss, of sequences split over the ranks
  return c;
}

torch::Tensor shard_of(const torch::Tensor& whole, const std::string& name, const TensorParallelGroup& tp) {
  switch (tensor_parallel_split(name)) {
    case TensorParallelSplit::kRows: return whole.chunk(tp.size(), 0)[tp.rank()];
    case TensorParallelSplit::kColumns: return whole.chunk(tp.size(), 1)[tp.rank()];
    case TensorParallelSplit::kWhole: break;
  }
  return whole;
}

// The gradients of the parameters whose ranks each see a part (tensor_parallel_partial_gradient)
// are summed over the group first, as training does.
void expect_split_model_equals_the_whole(const ModelConfig& c, bool sequence_parallel, const std::string& what) {
  WorldGroup world;
  TensorParallelGroup& tp = *world.group;
  CausalLM whole(c, LayerSlice::whole(c));
  initialize_parameters(*whole, c, 5);
  ComputeOptions options;
  options.tensor_parallel = &tp;
  options.sequence_parallel = sequence_parallel;
  CausalLM split(c, LayerSlice::whole(c), options);
  auto whole_params = sorted_parameters(*whole), split_params = sorted_parameters(*split);
  ASSERT_EQ(whole_params.size(), split_params.size());
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < whole_params.size(); ++i) {
      ASSERT_EQ(whole_params[i].first, split_params[i].first);
      split_params[i].second.copy_(shard_of(whole_params[i].second, whole_params[i].first, tp));
    }
  }
  torch::manual_seed(51);
  const torch::Tensor tokens = torch::randint(0, c.vocab_size, {2, 13}, torch::kLong);
  const torch::Tensor input = tokens.narrow(1, 0, 12);
  auto total = [&](CausalLM& model) {
    const LanguageModelLosses losses = model->losses(input, tokens, /*with_mtp=*/true);
    return losses.mtp.defined() ? losses.next_token + 0.3 * losses.mtp : losses.next_token;
  };
  const torch::Tensor expected = total(whole), loss = total(split);
  expected.backward();
  loss.backward();
  EXPECT_NEAR(loss.item<double>(), expected.item<double>(), 1e-5) << what;
  whole_params = sorted_parameters(*whole);
  split_params = sorted_parameters(*split);
  for (size_t i = 0; i < whole_params.size(); ++i) {
    const std::string& name = whole_params[i].first;
    torch::Tensor grad = split_params[i].second.grad();
    if (grad.defined() && tensor_parallel_partial_gradient(name, c, sequence_parallel)) tp.all_reduce_sum(grad);
    if (!whole_params[i].second.grad().defined()) {
      EXPECT_FALSE(grad.defined() && grad.abs().sum().item<double>() != 0) << what << ": " << name;
      continue;
    }
    ASSERT_TRUE(grad.defined()) << what << ": " << name;
    const torch::Tensor wanted = shard_of(whole_params[i].second.grad(), name, tp);
    EXPECT_TRUE(torch::allclose(grad, wanted, 1e-4, 1e-6))
        << what << ": " << name << ", max difference " << (grad - wanted).abs().max().item<double>();
  }
}

}  // namespace

TEST(TensorParallel, DenseModelWithGroupedQueryAttentionEqualsTheWholeModel) {
  WorldGroup world;
  expect_split_model_equals_the_whole(dense_config(world.group->size()), false, "dense");
}

TEST(TensorParallel, DenseModelWithSequenceParallelismEqualsTheWholeModel) {
  WorldGroup world;
  expect_split_model_equals_the_whole(dense_config(world.group->size()), true, "dense, sequence-parallel");
}

TEST(TensorParallel, LatentAttentionMoEAndMultiTokenPredictionWithSequenceParallelismEqualTheWholeModel) {
  WorldGroup world;
  expect_split_model_equals_the_whole(latent_moe_config(world.group->size()), true, "MLA, MoE, MTP, sequence-parallel");
}

TEST(TensorParallel, LatentAttentionMoEAndMultiTokenPredictionEqualTheWholeModel) {
  WorldGroup world;
  expect_split_model_equals_the_whole(latent_moe_config(world.group->size()), false, "MLA, MoE, MTP");
}
