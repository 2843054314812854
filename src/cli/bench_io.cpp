// bench io: how fast a corpus is read, in the loader's pattern (random samples of seq_len + 1
// tokens, hyperslab reads) and front to back; and how fast a checkpoint is written, the way
// training writes it (every rank its share, in the background), with how long training is blocked.
#include <chrono>
#include <cstdio>
#include <random>

#include "bench.h"
#include "dstrain/ckpt/checkpoint_writer.h"
#include "dstrain/ckpt/ckpt_config.h"
#include "dstrain/core/error.h"
#include "dstrain/core/files.h"
#include "dstrain/core/log.h"
#include "dstrain/data/corpus.h"
#include "dstrain/data/loader.h"
#include "dstrain/parallel/agreed_phase.h"
#include "dstrain/parallel/parallel_context.h"
#include "dstrain/train/job.h"

namespace dstrain::bench {

namespace {

// Writes bench.ckpt_mb of tensors as one checkpoint in a directory of its own under ckpt.dir
// (RUN_DIR/checkpoints unless set, as in training), then removes it; a row of `rows`.
double checkpoint_write(const Options& o, nlohmann::json& rows) {
  using Clock = std::chrono::steady_clock;
  // Every rank in one data-parallel group on the CPU: checkpoints are written from host memory.
  Job job = start_job([](int world_size, int) {
    TrainConfig c;
    c.loop.threads = torch::get_num_threads();  // LibTorch's own choice: these benchmarks compute nothing
    c.loop.device = DeviceRequest::kCpu;
    c.comm.backend = Backend::kMpi;
    c.parallel.dp = world_size;
    return c;
  });
  ParallelContext& parallel = *job.parallel;
  const std::string run_dir = o.get_string("run.dir");
  const CkptConfig ckpt = read_ckpt_config(o, run_dir);
  if (ckpt.dir_in_run_dir && run_dir.empty())
    throw config_error("run.dir", "", "give a directory (or ckpt.dir) to write in");
  const std::string dir = ckpt.dir + "/bench-io";
  // Removed afterwards, so it must be the benchmark's own: rank 0 looks before anyone creates it.
  const std::string seen_by_rank_0 = parallel.world_rank() == 0 && files::exists(dir) ? "exists" : "";
  const std::string key = ckpt.dir_in_run_dir ? "run.dir" : "ckpt.dir";
  if (!parallel.world().broadcast_string(seen_by_rank_0, 0).empty())
    throw config_error(key, ckpt.dir_in_run_dir ? run_dir : ckpt.dir,
                       dir + " exists already; remove it, or choose another directory");
  // Made by rank 0 before the writer, so that it knows which of the parents it made too: the
  // benchmark leaves none of them behind.
  std::vector<std::string> made;
  agreed_phase(parallel.world_rank(), [&] {
    std::string why;
    if (parallel.world_rank() == 0 && !files::make_directories(dir, &why, &made))
      throw config_error(key, ckpt.dir_in_run_dir ? run_dir : ckpt.dir, "cannot create " + dir + " (" + why + ")");
  });
  // fp32 tensors of 16 MiB, as many as make bench.ckpt_mb: the ranks share them, as the
  // data-parallel ranks of a stage share its parameters and optimizer state.
  const int64_t tensors = std::max<int64_t>(1, o.get_int("bench.ckpt_mb", 1) / 16);
  NamedTensors datasets;
  for (int64_t i = 0; i < tensors; ++i)
    datasets.emplace_back("model/tensor." + std::to_string(i), torch::randn({4 << 20}));
  const double bytes = static_cast<double>(tensors) * (16 << 20);
  CheckpointWriter writer(dir, RetentionPolicy{1, 0}, parallel.world(), parallel.group(Group::kDpCp));
  const torch::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
  const Clock::time_point start = Clock::now();
  const double blocked = writer.begin(1, datasets, {}, CheckpointState{}, rng);
  writer.finish();  // written, checksummed, synced, renamed
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  char line[200];
  std::snprintf(line, sizeof line, "  %-30s %10.1f MB/s %12s training blocked %.2f s of %.2f s",
                "checkpoint write", bytes / seconds / 1e6, "", blocked, seconds);
  log::info(line);
  rows.push_back({{"write", "checkpoint"}, {"bytes", bytes}, {"seconds", seconds}, {"blocked_seconds", blocked},
                  {"mbps", bytes / seconds / 1e6}, {"ranks", job.world_size}});
  if (parallel.world_rank() == 0) {
    files::remove_tree(dir);
    files::remove_empty_directories(made);
  }
  return bytes;
}

}  // namespace

nlohmann::json io(const Options& o) {
  using Clock = std::chrono::steady_clock;
  const std::string path = o.get_string("data.train");
  if (path.empty()) throw config_error("data.train", "", "give the corpus to read");
  const CorpusReader corpus(path);
  const uint64_t seq = static_cast<uint64_t>(o.get_int("train.seq_len", 1));
  const uint64_t n_samples = samples_in_corpus(corpus.info().n_tokens, seq);
  if (n_samples == 0) throw data_error(path + ": fewer tokens than one sample of train.seq_len + 1");
  const uint64_t token_bytes = corpus.info().vocab_size <= 65536 ? 2 : 4;
  const int64_t reads = o.get_int("bench.samples", 1);
  nlohmann::json rows = nlohmann::json::array();
  auto report = [&](const char* what, double bytes, double seconds, double items) {
    char line[160];
    std::snprintf(line, sizeof line, "  %-30s %10.1f MB/s %12.0f reads/s", what, bytes / seconds / 1e6, items / seconds);
    log::info(line);
    rows.push_back({{"read", what}, {"bytes", bytes}, {"seconds", seconds}, {"mbps", bytes / seconds / 1e6}});
  };
  log::info("bench io: ", path, ", ", corpus.info().n_tokens, " tokens of ", token_bytes, " bytes");

  std::vector<uint32_t> buffer(seq + 1);
  std::mt19937_64 random(1);
  std::uniform_int_distribution<uint64_t> sample(0, n_samples - 1);
  Clock::time_point start = Clock::now();
  for (int64_t i = 0; i < reads; ++i) corpus.read(sample(random) * seq, seq + 1, buffer.data());
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  report("random samples", static_cast<double>(reads * (seq + 1) * token_bytes), seconds, static_cast<double>(reads));

  const uint64_t chunk = uint64_t{1} << 20;  // tokens per sequential read
  buffer.resize(chunk);
  start = Clock::now();
  uint64_t chunks = 0;
  for (uint64_t offset = 0; offset < corpus.info().n_tokens; offset += chunk, ++chunks)
    corpus.read(offset, std::min(chunk, corpus.info().n_tokens - offset), buffer.data());
  seconds = std::chrono::duration<double>(Clock::now() - start).count();
  report("sequential, 1M-token reads", static_cast<double>(corpus.info().n_tokens * token_bytes), seconds,
         static_cast<double>(chunks));

  const double written = checkpoint_write(o, rows);
  return {{"bench", "io"}, {"corpus", path}, {"checkpoint_bytes", written}, {"results", rows}};
}


}  // namespace dstrain::bench
