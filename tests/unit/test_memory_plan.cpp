// The memory `dstrain model info` plans per rank, against counts made by hand from the
// configuration: with expert parallelism each rank holds 1/ep of the routed experts, and ZeRO-1
// shards their optimizer state over the edp ranks that hold the same ones (dp / ep of them).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "dstrain/core/error.h"
#include "dstrain/model/activation_memory.h"
#include "dstrain/pipeline/partition.h"
#include "dstrain/train/memory_plan.h"
#include "dstrain/train/train_config.h"

using namespace dstrain;

namespace {

// input/tiny-v3.ini (V3-shaped: MLA with query compression, 1 shared + 8 routed experts, the
// first of 3 layers dense, one MTP module) on `ranks` ranks, bf16, one pipeline stage.
TrainConfig tiny_v3(int ranks, int ep, int zero, const std::vector<std::string>& more = {}) {
  OptionTable table = train_option_table();
  std::vector<std::string> args = {"--config", std::string(DSTRAIN_SOURCE_DIR) + "/input/tiny-v3.ini",
                                   "--parallel.ep", std::to_string(ep), "--optim.zero", std::to_string(zero),
                                   "--train.precision", "bf16"};
  args.insert(args.end(), more.begin(), more.end());
  ParsedCommandLine parsed = parse_command_line(table, args);
  return read_model_and_layout(parsed.options, ranks);
}

// tiny-v3.ini by hand: hidden 32, vocabulary 264, moe_intermediate_size 16.
// Routed experts: layers 1 and 2 and the MTP module's layer are MoE, 8 experts of 3 × 32 × 16:
constexpr double kExperts = 3 * 8 * (3 * 32 * 16);  // 36,864
// The rest. MLA: q_a 32×24, q_b 24×4×12, kv_a 32×(16+4), kv_b 16×4×(8+8), o 4×8×32 = 4,608; norms
// 2×32 + 16 + 24 = 104. Dense layer 0: + SwiGLU 3×32×64 = 10,856. MoE layer: + router 8×32, shared
// expert 3×32×16 = 6,504. Embedding and head 2 × 264×32, final norm 32. MTP module: enorm, hnorm
// (2×32), eh_proj 32×64, its MoE layer's 6,504, its norm 32 = 8,648.
constexpr double kReplicated = 2 * 264 * 32 + 32 + 10856 + 2 * 6504 + 8648;  // 49,440

// A moment of a schedule (ActivationMemoryOptions): what is made then besides what is kept.
constexpr int kForwardEnded = 1, kBackwardStarting = 2, kBackwardEnded = 4;

// The activations `stage` of 2 holds, bf16, with `before_b` micro-batches awaiting their B and
// `before_w` awaiting their W, at `moment`.
double stage_peak(const TrainConfig& c, int stage, double before_b, double before_w, int moment) {
  ActivationMemoryOptions o;
  o.micro_batch = c.loop.micro_batch;
  o.seq_len = c.loop.seq_len;
  o.element_bytes = 2;
  o.recompute = {c.loop.recompute, 0};
  o.micro_batches_in_flight = before_b;
  o.micro_batches_awaiting_weights = before_w;
  o.forward_ended = (moment & kForwardEnded) != 0;
  o.backward_starting = (moment & kBackwardStarting) != 0;
  o.backward_ended = (moment & kBackwardEnded) != 0;
  const std::vector<LayerSlice> slices = partition_layers(c.model, c.loop.seq_len, 2, {});
  return step_activation_bytes(c.model, {slices[static_cast<size_t>(stage)]}, o);
}

}  // namespace

