// bench step: the real training loop on a corpus of random tokens, so that a figure depends on
// the model, the layout and the machine, not on a data set someone has to bring.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <random>

#include "bench.h"
#include "dstrain/core/files.h"
#include "dstrain/core/log.h"
#include "dstrain/data/corpus.h"
#include "dstrain/parallel/device.h"
#include "dstrain/parallel/mpi_check.h"
#include "dstrain/model/cuda_kernels.h"
#include "dstrain/model/flops.h"
#include "dstrain/model/fp8_matmul.h"
#include "dstrain/model/grouped_matmul.h"
#include "dstrain/model/model_config.h"
#include "dstrain/model/recompute.h"
#include "dstrain/train/step_profiler.h"
#include "dstrain/train/trainer.h"

namespace dstrain::bench {
namespace {

// Enough samples for a few global batches (the sampler wraps around epochs).
std::string write_random_corpus(const Options& o, int world_size, int world_rank) {
  const int64_t vocab = o.get_int("model.vocab_size", 2);
  const int64_t seq = o.get_int("train.seq_len", 1);
  int64_t global_batch = o.get_int("train.global_batch", 0);
  if (global_batch == 0)
    global_batch = o.get_int("train.micro_batch", 1) * std::max<int64_t>(1, o.get_int("train.grad_accum", 0)) *
                   world_size;
  const int64_t tokens = 4 * global_batch * seq + 1;
  const std::string path = files::temp_directory() + "/dstrain-bench-" + std::to_string(getpid()) + "-" +
                           std::to_string(world_rank) + ".h5";
  std::mt19937_64 random(1234);  // the same tokens on every rank
  std::uniform_int_distribution<uint32_t> token(0, static_cast<uint32_t>(vocab - 2));
  std::vector<uint32_t> document(static_cast<size_t>(tokens - 1));
  for (uint32_t& t : document) t = token(random);
  CorpusWriter writer(path, static_cast<uint64_t>(vocab), static_cast<uint64_t>(vocab - 1), "random");
  writer.add_document(document);
  writer.close();
  return path;
}

}  // namespace

nlohmann::json step(Options o) {
  int world_size = 1, world_rank = 0;
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  const int64_t warmup = o.get_int("bench.warmup", 1), timed = o.get_int("bench.steps", 1);
  std::string corpus;
  if (o.raw("data.train").empty()) {
    corpus = write_random_corpus(o, world_size, world_rank);
    o.set("data.train", corpus);
  }
  o.set("data.valid", "");
  o.set("train.steps", std::to_string(warmup + timed));
  o.set("log.interval", std::to_string(warmup));  // the first interval is the warm-up
  if (!o.raw("bench.profile").empty()) {
    const std::string prefix = o.raw("bench.profile");
    check_profile_prefix("bench.profile", prefix);  // named as the user gave it
    o.set("debug.profile", prefix);
    o.set("debug.profile_start", std::to_string(warmup + 1));
    o.set("debug.profile_steps", std::to_string(std::min<int64_t>(2, timed)));
  }
  // The learning-rate schedule changes no cost; a preset's long warm-up would not fit the steps.
  o.set("optim.warmup_steps", "0");
  o.set("optim.decay_steps", "0");
  // A benchmark leaves no run behind: its figures are what it prints (and --bench.json).
  const std::string run_dir = files::temp_directory() + "/dstrain-bench-run-" + std::to_string(getpid());
  o.set("run.dir", run_dir);
  auto clean_up = [&] {
    if (!corpus.empty()) files::remove_tree(corpus);
    if (world_rank == 0) files::remove_tree(run_dir);
  };
  TrainResult result;
  try {
    result = run_training(o);
  } catch (...) {
    clean_up();
    throw;
  }
  clean_up();

  const ModelConfig model = read_model_config(o);
  const int64_t seq = o.get_int("train.seq_len", 1);
  const bool on_gpu = computes_on_gpu(o.get_enum("train.device", device_request_names()));
  nlohmann::json out = {{"bench", "step"},
                        {"ranks", world_size},
                        {"precision", o.raw("train.precision")},
                        // dstrain's own kernels: built, on, used
                        {"cuda_kernels", cuda_kernels_built() && o.get_bool("train.cuda_kernels") && on_gpu},
                        {"grouped_experts", grouped_matmul_built() && o.get_bool("train.grouped_experts") && on_gpu &&
                                                model.n_routed_experts > 0},
                        // train.fp8, and whether its products go to LibTorch's FP8 kernel (fp8_matmul.h)
                        {"fp8", o.raw("train.fp8")},
                        {"fp8_kernel", fp8_matmul_built() && o.raw("train.fp8") != "none" && on_gpu},
                        {"params", count_parameters(model).total},
                        {"seq_len", seq},
                        {"flops_per_token", training_flops_per_token(model, seq)},
                        {"tokens_per_s", result.tokens_per_s},
                        {"mfu", result.mfu},
                        {"peak_memory_bytes", result.peak_memory_bytes},
                        {"peak_activation_bytes", result.peak_activation_bytes},
                        {"step_kept_bytes", result.step_kept_bytes},
                        {"recompute", o.raw("train.recompute")},
                        // Warm-up included; on a GPU only the time to queue the reruns (recompute.h).
                        {"rerun_s_per_step", result.rerun_seconds / static_cast<double>(warmup + timed)},
                        {"final_loss", result.final_loss},
                        // context parallelism: what a rank passed around the ring a step, both ways
                        {"cp_ring_bytes_per_step", static_cast<double>(result.ring_bytes) /
                                                       static_cast<double>(warmup + timed)}};
  char figures[128];
  std::snprintf(figures, sizeof figures, "bench step: %.0f tok/s over %lld timed steps", result.tokens_per_s,
                static_cast<long long>(timed));
  std::string line = figures;
  if (result.mfu > 0) {
    std::snprintf(figures, sizeof figures, ", MFU %.1f%%", 100 * result.mfu);
    line += figures;
  }
  if (result.peak_memory_bytes > 0)
    line += ", peak memory " + format_bytes(static_cast<double>(result.peak_memory_bytes));
  line += ", activations " + format_bytes(static_cast<double>(result.peak_activation_bytes)) + " (recompute " +
          o.raw("train.recompute") + ")";
  if (result.ring_bytes > 0)
    line += ", cp ring " + format_bytes(static_cast<double>(result.ring_bytes) / static_cast<double>(warmup + timed)) +
            " a step";
  log::info(line);
  return out;
}

}  // namespace dstrain::bench
