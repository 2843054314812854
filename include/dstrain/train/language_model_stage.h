// A rank's chunks of a DeepSeek language model as the pipeline executor sees them
// (pipeline/stage.h): the next-token loss, multi-token prediction's loss and its weight, and the
// MoE layers' balance loss, whose gradient factor each training pass hands to them.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "dstrain/model/transformer.h"
#include "dstrain/pipeline/stage.h"

namespace dstrain {

class LanguageModelStage : public PipelineStage {
 public:
  // `chunks`: this rank's model chunks, in the order of their virtual stages; `virtual_stages`:
  // of the whole pipeline (pp × chunks per stage).
  LanguageModelStage(std::vector<CausalLM> chunks, int virtual_stages);

  int chunks() const override { return static_cast<int>(chunks_.size()); }
  int64_t activation_width() const override { return activation_width_; }
  // "loss" (next token), then "mtp_loss" when the model has multi-token prediction modules.
  std::vector<std::string> loss_names() const override;
  void begin_pass(bool training, const torch::Tensor& loss_gradient_factor) override;
  torch::Tensor forward(int chunk, const torch::Tensor& input) override;
  // objective = next token + mtp_loss_weight × multi-token prediction (training only).
  MicroBatchLosses losses(int chunk, const torch::Tensor& input, const torch::Tensor& tokens) override;

  const std::vector<CausalLM>& models() const { return chunks_; }
  // The chunks' MoE layers by global layer index (empty for a dense model).
  const std::vector<std::pair<int64_t, MoE>>& moe_layers() const { return moe_layers_; }

 private:
  std::vector<CausalLM> chunks_;
  std::vector<std::pair<int64_t, MoE>> moe_layers_;
  int64_t activation_width_;  // hidden size, or twice it when the stages carry embeddings
  bool training_ = false;
};

}  // namespace dstrain