TEST(MemoryPlan, StageParametersSplitRoutedExpertsFromTheRest) {
  const TrainConfig c = tiny_v3(1, 1, 0);
  const StageParameters whole = stage_parameters(c.model, {LayerSlice::whole(c.model)});
  EXPECT_EQ(whole.routed_experts, kExperts);
  EXPECT_EQ(whole.replicated, kReplicated);
  // Split at layer 2: the head's side has layer 2's and the MTP module's experts.
  const StageParameters first = stage_parameters(c.model, {{0, 2, true, false}});
  const StageParameters last = stage_parameters(c.model, {{2, 3, false, true}});
  EXPECT_EQ(first.routed_experts, 8.0 * 3 * 32 * 16);
  EXPECT_EQ(last.routed_experts, 2.0 * 8 * 3 * 32 * 16);
  EXPECT_EQ(first.replicated + last.replicated, kReplicated);
}

// 8 ranks, ep 4: every rank holds all of the replicated parameters and a quarter of the experts:
// bf16 parameters, fp32 gradients, fp32 masters and moments (12 bytes per parameter).
TEST(MemoryPlan, ExpertParallelismDividesTheExpertsParametersAndState) {
  const double held = kReplicated + kExperts / 4;
  const MemoryPlan plan = plan_memory(tiny_v3(8, 4, 0), {});
  EXPECT_DOUBLE_EQ(plan.parameters, 2 * held);
  EXPECT_DOUBLE_EQ(plan.gradients, 4 * held);
  EXPECT_DOUBLE_EQ(plan.optimizer_state, 12 * held);
  // ZeRO-1: the replicated part's state over the 8 data-parallel ranks, the experts' over the 2
  // ranks holding the same quarter.
  const MemoryPlan sharded = plan_memory(tiny_v3(8, 4, 1), {});
  EXPECT_DOUBLE_EQ(sharded.parameters, 2 * held);
  EXPECT_DOUBLE_EQ(sharded.optimizer_state, 12 * (kReplicated / 8 + kExperts / 4 / 2));
  // Without expert parallelism every rank holds every expert, as before.
  const MemoryPlan replicated = plan_memory(tiny_v3(8, 1, 1), {});
  EXPECT_DOUBLE_EQ(replicated.parameters, 2 * (kReplicated + kExperts));
  EXPECT_DOUBLE_EQ(replicated.optimizer_state, 12 * (kReplicated + kExperts) / 8);
}

// What tensor parallelism splits of that: MLA's q_b, kv_b and o (24×48 + 16×64 + 32×32 = 3,200) in
// each of the 3 layers and the MTP module, the dense MLP (6,144), the shared experts of the 2 MoE
// layers and the module's (1,536 each), the embedding and the head (2 × 264×32 = 16,896).
constexpr double kSplit = 4 * 3200 + 6144 + 3 * 1536 + 16896;  // 40,448

// tp 2: each rank holds half of the split parameters, the rest whole, and the routed experts
// whole (tp 2 × dp 1: the two ranks route different tokens through the same experts); ZeRO-1 on
// tp 2 × dp 2 shards the split parameters' state over dp 2 and the experts' over the 4 ranks
// holding them (edp).
TEST(MemoryPlan, TensorParallelismDividesTheSplitParameters) {
  const TrainConfig c = tiny_v3(2, 1, 0, {"--parallel.tp", "2"});
  EXPECT_EQ(stage_parameters(c.model, {LayerSlice::whole(c.model)}).split, kSplit);
  const double held = kReplicated - kSplit / 2;
  const MemoryPlan plan = plan_memory(c, {});
  EXPECT_DOUBLE_EQ(plan.parameters, 2 * (held + kExperts));
  EXPECT_DOUBLE_EQ(plan.gradients, 4 * (held + kExperts));
  const MemoryPlan sharded = plan_memory(tiny_v3(4, 1, 1, {"--parallel.tp", "2"}), {});
  EXPECT_DOUBLE_EQ(sharded.optimizer_state, 12 * (held / 2 + kExperts / 4));
  // Sequence parallelism splits the norms' and residuals' activations too.
  const MemoryPlan whole = plan_memory(tiny_v3(2, 1, 0, {"--parallel.dp", "2"}), {});
  const MemoryPlan without = plan_memory(tiny_v3(2, 1, 0, {"--parallel.tp", "2", "--parallel.sequence_parallel",
                                                          "false"}), {});
  EXPECT_LT(plan.activations, without.activations);
  EXPECT_LT(without.activations, whole.activations);
}

