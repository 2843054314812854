// Tensor parallelism's pieces (model/tensor_parallel.h over parallel/tensor_parallel_collectives.h)
// on real ranks, against the unsplit computation in fp64 on every rank: the vocabulary-parallel
// loss against the full softmax, a column- then row-parallel MLP against the whole MLP, and the
// same with sequence parallelism, forward and backward; projections with their collectives
// overlapped; and whole models split over the group.
#include <gtest/gtest.h>
#include <mpi.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dstrain/model/parameter_shapes.h"
#include "dstrain/model/tensor_parallel.h"
#include "dstrain/model/tensor_parallel_projections.h"
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

namespace {

// The collectives of a real group, each start and end written down.
class RecordingGroup : public TensorParallelGroup {
 public:
  RecordingGroup(TensorParallelGroup& real, std::vector<std::string>& log) : real_(real), log_(log) {}
  int size() const override { return real_.size(); }
  int rank() const override { return real_.rank(); }
  void all_reduce_sum(torch::Tensor& t) override { record("all_reduce"), real_.all_reduce_sum(t); }
  void all_reduce_max(torch::Tensor& t) override { record("all_reduce_max"), real_.all_reduce_max(t); }
  torch::Tensor all_gather(const torch::Tensor& t, int64_t dim) override {
    return record("all_gather"), real_.all_gather(t, dim);
  }
  torch::Tensor reduce_scatter(const torch::Tensor& t, int64_t dim) override {
    return record("reduce_scatter"), real_.reduce_scatter(t, dim);
  }
  std::unique_ptr<TensorParallelWork> all_reduce_sum_async(const torch::Tensor& t) override {
    return recorded("all_reduce", real_.all_reduce_sum_async(t));
  }
  std::unique_ptr<TensorParallelWork> all_gather_async(const torch::Tensor& t, int64_t dim) override {
    return recorded("all_gather", real_.all_gather_async(t, dim));
  }
  std::unique_ptr<TensorParallelWork> reduce_scatter_async(const torch::Tensor& t, int64_t dim) override {
    return recorded("reduce_scatter", real_.reduce_scatter_async(t, dim));
  }

 private:
  class Recorded : public TensorParallelWork {
   public:
    Recorded(std::string name, std::unique_ptr<TensorParallelWork> work, std::vector<std::string>& log)
        : name_(std::move(name)), work_(std::move(work)), log_(log) {}
    torch::Tensor wait() override {
      torch::Tensor result = work_->wait();
      log_.push_back(name_ + " completed");
      return result;
    }

   private:
    std::string name_;
    std::unique_ptr<TensorParallelWork> work_;
    std::vector<std::string>& log_;
  };
  void record(const std::string& name) { log_.push_back(name); }
  std::unique_ptr<TensorParallelWork> recorded(const std::string& name, std::unique_ptr<TensorParallelWork> work) {
    log_.push_back(name + " started");
    return std::make_unique<Recorded>(name, std::move(work), log_);
  }
  TensorParallelGroup& real_;
  std::vector<std::string>& log_;
};

// A zero-bubble schedule's W action, as far as a product sees it: the weights' gradients handed
// over, and written down.
class RecordingDeferral : public WeightGradientDeferral {
 public:
  explicit RecordingDeferral(std::vector<std::string>& log) : log_(log) {}
  bool deferring() const override { return true; }
  void defer(const torch::Tensor& weight, std::function<torch::Tensor()> gradient) override {
    log_.push_back("weight gradient handed over");
    handed.emplace_back(weight, std::move(gradient));
  }
  std::vector<std::pair<torch::Tensor, std::function<torch::Tensor()>>> handed;

 private:
  std::vector<std::string>& log_;
};

// Two column-parallel projections of one input (q and k, gate and up) against the whole ones in
// fp64, with the input's collective folded in: their outputs, the input's gradient and the
// weights' (handed to a W action), and the order of the backward pass: the input's collectives
// under way while the products are computed, the weights' gradients handed over while the
// input's gradient is summed.
void expect_projections_overlap_their_collectives(bool sequence_parallel) {
  WorldGroup world;
  std::vector<std::string> log;
  RecordingGroup tp(*world.group, log);
  const int64_t T = tp.size(), r = tp.rank(), batch = 2, seq = 2 * T, hidden = 4, shard = 3;
  torch::manual_seed(43);
  const auto fp64 = torch::kFloat64;
  const torch::Tensor x = torch::randn({batch, seq, hidden}, fp64);
  const std::vector<torch::Tensor> weights = {torch::randn({shard * T, hidden}, fp64),
                                              torch::randn({shard * T, hidden}, fp64)};
  const std::vector<torch::Tensor> upstream = {torch::randn({batch, seq, shard * T}, fp64),
                                               torch::randn({batch, seq, shard * T}, fp64)};
  torch::Tensor x_all = x.clone().requires_grad_();
  std::vector<torch::Tensor> w_all, y_all;
  torch::Tensor whole_loss = torch::zeros({}, fp64);
  for (size_t i = 0; i < weights.size(); ++i) {
    w_all.push_back(weights[i].clone().requires_grad_());
    y_all.push_back(torch::matmul(x_all, w_all[i].t()));
    whole_loss = whole_loss + (y_all[i] * upstream[i]).sum();
  }
  whole_loss.backward();

  RecordingDeferral deferral(log);
  const int64_t part = seq / T;
  torch::Tensor x_mine = (sequence_parallel ? x.narrow(1, r * part, part) : x).clone().requires_grad_();
  std::vector<Projection> projections;
  for (const torch::Tensor& w : weights) {
    projections.emplace_back(hidden, shard, &deferral);
    projections.back()->to(fp64);
    torch::NoGradGuard no_grad;
    projections.back()->weight.copy_(w.narrow(0, r * shard, shard));
  }
  const std::vector<torch::Tensor> y = project_into_tensor_parallel({&tp, sequence_parallel}, x_mine, projections);
  EXPECT_EQ(log, std::vector<std::string>(sequence_parallel ? 1 : 0, "all_gather")) << "forward";
  log.clear();
  torch::Tensor loss = torch::zeros({}, fp64);
  for (size_t i = 0; i < y.size(); ++i) {
    expect_near(y[i], y_all[i].narrow(2, r * shard, shard), "output " + std::to_string(i));
    loss = loss + (y[i] * upstream[i].narrow(2, r * shard, shard)).sum();
  }
  loss.backward();

  const std::string sum = sequence_parallel ? "reduce_scatter" : "all_reduce";
  std::vector<std::string> expected;
  if (sequence_parallel) expected = {"all_gather started", "all_gather completed"};
  expected.insert(expected.end(), {sum + " started", "weight gradient handed over", "weight gradient handed over",
                                   sum + " completed"});
  EXPECT_EQ(log, expected) << "backward";
  expect_near(x_mine.grad(), sequence_parallel ? x_all.grad().narrow(1, r * part, part) : x_all.grad(),
              "the input's gradient");
  ASSERT_EQ(deferral.handed.size(), weights.size());
  for (size_t i = 0; i < weights.size(); ++i) {
    EXPECT_TRUE(deferral.handed[i].first.is_same(projections[i]->weight));
    EXPECT_FALSE(projections[i]->weight.grad().defined()) << "left to the W action";
    expect_near(deferral.handed[i].second(), w_all[i].grad().narrow(0, r * shard, shard),
                "weight " + std::to_string(i) + "'s gradient");
  }
}

}  // namespace

