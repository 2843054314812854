// AdamW (Loshchilov & Hutter) with decoupled weight decay, as torch.optim.AdamW computes it, on
// fp32 master weights: a bf16/fp16 model gets an fp32 copy of each parameter that the update
// works on, and the parameter receives the rounded result. Moments are fp32 in every case.
// Weight decay applies to matrices only (embeddings, projections), never to norm weights.
// Under ZeRO-1 it updates this rank's shards of the parameters (ParameterShard) alone: AdamW is
// elementwise, so the shards' updates together are the whole update.
#pragma once

#include "dstrain/core/torch_api.h"

#include <string>
#include <utility>
#include <vector>

#include "dstrain/optim/parameter_shard.h"

namespace dstrain {

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

class AdamW {
 public:
  AdamW(std::vector<std::pair<std::string, torch::Tensor>> params, const AdamWOptions& options);
  // The parts of the parameters this rank updates (their `grad` is not used here).
  AdamW(const std::vector<ParameterShard>& shards, const AdamWOptions& options);

  // One update with learning rate `lr` from the gradients `grads` / `grad_divisor` (fp32, one per
  // parameter or shard in the order given to the constructor; the divisor 0-dim, undefined for
  // one). When `found_inf` (0-dim on the parameters' device) is non-zero nothing changes: no
  // update, no moment, no step count. The fused kernel leaves `grads` divided, the other path
  // leaves them as they were.
  void step(double lr, const std::vector<torch::Tensor>& grads, const torch::Tensor& found_inf,
            const torch::Tensor& grad_divisor = {});
  // Updates applied so far (skipped steps not counted).
  int64_t step_count() const;
  // A resumed run: the count a checkpoint recorded (its moments and masters are copied into
  // states() by the caller, then load_masters() rounds the masters into the parameters).
  void set_step_count(int64_t count);
  void load_masters();

  struct State {
    std::string name;
    torch::Tensor param, master, exp_avg, exp_avg_sq;  // master is param itself for fp32
    bool decay;
    std::vector<int64_t> full_shape;  // of the parameter; param may be a shard of it ...
    int64_t offset = 0;               // ... starting at this element of the flattened parameter
  };
  const std::vector<State>& states() const { return states_; }
  std::vector<State>& states() { return states_; }
  // Bytes of optimizer state this rank holds: fp32 masters (bf16/fp16 models) and moments.
  int64_t state_bytes() const;

 private:
  void explicit_step(double lr, const std::vector<torch::Tensor>& grads, double grad_divisor);
  void fused_step(double lr, const std::vector<torch::Tensor>& grads, const torch::Tensor& found_inf,
                  const torch::Tensor& grad_divisor);

  AdamWOptions options_;
  std::vector<State> states_;
  bool fused_ = false;
  int64_t step_count_ = 0;  // explicit path
  torch::Tensor step_;      // fused path: the step number as a 0-dim fp32 tensor on the device
};

}  // namespace dstrain