// The token exchange keeps, per routed copy (2 per token) in each of the 3 MoE layers, the input
// received by the expert's rank and the output received back: 2 × 32 elements of 2 bytes, for
// micro_batch 2 × seq_len 32 tokens, one micro-batch in flight on a single stage.
TEST(MemoryPlan, TheTokenExchangeAddsTheReceivedCopiesToTheActivations) {
  const double added = 3 * 2 * (2 * 32) * 2.0 * (2 * 32);
  const MemoryPlan local = plan_memory(tiny_v3(8, 1, 0), {}), exchanged = plan_memory(tiny_v3(8, 4, 0), {});
  EXPECT_DOUBLE_EQ(exchanged.activations - local.activations, added);
  EXPECT_DOUBLE_EQ(exchanged.activations_by_recompute.at(Recompute::kNone), exchanged.activations);
  // Fused attention keeps no score matrix, with or without the exchange.
  const FusedOperations attention{/*attention=*/true};
  EXPECT_DOUBLE_EQ(plan_memory(tiny_v3(8, 4, 0), attention).activations -
                       plan_memory(tiny_v3(8, 1, 0), attention).activations,
                   added);
}

// A pipeline keeps as many micro-batches per stage as its schedule does: 1F1B's first of 2 stages
// 2 (its forward of the second starts before the first's backward), the last 1; GPipe all 4. The
// first stage makes the embedding's gradient as each backward pass ends, the last the head's
// logits and gradients as each forward pass ends and the backward pass starts.
TEST(MemoryPlan, EachStageKeepsTheMicroBatchesItsScheduleHoldsAtOnce) {
  for (const std::string schedule : {"1f1b", "gpipe"}) {
    const TrainConfig c = tiny_v3(2, 1, 0, {"--parallel.pp", "2", "--train.grad_accum", "4", "--parallel.schedule", schedule});
    const double held = schedule == "gpipe" ? 4 : 2, last_held = schedule == "gpipe" ? 4 : 1;
    const double expected = std::max({stage_peak(c, 0, held, 0, kForwardEnded | kBackwardStarting),
                                      stage_peak(c, 0, held - 1, 0, kBackwardEnded | kBackwardStarting),
                                      stage_peak(c, 1, last_held, 0, kForwardEnded | kBackwardStarting)});
    EXPECT_DOUBLE_EQ(plan_memory(c, {}).activations, expected) << schedule;
  }
}

// The moments matter: the embedding's gradient is made after a backward pass, when the micro-batch
// it ran for keeps nothing more, and the head's gradients before one.
TEST(MemoryPlan, TheEmbeddingsGradientComesAsABackwardPassEnds) {
  const TrainConfig c = tiny_v3(2, 1, 0, {"--parallel.pp", "2", "--train.grad_accum", "4"});
  const double embedding_gradient = 264 * 32 * 2;
  EXPECT_DOUBLE_EQ(stage_peak(c, 0, 1, 0, kBackwardEnded) - stage_peak(c, 0, 1, 0, kForwardEnded), embedding_gradient);
  EXPECT_DOUBLE_EQ(stage_peak(c, 0, 1, 0, kBackwardStarting), stage_peak(c, 0, 1, 0, kForwardEnded));
  // The last stage (no embedding) makes its head's logits' gradient and weight gradient as a
  // backward pass starts, and nothing besides as one ends; its heads' final norms and inputs (and
  // the MTP module's two input norms) are alive then: 4 norms op by op in bf16, each keeping its
  // input's fp32 copy and its normalised values (3 elements of hidden 32), and the 2 inputs.
  const double tokens = c.loop.micro_batch * c.loop.seq_len;
  EXPECT_DOUBLE_EQ(stage_peak(c, 1, 1, 0, kBackwardStarting) - stage_peak(c, 1, 1, 0, kBackwardEnded),
                   tokens * 264 * 2 + embedding_gradient + (4 * 3 + 2) * 32 * tokens * 2);
}

