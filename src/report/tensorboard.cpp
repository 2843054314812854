#include "dstrain/report/tensorboard.h"

#include <map>
#include <utility>
#include <vector>

namespace dstrain {

std::string tensorboard_tag(const std::string& key) {
  static const std::map<std::string, std::string> tags = {
      {"loss", "train/loss"},
      {"mtp_loss", "train/mtp_loss"},
      {"lr", "train/lr"},
      {"grad_norm", "train/grad_norm"},
      {"loss_scale", "train/loss_scale"},
      {"skipped_steps", "train/skipped_steps"},
      {"consumed_samples", "train/consumed_samples"},
      {"tokens", "train/tokens"},
      {"eval_loss", "eval/loss"},
      {"eval_ppl", "eval/perplexity"},
      {"tokens_per_s", "perf/tokens_per_s"},
      {"step_time_s", "perf/step_time_s"},
      {"mfu", "perf/mfu"},
      {"pipeline_idle", "perf/pipeline_idle"},
      {"memory_gib", "perf/memory_gib"},
      {"expert_load_max_over_mean", "moe/expert_load_max_over_mean"},
      {"ep_load_max_over_mean", "moe/ep_load_max_over_mean"},
      {"ep_ranks_per_token", "moe/ep_ranks_per_token"},
      {"expert_exchange_share", "perf/expert_exchange_share"},
      {"expert_exchange_bytes", "perf/expert_exchange_bytes"},
      {"expert_exchange_hidden", "perf/expert_exchange_hidden"},
      {"dp_comm_s", "perf/dp_comm_s"},
      {"dp_comm_exposed_s", "perf/dp_comm_exposed_s"},
      {"dp_comm_bytes", "perf/dp_comm_bytes"},
      {"balance_loss", "moe/balance_loss"},
  };
  if (key == "step") return "";
  auto it = tags.find(key);
  // A metric added later is still shown, under its own name, until it is given a section.
  return it != tags.end() ? it->second : key;
}

TensorBoardLog::TensorBoardLog(const std::string& run_dir, int64_t resumed_step)
    : writer_(std::make_shared<EventFileWriter>(run_dir)) {
  if (resumed_step > 0) writer_->write_restart(resumed_step + 1);
}

void TensorBoardLog::write(const nlohmann::json& record) {
  if (!writer_) return;
  std::vector<std::pair<std::string, float>> scalars;
  for (const auto& [key, value] : record.items()) {
    const std::string tag = tensorboard_tag(key);
    if (!tag.empty() && value.is_number()) scalars.emplace_back(tag, value.get<float>());
    // Per-layer values (MoE expert load): one scalar per layer, "<tag>/layer_<index>".
    if (!tag.empty() && value.is_object())
      for (const auto& [part, number] : value.items())
        if (number.is_number()) scalars.emplace_back(tag + "/layer_" + part, number.get<float>());
  }
  writer_->write_scalars(record.value("step", int64_t{0}), scalars);
}

}  // namespace dstrain
