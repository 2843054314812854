// Runs a schedule on this rank's stage: its chunks (a PipelineStage) compute, activations and
// gradients travel through the PP group's Communicator (shapes fixed by the configuration: nothing
// but the data travels), the last virtual stage computes the losses. Each activation is freed as
// soon as its backward pass is done.
#pragma once

#include "dstrain/core/torch_api.h"

#include <functional>
#include <map>
#include <tuple>
#include <vector>

#include "dstrain/core/accelerator.h"
#include "dstrain/pipeline/weight_gradient_store.h"
#include "dstrain/parallel/communicator.h"
#include "dstrain/pipeline/channels.h"
#include "dstrain/pipeline/schedule.h"
#include "dstrain/pipeline/simulator.h"
#include "dstrain/pipeline/stage.h"

namespace dstrain {

struct ActivationShape {
  int64_t micro_batch = 0, seq_len = 0;
  torch::ScalarType dtype = torch::kFloat32;
  torch::Device device = torch::kCPU;
  // The positions an activation between stages holds: its tp-th part of the sequence under
  // sequence parallelism; 0: seq_len.
  int64_t activation_positions = 0;
};

class PipelineExecutor {
 public:
  // Chunk c of `model` is virtual stage c × pp + stage of `train` (and of `eval`, the
  // forward-only schedule). `weight_gradients`: where the model's products leave their weight
  // gradients (ComputeOptions::deferral) for the W actions of a zero-bubble schedule. Both outlive
  // the executor. Collective over `pp_group` when `train` sends without waiting (its channels).
  PipelineExecutor(Schedule train, Schedule eval, int stage, PipelineStage& model,
                   WeightGradientStore& weight_gradients, Communicator& pp_group, const ActivationShape& shape);

  // The tokens of micro-batch i, int64 [micro_batch, seq_len + 1] on the device: asked for on
  // the stages that hold the first or the last virtual stage (inputs, targets).
  using BatchSource = std::function<torch::Tensor(int microbatch)>;

  // One training step: forward and backward of every micro-batch. Each micro-batch's objective
  // is divided by `loss_divisor`; `loss_scale` (a 0-dim tensor, or undefined) multiplies it
  // before backward. Returns, for each of the stage's loss_names(), the sum over micro-batches of
  // the divided losses (0-dim fp32, on the device; 0 on stages without the last virtual stage).
  std::vector<torch::Tensor> train_step(const BatchSource& batch, double loss_divisor, const torch::Tensor& loss_scale);
  // The training schedule for `microbatches` micro-batches per step from now on (a batch-size
  // ramp-up changes them between steps).
  void set_microbatches(int microbatches);
  // Forward only, without gradients: the sum of the micro-batches' first loss (0-dim, fp64).
  torch::Tensor evaluate(const BatchSource& batch);

  bool has_loss() const;  // this stage holds the last virtual stage
  bool needs_batches() const;  // ... the first or the last

  // Seconds this stage's device waited for transfers, and the seconds the training steps took,
  // since the last call (synchronises); both 0 with a single stage, which is not timed.
  std::pair<double, double> take_wait_and_span();
  // What one forward, backward and weight-gradient action of each of this stage's chunks took on
  // average since the last call (seconds; synchronises); empty with a single stage.
  std::vector<ActionCosts> take_action_costs();
  const Schedule& training_schedule() const { return train_; }
  // DualPipeV's pairs: each pair's forward pass on a side lane, beside its backward pass on this
  // thread (side_lane.h), instead of one after the other. For the CPU with the MPI backend, whose
  // expert exchange has a communicator for each lane; the results are the same bits.
  void set_pairs_side_by_side(bool on) { pairs_side_by_side_ = on; }
  bool pairs_side_by_side() const { return pairs_side_by_side_; }
  // The seconds of expert exchange that a pair's other lane hid behind its computation, since
  // the last call (0 unless pairs run side by side).
  double take_hidden_exchange_seconds();