// Full recomputation reruns the MTP module's layer too, which counts after the chunk's last one:
// with recompute_layers = 3 (tiny-v3's three layers) it keeps all it keeps without recomputation,
// with 0 (all) only its input, 32 per token. (At the end of a forward pass: no rerun then.)
TEST(MemoryPlan, TheMtpModulesLayerIsRecomputedAfterTheChunksLast) {
  const TrainConfig c = tiny_v3(1, 1, 0, {"--train.recompute", "full"});
  ActivationMemoryOptions o;
  o.micro_batch = c.loop.micro_batch;
  o.seq_len = c.loop.seq_len;
  o.element_bytes = 2;
  o.forward_ended = true;
  o.backward_starting = o.backward_ended = false;
  auto planned = [&](int64_t layers) {
    o.recompute = {Recompute::kFull, layers};
    return step_activation_bytes(c.model, {LayerSlice::whole(c.model)}, o);
  };
  const double tokens = static_cast<double>(c.loop.micro_batch * c.loop.seq_len);
  ActivationMemoryOptions kept_whole = o;
  kept_whole.recompute = {};
  EXPECT_DOUBLE_EQ(planned(3) - planned(0), (layer_activation_elements(c.model, 3, kept_whole) - 32) * tokens * 2);
}

// What a split backward pass leaves for W, per token, by hand for tiny-v3.ini (hidden 32, 4 heads,
// q_lora 24, kv_lora 16, qk 8 + 4 rope, v 8; FFN 64; experts 16 wide, 2 per token, 1 shared):
// MLA: the normalised input 32 (q_a's and kv_a's), q_a's gradient and q_b's input 2 × 24, q_b's
// gradient 4 × 12, kv_a's gradient 16 + 4, kv_b's input 16 and gradient 4 × 16, o_proj's input
// 4 × 8 and gradient 32: 292. A SwiGLU of width I: its input 32, down's input I, three gradients
// I, I, 32: 64 + 3 I.
TEST(MemoryPlan, WeightStoreHoldsEachProjectionsInputAndGradient) {
  const TrainConfig c = tiny_v3(1, 1, 0);
  EXPECT_DOUBLE_EQ(weight_store_elements(c.model, 0), 292 + (64 + 3 * 64));                   // dense
  EXPECT_DOUBLE_EQ(weight_store_elements(c.model, 1), 292 + 2 * (64 + 3 * 16) + (64 + 3 * 16));  // MoE
  // The MTP module's layer (MoE), and its eh_proj: input [hidden; embedding] 64, gradient 32.
  EXPECT_DOUBLE_EQ(weight_store_elements(c.model, 3), 292 + 3 * (64 + 3 * 16) + 96);
}

// zb-h1 on 2 stages, 4 micro-batches (dstrain pipeline simulate draws it): stage 0 runs
// F0 F1 B0 W0 F2 B1 W1 ..., holding at most 2 micro-batches before B, or after a B 1 before B and
// 1 before W; stage 1 runs F0 B0 F1 B1 W0 F2 B2 W1 ..., holding 1 and 1 as a B starts, or 2
// before W after one. Under full recomputation a micro-batch waiting for W holds more than one
// waiting for B (the projections' inputs and gradients against each layer's input), so zb-h1
// plans more than 1F1B.
TEST(MemoryPlan, SplitSchedulesCountWhatMicroBatchesAwaitingWHold) {
  const std::vector<std::string> layout = {"--parallel.pp", "2", "--train.grad_accum", "4", "--train.recompute", "full"};
  std::vector<std::string> zb_h1 = layout, one_f_one_b = layout;
  zb_h1.insert(zb_h1.end(), {"--parallel.schedule", "zb-h1"});
  one_f_one_b.insert(one_f_one_b.end(), {"--parallel.schedule", "1f1b"});
  const TrainConfig c = tiny_v3(2, 1, 0, zb_h1);
  const double expected = std::max({stage_peak(c, 0, 2, 0, kForwardEnded | kBackwardStarting),
                                    stage_peak(c, 0, 1, 1, kBackwardEnded), stage_peak(c, 0, 1, 0, kBackwardStarting),
                                    stage_peak(c, 1, 1, 1, kForwardEnded | kBackwardStarting),
                                    stage_peak(c, 1, 0, 2, kBackwardEnded)});
  EXPECT_DOUBLE_EQ(plan_memory(c, {}).activations, expected);
  EXPECT_GT(plan_memory(c, {}).activations, plan_memory(tiny_v3(2, 1, 0, one_f_one_b), {}).activations);
}

