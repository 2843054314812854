// Where the step report's records go (the console, metrics.jsonl, TensorBoard): one JSON object
// per log interval or evaluation, written as it comes.
#pragma once

#include <nlohmann/json.hpp>

namespace dstrain {

class ReportSink {
 public:
  virtual ~ReportSink() = default;
  virtual void write(const nlohmann::json& record) = 0;
};

}  // namespace dstrain
