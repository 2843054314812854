#include "dstrain/parallel/expert_all_to_all.h"

#include <torch/csrc/autograd/custom_function.h>

#include "dstrain/core/accelerator.h"
#include "dstrain/core/error.h"
#include "dstrain/core/fp8_quantization.h"

namespace dstrain {
namespace {

// How one exchange moves rows (a struct, not tensors: autograd functions take it as it is).
struct RowRoute {
  std::vector<int64_t> send_rows, recv_rows;
  const LaneGroups* groups;
  ExchangeCounters* counters;  // nullptr: not counted
};

// Each exchange of a training pass adds its wait and the bytes this rank sends to other ranks.
void count(const RowRoute& route, const Interval& wait, const torch::Tensor& rows) {
  if (!route.counters) return;
  route.counters->nanoseconds += static_cast<int64_t>(wait.length() * 1e9);
  const int64_t me = route.groups->current()->rank();
  const int64_t row_bytes = rows.dim() == 0 || rows.size(0) == 0 ? 0 : rows.nbytes() / rows.size(0);
  int64_t sent = 0;
  for (size_t r = 0; r < route.send_rows.size(); ++r)
    if (static_cast<int64_t>(r) != me) sent += route.send_rows[r];
  route.counters->bytes_sent += sent * row_bytes;
}

torch::Tensor all_to_all_rows(const torch::Tensor& rows, const RowRoute& route) {
  const double start = steady_seconds();
  const torch::Tensor input = rows.contiguous();
  int64_t received = 0;
  for (int64_t count : route.recv_rows) received += count;
  std::vector<int64_t> shape = input.sizes().vec();
  shape[0] = received;
  torch::Tensor output = torch::empty(shape, input.options());
  route.groups->current()->all_to_all(output, input, route.send_rows, route.recv_rows);
  const Interval wait{start, steady_seconds()};
  note_wait(wait);
  count(route, wait, input);
  return output;
}

// DeepSeek-V3's FP8 dispatch: the rows travel as E4M3 in 1×128 tiles with their fp32 scales (about
// half of bf16's bytes) and arrive dequantized, in the rows' dtype. The experts' FP8 products
// quantize them again in the same tiles, which finds (up to the last bit of a scale) the same codes.
torch::Tensor all_to_all_fp8_rows(const torch::Tensor& rows, const RowRoute& route) {
  const Fp8Tensor q = fp8_quantize(rows, {1, kFp8TileEdge});
  const Fp8Tensor arrived{all_to_all_rows(q.codes, route), all_to_all_rows(q.scales, route), q.tile};
  return fp8_dequantize(arrived).to(rows.scalar_type());
}

// The gradients travel back the reverse way in the backward pass, through the communicator of the
// lane that runs it, in their own dtype (`fp8` quantizes the forward pass's rows only: the
// gradient of a rounding is taken as the identity).
class ExchangeRowsFunction : public torch::autograd::Function<ExchangeRowsFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& rows,
                               const RowRoute& route, bool fp8) {
    ctx->saved_data["send_rows"] = route.send_rows;
    ctx->saved_data["recv_rows"] = route.recv_rows;
    ctx->saved_data["groups"] = reinterpret_cast<int64_t>(route.groups);
    ctx->saved_data["counters"] = reinterpret_cast<int64_t>(route.counters);
    return fp8 ? all_to_all_fp8_rows(rows, route) : all_to_all_rows(rows, route);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    // The reverse route: what was received goes back to where it came from.
    const RowRoute back{ctx->saved_data["recv_rows"].toIntVector(), ctx->saved_data["send_rows"].toIntVector(),
                        reinterpret_cast<const LaneGroups*>(ctx->saved_data["groups"].toInt()),
                        reinterpret_cast<ExchangeCounters*>(ctx->saved_data["counters"].toInt())};
    return {all_to_all_rows(grads[0], back), torch::Tensor(), torch::Tensor()};
  }
};

