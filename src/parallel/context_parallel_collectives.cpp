#include "dstrain/parallel/context_parallel_collectives.h"

#include <vector>

namespace dstrain {
namespace {

constexpr int kRingTag = 31;  // the ring's transfers between two ranks (+ their place in a pass)

// An exchange under way and the tensors it reads and writes, kept until it completes.
class ExchangeUnderWay final : public RingPassUnderWay {
 public:
  ExchangeUnderWay(Communicator& cp, std::vector<Transfer> transfers)
      : transfers_(std::move(transfers)), work_(cp.exchange_async(transfers_)) {}
  std::vector<torch::Tensor> wait() override {
    work_->wait();
    std::vector<torch::Tensor> received;
    for (const Transfer& t : transfers_)
      if (!t.send) received.push_back(t.tensor);
    return received;
  }

 private:
  std::vector<Transfer> transfers_;
  std::unique_ptr<Work> work_;
};

}  // namespace

std::unique_ptr<RingPassUnderWay> ContextParallelCollectives::start_pass(const std::vector<torch::Tensor>& outgoing) {
  const int size = cp_.size(), rank = cp_.rank();
  const int next = (rank + 1) % size, previous = (rank + size - 1) % size;
  std::vector<Transfer> transfers;
  for (size_t i = 0; i < outgoing.size(); ++i) {
    const int tag = kRingTag + static_cast<int>(i);
    const torch::Tensor sent = outgoing[i].contiguous();
    transfers.push_back({true, sent, next, tag});
    transfers.push_back({false, torch::empty_like(sent), previous, tag});
    bytes_passed_ += static_cast<int64_t>(sent.nbytes());
  }
  return std::make_unique<ExchangeUnderWay>(cp_, std::move(transfers));
}

}  // namespace dstrain