// The state that ranks sharing one memory hold from start to end is checked against it before
// anything is allocated: exit code 7, the figures and the memory named; activations, which the
// plan only estimates, are left to the run.
TEST(MemoryPlan, StateThatCannotFitStopsTheStartNamingTheMemory) {
  MemoryPlan plan;
  plan.parameters = 1 << 20;
  plan.gradients = 2 << 20;
  plan.optimizer_state = 5 << 20;
  plan.activations = 1e12;
  const int64_t mib = 1 << 20;
  EXPECT_NO_THROW(require_state_fits(plan, 2, 16 * mib, "this host's available memory"));
  EXPECT_NO_THROW(require_state_fits(plan, 100, 0, "a memory of unknown size"));
  try {
    require_state_fits(plan, 3, 20 * mib, "GPU 0 (H100)");
    FAIL() << "three ranks of 8 MiB fitted in 20 MiB";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kOutOfMemory);
    const std::string message = e.what();
    EXPECT_NE(message.find("take 8 MiB (`dstrain model info` plans them), 24 MiB for the 3 ranks that share GPU 0 "
                           "(H100), which has 20 MiB; "),
              std::string::npos)
        << message;
  }
  try {
    require_state_fits(plan, 1, 7 * mib, "GPU 1 (H100)");
    FAIL() << "8 MiB fitted in 7 MiB";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("take 8 MiB (`dstrain model info` plans them), and GPU 1 (H100) has 7 MiB; "),
              std::string::npos)
        << e.what();
  }
}

// A fused RMSNorm (LibTorch's CUDA kernel) keeps its input and output only, op by op two
// intermediates more: per decoder layer of hidden 32, 4 × 32 elements a token fewer without
// recomputation; with selective, where each norm keeps its input only, no difference.
TEST(MemoryPlan, FusedNormsKeepTheirInputAndOutputOnly) {
  const TrainConfig c = tiny_v3(1, 1, 0);
  for (const auto& [mode, fewer] : {std::pair{Recompute::kNone, 4 * 32}, std::pair{Recompute::kSelective, 0}}) {
    ActivationMemoryOptions op_by_op, one_kernel;
    op_by_op.recompute = one_kernel.recompute = {mode, 0};
    one_kernel.fused.rms_norm = true;
    for (int64_t layer = 0; layer < 3; ++layer)
      EXPECT_DOUBLE_EQ(layer_activation_elements(c.model, layer, op_by_op) -
                           layer_activation_elements(c.model, layer, one_kernel), fewer) << layer;
  }
  const double tokens = static_cast<double>(c.loop.micro_batch * c.loop.seq_len);
  const TrainConfig none = tiny_v3(1, 1, 0, {"--train.recompute", "none"});
  const double saved = plan_memory(none, {true, false}).activations - plan_memory(none, {true, true}).activations;
  // The 3 layers and the MTP module's, in bf16, where op by op each norm also keeps an fp32 copy of
  // its input: the two of hidden 32 and MLA's of the query (24) and key-value (16) latents; and at
  // the head's moments its final norm, and the MTP module's final and two input norms, each
  // keeping its input instead of the fp32 copy and the normalised values (2 elements fewer).
  EXPECT_DOUBLE_EQ(saved, (4 * (4 * 32 + 2 * 32 + 24 + 16) + 4 * 2 * 32) * tokens * 2);
}

