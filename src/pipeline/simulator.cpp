#include "dstrain/pipeline/simulator.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <sstream>

namespace dstrain {
namespace {

std::string describe(const Action& a) {
  const char* names[] = {"forward", "backward", "send activation", "receive activation", "send gradient",
                         "receive gradient", "weight gradient"};
  return std::string(names[static_cast<int>(a.kind)]) + " of micro-batch " + std::to_string(a.microbatch) +
         ", chunk " + std::to_string(a.chunk) + (a.peer >= 0 ? ", peer stage " + std::to_string(a.peer) : "");
}

}  // namespace

ActionCosts SimulationCosts::of(const Schedule& schedule, int virtual_stage) const {
  if (!per_virtual_stage.empty()) return per_virtual_stage.at(static_cast<size_t>(virtual_stage));
  const double v = schedule.virtual_stages;
  if (schedule.splits_backward()) return {forward / v, (backward - weight) / v, weight / v};
  return {forward / v, backward / v, 0.0};
}

SimulationResult simulate(const Schedule& schedule, const SimulationCosts& costs) {
  const int pp = schedule.pp;
  SimulationResult result;
  result.busy.assign(pp, 0.0);
  result.peak_live.assign(pp, 0);
  result.live_states.assign(pp, {});
  result.timeline.assign(pp, {});
  std::vector<size_t> next(pp, 0);
  std::vector<double> clock(pp, 0.0);
  std::vector<int> awaiting_backward(pp, 0), awaiting_weights(pp, 0);
  // Per directed pair (from, to): messages posted by the sender and by the receiver, matched
  // first to first; each with the time it was posted.
  struct Posted {
    TransferId id;
    double time;
  };
  std::map<std::pair<int, int>, std::deque<Posted>> sent, received;
  // Per stage: the group being waited on, as (pair, index in that pair's queue, sender side?).
  struct Pending {
    std::pair<int, int> pair;
    size_t index;
    bool is_send;
  };
  std::vector<std::vector<Pending>> waiting(pp);
  std::vector<bool> posted(pp, false);

  auto group_end = [&](int s) {  // index after the transfer group starting at next[s]
    size_t i = next[s];
    while (i < schedule.stages[s].size() && !schedule.stages[s][i].is_compute()) ++i;
    return i;
  };

  auto next_compute_is_backward = [&](int s) {  // after the compute action at next[s]
    const std::vector<Action>& actions = schedule.stages[s];
    for (size_t i = next[s] + 1; i < actions.size(); ++i)
      if (actions[i].is_compute()) return actions[i].kind == ActionKind::kBackward;
    return false;
  };

  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < pp; ++s) {
      const std::vector<Action>& actions = schedule.stages[s];
      while (next[s] < actions.size()) {
        const Action& a = actions[next[s]];
        if (a.is_compute()) {
          const ActionCosts c = costs.of(schedule, schedule.virtual_stage(s, a.chunk));
          const double cost = a.kind == ActionKind::kForward    ? c.forward
                              : a.kind == ActionKind::kBackward ? c.backward
                                                                : c.weight;
          result.timeline[s].push_back({clock[s], clock[s] + cost, a});
          clock[s] += cost;
          result.busy[s] += cost;
          // A micro-batch's activations stay until its backward pass; a split one's B leaves what
          // its weight gradients need until W.
          if (a.kind == ActionKind::kForward) ++awaiting_backward[s];
          if (a.kind == ActionKind::kBackward) --awaiting_backward[s];
          if (a.kind == ActionKind::kBackward && schedule.splits_backward()) ++awaiting_weights[s];
          if (a.kind == ActionKind::kWeight) --awaiting_weights[s];
          result.peak_live[s] = std::max(result.peak_live[s], awaiting_backward[s] + awaiting_weights[s]);
          const LiveState state{awaiting_backward[s], awaiting_weights[s], a.kind, next_compute_is_backward(s)};
          std::vector<LiveState>& states = result.live_states[s];
          if (std::find(states.begin(), states.end(), state) == states.end()) states.push_back(state);
          ++next[s];
          progress = true;
          continue;
        }
        const size_t end = group_end(s);
        if (!posted[s]) {
          for (size_t i = next[s]; i < end; ++i) {
            const Action& t = actions[i];
            const bool is_send = t.kind == ActionKind::kSendActivation || t.kind == ActionKind::kSendGrad;
            const std::pair<int, int> pair = is_send ? std::make_pair(s, t.peer) : std::make_pair(t.peer, s);
            auto& queue = is_send ? sent[pair] : received[pair];
            queue.push_back({transfer_id(schedule, s, t), clock[s]});
            waiting[s].push_back({pair, queue.size() - 1, is_send});
          }
          posted[s] = true;
          progress = true;
        }
        // Complete when every transfer of the group has its other end posted; where sends do not
        // wait (send_async), when every receive has its send posted: the send at the same place
        // among its channel's (same_channel), which must be the same transfer.
        double done = clock[s];
        bool complete = true;
        for (const Pending& p : waiting[s]) {
          if (schedule.sends_without_waiting()) {
            if (p.is_send) continue;
            const auto& receives = received[p.pair];
            const TransferId& id = receives[p.index].id;
            auto in_channel = [&](const Posted& x) { return same_channel(x.id, id); };
            const auto place = std::count_if(receives.begin(), receives.begin() + p.index, in_channel);
            const std::deque<Posted>& sends = sent[p.pair];
            auto match = std::find_if(sends.begin(), sends.end(), in_channel);
            for (auto n = place; match != sends.end() && n > 0; --n) match = std::find_if(match + 1, sends.end(), in_channel);
            if (match == sends.end()) {
              complete = false;
              break;
            }
            if (!(match->id == id)) {
              result.deadlock = true;
              result.problem = "stage " + std::to_string(s) + ": " + describe(actions[next[s]]) +
                               " is posted in another order than stage " + std::to_string(p.pair.first) +
                               " sends its channel's transfers";
              return result;
            }
            done = std::max(done, match->time);
            continue;
          }
          auto& mine = p.is_send ? sent[p.pair] : received[p.pair];
          auto& theirs = p.is_send ? received[p.pair] : sent[p.pair];
          if (theirs.size() <= p.index) {
            complete = false;
            break;
          }
          if (!(mine[p.index].id == theirs[p.index].id)) {
            result.deadlock = true;
            result.problem = "stage " + std::to_string(s) + ": " + describe(actions[next[s]]) +
                             " is matched, in posting order, with a different transfer of stage " +
                             std::to_string(p.is_send ? p.pair.second : p.pair.first);
            return result;
          }
          done = std::max({done, mine[p.index].time, theirs[p.index].time});
        }
        if (!complete) break;
        clock[s] = done + costs.transfer;
        waiting[s].clear();
        posted[s] = false;
        next[s] = end;
        progress = true;
      }
    }
  }
  for (int s = 0; s < pp; ++s) {
    if (next[s] < schedule.stages[s].size()) {
      result.deadlock = true;
      if (result.problem.empty())
        result.problem = "deadlock: stage " + std::to_string(s) + " waits forever at " +
                         describe(schedule.stages[s][next[s]]);
    }
  }
  if (result.deadlock) return result;
  result.makespan = *std::max_element(clock.begin(), clock.end());
  double idle_total = 0;
  for (int s = 0; s < pp; ++s) {
    result.idle.push_back(result.makespan - result.busy[s]);
    idle_total += result.idle.back();
  }
  result.bubble_fraction = result.makespan > 0 ? idle_total / (pp * result.makespan) : 0.0;
  return result;
}

std::string render_timeline(const SimulationResult& result, double resolution) {
  std::ostringstream out;
  const int width = static_cast<int>(std::ceil(result.makespan / resolution - 1e-9));
  for (size_t s = 0; s < result.timeline.size(); ++s) {
    std::string row(width, '.');
    for (const auto& span : result.timeline[s]) {
      const int microbatch = span.action.microbatch;
      const char mark = span.action.kind == ActionKind::kForward    ? static_cast<char>('0' + microbatch % 10)
                        : span.action.kind == ActionKind::kBackward ? static_cast<char>('a' + microbatch % 26)
                                                                    : static_cast<char>('A' + microbatch % 26);
      for (int t = static_cast<int>(std::lround(span.start / resolution));
           t < static_cast<int>(std::lround(span.end / resolution)) && t < width; ++t)
        row[t] = mark;
    }
    out << "stage " << s << " |" << row << "|\n";
  }
  return out.str();
}

}  // namespace dstrain