// The order that puts the received rows (source by source, expert by expert within a source)
// expert by expert, from every source.
torch::Tensor expert_order(const ExchangePlan& plan, int64_t local_experts, const torch::Device& device) {
  const int64_t sources = static_cast<int64_t>(plan.recv_rows.size());
  std::vector<int64_t> block_start(plan.received_by_expert.size());
  int64_t at = 0;
  for (size_t i = 0; i < block_start.size(); ++i) {
    block_start[i] = at;
    at += plan.received_by_expert[i];
  }
  std::vector<int64_t> by_expert;
  by_expert.reserve(static_cast<size_t>(at));
  for (int64_t e = 0; e < local_experts; ++e)
    for (int64_t s = 0; s < sources; ++s) {
      const size_t block = static_cast<size_t>(s * local_experts + e);
      for (int64_t row = 0; row < plan.received_by_expert[block]; ++row) by_expert.push_back(block_start[block] + row);
    }
  return torch::tensor(by_expert, torch::kInt64).to(device);
}

}  // namespace

ExpertAllToAll::ExpertAllToAll(LaneGroups groups, bool fp8_dispatch) : groups_(groups), fp8_dispatch_(fp8_dispatch) {}

ExpertShard ExpertAllToAll::shard() const {
  const Communicator& group = *groups_.main();
  return {group.rank(), group.size()};
}

ExchangePlan ExpertAllToAll::plan(const torch::Tensor& rows_per_expert, bool measured) {
  Communicator& group = *groups_.current();
  const int64_t ranks = group.size(), experts = rows_per_expert.size(0);
  if (experts % ranks != 0)
    throw Error(ExitCode::kInternal, "expert dispatch: " + std::to_string(experts) + " experts over " +
                                         std::to_string(ranks) + " ranks");
  const int64_t local = experts / ranks;
  // Row r of `mine`: this rank's rows for rank r's experts; row s of `theirs`: rank s's rows for mine.
  const torch::Tensor mine = rows_per_expert.to(torch::kInt64).reshape({ranks, local}).contiguous();
  torch::Tensor theirs = torch::empty_like(mine);
  const std::vector<int64_t> one_row_each(static_cast<size_t>(ranks), 1);
  group.all_to_all(theirs, mine, one_row_each, one_row_each);
  torch::Tensor host;
  {
    accel::HostSyncExpected counts;  // the sizes of the exchange: one wait per layer
    host = torch::stack({mine, theirs}).to(torch::kCPU);
  }
  ExchangePlan plan;
  const torch::Tensor sent = host[0].sum(1), received = host[1].sum(1), per_expert = host[1].sum(0);
  plan.send_rows.assign(sent.data_ptr<int64_t>(), sent.data_ptr<int64_t>() + ranks);
  plan.recv_rows.assign(received.data_ptr<int64_t>(), received.data_ptr<int64_t>() + ranks);
  const torch::Tensor by_source = host[1].contiguous();
  plan.received_by_expert.assign(by_source.data_ptr<int64_t>(), by_source.data_ptr<int64_t>() + by_source.numel());
  plan.rows_per_expert.assign(per_expert.data_ptr<int64_t>(), per_expert.data_ptr<int64_t>() + local);
  plan.expert_order = expert_order(plan, local, rows_per_expert.device());
  plan.measured = measured;
  return plan;
}

torch::Tensor ExpertAllToAll::dispatch(const torch::Tensor& rows, const ExchangePlan& plan) {
  ExchangeCounters* counters = plan.measured ? &counters_ : nullptr;
  const torch::Tensor received = ExchangeRowsFunction::apply(
      rows, RowRoute{plan.send_rows, plan.recv_rows, &groups_, counters}, fp8_dispatch_);
  return received.index_select(0, plan.expert_order.to(received.device()));
}

torch::Tensor ExpertAllToAll::combine(const torch::Tensor& computed, const ExchangePlan& plan) {
  ExchangeCounters* counters = plan.measured ? &counters_ : nullptr;
  // Nothing received works too: the (empty) rows still lead back through the exchange, whose
  // backward pass the peers wait for.
  const torch::Tensor arrived = computed.index_select(0, plan.expert_order.to(computed.device()).argsort());
  return ExchangeRowsFunction::apply(arrived, RowRoute{plan.recv_rows, plan.send_rows, &groups_, counters}, false);
}

double ExpertAllToAll::take_seconds() { return static_cast<double>(counters_.nanoseconds.exchange(0)) * 1e-9; }

int64_t ExpertAllToAll::take_bytes_sent() { return counters_.bytes_sent.exchange(0); }

}  // namespace dstrain
