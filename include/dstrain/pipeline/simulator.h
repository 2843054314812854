// Runs a schedule on paper: each stage works through its actions, computes take the given time,
// transfer groups complete when their peers have posted the matching transfers (in the order the
// peers post them, as NCCL matches them; where sends do not wait for their receivers, in the order
// of each channel, as schedule.h's same_channel promises). Reports deadlocks, idle time, the bubble
// and how many micro-batches' activations each stage keeps alive at once.
#pragma once

#include <string>
#include <vector>

#include "dstrain/pipeline/schedule.h"

namespace dstrain {

// What one action of a virtual stage takes: a forward, a backward (the input's gradient alone
// where the schedule splits it) and a weight-gradient action.
struct ActionCosts {
  double forward = 0, backward = 0, weight = 0;
};

struct SimulationCosts {
  double forward = 1.0, backward = 2.0;  // of one micro-batch through a whole stage (all its chunks)
  double weight = 1.0;                   // the part of `backward` that is the weights' gradients (W)
  double transfer = 0.0;                 // of one point-to-point group
  // Measured ones, per virtual stage; when given, they replace the uniform costs above.
  std::vector<ActionCosts> per_virtual_stage;

  ActionCosts of(const Schedule& schedule, int virtual_stage) const;
};

// A stage's state after one of its compute actions: the micro-batch chunks that keep their
// activations for their B, those that keep only what their W needs (split schedules), which
// recomputation does not shrink, and the actions around it, which say what is made at that moment
// besides (activation_memory.h: the LM head's logits after a forward, its gradients as a B
// starts, the embedding's gradient as a B ends).
struct LiveState {
  int awaiting_backward = 0, awaiting_weights = 0;
  ActionKind reached_by = ActionKind::kForward;  // the action just run
  bool backward_next = false;                     // the stage's next compute action is a B

  bool operator==(const LiveState& o) const {
    return awaiting_backward == o.awaiting_backward && awaiting_weights == o.awaiting_weights &&
           reached_by == o.reached_by && backward_next == o.backward_next;
  }
};

struct SimulationResult {
  bool deadlock = false;
  std::string problem;               // what went wrong (deadlock or mismatched transfers), for people
  double makespan = 0;               // until the last stage finishes
  std::vector<double> busy, idle;    // per stage; idle = makespan - busy
  double bubble_fraction = 0;        // total idle / (stages × makespan)
  std::vector<int> peak_live;        // per stage: most micro-batch chunks with activations kept (until W)
  std::vector<std::vector<LiveState>> live_states;  // per stage: each state reached, once
  // Per stage: [start, end) of each compute action, in the stage's order.
  struct Span {
    double start, end;
    Action action;
  };
  std::vector<std::vector<Span>> timeline;
};

SimulationResult simulate(const Schedule& schedule, const SimulationCosts& costs);

// One row per stage: a character per `resolution` time units: forwards as the micro-batch's
// last digit, backwards as a letter (a = 0, b = 1, ...), weight gradients as the upper-case
// letter, idle as '.'.
std::string render_timeline(const SimulationResult& result, double resolution);

}  // namespace dstrain
