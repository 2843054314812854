// What the pipeline executor drives on a rank: the model chunks of its stage, seen only through
// forward, the losses of the last virtual stage and their names. The executor moves activations,
// starts the backward passes and sums the losses; what a chunk computes (a DeepSeek model, its
// MoE balance loss, multi-token prediction) stays behind this interface, so that a new model or
// a new auxiliary loss needs no change in pipeline/.
#pragma once

#include "dstrain/core/torch_api.h"

#include <string>
#include <vector>

namespace dstrain {

// One micro-batch's losses on the last virtual stage.
struct MicroBatchLosses {
  torch::Tensor objective;              // what its backward pass starts from
  std::vector<torch::Tensor> reported;  // 0-dim, in loss_names() order; undefined: not computed
};

class PipelineStage {
 public:
  virtual ~PipelineStage() = default;

  virtual int chunks() const = 0;
  // The last dimension of the activations virtual stages exchange, [micro_batch, seq_len, width].
  virtual int64_t activation_width() const = 0;
  // The names of the losses losses() reports, the same on every stage. The first is the one
  // evaluation measures; training reports them all.
  virtual std::vector<std::string> loss_names() const = 0;

  // Before the forward passes of a training step (`training`) or an evaluation.
  // `loss_gradient_factor` (training only): the factor, a 0-dim fp32 tensor on the device, by
  // which the backward pass multiplies each micro-batch's objective (loss scale / micro-batches);
  // losses a chunk adds inside its layers must be given the same.
  virtual void begin_pass(bool training, const torch::Tensor& loss_gradient_factor) = 0;
  // Chunk `chunk` on a micro-batch: token ids [B, S] on the first virtual stage, else the
  // previous virtual stage's activation.
  virtual torch::Tensor forward(int chunk, const torch::Tensor& input) = 0;
  // The last virtual stage: the losses of the micro-batch whose tokens [B, S + 1] are `tokens`.
  virtual MicroBatchLosses losses(int chunk, const torch::Tensor& input, const torch::Tensor& tokens) = 0;
};

}  // namespace dstrain
