#include "dstrain/optim/grad_buffer.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

#include <algorithm>
#include <map>

#include "dstrain/core/error.h"

namespace dstrain {

// Runs after a parameter's gradient accumulator: its gradient of this backward pass is in.
class GradientArrivalHook final : public torch::autograd::FunctionPostHook {
 public:
  GradientArrivalHook(GradientBuffer* buffer, size_t slot) : buffer_(buffer), slot_(slot) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    buffer_->on_gradient(slot_);
    return outputs;
  }

 private:
  GradientBuffer* buffer_;
  size_t slot_;
};

GradientBuffer::GradientBuffer(const NamedTensors& params, const std::vector<torch::Tensor>& use_order,
                               GradientReduction reduction)
    : reduction_(reduction), owner_(std::this_thread::get_id()) {
  // Buffer order: the reverse of use, which is the order in which backward finishes them.
  std::vector<torch::Tensor> order(use_order.rbegin(), use_order.rend());
  if (order.size() != params.size())
    throw Error(ExitCode::kInternal, "gradient buffer: use order and parameters differ");
  int64_t total = 0;
  for (const torch::Tensor& p : order) total += p.numel();
  const torch::Device device = order.empty() ? torch::Device(torch::kCPU) : order.front().device();
  flat_ = torch::zeros({total}, torch::dtype(torch::kFloat32).device(device));

  const int64_t bucket_elements = std::max<int64_t>(1, reduction_.bucket_bytes / 4);
  std::map<const void*, size_t> slot_of;  // by parameter identity
  int64_t offset = 0;
  for (const torch::Tensor& p : order) {
    if (buckets_.empty() || buckets_.back().length >= bucket_elements) buckets_.push_back({offset, 0});
    Bucket& bucket = buckets_.back();
    bucket.length += p.numel();
    ++bucket.slots;
    slot_of[p.unsafeGetTensorImpl()] = slots_.size();
    slots_.push_back({p, flat_.narrow(0, offset, p.numel()).view(p.sizes()), p.scalar_type() != torch::kFloat32,
                      buckets_.size() - 1});
    offset += p.numel();
  }
  for (const auto& [name, p] : params) {
    auto it = slot_of.find(p.unsafeGetTensorImpl());
    if (it == slot_of.end()) throw Error(ExitCode::kInternal, "gradient buffer: " + name + " is not in the use order");
    views_.push_back(slots_[it->second].view);
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    torch::Tensor& param = slots_[i].param;
    if (!slots_[i].added_in) param.mutable_grad() = slots_[i].view;  // autograd adds in place
    std::shared_ptr<torch::autograd::Node> accumulator = torch::autograd::impl::grad_accumulator(param);
    accumulator->add_post_hook(std::make_unique<GradientArrivalHook>(this, i));
    accumulators_.push_back(accumulator);  // autograd keeps only a weak reference
  }
}

GradientBuffer::~GradientBuffer() {
  // A reduction still under way must not outlive the buffer it writes.
  for (Bucket& b : buckets_)
    if (b.work) b.work->wait();
}

void GradientBuffer::zero() {
  flat_.zero_();
  for (Slot& s : slots_) s.arrivals = 0;
  for (Bucket& b : buckets_) b.ready = 0;
  next_launch_ = 0;
}

void GradientBuffer::on_gradient(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  torch::NoGradGuard no_grad;
  Slot& slot = slots_[index];
  if (slot.added_in) {
    torch::Tensor& grad = slot.param.mutable_grad();
    if (grad.defined()) slot.view.add_(grad);
    grad = torch::Tensor();  // the next backward pass hands over a fresh one
  }
  const bool averaging = reduction_.dp_group && reduction_.dp_group->size() > 1;
  if (++slot.arrivals != reduction_.microbatches || !averaging || !reduction_.overlap) return;
  Bucket& bucket = buckets_[slot.bucket];
  // MPI is called from the thread that owns it only; elsewhere reduce() starts the bucket.
  const bool may_call = reduction_.dp_group->callable_from_any_thread() || std::this_thread::get_id() == owner_;
  ++bucket.ready;
  if (!may_call) return;
  // Buckets start strictly in buffer order, so that every rank issues its collectives in the same
  // order even where gradients arrive out of it (a tied weight's, say), as the backends require.
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].ready == buckets_[next_launch_].slots)
    launch(buckets_[next_launch_++]);
}

void GradientBuffer::launch(Bucket& bucket) {
  torch::Tensor region = flat_.narrow(0, bucket.start, bucket.length);
  bucket.wire = reduction_.wire_dtype == torch::kFloat32 ? region : region.to(reduction_.wire_dtype);
  bucket.work = reduction_.dp_group->all_reduce_async(bucket.wire, ReduceOp::kAvg);
}

void GradientBuffer::reduce() {
  if (!reduction_.dp_group || reduction_.dp_group->size() == 1) return;
  torch::NoGradGuard no_grad;
  std::lock_guard<std::mutex> lock(mutex_);
  // Buckets not started yet (no overlap, a parameter without a gradient this step, or hooks on
  // another thread with MPI), in buffer order; then every one completed in the same order.
  while (next_launch_ < buckets_.size()) launch(buckets_[next_launch_++]);
  for (Bucket& b : buckets_) {
    b.work->wait();
    b.work.reset();
    if (reduction_.wire_dtype != torch::kFloat32) flat_.narrow(0, b.start, b.length).copy_(b.wire);
    b.wire = torch::Tensor();
  }
}

}  // namespace dstrain
