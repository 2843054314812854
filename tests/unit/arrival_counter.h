// Counts the runs of a parameter's gradient accumulator, as GradientBuffer's arrival hook sees
// them (optim/grad_buffer.h): add one with
//   torch::autograd::impl::grad_accumulator(param)->add_post_hook(std::make_unique<ArrivalCounter>(&count));
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

namespace dstrain::test {

class ArrivalCounter final : public torch::autograd::FunctionPostHook {
 public:
  explicit ArrivalCounter(int* count) : count_(count) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    ++*count_;
    return outputs;
  }

 private:
  int* count_;
};

}  // namespace dstrain::test
