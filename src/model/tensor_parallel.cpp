#include "dstrain/model/tensor_parallel.h"

#include <torch/csrc/autograd/custom_function.h>

#include <stdexcept>
#include <string>

namespace dstrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group travels through the autograd context as an address, as the model's other
// differentiable exchanges do: it outlives the passes that use it.
void keep_group(AutogradContext* ctx, TensorParallelGroup& group) {
  ctx->saved_data["group"] = reinterpret_cast<int64_t>(&group);
}
TensorParallelGroup& group_of(AutogradContext* ctx) {
  return *reinterpret_cast<TensorParallelGroup*>(ctx->saved_data["group"].toInt());
}

torch::Tensor summed(const torch::Tensor& x, TensorParallelGroup& group) {
  torch::Tensor sum = x.contiguous().clone();
  group.all_reduce_sum(sum);
  return sum;
}

class CopyToTensorParallel : public torch::autograd::Function<CopyToTensorParallel> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, TensorParallelGroup* group) {
    keep_group(ctx, *group);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {summed(grads[0], group_of(ctx)), torch::Tensor()};
  }
};

class ReduceFromTensorParallel : public torch::autograd::Function<ReduceFromTensorParallel> {
 public:
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& x, TensorParallelGroup* group) {
    return summed(x, *group);
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0], torch::Tensor()}; }
};

// The sequence's three mappings: one collective or slice forward, its transpose backward.
enum class SequenceStep : int64_t { kAllGather, kReduceScatter, kOwnPart };

torch::Tensor sequence_step(SequenceStep step, const torch::Tensor& x, TensorParallelGroup& group, int64_t dim) {
  switch (step) {
    case SequenceStep::kAllGather: return group.all_gather(x, dim);
    case SequenceStep::kReduceScatter: return group.reduce_scatter(x, dim);
    case SequenceStep::kOwnPart: break;
  }
  return x.chunk(group.size(), dim)[group.rank()].contiguous();
}

class SequenceMapping : public torch::autograd::Function<SequenceMapping> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, TensorParallelGroup* group, int64_t dim,
                               SequenceStep forward_step, SequenceStep backward_step) {
    keep_group(ctx, *group);
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["backward"] = static_cast<int64_t>(backward_step);
    return sequence_step(forward_step, x, *group, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto step = static_cast<SequenceStep>(ctx->saved_data["backward"].toInt());
    return {sequence_step(step, grads[0], group_of(ctx), ctx->saved_data["dim"].toInt()), torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// Megatron-LM's vocabulary-parallel cross-entropy: the softmax's normaliser from each shard's sum
// of exponentials (shifted by the group's max, so that none overflows), the target's logit from
// the one shard that holds it. Keeps this shard's probabilities for the backward pass.
class VocabParallelCrossEntropy : public torch::autograd::Function<VocabParallelCrossEntropy> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits, const torch::Tensor& targets,
                               TensorParallelGroup* group, int64_t ignore_index) {
    const auto compute = logits.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
    torch::Tensor x = logits.to(compute);
    const int64_t shard = x.size(1), first = group->rank() * shard;
    torch::Tensor max = std::get<0>(x.max(1)).contiguous();
    group->all_reduce_max(max);
    x = x - max.unsqueeze(1);
    // The target's shifted logit: from the shard that holds it, 0 from the others, summed.
    const torch::Tensor kept = targets != ignore_index;
    const torch::Tensor local = targets - first;
    const torch::Tensor here = kept & (local >= 0) & (local < shard);
    const torch::Tensor index = local.masked_fill(here.logical_not(), 0).unsqueeze(1);
    torch::Tensor target_logit = x.gather(1, index).squeeze(1).masked_fill(here.logical_not(), 0).contiguous();
    group->all_reduce_sum(target_logit);
    torch::Tensor exp = x.exp();
    torch::Tensor sum_exp = exp.sum(1).contiguous();
    group->all_reduce_sum(sum_exp);
    const torch::Tensor per_position = (sum_exp.log() - target_logit).masked_fill(kept.logical_not(), 0);
    const double count = std::max<double>(1.0, kept.sum().item<double>());
    ctx->save_for_backward({exp.div_(sum_exp.unsqueeze(1)), index, here, kept});
    ctx->saved_data["count"] = count;
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return per_position.sum() / count;
  }

  // d loss / d logit = (softmax - one-hot(target)) / count at kept positions, 0 at ignored ones.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    torch::Tensor grad = saved[0];  // this shard's probabilities
    grad.scatter_add_(1, saved[1], -saved[2].to(grad.scalar_type()).unsqueeze(1));
    grad.mul_(saved[3].to(grad.scalar_type()).unsqueeze(1));
    grad.mul_(grads[0] / ctx->saved_data["count"].toDouble());
    const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grad.to(dtype), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

int64_t split_by_tensor_parallel(int64_t n, const TensorParallelGroup* group, const char* what) {
  if (!group) return n;
  if (n % group->size() != 0)
    throw std::invalid_argument(std::string("tensor parallelism over ") + std::to_string(group->size()) +
                                " ranks must divide " + what + " (" + std::to_string(n) + ")");
  return n / group->size();
}

torch::Tensor copy_to_tensor_parallel(const torch::Tensor& x, TensorParallelGroup& group) {
  return CopyToTensorParallel::apply(x, &group);
}
torch::Tensor reduce_from_tensor_parallel(const torch::Tensor& x, TensorParallelGroup& group) {
  return ReduceFromTensorParallel::apply(x, &group);
}
torch::Tensor gather_from_sequence_parallel(const torch::Tensor& x, TensorParallelGroup& group, int64_t dim) {
  return SequenceMapping::apply(x, &group, dim, SequenceStep::kAllGather, SequenceStep::kReduceScatter);
}
torch::Tensor scatter_to_sequence_parallel(const torch::Tensor& x, TensorParallelGroup& group, int64_t dim) {
  return SequenceMapping::apply(x, &group, dim, SequenceStep::kReduceScatter, SequenceStep::kAllGather);
}
torch::Tensor gather_sequence_whole(const torch::Tensor& x, TensorParallelGroup& group, int64_t dim) {
  return SequenceMapping::apply(x, &group, dim, SequenceStep::kAllGather, SequenceStep::kOwnPart);
}

torch::Tensor TensorParallelRegion::enter(const torch::Tensor& x) const {
  if (!group) return x;
  return sequence_parallel ? gather_from_sequence_parallel(x, *group, token_dim(x)) : copy_to_tensor_parallel(x, *group);
}

torch::Tensor TensorParallelRegion::leave(const torch::Tensor& x) const {
  if (!group) return x;
  return sequence_parallel ? scatter_to_sequence_parallel(x, *group, token_dim(x)) : reduce_from_tensor_parallel(x, *group);
}

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                           TensorParallelGroup& group, int64_t ignore_index) {
  return VocabParallelCrossEntropy::apply(logits, targets, &group, ignore_index);
}

}  // namespace dstrain
