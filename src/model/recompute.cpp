#include "dstrain/model/recompute.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <atomic>
#include <chrono>

#include "dstrain/core/error.h"

namespace dstrain {

// A rerun under way, while it lives: its lifetime counts on `clock` unless an enclosing rerun's
// counts it already (parts may nest). Nothing without a clock.
class Rerun {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Rerun(RerunClock* clock) : clock_(clock), outermost_(clock && clock->depth_++ == 0), start_(Clock::now()) {}
  ~Rerun() {
    if (!clock_) return;
    --clock_->depth_;
    if (!outermost_) return;
    clock_->nanoseconds_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start_).count();
    ++clock_->reruns_;
  }
  Rerun(const Rerun&) = delete;
  Rerun& operator=(const Rerun&) = delete;

 private:
  RerunClock* clock_;
  bool outermost_;
  Clock::time_point start_;
};

namespace {

// The part to rerun and its clock, kept in the autograd node (an autograd context holds no
// std::function).
struct Part : torch::CustomClassHolder {
  Part(RerunnablePart f, RerunClock* c) : run(std::move(f)), clock(c) {}
  RerunnablePart run;
  RerunClock* clock;
};

class RecomputeFunction : public torch::autograd::Function<RecomputeFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
                               c10::intrusive_ptr<Part> part) {
    ctx->save_for_backward({input});
    ctx->saved_data["part"] = c10::IValue::make_capsule(part);
    // With gradients on, as without recomputation: LibTorch picks some kernels by whether their
    // inputs need gradients (matmul folds batches only then), and the rerun must compute bitwise
    // what this pass computed. The graph is dropped with the pass: nothing of the part is kept.
    torch::AutoGradMode with_gradients(true);
    return part->run(input.detach().requires_grad_(input.requires_grad()), Pass::kFirst).detach();
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::Tensor kept = ctx->get_saved_variables()[0];
    const auto part = c10::static_intrusive_pointer_cast<Part>(ctx->saved_data["part"].toCapsule());
    // The rerun's input is a leaf of its own graph: its gradient is what this node passes back.
    torch::Tensor input = kept.detach().requires_grad_(kept.requires_grad());
    torch::Tensor output;
    {
      torch::AutoGradMode with_gradients(true);
      Rerun marked(part->clock);
      output = part->run(input, Pass::kRerun);
    }
    // Outside the scopes above: the parameters' gradients accumulate as in any backward pass.
    torch::autograd::backward({output}, {grads[0]});
    return {input.requires_grad() ? input.grad() : torch::Tensor(), torch::Tensor()};  // (nothing for the part)
  }
};

// --- recompute_outputs ---

bool shares_storage(const torch::Tensor& t, const Tensors& others) {
  for (const torch::Tensor& other : others)
    if (other.defined() && other.storage().unsafeGetStorageImpl() == t.storage().unsafeGetStorageImpl()) return true;
  return false;
}

// Gives back the memory of `t`, which must be the only tensor of its storage and cover all of it;
// returns the bytes given back (0: kept, when it is not alone or its memory is not the
// allocator's).
size_t release_storage(const torch::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (storage->allocator() == nullptr || t.storage_offset() != 0 || storage->nbytes() != bytes || bytes == 0) return 0;
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, storage->device()));
  storage->set_nbytes(0);
  return bytes;
}

// Gives `t` memory again and fills it with `values`, without touching `t`'s version counter
// (the backward nodes that saved `t` check it): the copy goes through an alias of its own.
void refill_storage(const torch::Tensor& t, size_t bytes, const torch::Tensor& values) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
  torch::NoGradGuard no_gradients;
  torch::Tensor alias = torch::empty({0}, t.options()).set_(t.storage(), 0, t.sizes(), t.strides());
  alias.copy_(values);
}

// What the two autograd functions below share: the part, its inputs, the outputs whose memory was
// given back and, once rerun, the rerun's graph. Only detached tensors: nothing here refers back
// to the autograd nodes that hold it.
struct DroppedOutputs : torch::CustomClassHolder {
  TensorsFunction part;
  RerunClock* clock = nullptr;
  Tensors inputs;
  std::vector<bool> input_needs_grad;
  Tensors outputs;
  std::vector<size_t> released;  // bytes given back per output (0: kept)
  Tensors leaves, rerun;         // the rerun's inputs and outputs, with its graph