 private:
  using Key = std::tuple<int, int>;  // (micro-batch, chunk)
  // Returns the loss sums (training: every loss, fp32; evaluation: the first, fp64).
  std::vector<torch::Tensor> run(const Schedule& schedule, const BatchSource& batch, double loss_divisor,
                                 const torch::Tensor& loss_scale);
  // Forward of a micro-batch on chunk `a.chunk`; on the last virtual stage, its losses are added
  // to `sums` and its objective kept for the backward pass.
  void forward(const Schedule& schedule, const Action& a, const torch::Tensor& tokens, bool training,
               double loss_divisor, const torch::Tensor& loss_scale, std::vector<torch::Tensor>& sums);
  // The three parts of forward(): its input (taken from the received ones), the model's work
  // (which touches nothing of the executor's, so that a side lane may run it), and keeping what
  // it computed for the transfers and the backward pass.
  struct ForwardResult {
    torch::Tensor output;      // the activation for the next virtual stage
    MicroBatchLosses losses;   // or, on the last virtual stage, the losses
  };
  torch::Tensor forward_input(const Schedule& schedule, const Action& a, const torch::Tensor& tokens, bool training);
  ForwardResult compute_forward(const Schedule& schedule, const Action& a, const torch::Tensor& input,
                                const torch::Tensor& tokens);
  void keep_forward(const Schedule& schedule, const Action& a, const ForwardResult& result, bool training,
                    double loss_divisor, const torch::Tensor& loss_scale, std::vector<torch::Tensor>& sums);
  // The actions paired with the forward at `actions[forward]`: its B, and its W if it follows.
  static std::vector<Action> paired_backward(const std::vector<Action>& actions, size_t forward);
  // A paired forward `f` on the side lane, beside `backward_actions` (its pair's B and W) here.
  void run_pair(const Schedule& schedule, const Action& f, const torch::Tensor& tokens,
                const std::vector<Action>& backward_actions, double loss_divisor, const torch::Tensor& loss_scale,
                std::vector<torch::Tensor>& sums, bool timed);
  void backward(const Schedule& schedule, const Action& a);
  // A B action (backward()) or a W action (the weight gradients the store kept for it).
  void backward_or_weights(const Schedule& schedule, const Action& a);
  // Runs `work`, compute action `a`, keeping its span for the bubble's prediction when `timed`.
  // From the main lane only: the spans are the executor's state.
  void timed_compute(const Action& a, bool timed, const std::function<void()>& work);
  // Sends and receives of one group of consecutive transfer actions, all at once.
  void exchange(const Schedule& schedule, const std::vector<Action>& transfers, bool training, bool timed);
  int64_t activation_positions() const {
    return shape_.activation_positions ? shape_.activation_positions : shape_.seq_len;
  }

  Schedule train_, eval_;
  int stage_;
  PipelineStage& model_;
  Communicator& pp_group_;
  std::unique_ptr<PipelineChannels> channels_;  // training steps of a schedule whose sends do not wait
  ActivationShape shape_;
  int64_t activation_width_;
  // Per (micro-batch, chunk) in flight: the input (received activation, a leaf that collects its
  // gradient) and the output (activation to send back the gradient through, or the loss).
  std::map<Key, torch::Tensor> inputs_, outputs_;
  std::map<Key, torch::Tensor> received_grads_;
  WeightGradientStore& weight_gradients_;     // split backward passes: the W actions' work
  std::vector<std::unique_ptr<Work>> sends_;  // schedules whose sends do not wait: this step's
  std::vector<std::pair<accel::Timestamp, accel::Timestamp>> waits_, steps_;
  struct ComputeSpan {
    ActionKind kind;
    int chunk;
    accel::Timestamp start, end;
  };
  std::vector<ComputeSpan> computes_;
  bool pairs_side_by_side_ = false;
  double hidden_exchange_seconds_ = 0;
};

}  // namespace dstrain
