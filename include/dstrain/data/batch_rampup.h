// Batch-size ramp-up (train.batch_rampup = START,INCREMENT,SAMPLES, Megatron-LM's
// --rampup-batch-size): the global batch starts at START sequences and grows by INCREMENT, in
// equal stretches of the first SAMPLES sequences, until it is train.global_batch. A step's batch
// follows from the samples consumed before it, so the data position stays the number of samples
// consumed, and a ramped run resumes where it was, on any layout. DeepSeek-V3 raised its batch from
// 3,072 to 15,360 sequences over its first 469B tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dstrain {

struct BatchRampup {
  int64_t start = 0, increment = 0, samples = 0;  // start 0: no ramp-up
  bool on() const { return start > 0; }
};

// "START,INCREMENT,SAMPLES", or "" for none. Throws Error(kUsage) naming train.batch_rampup when
// it is not three positive integers, or START is not below `global_batch` with INCREMENT
// dividing the difference.
BatchRampup parse_batch_rampup(const std::string& text, int64_t global_batch);

// The global batches of the ramp before the full one, in order (none without a ramp-up).
std::vector<int64_t> ramp_batches(const BatchRampup& rampup, int64_t global_batch);

// The global batch of a step that starts after `consumed` samples.
int64_t global_batch_after(int64_t consumed, const BatchRampup& rampup, int64_t global_batch);

}  // namespace dstrain