  void rerun_part() {
    if (!rerun.empty()) return;
    for (size_t i = 0; i < inputs.size(); ++i) leaves.push_back(inputs[i].detach().requires_grad_(input_needs_grad[i]));
    torch::AutoGradMode with_gradients(true);
    Rerun marked(clock);
    rerun = part(leaves);
  }
  // Refills the outputs the consumer saved. From then on the consumer's saved tensors alone hold
  // them, so that they are given back with the consumer's backward pass (or, for a projection's
  // input, with its deferred weight gradient), not when the whole graph goes.
  void restore() {
    Rerun marked(clock);  // the refills are the rerun's cost too
    rerun_part();
    for (size_t i = 0; i < outputs.size(); ++i)
      if (released[i] > 0) refill_storage(outputs[i], released[i], rerun[i].detach());
    outputs.clear();
    released.clear();
  }
  // After the part's own backward pass nothing here is needed any more, though the autograd nodes
  // that hold it live until the whole backward pass has run.
  void release() {
    inputs.clear();
    outputs.clear();
    leaves.clear();
    rerun.clear();
  }
};

// part(inputs), with gradients into the inputs and the part's parameters through its rerun.
class DropOutputsFunction : public torch::autograd::Function<DropOutputsFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::TensorList inputs,
                                                c10::intrusive_ptr<DroppedOutputs> dropped) {
    ctx->saved_data["dropped"] = c10::IValue::make_capsule(dropped);
    Tensors leaves;
    for (const torch::Tensor& input : inputs) leaves.push_back(input.detach().requires_grad_(input.requires_grad()));
    torch::AutoGradMode with_gradients(true);  // the kernels the rerun will pick (see RecomputeFunction)
    Tensors outputs = dropped->part(leaves);
    for (torch::Tensor& output : outputs) output = output.detach();
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto dropped = c10::static_intrusive_pointer_cast<DroppedOutputs>(ctx->saved_data["dropped"].toCapsule());
    dropped->rerun_part();
    Tensors outputs, output_grads;
    for (size_t i = 0; i < grads.size(); ++i)
      if (grads[i].defined() && dropped->rerun[i].requires_grad()) {
        outputs.push_back(dropped->rerun[i]);
        output_grads.push_back(grads[i]);
      }
    if (!outputs.empty()) torch::autograd::backward(outputs, output_grads);
    torch::autograd::variable_list input_grads;
    for (const torch::Tensor& leaf : dropped->leaves) input_grads.push_back(leaf.requires_grad() ? leaf.grad() : torch::Tensor());
    input_grads.emplace_back();  // (nothing for `dropped`)
    dropped->release();
    return input_grads;
  }
};

// The consumer's outputs as they are; in the backward pass, before their gradients reach the
// consumer, the dropped outputs it saved are computed again.
class RestoreOutputsFunction : public torch::autograd::Function<RestoreOutputsFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::TensorList consumed,
                                                c10::intrusive_ptr<DroppedOutputs> dropped) {
    ctx->saved_data["dropped"] = c10::IValue::make_capsule(dropped);
    return consumed.vec();
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    c10::static_intrusive_pointer_cast<DroppedOutputs>(ctx->saved_data["dropped"].toCapsule())->restore();
    grads.emplace_back();  // (nothing for `dropped`)
    return grads;
  }
};

}  // namespace

const EnumNames<Recompute>& recompute_names() {
  static const EnumNames<Recompute> names = {
      {"none", Recompute::kNone}, {"selective", Recompute::kSelective}, {"full", Recompute::kFull}};
  return names;
}

Tensors recompute_outputs(const TensorsFunction& part, const Tensors& inputs, const TensorsFunction& consumer,
                          RerunClock* clock) {
  bool any_needs_grad = false;
  for (const torch::Tensor& input : inputs) any_needs_grad = any_needs_grad || input.requires_grad();
  if (!torch::GradMode::is_enabled() || !any_needs_grad) return consumer(part(inputs));
  auto dropped = c10::make_intrusive<DroppedOutputs>();
  dropped->part = part;
  dropped->clock = clock;
  for (const torch::Tensor& input : inputs) {
    dropped->inputs.push_back(input.detach());
    dropped->input_needs_grad.push_back(input.requires_grad());
  }
  // (A TensorList, not a vector: autograd counts the tensors of a list as inputs.)
  const Tensors outputs = DropOutputsFunction::apply(at::TensorList(inputs), dropped);
  const Tensors consumed = consumer(outputs);
  for (size_t i = 0; i < outputs.size(); ++i) {
    const torch::Tensor& output = outputs[i];
    dropped->outputs.push_back(output.detach());
    const Tensors earlier(outputs.begin(), outputs.begin() + static_cast<std::ptrdiff_t>(i));
    const bool alone = !shares_storage(output, inputs) && !shares_storage(output, consumed) && !shares_storage(output, earlier);
    dropped->released.push_back(alone ? release_storage(output) : 0);
  }
  return RestoreOutputsFunction::apply(at::TensorList(consumed), dropped);
}

torch::Tensor recompute_in_backward(const RerunnablePart& part, const torch::Tensor& input, RerunClock* clock) {
  if (!torch::GradMode::is_enabled() || !input.requires_grad()) return part(input, Pass::kFirst);
  return RecomputeFunction::apply(input, c10::make_intrusive<Part>(part, clock));
}

}  // namespace dstrain
