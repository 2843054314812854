// Runs a schedule on this rank's stage: its model chunks compute, activations and gradients travel
// through the PP group's Communicator (shapes fixed by the configuration: nothing but the data
// travels), the last virtual stage computes the loss. Each activation is freed as soon as its
// backward pass is done.
#pragma once

#include "dstrain/core/torch_api.h"

#include <functional>
#include <map>
#include <tuple>
#include <vector>

#include "dstrain/core/accelerator.h"
#include "dstrain/dist/communicator.h"
#include "dstrain/model/transformer.h"
#include "dstrain/pipeline/schedule.h"

namespace dstrain {

struct ActivationShape {
  int64_t micro_batch = 0, seq_len = 0;
  torch::ScalarType dtype = torch::kFloat32;
  torch::Device device = torch::kCPU;
};

class PipelineExecutor {
 public:
  // chunks[c] is virtual stage c × pp + stage of `train` (and of `eval`, the forward-only schedule).
  PipelineExecutor(Schedule train, Schedule eval, int stage, std::vector<CausalLM> chunks, Communicator& pp_group,
                   const ActivationShape& shape);

  // The tokens of micro-batch i, int64 [micro_batch, seq_len + 1] on the device: asked for on
  // the stages that hold the first or the last virtual stage (inputs, targets).
  using BatchSource = std::function<torch::Tensor(int microbatch)>;

  // One training step: forward and backward of every micro-batch. Each micro-batch's loss
  // (next token + mtp_loss_weight × multi-token prediction) is divided by `loss_divisor`;
  // `loss_scale` (a 0-dim tensor, or undefined) multiplies it before backward. Returns the sum of
  // the divided next-token losses (0-dim, on the device; 0 on stages without the last virtual
  // stage); mtp_loss() the same sum of the multi-token prediction losses.
  torch::Tensor train_step(const BatchSource& batch, double loss_divisor, const torch::Tensor& loss_scale);
  // Forward only, without gradients: the sum of the micro-batches' mean next-token losses (0-dim, fp64).
  torch::Tensor evaluate(const BatchSource& batch);
  // The last train_step's multi-token prediction loss (see above); undefined when the model has
  // no MTP modules.
  const torch::Tensor& mtp_loss() const { return mtp_loss_; }

  bool has_loss() const;  // this stage holds the last virtual stage
  bool needs_batches() const;  // ... the first or the last

  // Seconds this stage's device waited for transfers, and the seconds the training steps took,
  // since the last call (synchronises); both 0 with a single stage, which is not timed.
  std::pair<double, double> take_wait_and_span();

 private:
  using Key = std::tuple<int, int>;  // (micro-batch, chunk)
  torch::Tensor run(const Schedule& schedule, const BatchSource& batch, double loss_divisor,
                    const torch::Tensor& loss_scale);

  Schedule train_, eval_;
  int stage_;
  std::vector<CausalLM> chunks_;
  Communicator& pp_group_;
  ActivationShape shape_;
  int64_t activation_width_;  // hidden size, or twice it when the stages carry embeddings
  torch::Tensor mtp_loss_;
  // Per (micro-batch, chunk) in flight: the input (received activation, a leaf that collects its
  // gradient) and the output (activation to send back the gradient through, or the loss).
  std::map<Key, torch::Tensor> inputs_, outputs_;
  std::map<Key, torch::Tensor> received_grads_;
  std::vector<std::pair<accel::Timestamp, accel::Timestamp>> waits_, steps_;
};

}  // namespace dstrain