// dstrain's SwiGLU kernel keeps gate and up beside the product down_proj keeps: silu(gate) fewer,
// one intermediate width per SwiGLU a token: 64 in the dense layer 0; in a MoE layer 16 for each
// of the 2 routed copies and 16 for the shared expert. Selective recomputation keeps gate and up
// only, fused or not.
TEST(MemoryPlan, TheFusedSwigluKeepsNoActivationBesidesGateAndUp) {
  const TrainConfig c = tiny_v3(1, 1, 0);
  const double fewer[] = {64, 2 * 16 + 16, 2 * 16 + 16};
  for (const Recompute mode : {Recompute::kNone, Recompute::kSelective}) {
    ActivationMemoryOptions op_by_op, one_kernel;
    op_by_op.recompute = one_kernel.recompute = {mode, 0};
    one_kernel.fused.swiglu = true;
    for (int64_t layer = 0; layer < 3; ++layer)
      EXPECT_DOUBLE_EQ(layer_activation_elements(c.model, layer, op_by_op) -
                           layer_activation_elements(c.model, layer, one_kernel),
                       mode == Recompute::kNone ? fewer[layer] : 0.0) << layer;
  }
}

// On 16-bit activations, what LibTorch computes op by op keeps fp32 copies besides: unfused
// attention its fp32 probabilities and their bf16 copy (per head and token 4 + 2 bytes a key, not
// 4), and the loss a chunk's fp32 copy of the logits beside its fp32 log-probabilities, where no
// kernel reads the bf16 logits as they are (tiny-v3: 64 tokens, vocabulary 264, one chunk).
TEST(MemoryPlan, SixteenBitActivationsCountTheFp32CopiesMadeOpByOp) {
  const TrainConfig c = tiny_v3(1, 1, 0);
  ActivationMemoryOptions unfused, fused;
  unfused.seq_len = fused.seq_len = 32;
  unfused.element_bytes = fused.element_bytes = 2;
  fused.fused.attention = true;
  // Unfused: 4 heads × 32 keys × 3 elements; fused: a log-sum-exp (4 bytes, 2 elements) a head.
  EXPECT_DOUBLE_EQ(layer_activation_elements(c.model, 0, unfused) - layer_activation_elements(c.model, 0, fused),
                   4 * 32 * 3 - 4);
  ActivationMemoryOptions copied;
  copied.micro_batch = c.loop.micro_batch;
  copied.seq_len = c.loop.seq_len;
  copied.element_bytes = 2;
  copied.backward_starting = copied.backward_ended = false;  // the forward pass's end alone
  ActivationMemoryOptions read_as_they_are = copied;
  read_as_they_are.fused.loss = true;
  const std::vector<LayerSlice> whole = {LayerSlice::whole(c.model)};
  EXPECT_DOUBLE_EQ(step_activation_bytes(c.model, whole, copied) -
                       step_activation_bytes(c.model, whole, read_as_they_are),
                   c.loop.micro_batch * c.loop.seq_len * 264 * 4);
}

