#include "dstrain/train/report_fields.h"

#include <algorithm>
#include <memory>

#include "dstrain/pipeline/bubble.h"

namespace dstrain {
namespace {

// The number of pipelines (the pp groups), and the place of this rank's among them.
struct Pipelines {
  int count, mine;
};
Pipelines pipelines(const ParallelContext& parallel) {
  const std::vector<std::vector<int>> all = parallel.grid().all(Group::kPp);
  int mine = 0;
  while (std::find(all[mine].begin(), all[mine].end(), parallel.world_rank()) == all[mine].end()) ++mine;
  return {static_cast<int>(all.size()), mine};
}

// What one forward, backward and weight-gradient action of each virtual stage took in the
// interval, averaged over the pipelines: every rank fills its own stage's places.
std::vector<ActionCosts> measured_action_costs(PipelineExecutor& executor, ParallelContext& parallel) {
  const Schedule& schedule = executor.training_schedule();
  const int virtual_stages = schedule.pp * schedule.virtual_stages;
  torch::Tensor costs = torch::zeros({virtual_stages, 3}, torch::kFloat64);
  const std::vector<ActionCosts> mine = executor.take_action_costs();
  for (size_t chunk = 0; chunk < mine.size(); ++chunk) {
    const int vs = schedule.virtual_stage(parallel.group(Group::kPp).rank(), static_cast<int>(chunk));
    costs[vs][0] = mine[chunk].forward;
    costs[vs][1] = mine[chunk].backward;
    costs[vs][2] = mine[chunk].weight;
  }
  parallel.world().all_reduce(costs, ReduceOp::kSum);
  costs /= pipelines(parallel).count;
  std::vector<ActionCosts> by_virtual_stage;
  for (int vs = 0; vs < virtual_stages; ++vs)
    by_virtual_stage.push_back({costs[vs][0].item<double>(), costs[vs][1].item<double>(), costs[vs][2].item<double>()});
  return by_virtual_stage;
}

// The bubble of each pipeline (pipeline/bubble.h) from its stages' waits and spans in the
// interval, averaged over the pipelines.
double measured_bubble(PipelineExecutor& executor, ParallelContext& parallel) {
  const auto [waited, span] = executor.take_wait_and_span();
  const Pipelines pipes = pipelines(parallel);
  const int stages = parallel.group(Group::kPp).size(), stage = parallel.group(Group::kPp).rank();
  torch::Tensor all = torch::zeros({pipes.count, stages, 2}, torch::kFloat64);
  all[pipes.mine][stage][0] = waited;
  all[pipes.mine][stage][1] = span;
  parallel.world().all_reduce(all, ReduceOp::kSum);
  double sum = 0;
  for (int pipeline = 0; pipeline < pipes.count; ++pipeline) {
    std::vector<StageWaits> waits;
    for (int s = 0; s < stages; ++s)
      waits.push_back({all[pipeline][s][0].item<double>(), all[pipeline][s][1].item<double>()});
    sum += pipeline_bubble(waits);
  }
  return sum / pipes.count;
}

}  // namespace

StepReport::FieldSource pipeline_bubble_field(PipelineExecutor& executor, ParallelContext& parallel) {
  return [&executor, &parallel](nlohmann::json& record) {
    record["pipeline_idle"] = measured_bubble(executor, parallel);
    // Beside it, what the schedule would idle if its actions took the times measured and the
    // transfers none (the simulator), and those times.
    SimulationCosts costs;
    costs.per_virtual_stage = measured_action_costs(executor, parallel);
    const SimulationResult predicted = simulate(executor.training_schedule(), costs);
    if (!predicted.deadlock) record["pipeline_idle_predicted"] = predicted.bubble_fraction;
    // One number per virtual stage, in their order.
    for (const ActionCosts& c : costs.per_virtual_stage) {
      record["pipeline_forward_ms"].push_back(1000 * c.forward);
      record["pipeline_backward_ms"].push_back(1000 * c.backward);
      if (executor.training_schedule().splits_backward()) record["pipeline_weight_ms"].push_back(1000 * c.weight);
    }
  };
}

StepReport::FieldSource expert_balance_field(const MoeBalancing& balancing) {
  return [&balancing](nlohmann::json& record) {
    auto add = [&](const char* key, const std::vector<std::pair<int64_t, double>>& values) {
      nlohmann::json by_layer = nlohmann::json::object();
      for (const auto& [layer, value] : values) by_layer[std::to_string(layer)] = value;
      if (!by_layer.empty()) record[key] = by_layer;
    };
    add("expert_load_max_over_mean", balancing.expert_balance());  // 1 is perfect balance
    add("ep_load_max_over_mean", balancing.ep_rank_balance());
    add("ep_ranks_per_token", balancing.ep_ranks_per_token());
  };
}

StepReport::FieldSource context_parallel_ring_field(const ContextParallelGroup& ring, ParallelContext& parallel,
                                                    int64_t start_step) {
  auto last = std::make_shared<std::pair<int64_t, int64_t>>(start_step, ring.bytes_passed());  // step, bytes
  return [&ring, &parallel, last](nlohmann::json& record) {
    const int64_t step = record["step"].get<int64_t>();
    const double steps = static_cast<double>(std::max<int64_t>(1, step - last->first));
    torch::Tensor per_step =
        torch::tensor({static_cast<double>(ring.bytes_passed() - last->second) / steps}, torch::kFloat64);
    *last = {step, ring.bytes_passed()};
    parallel.world().all_reduce(per_step, ReduceOp::kAvg);
    record["cp_ring_bytes"] = per_step[0].item<double>();
  };
}

StepReport::FieldSource expert_exchange_field(ExpertAllToAll& exchange, PipelineExecutor& executor,
                                              ParallelContext& parallel, int64_t start_step) {
  auto last_step = std::make_shared<int64_t>(start_step);
  return [&exchange, &executor, &parallel, last_step](nlohmann::json& record) {
    // The interval's training passes only: evaluation's exchanges are not counted.
    const double seconds = exchange.take_seconds();
    const int64_t step = record["step"].get<int64_t>();
    const double interval = record["step_time_s"].get<double>() * static_cast<double>(step - *last_step);
    const double steps = static_cast<double>(std::max<int64_t>(1, step - *last_step));
    *last_step = step;
    // [share of the interval, exchange seconds, of them hidden by the other lane of a pair, bytes
    // sent a step]
    torch::Tensor sums = torch::tensor({interval > 0 ? seconds / interval : 0.0, seconds,
                                        executor.take_hidden_exchange_seconds(),
                                        static_cast<double>(exchange.take_bytes_sent()) / steps},
                                       torch::kFloat64);
    parallel.world().all_reduce(sums, ReduceOp::kSum);
    record["expert_exchange_share"] = sums[0].item<double>() / parallel.world().size();
    record["expert_exchange_bytes"] = sums[3].item<double>() / parallel.world().size();
    if (executor.pairs_side_by_side() && sums[1].item<double>() > 0)
      record["expert_exchange_hidden"] = sums[2].item<double>() / sums[1].item<double>();
  };
}

StepReport::FieldSource data_parallel_comm_field(const ModelGradients& grads, ParallelContext& parallel,
                                                 bool host_clocks) {
  auto last = std::make_shared<CommunicationRecord>(grads.communication());
  return [&grads, &parallel, last, host_clocks](nlohmann::json& record) {
    const CommunicationRecord now = grads.communication();
    const double steps = static_cast<double>(std::max<int64_t>(1, now.steps - last->steps));
    torch::Tensor per_step =
        torch::tensor({(now.in_flight_s - last->in_flight_s) / steps, (now.exposed_s - last->exposed_s) / steps,
                       static_cast<double>(now.bytes_sent - last->bytes_sent) / steps},
                      torch::kFloat64);
    *last = now;
    parallel.world().all_reduce(per_step, ReduceOp::kAvg);
    if (host_clocks) {
      record["dp_comm_s"] = per_step[0].item<double>();
      record["dp_comm_exposed_s"] = per_step[1].item<double>();
    }
    record["dp_comm_bytes"] = per_step[2].item<double>();
  };
}

}  // namespace dstrain
