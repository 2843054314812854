#include "dstrain/data/batch_rampup.h"

#include <algorithm>
#include <sstream>
#include <vector>

#include "dstrain/core/error.h"

namespace dstrain {

BatchRampup parse_batch_rampup(const std::string& text, int64_t global_batch) {
  if (text.empty()) return {};
  std::vector<int64_t> numbers;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    int64_t value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || value <= 0)
      throw config_error("train.batch_rampup", text, "expected START,INCREMENT,SAMPLES: three positive integers");
    numbers.push_back(value);
  }
  if (numbers.size() != 3)
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

int64_t global_batch_after(int64_t consumed, const BatchRampup& rampup, int64_t global_batch) {
  if (!rampup.on()) return global_batch;
  // As Megatron-LM: SAMPLES split evenly among the increments, each stretch a batch size.
  const int64_t increments = (global_batch - rampup.start) / rampup.increment;
  const double per_increment = static_cast<double>(rampup.samples) / static_cast<double>(increments);
  const auto stretches = static_cast<int64_t>(static_cast<double>(consumed) / per_increment);
  return std::min(global_batch, rampup.start + stretches * rampup.increment);
}

}  // namespace dstrain
