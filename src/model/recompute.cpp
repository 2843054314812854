#include "dstrain/model/recompute.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "dstrain/core/error.h"

namespace dstrain {
namespace {

thread_local bool rerunning = false;

// Marks this thread as rerunning a part while it lives (parts may nest).
class Rerun {
 public:
  Rerun() : outer_(rerunning) { rerunning = true; }
  ~Rerun() { rerunning = outer_; }
  Rerun(const Rerun&) = delete;
  Rerun& operator=(const Rerun&) = delete;

 private:
  bool outer_;
};

// The part to rerun, kept in the autograd node (an autograd context holds no std::function).
struct Part : torch::CustomClassHolder {
  explicit Part(std::function<torch::Tensor(const torch::Tensor&)> f) : run(std::move(f)) {}
  std::function<torch::Tensor(const torch::Tensor&)> run;
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
    return part->run(input.detach().requires_grad_(input.requires_grad())).detach();
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
      Rerun marked;
      output = part->run(input);
    }
    // Outside the scopes above: the parameters' gradients accumulate as in any backward pass.
    torch::autograd::backward({output}, {grads[0]});
    return {input.requires_grad() ? input.grad() : torch::Tensor(), torch::Tensor()};  // (nothing for the part)
  }
};

}  // namespace

Recompute recompute_named(const std::string& name) {
  if (name == "none") return Recompute::kNone;
  if (name == "full") return Recompute::kFull;
  throw config_error("train.recompute", name, "expected none or full");
}

torch::Tensor recompute_in_backward(const std::function<torch::Tensor(const torch::Tensor&)>& part,
                                    const torch::Tensor& input) {
  if (!torch::GradMode::is_enabled() || !input.requires_grad()) return part(input);
  return RecomputeFunction::apply(input, c10::make_intrusive<Part>(part));
}

bool recomputing() { return rerunning; }

}  // namespace dstrain
