#include "dstrain/model/expert_exchange.h"

#include "dstrain/core/accelerator.h"

namespace dstrain {

ExchangePlan LocalExpertExchange::plan(const torch::Tensor& rows_per_expert, bool measured) {
  torch::Tensor host;
  {
    accel::HostSyncExpected batch_sizes;  // the experts' batch sizes: one wait per layer
    host = rows_per_expert.to(torch::kCPU, torch::kInt64).contiguous();
  }
  const int64_t* count = host.data_ptr<int64_t>();
  ExchangePlan plan;
  plan.rows_per_expert.assign(count, count + host.numel());
  plan.received_by_expert = plan.rows_per_expert;
  int64_t rows = 0;
  for (int64_t n : plan.rows_per_expert) rows += n;
  plan.send_rows = plan.recv_rows = {rows};
  plan.measured = measured;
  return plan;
}

}  // namespace dstrain
