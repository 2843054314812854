// The gradient buffer keeps its buckets' reductions going while the backward pass computes: MPI
// advances a nonblocking collective only inside MPI calls, so each gradient arrival asks the
// buckets under way whether they are done. Measured in polls, not in wall-clock time: a reduction
// here needs a number of such calls to finish, as an MPI collective needs its rounds progressed,
// and as in MPI any call progresses every reduction under way.
#include <gtest/gtest.h>

#include "dstrain/optim/grad_buffer.h"
#include "unused_communicator.h"

using namespace dstrain;

namespace {

// The group's progress (polls so far), and what the fake reductions saw: how many were still
// unfinished when the step waited for them.
struct Ledger {
  int64_t polls = 0;
  int started = 0, waited_unfinished = 0;
};

class PolledReduction : public Work {
 public:
  PolledReduction(int polls_needed, Ledger& ledger) : done_at_(ledger.polls + polls_needed), ledger_(ledger) {}
  bool ready() override { return ++ledger_.polls >= done_at_; }
  // (Waiting moves no other reduction on: what is counted is what the backward pass left.)
  void wait() override {
    if (ledger_.polls < done_at_) ++ledger_.waited_unfinished;
  }

 private:
  int64_t done_at_;
  Ledger& ledger_;
};

// Two ranks with the same gradients: the average leaves them as they are.
class PolledGroup : public test::UnusedCommunicator {
 public:
  PolledGroup(int polls_needed, Ledger& ledger)
      : UnusedCommunicator("the gradient buffer does not call this"), polls_needed_(polls_needed), ledger_(ledger) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  Backend backend() const override { return Backend::kMpi; }  // (polled, as MPI's)
  void all_reduce(torch::Tensor&, ReduceOp) override {}
  std::unique_ptr<Work> all_reduce_async(torch::Tensor&, ReduceOp) override {
    ++ledger_.started;
    return std::make_unique<PolledReduction>(polls_needed_, ledger_);
  }
  bool callable_from_any_thread() const override { return true; }
  void barrier() override {}
  void synchronize() override {}

 private:
  int polls_needed_;
  Ledger& ledger_;
};

// One backward pass of eight chained matrices with a bucket each; returns how many buckets the
// step still had to wait for after it.
Ledger one_step(bool overlap, int polls_needed) {
  torch::manual_seed(3);
  std::vector<torch::Tensor> weights;
  NamedTensors named;
  for (int i = 0; i < 8; ++i) {
    weights.push_back((torch::randn({8, 8}) * 0.3).set_requires_grad(true));
    named.emplace_back("layer." + std::to_string(i), weights.back());
  }
  Ledger ledger;
  PolledGroup group(polls_needed, ledger);
  GradientBuffer buffer(named, weights, {&group, torch::kFloat32, 8 * 8 * 4, overlap, 1});
  EXPECT_EQ(buffer.buckets(), 8u);
  buffer.zero();
  torch::Tensor h = torch::randn({4, 8});
  for (const torch::Tensor& w : weights) h = torch::tanh(h.matmul(w));
  h.pow(2).sum().backward();
  buffer.reduce();
  EXPECT_EQ(ledger.started, 8);
  return ledger;
}

}  // namespace

// Each bucket needs three polls after its start; the arrivals after it give them, so only the
// last buckets, started at the end of the backward pass, are left for the step to wait for.
TEST(GradientBufferProgress, ArrivalsKeepTheReductionsUnderWayGoing) {
  const Ledger overlapped = one_step(/*overlap=*/true, /*polls_needed=*/3);
  EXPECT_LE(overlapped.waited_unfinished, 3);
  // Without overlap every bucket starts after the backward pass: all of them are waited for.
  const Ledger plain = one_step(/*overlap=*/false, /*polls_needed=*/3);
  EXPECT_EQ(plain.waited_unfinished, 8);
}