// FP8 (train.fp8) keeps a linear map's input in a byte (blockwise: and a 4-byte scale a 128-element
// tile) where only linear maps keep it; beside the bf16 one where something else does. By hand for
// tiny-v3 (hidden 32), counted in bf16 elements a token:
//   layer 0 (dense): attention's normalised input 32, MLA's query and key-value latents 24 + 16,
//     o_proj's input 4 heads × 8 (unfused attention keeps none of it), the MLP's normalised input
//     32 and SwiGLU product 64: 200 elements at half their bytes;
//   layer 1 (MoE): the same attention's 104, each of 2 routed copies' input 32 and product 16, the
//     shared expert's product 16 (216 at half), and a byte for the shared expert's copy of the
//     normalised input, which the router keeps in bf16 (32 at half a bf16 element);
//   fused attention keeps its output, of which o_proj's input is a view: 32 more on top.
TEST(MemoryPlan, Fp8KeepsTheLinearMapsInputsInAByte) {
  const TrainConfig c = tiny_v3(1, 1, 0);
  auto change = [&](int64_t layer, Fp8Recipe recipe, bool fused_attention, Recompute mode) {
    ActivationMemoryOptions bf16;
    bf16.element_bytes = 2;
    bf16.fused.attention = fused_attention;
    bf16.recompute = {mode, 0};
    ActivationMemoryOptions fp8 = bf16;
    fp8.fp8 = recipe;
    return layer_activation_elements(c.model, layer, fp8) - layer_activation_elements(c.model, layer, bf16);
  };
  EXPECT_DOUBLE_EQ(change(0, Fp8Recipe::kTensorwise, false, Recompute::kNone), -200 * 0.5);
  EXPECT_DOUBLE_EQ(change(0, Fp8Recipe::kRowwise, false, Recompute::kNone), -200 * 0.5);
  EXPECT_DOUBLE_EQ(change(0, Fp8Recipe::kBlockwise, false, Recompute::kNone), -200 * (1 - (1 + 4.0 / 128) / 2));
  EXPECT_DOUBLE_EQ(change(1, Fp8Recipe::kTensorwise, false, Recompute::kNone), -216 * 0.5 + 32 * 0.5);
  EXPECT_DOUBLE_EQ(change(0, Fp8Recipe::kTensorwise, true, Recompute::kNone), -168 * 0.5 + 32 * 0.5);
  EXPECT_DOUBLE_EQ(change(1, Fp8Recipe::kTensorwise, false, Recompute::kSelective), 0);  // not counted apart
}

// The FP8 copies of the decoder layers' weights a rank keeps between steps, by hand for tiny-v3:
// MLA 4,608 a layer (its 3 layers' and the MTP module's), the dense SwiGLU 6,144, and in each of
// the 3 MoE layers the shared expert's 1,536 and 8 routed experts' 12,288: 66,048 elements, a
// byte each; not the embedding, head, routers or eh_proj. Every weight here is one 128×128 block:
// 104 weights, a 4-byte scale each. Rowwise quantizes each weight twice (a scale a row for the
// forward product, a column for the input gradient): 2 × 66,048 bytes and 4 × (rows + columns)
// summed over the weights, 5,472. With ep 2 a rank holds half of the routed experts.
TEST(MemoryPlan, Fp8WeightCopiesAreAByteForEachDecoderLayerWeight) {
  auto copies = [](int ranks, int ep, const std::string& recipe) {
    return plan_memory(tiny_v3(ranks, ep, 0, {"--train.fp8", recipe}), {});
  };
  EXPECT_DOUBLE_EQ(copies(1, 1, "none").fp8_weight_copies, 0);
  const MemoryPlan blockwise = copies(1, 1, "blockwise");
  EXPECT_DOUBLE_EQ(blockwise.fp8_weight_copies, 66048 + 104 * 4);
  EXPECT_DOUBLE_EQ(blockwise.state(), blockwise.parameters + blockwise.gradients + blockwise.optimizer_state +
                                          blockwise.fp8_weight_copies);
  EXPECT_DOUBLE_EQ(copies(1, 1, "tensorwise").fp8_weight_copies, 66048 + 104 * 4);
  EXPECT_DOUBLE_EQ(copies(1, 1, "rowwise").fp8_weight_copies, 2 * 66048 + 4 * 5472);
  const double routed = 3 * 8 * (3 * 32 * 16 + 3 * 4);  // elements and a scale each, of 24 experts' weights
  EXPECT_DOUBLE_EQ(copies(2, 2, "blockwise").fp8_weight_copies, 66048 + 104 * 4 - routed / 2);
}