TEST(TensorParallel, ProjectionsOverlapTheirCollectivesWithTheirProducts) {
  expect_projections_overlap_their_collectives(false);
}

TEST(TensorParallel, ProjectionsOverlapTheSequencesCollectivesWithTheirProducts) {
  expect_projections_overlap_their_collectives(true);
}

// FP8 products (DeepSeek-V3's blockwise recipe: 1×128 tiles of activations and gradients, 128×128
// blocks of weights) split by tensor parallelism where the split falls on those boundaries: a
// column-parallel projection of 128 rows a rank and a row-parallel one of 128 columns a rank
// quantize exactly the blocks the whole products quantize, so the split MLP equals the whole one
// up to the order of fp32 sums, forward and backward, with and without sequence parallelism.
void expect_fp8_products_split_on_block_boundaries_equal_the_whole(bool sequence_parallel) {
  WorldGroup world;
  TensorParallelGroup& tp = *world.group;
  const int64_t T = tp.size(), r = tp.rank(), batch = 2, seq = 4 * T, hidden = 256, width = 128;
  torch::manual_seed(47);
  const torch::Tensor x = torch::randn({batch, seq, hidden});
  const torch::Tensor upstream = torch::randn({batch, seq, hidden});
  auto fp8 = [](int64_t in, int64_t out, const torch::Tensor& weight) {
    Projection p(in, out, nullptr, Fp8Recipe::kBlockwise);
    torch::NoGradGuard no_grad;
    p->weight.copy_(weight);
    return p;
  };
  const torch::Tensor w_up = torch::randn({width * T, hidden}) * 0.1, w_down = torch::randn({hidden, width * T}) * 0.1;
  Projection up_all = fp8(hidden, width * T, w_up), down_all = fp8(width * T, hidden, w_down);
  torch::Tensor x_all = x.clone().requires_grad_();
  const torch::Tensor y_all = down_all(torch::silu(up_all(x_all)));
  (y_all * upstream).sum().backward();

  Projection up = fp8(hidden, width, w_up.narrow(0, r * width, width));
  Projection down = fp8(width, hidden, w_down.narrow(1, r * width, width));
  const TensorParallelRegion region{&tp, sequence_parallel};
  const int64_t part = seq / T;
  auto mine = [&](const torch::Tensor& t) { return sequence_parallel ? t.narrow(1, r * part, part) : t; };
  torch::Tensor x_mine = mine(x).clone().requires_grad_();
  const torch::Tensor y = region.leave(down(torch::silu(project_into_tensor_parallel(region, x_mine, {up})[0])));
  (y * mine(upstream)).sum().backward();
  auto expect_close = [](const torch::Tensor& actual, const torch::Tensor& expected, const std::string& what) {
    ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
    EXPECT_TRUE(torch::allclose(actual, expected, 1e-4, 1e-5))
        << what << ": max difference " << (actual - expected).abs().max().item<double>();
  };
  expect_close(y, mine(y_all), "output");
  expect_close(x_mine.grad(), mine(x_all.grad()), "the input's gradient");
  expect_close(up->weight.grad(), up_all->weight.grad().narrow(0, r * width, width), "up's gradient");
  expect_close(down->weight.grad(), down_all->weight.grad().narrow(1, r * width, width), "down's gradient");
}

TEST(TensorParallel, Fp8ProductsSplitOnBlockBoundariesEqualTheWholeOnes) {
  expect_fp8_products_split_on_block_boundaries_equal_the_whole(false);
}

TEST(TensorParallel, Fp8ProductsSplitOnBlockBoundariesWithSequenceParallelismEqualTheWholeOnes) {
  expect_fp8_products_split_on_block_boundaries_equal_the_whole(true);
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
