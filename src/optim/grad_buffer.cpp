#include "dstrain/optim/grad_buffer.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

#include <algorithm>
#include <map>

#include "dstrain/core/error.h"
#include "dstrain/core/profile_scope.h"
#include "dstrain/optim/quantized_reduction.h"

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
  const int64_t dp = reduction_.group ? reduction_.group->size() : 1;
  sharded_ = reduction_.shard && dp > 1;
  // Buffer order: the reverse of use, which is the order in which backward finishes them.
  std::vector<torch::Tensor> order(use_order.rbegin(), use_order.rend());
  if (order.size() != params.size())
    throw Error(ExitCode::kInternal, "gradient buffer: use order and parameters differ");
  const torch::Device device = order.empty() ? torch::Device(torch::kCPU) : order.front().device();

  // Parameters into buckets of about bucket_bytes, then each bucket padded to a multiple of the
  // DP size when it is reduce-scattered, or to DP whole chunks of blocks when it is quantized.
  const bool quantized = reduction_.quantized.has_value() && dp > 1;
  const int64_t multiple = quantized ? dp * kQuantizationBlock : sharded_ ? dp : 1;
  const int64_t bucket_elements = std::max<int64_t>(1, reduction_.bucket_bytes / 4);
  std::map<const void*, size_t> slot_of;  // by parameter identity
  int64_t offset = 0;
  auto close_bucket = [&] {
    if (buckets_.empty()) return;
    Bucket& last = buckets_.back();
    last.length += (multiple - last.length % multiple) % multiple;
    offset = last.start + last.length;
  };
  for (const torch::Tensor& p : order) {
    if (buckets_.empty() || buckets_.back().length >= bucket_elements) {
      close_bucket();
      buckets_.emplace_back();
      buckets_.back().start = offset;
      buckets_.back().first_slot = slots_.size();
    }
    Bucket& bucket = buckets_.back();
    bucket.length += p.numel();
    ++bucket.slots;
    slot_of[p.unsafeGetTensorImpl()] = slots_.size();
    slots_.push_back({p, torch::Tensor(), offset, p.scalar_type() != torch::kFloat32, buckets_.size() - 1});
    offset += p.numel();
  }
  close_bucket();
  flat_ = torch::zeros({offset}, torch::dtype(torch::kFloat32).device(device));
  if (quantized && reduction_.error_feedback) residual_ = torch::zeros_like(flat_);
  for (Slot& slot : slots_) slot.view = flat_.narrow(0, slot.offset, slot.param.numel()).view(slot.param.sizes());

  for (const auto& [name, p] : params) {
    auto it = slot_of.find(p.unsafeGetTensorImpl());
    if (it == slot_of.end()) throw Error(ExitCode::kInternal, "gradient buffer: " + name + " is not in the use order");
    const Slot& slot = slots_[it->second];
    views_.push_back(slot.view);
    if (!sharded_) {
      shards_.push_back({name, p, slot.view, p.sizes().vec(), 0});
      continue;
    }
    if (p.scalar_type() != order.front().scalar_type())
      throw Error(ExitCode::kInternal, "gradient buffer: ZeRO-1 needs parameters of one dtype");
    // The elements of the parameter inside this rank's shard of its bucket, if any.
    const Bucket& bucket = buckets_[slot.bucket];
    const int64_t first = std::max(slot.offset, shard_start(bucket));
    const int64_t last = std::min(slot.offset + p.numel(), shard_start(bucket) + shard_length(bucket));
    if (first >= last) continue;
    shards_.push_back({name, p.detach().view({-1}).narrow(0, first - slot.offset, last - first),
                       flat_.narrow(0, first, last - first), p.sizes().vec(), first - slot.offset});
    shard_places_.push_back({slot.bucket, first});
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    torch::Tensor& param = slots_[i].param;
    if (!slots_[i].added_in) param.mutable_grad() = slots_[i].view;  // autograd adds in place
    compat::GradAccumulatorPtr accumulator = torch::autograd::impl::grad_accumulator(param);
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
  for (Slot& s : slots_) {
    if (!s.added_in) s.view.zero_();  // autograd adds into it; added-in views are copied over
    s.arrivals = 0;
    s.written = false;
  }
  for (Bucket& b : buckets_) b.ready = 0;
  next_launch_ = next_complete_ = 0;
}

