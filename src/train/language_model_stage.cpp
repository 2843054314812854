#include "dstrain/train/language_model_stage.h"

namespace dstrain {

LanguageModelStage::LanguageModelStage(std::vector<CausalLM> chunks, int virtual_stages)
    : chunks_(std::move(chunks)),
      activation_width_(CausalLMImpl::stage_activation_width(chunks_.front()->config(), virtual_stages)) {
  for (const CausalLM& chunk : chunks_)
    for (const auto& layer : chunk->moe_layers()) moe_layers_.push_back(layer);
}

std::vector<std::string> LanguageModelStage::loss_names() const {
  if (chunks_.front()->config().num_nextn_predict_layers > 0) return {"loss", "mtp_loss"};
  return {"loss"};
}

void LanguageModelStage::begin_pass(bool training, const torch::Tensor& loss_gradient_factor) {
  // Training or evaluation mode: MoE layers count expert loads and add their balance loss in
  // training only.
  training_ = training;
  for (CausalLM& chunk : chunks_) chunk->train(training);
  if (training)
    for (auto& [index, moe] : moe_layers_) moe->set_auxiliary_loss_gradient_factor(loss_gradient_factor);
}

torch::Tensor LanguageModelStage::forward(int chunk, const torch::Tensor& input) {
  return chunks_.at(static_cast<size_t>(chunk))->forward(input);
}

MicroBatchLosses LanguageModelStage::losses(int chunk, const torch::Tensor& input, const torch::Tensor& tokens) {
  // Multi-token prediction trains; evaluation measures the next token only.
  const LanguageModelLosses losses = chunks_.at(static_cast<size_t>(chunk))->losses(input, tokens, training_);
  MicroBatchLosses result;
  result.objective = losses.total(chunks_.front()->config().mtp_loss_weight);
  result.reported = {losses.next_token};
  if (chunks_.front()->config().num_nextn_predict_layers > 0) result.reported.push_back(losses.mtp);
  return result;
}

}  // namespace dstrain
