// TensorBoard logging of a run: every metrics record (metrics.jsonl's objects) becomes one Event
// of scalars in an event file in the run directory, so `tensorboard --logdir runs/` shows every
// run by its directory's name. Written by rank 0 only.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

#include "dstrain/report/event_file.h"
#include "dstrain/report/report_sink.h"

namespace dstrain {

class TensorBoardLog : public ReportSink {
 public:
  TensorBoardLog() = default;  // disabled: every call is a no-op (ranks other than 0)
  // A new event file in `run_dir`; a run resumed after `resumed_step` > 0 first marks a restart
  // there, so that TensorBoard drops the steps after it that an earlier attempt logged.
  TensorBoardLog(const std::string& run_dir, int64_t resumed_step);

  // The record's numbers under their TensorBoard tags (tensorboard_tag), at the record's "step".
  void write(const nlohmann::json& record) override;

 private:
  std::shared_ptr<EventFileWriter> writer_;
};

// "loss" → "train/loss", "eval_loss" → "eval/loss", "tokens_per_s" → "perf/tokens_per_s", ...:
// grouped so TensorBoard shows them in sections; "" for keys that are not plotted ("step").
std::string tensorboard_tag(const std::string& metrics_key);

}  // namespace dstrain
