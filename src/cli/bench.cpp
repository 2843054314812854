#include "bench.h"

#include "dstrain/train/train_config.h"

namespace dstrain::bench {

OptionTable option_table() {
  OptionTable t = train_option_table();
  t.add("bench.warmup", OptionKind::kInt, "5", "step: steps before timing starts (the first log interval)");
  t.add("bench.steps", OptionKind::kInt, "10", "step: timed steps");
  t.add("bench.min_bytes", OptionKind::kInt, "1024", "comm: smallest message");
  t.add("bench.max_bytes", OptionKind::kInt, "0", "comm: largest message (0: 1 GiB on GPUs, 64 MiB on the CPU)");
  t.add("bench.iters", OptionKind::kInt, "20", "comm, memory: timed repetitions of each measurement");
  t.add("bench.bytes", OptionKind::kInt, "0", "memory: bytes per copy (0: 1 GiB on GPUs, 256 MiB on the CPU)");
  t.add("bench.samples", OptionKind::kInt, "2000", "io: random samples of seq_len + 1 tokens to read");
  t.add("bench.ckpt_mb", OptionKind::kInt, "256", "io: megabytes of the checkpoint to write (under ckpt.dir)");
  t.add("bench.json", OptionKind::kString, "", "also write the results as JSON to this file (rank 0)");
  t.add("bench.profile", OptionKind::kString, "",
        "step: profile the first two timed steps (debug.profile): PREFIX.md, the time by model part and by kernel; "
        "PREFIX.trace.json, a Chrome trace (the timed figures then include the profiler's cost)");
  return t;
}

}  // namespace dstrain::bench
