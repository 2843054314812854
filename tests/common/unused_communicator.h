// A Communicator for tests whose code under test calls only some of its operations: each one
// throws std::logic_error with the test's reason until the test's own class overrides it, so an
// operation called unexpectedly fails the test instead of doing nothing.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dstrain/parallel/communicator.h"

namespace dstrain::test {

class UnusedCommunicator : public Communicator {
 public:
  explicit UnusedCommunicator(std::string why_unused) : why_unused_(std::move(why_unused)) {}

  void all_reduce(torch::Tensor&, ReduceOp) override { unused(); }
  std::unique_ptr<Work> all_reduce_async(torch::Tensor&, ReduceOp) override { unused(); }
  void reduce_scatter(torch::Tensor&, const torch::Tensor&, ReduceOp) override { unused(); }
  std::unique_ptr<Work> reduce_scatter_async(torch::Tensor&, const torch::Tensor&, ReduceOp) override { unused(); }
  void all_gather(torch::Tensor&, const torch::Tensor&) override { unused(); }
  std::unique_ptr<Work> all_gather_async(torch::Tensor&, const torch::Tensor&) override { unused(); }
  void broadcast(torch::Tensor&, int) override { unused(); }
  void all_to_all(torch::Tensor&, const torch::Tensor&, const std::vector<int64_t>&,
                  const std::vector<int64_t>&) override {
    unused();
  }
  void send(const torch::Tensor&, int) override { unused(); }
  void recv(torch::Tensor&, int) override { unused(); }
  void exchange(std::vector<Transfer>&) override { unused(); }
  std::unique_ptr<Work> exchange_async(std::vector<Transfer>&) override { unused(); }
  std::unique_ptr<Work> send_async(const torch::Tensor&, int, int) override { unused(); }
  std::unique_ptr<Communicator> make_subgroup(const std::vector<int>&) override { unused(); }
  void barrier() override { unused(); }
  void synchronize() override { unused(); }

 protected:
  [[noreturn]] void unused() const { throw std::logic_error(why_unused_); }

 private:
  std::string why_unused_;
};

}  // namespace dstrain::test
