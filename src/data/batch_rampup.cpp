#include "dstrain/data/batch_rampup.h"

#include <algorithm>
#include <vector>

#include "dstrain/core/config.h"
#include "dstrain/core/error.h"

namespace dstrain {

BatchRampup parse_batch_rampup(const std::string& text, int64_t global_batch) {
  if (text.empty()) return {};
  std::vector<int64_t> numbers;
  if (!parse_integer_list(text, &numbers) || numbers.size() != 3 ||
      std::any_of(numbers.begin(), numbers.end(), [](int64_t n) { return n <= 0; }))
    throw config_error("train.batch_rampup", text, "expected START,INCREMENT,SAMPLES: three positive integers");
  const BatchRampup rampup{numbers[0], numbers[1], numbers[2]};
  if (rampup.start >= global_batch)
    throw config_error("train.batch_rampup", text,
                       "START must be below train.global_batch (" + std::to_string(global_batch) + ")");
  if ((global_batch - rampup.start) % rampup.increment != 0)
    throw config_error("train.batch_rampup", text,
                       "INCREMENT must divide train.global_batch − START (" + std::to_string(global_batch) +
                           " − " + std::to_string(rampup.start) + ")");
  return rampup;
}

std::vector<int64_t> ramp_batches(const BatchRampup& rampup, int64_t global_batch) {
  std::vector<int64_t> sizes;
  for (int64_t size = rampup.start; rampup.on() && size < global_batch; size += rampup.increment) sizes.push_back(size);
  return sizes;
}

int64_t global_batch_after(int64_t consumed, const BatchRampup& rampup, int64_t global_batch) {
  if (!rampup.on()) return global_batch;
  // As Megatron-LM: SAMPLES split evenly among the increments, each stretch a batch size.
  const int64_t increments = (global_batch - rampup.start) / rampup.increment;
  const double per_increment = static_cast<double>(rampup.samples) / static_cast<double>(increments);
  const auto stretches = static_cast<int64_t>(static_cast<double>(consumed) / per_increment);
  return std::min(global_batch, rampup.start + stretches * rampup.increment);
}

}  // namespace dstrain