void GradientBuffer::on_gradient(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  torch::NoGradGuard no_grad;
  Slot& slot = slots_[index];
  if (slot.added_in) {
    torch::Tensor& grad = slot.param.mutable_grad();
    if (grad.defined()) {
      if (slot.written)
        slot.view.add_(grad);
      else
        slot.view.copy_(grad);  // the step's first: what the view held is the last step's
      slot.written = true;
    }
    grad = torch::Tensor();  // the next backward pass hands over a fresh one
  }
  const bool averaging = reduction_.group && reduction_.group->size() > 1;
  if (++slot.arrivals != reduction_.microbatches || !averaging || !reduction_.overlap || reduction_.quantized) return;
  Bucket& bucket = buckets_[slot.bucket];
  // MPI is called from the thread that owns it only; elsewhere reduce() starts the bucket.
  const bool may_call = reduction_.group->callable_from_any_thread() || std::this_thread::get_id() == owner_;
  ++bucket.ready;
  if (!may_call) return;
  // Buckets start strictly in buffer order, so that every rank issues its collectives in the same
  // order even where gradients arrive out of it (a tied weight's, say), as the backends require.
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].ready == buckets_[next_launch_].slots)
    launch(buckets_[next_launch_++]);
  poll_started();
}

void GradientBuffer::poll_started() {
  while (next_complete_ < next_launch_ && buckets_[next_complete_].work->ready())
    buckets_[next_complete_++].completed = std::chrono::steady_clock::now();
}

void GradientBuffer::zero_unwritten(const Bucket& bucket) {
  for (size_t i = bucket.first_slot; i < bucket.first_slot + bucket.slots; ++i) {
    Slot& slot = slots_[i];
    if (!slot.added_in || slot.written) continue;
    slot.view.zero_();
    slot.written = true;
  }
}

void GradientBuffer::launch(Bucket& bucket) {
  bucket.started = std::chrono::steady_clock::now();
  zero_unwritten(bucket);
  torch::Tensor region = flat_.narrow(0, bucket.start, bucket.length);
  bucket.wire = reduction_.wire_dtype == torch::kFloat32 ? region : region.to(reduction_.wire_dtype);
  const int64_t dp = reduction_.group->size();
  const int64_t sent = (dp - 1) * (bucket.wire.nbytes() / dp);  // a reduce-scatter's, or an all-gather's
  record_.bytes_sent += sharded_ ? sent : 2 * sent;
  if (!sharded_) {
    bucket.work = reduction_.group->all_reduce_async(bucket.wire, ReduceOp::kAvg);
    return;
  }
  bucket.shard = torch::empty({shard_length(bucket)}, bucket.wire.options());
  bucket.work = reduction_.group->reduce_scatter_async(bucket.shard, bucket.wire, ReduceOp::kAvg);
}

void GradientBuffer::reduce() {
  ProfileScope scope(profile_part::kCommunication);
  torch::NoGradGuard no_grad;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!reduction_.group || reduction_.group->size() == 1) {
    for (const Bucket& b : buckets_) zero_unwritten(b);
    apply_divisor();
    return;
  }
  const std::chrono::steady_clock::time_point backward_end = std::chrono::steady_clock::now();
  if (reduction_.quantized) {
    for (Bucket& b : buckets_) reduce_quantized(b);
    next_launch_ = next_complete_ = buckets_.size();
    record_times(backward_end);
    apply_divisor();
    return;
  }
  // Buckets not started yet (no overlap, a parameter without a gradient this step, or hooks on
  // another thread with MPI), in buffer order; then every one completed in the same order.
  while (next_launch_ < buckets_.size()) launch(buckets_[next_launch_++]);
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    b.work->wait();
    if (i >= next_complete_) b.completed = std::chrono::steady_clock::now();
    b.work.reset();
    if (sharded_)
      flat_.narrow(0, shard_start(b), shard_length(b)).copy_(b.shard);
    else if (reduction_.wire_dtype != torch::kFloat32)
      flat_.narrow(0, b.start, b.length).copy_(b.wire);
    b.wire = b.shard = torch::Tensor();
  }
  next_complete_ = buckets_.size();
  record_times(backward_end);
  apply_divisor();
}

