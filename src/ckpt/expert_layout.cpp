#include "dstrain/ckpt/expert_layout.h"

#include "dstrain/core/error.h"
#include "dstrain/model/grouped_experts.h"

namespace dstrain {
namespace {

// The elements [start, end) of the flattened parameter that `stacked` holds (from its offset),
// as a view: shaped like one expert's weight when the piece is a whole expert, flat otherwise.
torch::Tensor piece(const torch::Tensor& t, const OptimizerStateView& stacked, int64_t start, int64_t end,
                    const std::vector<int64_t>& expert_shape, bool whole) {
  const torch::Tensor part = t.reshape({-1}).narrow(0, start - stacked.offset, end - start);
  return whole ? part.view(expert_shape) : part;
}

void split(const OptimizerStateView& stacked, int64_t first_expert, std::vector<OptimizerStateView>& out) {
  const std::vector<int64_t> expert_shape(stacked.full_shape.begin() + 1, stacked.full_shape.end());
  int64_t per_expert = 1;
  for (int64_t d : expert_shape) per_expert *= d;
  const int64_t held = stacked.master.numel(), begin = stacked.offset, end = begin + held;
  for (const torch::Tensor& t : {stacked.param, stacked.exp_avg, stacked.exp_avg_sq})
    if (t.numel() != held)
      throw Error(ExitCode::kInternal, "optimizer state of " + stacked.name + ": parts of unequal sizes");
  const bool master_is_param = stacked.master.is_same(stacked.param);
  for (int64_t e = begin / per_expert; e * per_expert < end; ++e) {
    const int64_t start = std::max(begin, e * per_expert), stop = std::min(end, (e + 1) * per_expert);
    const bool whole = start == e * per_expert && stop == (e + 1) * per_expert;
    OptimizerStateView part;
    part.name = expert_weight_name(stacked.name, first_expert + e);
    part.param = piece(stacked.param, stacked, start, stop, expert_shape, whole);
    part.master = master_is_param ? part.param : piece(stacked.master, stacked, start, stop, expert_shape, whole);
    part.exp_avg = piece(stacked.exp_avg, stacked, start, stop, expert_shape, whole);
    part.exp_avg_sq = piece(stacked.exp_avg_sq, stacked, start, stop, expert_shape, whole);
    part.full_shape = expert_shape;
    part.offset = start - e * per_expert;
    out.push_back(std::move(part));
  }
}

}  // namespace

std::vector<OptimizerStateView> per_expert_state_views(const std::vector<OptimizerStateView>& views,
                                                       int64_t first_expert) {
  std::vector<OptimizerStateView> out;
  for (const OptimizerStateView& view : views) {
    if (is_stacked_expert_parameter(view.name))
      split(view, first_expert, out);
    else
      out.push_back(view);
  }
  return out;
}

}  // namespace dstrain
