#include "dstrain/model/expert_dispatch.h"

#include <torch/csrc/autograd/custom_function.h>

#include "dstrain/core/accelerator.h"
#include "dstrain/core/error.h"

namespace dstrain {
namespace {

// How one exchange moves rows (a struct, not tensors: autograd functions take it as it is).
struct RowRoute {
  std::vector<int64_t> send_rows, recv_rows;
  const LaneGroups* groups;
  double* seconds;
};

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
  if (route.seconds) *route.seconds += wait.length();
  return output;
}

class ExchangeRowsFunction : public torch::autograd::Function<ExchangeRowsFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& rows,
                               const RowRoute& route) {
    ctx->saved_data["send_rows"] = route.send_rows;
    ctx->saved_data["recv_rows"] = route.recv_rows;
    ctx->saved_data["groups"] = reinterpret_cast<int64_t>(route.groups);
    ctx->saved_data["seconds"] = reinterpret_cast<int64_t>(route.seconds);
    return all_to_all_rows(rows, route);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    // The reverse route: what was received goes back to where it came from.
    const RowRoute back{ctx->saved_data["recv_rows"].toIntVector(), ctx->saved_data["send_rows"].toIntVector(),
                        reinterpret_cast<const LaneGroups*>(ctx->saved_data["groups"].toInt()),
                        reinterpret_cast<double*>(ctx->saved_data["seconds"].toInt())};
    return {all_to_all_rows(grads[0], back), torch::Tensor()};
  }
};

}  // namespace

DispatchPlan plan_dispatch(const torch::Tensor& expert_rows, Communicator& group) {
  const int64_t ranks = group.size(), experts = expert_rows.size(0);
  if (experts % ranks != 0)
    throw Error(ExitCode::kInternal, "expert dispatch: " + std::to_string(experts) + " experts over " +
                                         std::to_string(ranks) + " ranks");
  DispatchPlan plan;
  plan.local_experts = experts / ranks;
  // Row r of `mine`: this rank's rows for rank r's experts; row s of `theirs`: rank s's rows for mine.
  const torch::Tensor mine = expert_rows.to(torch::kInt64).reshape({ranks, plan.local_experts}).contiguous();
  torch::Tensor theirs = torch::empty_like(mine);
  const std::vector<int64_t> one_row_each(static_cast<size_t>(ranks), 1);
  group.all_to_all(theirs, mine, one_row_each, one_row_each);
  torch::Tensor host;
  {
    accel::HostSyncExpected counts;  // the sizes of the exchange: one wait per layer
    host = torch::stack({mine, theirs}).to(torch::kCPU);
  }
  const torch::Tensor sent = host[0].sum(1), received = host[1].sum(1);
  plan.send_rows.assign(sent.data_ptr<int64_t>(), sent.data_ptr<int64_t>() + ranks);
  plan.recv_rows.assign(received.data_ptr<int64_t>(), received.data_ptr<int64_t>() + ranks);
  const torch::Tensor by_expert = host[1].contiguous();
  plan.received_by_expert.assign(by_expert.data_ptr<int64_t>(), by_expert.data_ptr<int64_t>() + by_expert.numel());
  return plan;
}

torch::Tensor exchange_rows(const torch::Tensor& rows, const std::vector<int64_t>& send_rows,
                            const std::vector<int64_t>& recv_rows, const LaneGroups& groups, double* seconds) {
  return ExchangeRowsFunction::apply(rows, RowRoute{send_rows, recv_rows, &groups, seconds});
}

torch::Tensor run_local_experts(const torch::Tensor& received, const DispatchPlan& plan, GroupedExperts& experts) {
  const int64_t sources = static_cast<int64_t>(plan.recv_rows.size()), local = plan.local_experts;
  // Where each expert's rows lie: source by source, expert by expert within a source.
  std::vector<int64_t> block_start(plan.received_by_expert.size());
  int64_t at = 0;
  for (size_t i = 0; i < block_start.size(); ++i) {
    block_start[i] = at;
    at += plan.received_by_expert[i];
  }
  // The order that puts each expert's rows together (from every source), and its inverse.
  std::vector<int64_t> by_expert, rows_per_expert(static_cast<size_t>(local), 0);
  by_expert.reserve(static_cast<size_t>(at));
  for (int64_t e = 0; e < local; ++e)
    for (int64_t s = 0; s < sources; ++s) {
      const size_t block = static_cast<size_t>(s * local + e);
      rows_per_expert[static_cast<size_t>(e)] += plan.received_by_expert[block];
      for (int64_t row = 0; row < plan.received_by_expert[block]; ++row) by_expert.push_back(block_start[block] + row);
    }
  const torch::Tensor order = torch::tensor(by_expert, torch::kInt64).to(received.device());
  // Nothing received works too: the (empty) rows still lead back through the exchange, whose
  // backward pass the peers wait for.
  const torch::Tensor computed = experts(received.index_select(0, order), rows_per_expert);
  return computed.index_select(0, order.argsort());
}

}  // namespace dstrain
