// How a MoE layer's routed rows reach the experts that compute them (GShard's dispatch and
// combine; DeepSeek-V3 §3.2.2), as the layer sees it. The layer routes its own tokens, sorts the
// (token, chosen expert) rows by global expert, and then
//
//   plan      learns how many rows every rank sends each expert (collective)
//   dispatch  sends each row to the rank that holds its expert; returns the rows this rank's
//             experts compute, each expert's rows together, in expert order
//   combine   sends the experts' results back, in the order dispatch took the rows
//
// Dropless: every row travels, however unbalanced the routing. A layer holding every expert uses
// LocalExpertExchange (nothing travels); expert parallelism hands in the all-to-all over the
// expert-parallel group (parallel/expert_all_to_all.h). Both are differentiable: the gradients go
// back the reverse way, so every rank of a group runs the same backward passes.
#pragma once

#include "dstrain/core/torch_api.h"

#include <cstdint>
#include <vector>

#include "dstrain/model/layer_slice.h"

namespace dstrain {

// One exchange's sizes, known to the host.
struct ExchangePlan {
  std::vector<int64_t> send_rows;           // to each rank of the group, in rank order
  std::vector<int64_t> recv_rows;           // from each rank of the group
  std::vector<int64_t> received_by_expert;  // [source rank × local expert], row-major
  std::vector<int64_t> rows_per_expert;     // what each of this rank's experts computes (summed over sources)
  // The order that puts the received rows (source by source, expert by expert within a source)
  // expert by expert: what dispatch returns is received.index_select(0, expert_order). Undefined
  // where they arrive so already (a single source).
  torch::Tensor expert_order;
  bool measured = false;  // a training pass: the exchange's time counts in the run's measures
};

class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  // Which part of every MoE layer's routed experts this rank holds.
  virtual ExpertShard shard() const = 0;
  // `rows_per_expert`: this rank's rows for each of the layer's routed experts (int64 [experts],
  // on any device). Waits for the device once: the counts decide the sizes of everything after.
  // `measured`: a training pass (evaluation's exchanges are left out of the run's measures).
  virtual ExchangePlan plan(const torch::Tensor& rows_per_expert, bool measured) = 0;
  // `rows` [N, hidden], sorted by global expert, N = Σ rows_per_expert.
  virtual torch::Tensor dispatch(const torch::Tensor& rows, const ExchangePlan& plan) = 0;
  // `computed`: what dispatch returned, through the experts.
  virtual torch::Tensor combine(const torch::Tensor& computed, const ExchangePlan& plan) = 0;
};

// A rank that holds every expert: the rows stay where they are.
class LocalExpertExchange : public ExpertExchange {
 public:
  ExpertShard shard() const override { return {}; }
  ExchangePlan plan(const torch::Tensor& rows_per_expert, bool measured) override;
  torch::Tensor dispatch(const torch::Tensor& rows, const ExchangePlan&) override { return rows; }
  torch::Tensor combine(const torch::Tensor& computed, const ExchangePlan&) override { return computed; }
};

}  // namespace dstrain
