// Expert parallelism's token exchange over the expert-parallel group (the model's ExpertExchange;
// DeepSeek-V3 §3.2.2): each rank routes its own tokens, sends every (token, chosen expert) row to
// the rank of the group that holds the expert, computes the rows it received with its own experts,
// and sends the results back to where the rows came from. Dropless: every row travels, however
// unbalanced the routing; a rank that receives nothing still takes part in every exchange, forward
// and backward, so that no peer waits for it.
//
// Rows leave sorted by global expert, so each destination's rows are one contiguous block; they
// arrive grouped by source rank, within a source by local expert, and dispatch regroups them
// expert by expert for the experts' products (combine undoes it before they go back).
//
// Each exchange goes through the communicator of the lane that runs it (compute_lane.h): a forward
// pass on DualPipeV's side lane may have its backward pass on the main one. Each wait is noted for
// the lane's WaitLog, and the training passes' waits and the bytes they send are summed.
//
// With `fp8_dispatch` (train.fp8 = blockwise) the dispatch sends its rows as E4M3 in 1×128 tiles
// with their fp32 scales, as DeepSeek-V3's does; the combine, and the gradients both ways, stay in
// the rows' dtype.
#pragma once

#include "dstrain/core/torch_api.h"

#include <atomic>
#include <vector>

#include "dstrain/model/expert_exchange.h"
#include "dstrain/parallel/communicator.h"
#include "dstrain/parallel/compute_lane.h"

namespace dstrain {

// What the training passes' exchanges add up to; both lanes add to it.
struct ExchangeCounters {
  std::atomic<int64_t> nanoseconds{0};
  std::atomic<int64_t> bytes_sent{0};  // to other ranks of the group
};

class ExpertAllToAll : public ExpertExchange {
 public:
  // `groups`: the expert-parallel group, ordered by the part of the experts each member holds, a
  // communicator for each lane; they outlive the exchange and every backward pass through it.
  explicit ExpertAllToAll(LaneGroups groups, bool fp8_dispatch = false);

  ExpertShard shard() const override;
  // Collective over the group: exchanges the row counts.
  ExchangePlan plan(const torch::Tensor& rows_per_expert, bool measured) override;
  torch::Tensor dispatch(const torch::Tensor& rows, const ExchangePlan& plan) override;
  torch::Tensor combine(const torch::Tensor& computed, const ExchangePlan& plan) override;

  // The wall seconds training passes spent exchanging rows, forward and backward, on either lane,
  // since the last call.
  double take_seconds();
  // The bytes they sent to other ranks since the last call.
  int64_t take_bytes_sent();

 private:
  LaneGroups groups_;
  bool fp8_dispatch_;
  ExchangeCounters counters_;
};

}  // namespace dstrain
