// Expert parallelism's token exchange (GShard's dispatch and combine; DeepSeek-V3 §3.2.2): each
// rank routes its own tokens, sends every (token, chosen expert) row to the rank of the
// expert-parallel group that holds the expert, computes the rows it received with its own
// experts, and sends the results back to where the rows came from. Dropless: every row travels,
// however unbalanced the routing; a rank that receives nothing still takes part in every exchange,
// forward and backward, so that no peer waits for it.
//
// Rows leave sorted by global expert, so each destination's rows are one contiguous block; they
// arrive grouped by source rank, within a source by local expert (DispatchPlan says how many).
#pragma once

#include "dstrain/core/torch_api.h"

#include <vector>

#include "dstrain/parallel/communicator.h"
#include "dstrain/parallel/compute_lane.h"
#include "dstrain/model/grouped_experts.h"

namespace dstrain {

struct DispatchPlan {
  std::vector<int64_t> send_rows;      // to each rank of the group
  std::vector<int64_t> recv_rows;      // from each rank of the group
  // [source rank × local expert], row-major: the rows each source sends each local expert.
  std::vector<int64_t> received_by_expert;
  int64_t local_experts = 0;
};

// Collective over `group`: exchanges the row counts. `expert_rows`: this rank's rows for each
// global expert (int64, on any device; experts split evenly and contiguously over the group).
// Waits for the device once: the counts decide the sizes of everything after.
DispatchPlan plan_dispatch(const torch::Tensor& expert_rows, Communicator& group);

// Differentiable all-to-all of rows (Communicator::all_to_all): the gradients travel back the
// reverse way in the backward pass, so every rank of the group must run the same backward passes.
// Each exchange goes through the communicator of the lane that runs it (compute_lane.h): a
// forward pass on the side lane may have its backward pass on the main one. `seconds`, when
// given, accumulates the wall time spent exchanging, forward and backward; each wait is also
// noted for the lane's WaitLog. `groups` outlives the backward pass.
torch::Tensor exchange_rows(const torch::Tensor& rows, const std::vector<int64_t>& send_rows,
                            const std::vector<int64_t>& recv_rows, const LaneGroups& groups,
                            double* seconds = nullptr);

// The received rows through this rank's experts (`experts`: its local experts in order), each
// expert's rows as one batch; the results in the order the rows arrived, ready to go back.
torch::Tensor run_local_experts(const torch::Tensor& received, const DispatchPlan& plan,
                                GroupedExperts& experts);

}  // namespace dstrain
