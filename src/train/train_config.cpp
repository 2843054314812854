#include "dstrain/train/train_config.h"

#include "dstrain/core/error.h"
#include "dstrain/core/files.h"
#include "dstrain/data/mixture.h"
#include "dstrain/pipeline/partition.h"
#include "dstrain/pipeline/schedule.h"

namespace dstrain {
namespace {

void add_run_options(OptionTable& t) {
  t.add("run.dir", OptionKind::kString, "runs/default",
        "run directory (created if missing): config.ini, metrics.jsonl, summary.json");
  t.add("run.seed", OptionKind::kInt, "1234", "seed of initialisation and data order");
}

void add_loop_options(OptionTable& t) {
  t.add("train.steps", OptionKind::kInt, "100", "optimizer steps to run");
  t.add("train.micro_batch", OptionKind::kInt, "4", "sequences per micro-batch on each rank");
  t.add("train.grad_accum", OptionKind::kInt, "0",
        "micro-batches per step on each rank (0: from global_batch, or 1)");
  t.add("train.global_batch", OptionKind::kInt, "0",
        "sequences per step over all ranks (0: micro_batch × grad_accum × dp)");
  t.add("train.batch_rampup", OptionKind::kString, "",
        "START,INCREMENT,SAMPLES: the global batch starts at START sequences and grows by INCREMENT, in equal "
        "stretches of the first SAMPLES sequences, to train.global_batch (Megatron-LM's --rampup-batch-size; "
        "empty: none)");
  t.add("train.seq_len", OptionKind::kInt, "128", "tokens per training sequence");
  t.add("train.eval_interval", OptionKind::kInt, "100",
        "evaluate on data.valid every N steps and at the end (0: only at the end)");
  t.add("train.eval_batches", OptionKind::kInt, "8", "global batches per evaluation");
  t.add("train.threads", OptionKind::kInt, "1", "torch CPU threads per rank");
  t.add("train.device", OptionKind::kString, "auto",
        "cpu, cuda (the GPU of the rank's place on its node), or auto (cuda when there is a GPU)");
  t.add("train.precision", OptionKind::kString, "fp32",
        "parameters and activations: fp32, bf16 or fp16 (fp32 master weights and optimizer state; "
        "fp16 with dynamic loss scaling)");
  t.add("train.fp8", OptionKind::kString, "none",
        "the decoder layers' linear maps in FP8 (E4M3, fp32 accumulation; needs train.precision = bf16): none; "
        "tensorwise; rowwise; or blockwise, DeepSeek-V3's recipe (1x128 tiles for activations and gradients, "
        "128x128 blocks for weights). Embedding, LM head, router, norms, attention core and the multi-token "
        "prediction projection stay bf16");
  t.add("train.cuda_kernels", OptionKind::kBool, "true",
        "dstrain's own fused CUDA kernels (LM loss softmax, SwiGLU, RoPE) on GPUs where built; "
        "false: LibTorch's operations");
  t.add("train.grouped_experts", OptionKind::kBool, "true",
        "the routed experts' matrix products as one grouped kernel (aten::_grouped_mm: LibTorch 2.8+, CUDA, "
        "bf16) where it applies; false: one product per expert");
  t.add("train.recompute", OptionKind::kString, "none",
        "activations rerun in the backward pass instead of kept: none; selective (DeepSeek-V3's: the RMSNorm "
        "outputs, MLA's up-projections and the SwiGLU activations of the decoder layers); or full (a decoder "
        "layer keeps only its input)");
  t.add("train.recompute_layers", OptionKind::kInt, "0",
        "train.recompute = full: the first N decoder layers of each model chunk rerun (0: all of them; a "
        "chunk's multi-token prediction layers count after its last)");
  t.add("train.peak_tflops", OptionKind::kFloat, "0",
        "peak TFLOP/s of one device for MFU (0: the data sheet's figure for the GPU, where known; no MFU otherwise)");
}

void add_data_options(OptionTable& t) {
  t.add("data.train", OptionKind::kString, "",
        "training corpus (HDF5, made by dstrain prep), or several in proportions: a.h5:0.7,b.h5:0.3");
  t.add("data.valid", OptionKind::kString, "", "validation corpus (empty: no evaluation)");
  t.add("data.prefetch", OptionKind::kInt, "4", "micro-batches read ahead by the loader thread");
}

void add_debug_options(OptionTable& t) {
  t.add("debug.fail_at_step", OptionKind::kInt, "0", "tests: make debug.fail_rank fail at the start of this step (0: never)");
  t.add("debug.fail_rank", OptionKind::kInt, "0", "tests: the world rank that fails");
  t.add("debug.fail_mode", OptionKind::kString, "kill",
        "tests: kill (SIGKILL), kill_in_save (SIGKILL while writing a checkpoint saved at that step), "
        "sigterm (as Slurm before a time limit), sigint (Ctrl-C), hang (stops answering), nan (its gradients become "
        "NaN)");
  t.add("debug.forbid_host_sync", OptionKind::kBool, "false",
        "tests (CUDA): a training step in which a LibTorch operation makes the host wait for the GPU fails the run, "
        "with the operation's backtrace (save the one wait by design: MoE's per-expert batch sizes)");
  t.add("debug.profile", OptionKind::kString, "",
        "profile steps with LibTorch's profiler: PREFIX.md gets the time by model part and by kernel (GPU time on "
        "GPUs, host self time on the CPU), PREFIX.trace.json a Chrome trace (ranks other than 0: PREFIX.rankR.*)");
  t.add("debug.profile_start", OptionKind::kInt, "3", "the first step debug.profile profiles");
  t.add("debug.profile_steps", OptionKind::kInt, "2", "how many steps debug.profile profiles");
}

void add_log_options(OptionTable& t) {
  t.add("log.interval", OptionKind::kInt, "10", "print and record metrics every N steps");
  t.add("log.all_ranks", OptionKind::kBool, "false", "every rank prints, prefixed with its rank");
  t.add("log.rank_groups", OptionKind::kBool, "false",
        "the start-up log lists the ranks of every group (tp, cp, dp, pp, dp-cp, ep, edp), not only their sizes");
}

}  // namespace

const EnumNames<torch::ScalarType>& precision_names() {
  static const EnumNames<torch::ScalarType> names = {
      {"fp32", torch::kFloat32}, {"bf16", torch::kBFloat16}, {"fp16", torch::kFloat16}};
  return names;
}

namespace {

void require_file(const Options& o, const std::string& key) {
  const std::string& path = o.raw(key);
  if (!files::is_regular_file(path))
    throw config_error(key, path, "no such file (make a corpus with `dstrain prep`)");
}

LoopConfig read_loop_config(Options& o, const ModelConfig& model, int dp) {
  LoopConfig c;
  c.steps = o.get_int("train.steps", 1);
  c.micro_batch = o.get_int("train.micro_batch", 1);
  c.grad_accum = o.get_int("train.grad_accum", 0);
  c.global_batch = o.get_int("train.global_batch", 0);
  c.seq_len = o.get_int("train.seq_len", 1);
  if (c.seq_len > model.max_seq_len)
    throw config_error("train.seq_len", std::to_string(c.seq_len),
                       "longer than model.max_seq_len = " + std::to_string(model.max_seq_len) +
                           " (the positions RoPE is set up for; raise it with the model)");
  if (model.num_nextn_predict_layers >= c.seq_len)  // depth k predicts from the first seq_len - k positions
    throw config_error("train.seq_len", std::to_string(c.seq_len),
                       "must be longer than model.num_nextn_predict_layers = " + std::to_string(model.num_nextn_predict_layers) +
                           " (each multi-token prediction module sees one position fewer)");
  c.eval_interval = o.get_int("train.eval_interval", 0);
  c.eval_batches = o.get_int("train.eval_batches", 1);
  c.threads = static_cast<int>(o.get_int("train.threads", 1, 1024));
  c.device = o.get_enum("train.device", device_request_names());
  c.precision = o.get_enum("train.precision", precision_names());
  c.peak_tflops = o.get_float("train.peak_tflops", 0.0, 1e6);
  c.fp8 = o.get_enum("train.fp8", fp8_recipe_names());
  if (c.fp8 != Fp8Recipe::kNone && c.precision != torch::kBFloat16)
    throw config_error("train.fp8", o.raw("train.fp8"),
                       "computes in FP8 around bf16 activations; train.precision is " + o.raw("train.precision") +
                           " here: set train.precision = bf16");
  c.cuda_kernels = o.get_bool("train.cuda_kernels");
  c.grouped_experts = o.get_bool("train.grouped_experts");
  c.recompute = o.get_enum("train.recompute", recompute_names());
  c.recompute_layers = o.get_int("train.recompute_layers", 0);
  if (c.recompute_layers > 0 && c.recompute != Recompute::kFull)
    throw config_error("train.recompute_layers", o.raw("train.recompute_layers"),
                       "counts the layers of train.recompute = full, which is " + o.raw("train.recompute") +
                           " here; set train.recompute = full");

  const int64_t per_micro = c.micro_batch * dp;
  const std::string product = "train.micro_batch × parallel.dp = " + std::to_string(c.micro_batch) +
                              " × " + std::to_string(dp) + " = " + std::to_string(per_micro);
  if (c.global_batch > 0) {
    if (c.global_batch % per_micro != 0)
      throw config_error("train.global_batch", o.raw("train.global_batch"),
                         "must be a multiple of " + product);
    int64_t derived = c.global_batch / per_micro;
    if (c.grad_accum > 0 && c.grad_accum != derived)
      throw config_error("train.grad_accum", o.raw("train.grad_accum"),
                         "disagrees with train.global_batch = " + o.raw("train.global_batch") +
                             " (which needs " + std::to_string(derived) + " with " + product + ")");
    c.grad_accum = derived;
  } else if (c.grad_accum == 0) {
    c.grad_accum = 1;
  }
  c.global_batch = per_micro * c.grad_accum;
  o.set("train.grad_accum", std::to_string(c.grad_accum));
  o.set("train.global_batch", std::to_string(c.global_batch));
  c.rampup = parse_batch_rampup(o.get_string("train.batch_rampup"), c.global_batch);
  // Every batch of the ramp must divide over the ranks' micro-batches: the first that does not is named.
  for (int64_t size : ramp_batches(c.rampup, c.global_batch))
    if (size % per_micro != 0)
      throw config_error("train.batch_rampup", o.raw("train.batch_rampup"),
                         "its global batch of " + std::to_string(size) + " sequences is not a multiple of " + product);
  return c;
}

}  // namespace

OptionTable train_option_table() {
  OptionTable table;
  add_run_options(table);
  add_model_options(table);
  add_parallel_options(table);
  add_pipeline_options(table);
  add_comm_options(table);
  add_loop_options(table);
  add_optim_options(table);
  add_data_options(table);
  add_ckpt_options(table);
  add_log_options(table);
  add_debug_options(table);
  return table;
}

TrainConfig read_model_and_layout(Options& o, int world_size) {
  TrainConfig c;
  c.run.dir = o.get_string("run.dir");
  if (c.run.dir.empty()) throw config_error("run.dir", "", "give a directory for this run's files");
  c.run.seed = static_cast<uint64_t>(o.get_int("run.seed", 0));
  c.model = read_model_config(o);
  c.parallel = read_parallel_config(o, world_size);
  check_expert_parallelism(c.parallel, c.model.n_routed_experts);
  c.pipeline = read_pipeline_config(o);
  c.comm = read_comm_config(o);
  c.loop = read_loop_config(o, c.model, c.parallel.dp);
  check_context_parallelism(c.parallel, c.model, c.loop.seq_len);
  check_tensor_parallelism(c.parallel, c.model, c.loop.seq_len);
  // The schedule and the split of the layers, checked now (the trainer makes them again).
  check_schedule(c.pipeline.schedule, c.parallel.pp, c.pipeline.virtual_stages, static_cast<int>(c.loop.grad_accum));
  for (int64_t size : ramp_batches(c.loop.rampup, c.loop.global_batch)) {
    try {
      check_schedule(c.pipeline.schedule, c.parallel.pp, c.pipeline.virtual_stages,
                     static_cast<int>(c.loop.grad_accum_for(size)));
    } catch (const Error& e) {
      throw config_error("train.batch_rampup", o.raw("train.batch_rampup"),
                         "its global batch of " + std::to_string(size) + " sequences does not fit the schedule (" +
                             e.what() + ")");
    }
  }
  partition_layers(c.model, c.loop.seq_len, c.parallel.pp * c.pipeline.virtual_stages, c.pipeline.stage_layers);
  c.optim = read_optim_config(o);
  return c;
}

TrainConfig read_train_config(Options& o, int world_size) {
  TrainConfig c = read_model_and_layout(o, world_size);
  // The learning-rate schedule over the run's steps: what a plan of the model and layout leaves out.
  if (c.optim.decay_steps == 0) {
    c.optim.decay_steps = c.loop.steps;
    o.set("optim.decay_steps", std::to_string(c.optim.decay_steps));
  }
  if (c.optim.warmup_steps > c.optim.decay_steps)
    throw config_error("optim.warmup_steps", o.raw("optim.warmup_steps"),
                       "must not exceed optim.decay_steps (" + std::to_string(c.optim.decay_steps) + ")");
  c.data.train = o.get_string("data.train");
  if (c.data.train.empty())
    throw config_error("data.train", "", "give the training corpus (make one with `dstrain prep`)");
  const std::vector<MixtureComponent> mixture = parse_mixture(c.data.train, "data.train");
  if (mixture.size() == 1 && mixture[0].path == c.data.train) require_file(o, "data.train");
  for (const MixtureComponent& component : mixture)
    if (!files::is_regular_file(component.path))
      throw config_error("data.train", c.data.train, component.path + ": no such file (make a corpus with `dstrain prep`)");
  c.data.valid = o.get_string("data.valid");
  if (!c.data.valid.empty() && !files::exists(c.data.valid) && parse_mixture(c.data.valid, "data.valid").size() > 1)
    throw config_error("data.valid", c.data.valid, "one corpus: evaluation takes no mixture");
  if (!c.data.valid.empty()) require_file(o, "data.valid");
  c.data.prefetch = o.get_int("data.prefetch", 1, 1024);
  c.ckpt = read_ckpt_config(o, c.run.dir);
  c.log.interval = o.get_int("log.interval", 1);
  c.log.all_ranks = o.get_bool("log.all_ranks");
  c.log.rank_groups = o.get_bool("log.rank_groups");
  c.debug.fail_at_step = o.get_int("debug.fail_at_step", 0);
  c.debug.fail_rank = static_cast<int>(o.get_int("debug.fail_rank", 0, world_size - 1));
  c.debug.fail_mode = o.get_enum("debug.fail_mode", EnumNames<FailMode>{{"kill", FailMode::kKill},
                                                                        {"kill_in_save", FailMode::kKillInSave},
                                                                        {"sigterm", FailMode::kSigterm},
                                                                        {"sigint", FailMode::kSigint},
                                                                        {"hang", FailMode::kHang},
                                                                        {"nan", FailMode::kNan}});
  c.debug.forbid_host_sync = o.get_bool("debug.forbid_host_sync");
  c.debug.profile.prefix = o.raw("debug.profile");
  c.debug.profile.first_step = o.get_int("debug.profile_start", 1);
  c.debug.profile.steps = o.get_int("debug.profile_steps", 1);
  return c;
}

}  // namespace dstrain