void GradientBuffer::reduce_quantized(Bucket& bucket) {
  bucket.started = std::chrono::steady_clock::now();
  zero_unwritten(bucket);
  torch::Tensor region = flat_.narrow(0, bucket.start, bucket.length);
  const torch::Tensor residual = residual_.defined() ? residual_.narrow(0, bucket.start, bucket.length) : torch::Tensor();
  const torch::Tensor chunk =
      quantized_reduce_scatter(*reduction_.group, region, *reduction_.quantized, residual, &record_.bytes_sent);
  if (sharded_)
    flat_.narrow(0, shard_start(bucket), shard_length(bucket)).copy_(chunk);
  else
    all_gather_bf16(*reduction_.group, region, chunk, &record_.bytes_sent);
  bucket.completed = std::chrono::steady_clock::now();
}

void GradientBuffer::record_times(std::chrono::steady_clock::time_point backward_end) {
  using Seconds = std::chrono::duration<double>;
  ++record_.steps;
  if (buckets_.empty()) return;
  // Exposed: from the end of the backward pass until the last bucket was complete.
  auto last_complete = backward_end;
  for (const Bucket& b : buckets_) last_complete = std::max(last_complete, b.completed);
  record_.exposed_s += Seconds(last_complete - backward_end).count();
  // The union of the buckets' [started, completed] spans: they start in order and may overlap.
  auto span_start = buckets_.front().started, span_end = buckets_.front().completed;
  for (const Bucket& b : buckets_) {
    if (b.started > span_end) {
      record_.in_flight_s += Seconds(span_end - span_start).count();
      span_start = b.started;
    }
    span_end = std::max(span_end, b.completed);
  }
  record_.in_flight_s += Seconds(span_end - span_start).count();
}

void GradientBuffer::apply_divisor() {
  const int64_t members = reduction_.group ? reduction_.group->size() : 1;
  if (reduction_.divide_sum_by == 0 || reduction_.divide_sum_by == members) return;
  // The group averaged (divided by its size) already.
  const double factor = static_cast<double>(members) / static_cast<double>(reduction_.divide_sum_by);
  for (torch::Tensor& region : owned_regions()) region.mul_(factor);
}

std::vector<torch::Tensor> GradientBuffer::shard_grads() const {
  std::vector<torch::Tensor> grads;
  for (const ParameterShard& s : shards_) grads.push_back(s.grad);
  return grads;
}

std::vector<torch::Tensor> GradientBuffer::owned_regions() const {
  if (!sharded_) return {flat_};
  std::vector<torch::Tensor> regions;
  for (const Bucket& b : buckets_) regions.push_back(flat_.narrow(0, shard_start(b), shard_length(b)));
  return regions;
}

void GradientBuffer::gather_parameters() {
  if (!sharded_ || slots_.empty()) return;
  torch::NoGradGuard no_grad;
  const torch::TensorOptions options = slots_.front().param.options();
  struct Gather {
    torch::Tensor mine, all;
    std::unique_ptr<Work> work;
  };
  // This rank's updated elements at their places in its shard (padding stays zero), on their way
  // to every rank ...
  auto start = [&](size_t b) {
    const Bucket& bucket = buckets_[b];
    Gather g{torch::zeros({shard_length(bucket)}, options), torch::empty({bucket.length}, options), nullptr};
    for (size_t i = 0; i < shards_.size(); ++i)
      if (shard_places_[i].bucket == b)
        g.mine.narrow(0, shard_places_[i].flat_offset - shard_start(bucket), shards_[i].values.numel())
            .copy_(shards_[i].values);
    g.work = reduction_.group->all_gather_async(g.all, g.mine);
    return g;
  };
  // ... and everybody's, back into the parameters.
  auto finish = [&](size_t b, Gather& g) {
    g.work->wait();
    for (const Slot& slot : slots_)
      if (slot.bucket == b)
        slot.param.detach().view({-1}).copy_(g.all.narrow(0, slot.offset - buckets_[b].start, slot.param.numel()));
    g = Gather();
  };
  // Two buckets under way at a time: one travels (MPI: moved by the progress thread) while this
  // rank packs the next or unpacks the last, and no more than two buckets' copies are held.
  Gather previous;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Gather current = start(b);
    if (b > 0) finish(b - 1, previous);
    previous = std::move(current);
  }
  finish(buckets_.size() - 1, previous);
}

}  // namespace dstrain
