#include "dstrain/parallel/parallel_config.h"

#include "dstrain/core/error.h"
#include "dstrain/model/model_config.h"
#include "dstrain/parallel/parallel_grid.h"

namespace dstrain {

void add_parallel_options(OptionTable& t) {
  t.add("parallel.tp", OptionKind::kInt, "1",
        "tensor-parallel ranks: each layer's heads, FFN width and vocabulary split over them (Megatron-LM's "
        "column- and row-parallel products); must divide model.num_heads, num_kv_heads, intermediate_size, the "
        "shared experts' width and vocab_size");
  t.add("parallel.sequence_parallel", OptionKind::kBool, "true",
        "with parallel.tp > 1: norms and residuals hold 1/tp of the sequence, the split layers' all-reduces "
        "becoming an all-gather and a reduce-scatter (train.seq_len must then split over tp)");
  t.add("parallel.cp", OptionKind::kInt, "1",
        "context-parallel ranks: each sequence is cut into 2 × cp chunks, rank i holding chunks i and 2 cp - 1 - i, "
        "and attention runs over the ring of the cp group (train.seq_len must split into 2 × cp chunks)");
  t.add("parallel.cp_mla", OptionKind::kString, "latent",
        "with parallel.cp > 1, what MLA passes around the ring: latent (each token's compressed latent and rope "
        "key, expanded by every rank's kv_b_proj) or heads (the per-head keys and values)");
  t.add("parallel.dp", OptionKind::kInt, "0", "data-parallel ranks (0: number of ranks / (tp × cp × pp))");
  t.add("parallel.pp", OptionKind::kInt, "1", "pipeline-parallel stages");
  t.add("parallel.ep", OptionKind::kInt, "1",
        "expert-parallel ranks: each MoE layer's routed experts are split over this many of a stage's tp × cp × dp "
        "ranks, which hold tp × cp × dp / ep copies of them (must divide that and model.n_routed_experts)");
  t.add("parallel.order", OptionKind::kString, "tp-cp-ep-dp-pp",
        "the grids' dimensions, innermost (consecutive ranks) first, each name once: the dense grid takes tp, cp, dp, "
        "pp in this sequence, the expert grid ep, dp (its expert-data dimension) and pp. pp first or last gives "
        "every rank one stage in both. A name left out stands just inside the first of those after it in "
        "tp-cp-ep-dp (dp-pp, pp-dp)");
}

void add_comm_options(OptionTable& t) {
  t.add("comm.backend", OptionKind::kString, "auto",
        "collectives between ranks: nccl (GPUs), mpi (CPU, or GPUs through host memory), "
        "auto (nccl on GPUs when built with NCCL, else mpi)");
  t.add("comm.grad_dtype", OptionKind::kString, "fp32",
        "dtype gradients are reduced in: fp32; bf16/fp16 to halve the traffic; int8 or fp8 (E4M3) in blocks of 256 "
        "with an fp32 scale each, about a quarter, exchanged after the backward pass");
  t.add("comm.error_feedback", OptionKind::kBool, "false",
        "comm.grad_dtype = int8 or fp8: each rank adds what quantizing its gradient lost to its next step's "
        "gradient (checkpointed)");
  t.add("comm.bucket_mb", OptionKind::kFloat, "25",
        "gradients are averaged over the data-parallel group in buckets of this many MB (of fp32)");
  t.add("comm.overlap", OptionKind::kBool, "true",
        "start each bucket's average as soon as its gradients are complete, during the backward pass");
  t.add("comm.progress_thread", OptionKind::kBool, "true",
        "MPI backend: a thread keeps started buckets and sends moving while the rank computes (needs "
        "MPI_THREAD_MULTIPLE; without it, or off, they move when the rank polls them)");
  t.add("comm.timeout_s", OptionKind::kFloat, "600",
        "a collective, transfer or start-up phase (MPI_Init, the communicators' set-up) that has not finished "
        "after this many seconds ends the job (exit code 5)");
}

ParallelConfig read_parallel_config(Options& o, int world_size) {
  ParallelConfig c;
  c.cp = static_cast<int>(o.get_int("parallel.cp", 1, INT32_MAX));
  static const EnumNames<bool> ring_passes = {{"latent", true}, {"heads", false}};  // cp_latent
  c.cp_latent = o.get_enum("parallel.cp_mla", ring_passes);
  c.tp = static_cast<int>(o.get_int("parallel.tp", 1, INT32_MAX));
  c.sequence_parallel = c.tp > 1 && o.get_bool("parallel.sequence_parallel");
  c.pp = static_cast<int>(o.get_int("parallel.pp", 1, INT32_MAX));
  int64_t dp = o.get_int("parallel.dp", 0, INT32_MAX);
  if (dp == 0) {
    const int64_t model_parallel = int64_t{c.tp} * c.cp * c.pp;
    if (world_size % model_parallel != 0)
      throw config_error("parallel.pp", o.raw("parallel.pp"),
                         "tp × cp × pp = " + std::to_string(model_parallel) + " must divide the number of ranks (" +
                             std::to_string(world_size) + ")");
    dp = world_size / model_parallel;
    o.set("parallel.dp", std::to_string(dp));
  }
  c.dp = static_cast<int>(dp);
  c.ep = static_cast<int>(o.get_int("parallel.ep", 1, INT32_MAX));
  c.order = o.get_string("parallel.order");
  const ParallelGrid grid(c);  // checks the sizes against the world, ep against the ranks, and the order
  if (grid.world() != world_size) {
    const std::string product = "tp × cp × dp × pp = " + std::to_string(c.tp) + " × " + std::to_string(c.cp) + " × " +
                                std::to_string(c.dp) + " × " + std::to_string(c.pp);
    throw config_error("parallel.dp", std::to_string(c.dp),
                       product + " = " + std::to_string(grid.world()) + " must equal the number of ranks (" +
                           std::to_string(world_size) + ")");
  }
  c.order = grid.order();
  o.set("parallel.order", c.order);
  return c;
}

void check_expert_parallelism(const ParallelConfig& c, int64_t routed_experts) {
  if (c.ep == 1) return;
  if (routed_experts == 0)
    throw config_error("parallel.ep", std::to_string(c.ep), "the model has no routed experts (a dense model); use 1");
  if (routed_experts % c.ep != 0)
    throw config_error("parallel.ep", std::to_string(c.ep),
                       "must divide model.n_routed_experts = " + std::to_string(routed_experts) +
                           ", so that every expert-parallel rank holds as many experts");
}

void check_context_parallelism(const ParallelConfig& c, const ModelConfig& model, int64_t seq_len) {
  if (c.cp == 1) return;
  if (seq_len % (2 * c.cp) != 0)
    throw config_error("parallel.cp", std::to_string(c.cp),
                       "train.seq_len = " + std::to_string(seq_len) + " must split into 2 × cp = " +
                           std::to_string(2 * c.cp) + " chunks of equal length");
  // Multi-token prediction reads the embeddings `depth` positions on from the next chunk alone.
  if (seq_len / (2 * c.cp) < model.num_nextn_predict_layers)
    throw config_error("parallel.cp", std::to_string(c.cp),
                       "its chunks of train.seq_len / (2 × cp) = " + std::to_string(seq_len / (2 * c.cp)) +
                           " positions must be at least model.num_nextn_predict_layers = " +
                           std::to_string(model.num_nextn_predict_layers) + " long");
}

void check_tensor_parallelism(const ParallelConfig& c, const ModelConfig& model, int64_t seq_len) {
  if (c.tp == 1) return;
  auto must_divide = [&](const std::string& key, int64_t value) {
    if (value % c.tp != 0)
      throw config_error("parallel.tp", std::to_string(c.tp), "must divide " + key + " = " + std::to_string(value));
  };
  must_divide("model.num_heads", model.num_heads);
  if (!model.is_mla()) must_divide("model.num_kv_heads", model.num_kv_heads);
  must_divide("model.vocab_size", model.vocab_size);
  bool dense_layers = false;
  for (int64_t layer = 0; layer < model.num_layers + model.num_nextn_predict_layers; ++layer)
    dense_layers = dense_layers || !model.is_moe_layer(layer);
  if (dense_layers) must_divide("model.intermediate_size", model.intermediate_size);
  if (model.n_routed_experts > 0 && model.n_shared_experts > 0)
    must_divide("the shared experts' width (model.moe_intermediate_size × n_shared_experts)",
                model.moe_intermediate_size * model.n_shared_experts);
  const int64_t held = seq_len / c.cp;  // the positions of a rank's chunks
  if (c.sequence_parallel && held % c.tp != 0)
    throw config_error("parallel.tp", std::to_string(c.tp),
                       "must divide train.seq_len" + std::string(c.cp > 1 ? " / parallel.cp" : "") + " = " +
                           std::to_string(held) +
                           " under sequence parallelism (or set parallel.sequence_parallel = false)");
}

const EnumNames<Backend>& backend_names() {
  static const EnumNames<Backend> names = {{"auto", Backend::kAuto}, {"mpi", Backend::kMpi}, {"nccl", Backend::kNccl}};
  return names;
}

const EnumNames<GradientWire>& gradient_wire_names() {
  static const EnumNames<GradientWire> names = {{"fp32", GradientWire::kFp32},
                                                {"bf16", GradientWire::kBf16},
                                                {"fp16", GradientWire::kFp16},
                                                {"int8", GradientWire::kInt8},
                                                {"fp8", GradientWire::kFp8}};
  return names;
}

CommConfig read_comm_config(const Options& o) {
  CommConfig c;
  c.backend = o.get_enum("comm.backend", backend_names());
  c.grad_dtype = o.get_enum("comm.grad_dtype", gradient_wire_names());
  c.error_feedback = o.get_bool("comm.error_feedback");
  if (c.error_feedback && c.grad_dtype != GradientWire::kInt8 && c.grad_dtype != GradientWire::kFp8)
    throw config_error("comm.error_feedback", o.raw("comm.error_feedback"),
                       "carries quantization error, and comm.grad_dtype = " + o.raw("comm.grad_dtype") +
                           " quantizes nothing; set comm.grad_dtype = int8 or fp8");
  c.timeout_s = o.get_float("comm.timeout_s", 1.0, 1e7);
  c.bucket_mb = o.get_float("comm.bucket_mb", 0.001, 1e6);
  c.overlap = o.get_bool("comm.overlap");
  c.progress_thread = o.get_bool("comm.progress_thread");
  return c;
}

}  // namespace dstrain
