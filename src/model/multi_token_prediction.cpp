#include "dstrain/model/multi_token_prediction.h"

namespace dstrain {

MultiTokenPredictionImpl::MultiTokenPredictionImpl(const ModelConfig& c, int64_t layer, const ComputeOptions& options)
    : DecoderLayerImpl(c, layer, options, /*unrouted_tail=*/layer - c.num_layers + 1) {
  enorm_ = register_module("enorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  hnorm_ = register_module("hnorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  eh_proj_ = register_module("eh_proj", Projection(2 * c.hidden_size, c.hidden_size, options.deferral));
  auto shared_head = register_module("shared_head", std::make_shared<torch::nn::Module>());
  head_norm_ = shared_head->register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps));
}

torch::Tensor MultiTokenPredictionImpl::join(const torch::Tensor& previous, const torch::Tensor& embedded) {
  return eh_proj_(torch::cat({enorm_(embedded), hnorm_(previous)}, -1));
}

}  // namespace dstrain
