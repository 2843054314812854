#include "dstrain/pipeline/schedule.h"

#include <algorithm>
#include <tuple>

#include "dstrain/core/error.h"

namespace dstrain {
namespace {

struct Compute {
  bool forward;
  int microbatch, chunk;
};

// The compute actions of stage `s`, in segments: a segment's computes run back to back, and the
// transfers between two segments (the sends of the one before, the receives of the one after)
// form one group. 1F1B alternates single forwards and backwards with a group in between, as
// Megatron's send_forward_recv_backward / send_backward_recv_forward do; the interleaved steady
// state pairs a forward with a backward and exchanges everything after the pair, as Megatron's
// send_forward_backward_recv_forward_backward does (a group between them would deadlock).
using Segment = std::vector<Compute>;

std::vector<Segment> compute_segments(ScheduleKind kind, int pp, int v, int m, int s) {
  // Micro-batches go through the chunks in groups of pp (Narayanan et al. 2021, as Megatron-Core
  // orders them): forward k runs chunk (k / pp) mod v, backward k runs the chunks in reverse.
  // With one chunk, forward k is simply micro-batch k.
  auto microbatch_of = [&](int k) { return (k / (pp * v)) * pp + k % pp; };
  auto forward = [&](int k) { return Compute{true, microbatch_of(k), (k / pp) % v}; };
  auto backward = [&](int k) { return Compute{false, microbatch_of(k), v - 1 - (k / pp) % v}; };
  const int total = m * v;
  std::vector<Segment> segments;
  if (kind == ScheduleKind::kGPipe || kind == ScheduleKind::kForwardOnly) {
    for (int k = 0; k < total; ++k) segments.push_back({forward(k)});
    if (kind == ScheduleKind::kGPipe)
      for (int k = 0; k < total; ++k) segments.push_back({backward(k)});
    return segments;
  }
  // 1F1B: warm-up forwards fill the pipeline below this stage, then one forward and one backward
  // in turn, then the remaining backwards; at most pp - s micro-batches are in flight. The
  // interleaved variant warms up longer, for its v chunks.
  const bool interleaved = kind == ScheduleKind::kInterleaved;
  const int warmup = interleaved ? std::min((pp - s - 1) * 2 + (v - 1) * pp, total) : std::min(pp - s - 1, total);
  for (int k = 0; k < warmup; ++k) segments.push_back({forward(k)});
  for (int k = warmup; k < total; ++k) {
    if (interleaved) {
      segments.push_back({forward(k), backward(k - warmup)});
    } else {
      segments.push_back({forward(k)});
      segments.push_back({backward(k - warmup)});
    }
  }
  for (int k = total - warmup; k < total; ++k) segments.push_back({backward(k)});
  return segments;
}

}  // namespace

ScheduleKind schedule_kind_named(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::kOneFOneB;
  if (name == "interleaved") return ScheduleKind::kInterleaved;
  throw config_error("parallel.schedule", name, "expected gpipe, 1f1b or interleaved");
}

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe: return "gpipe";
    case ScheduleKind::kOneFOneB: return "1f1b";
    case ScheduleKind::kInterleaved: return "interleaved";
    case ScheduleKind::kForwardOnly: return "forward-only";
  }
  return "?";
}

void check_schedule(ScheduleKind kind, int pp, int v, int m) {
  if (kind == ScheduleKind::kInterleaved) {
    if (v < 2)
      throw config_error("parallel.virtual_stages", std::to_string(v),
                         "the interleaved schedule needs at least 2 chunks per stage");
    if (m < pp || m % pp != 0)
      throw config_error("train.grad_accum", std::to_string(m),
                         "the interleaved schedule needs micro-batches in multiples of parallel.pp = " +
                             std::to_string(pp) + " (train.grad_accum is the number of micro-batches)");
  } else if (v != 1) {
    throw config_error("parallel.virtual_stages", std::to_string(v),
                       std::string("the ") + schedule_name(kind) +
                           " schedule runs one chunk per stage; use 1, or parallel.schedule = interleaved");
  }
}

TransferId transfer_id(const Schedule& schedule, int stage, const Action& t) {
  const bool activation = t.kind == ActionKind::kSendActivation || t.kind == ActionKind::kRecvActivation;
  const bool send = t.kind == ActionKind::kSendActivation || t.kind == ActionKind::kSendGrad;
  const int mine = schedule.virtual_stage(stage, t.chunk);
  // A received activation comes from the previous virtual stage, a received gradient from the next.
  return {activation, t.microbatch, send ? mine : mine + (activation ? -1 : 1)};
}

int transfer_tag(const Schedule& schedule, const TransferId& id) {
  const int virtual_stages = schedule.pp * schedule.virtual_stages;
  // Unique within any window of transfers that can be in flight at once.
  return ((id.microbatch * virtual_stages + id.from_virtual_stage) * 2 + (id.activation ? 0 : 1)) % 32768;
}

Schedule make_schedule(ScheduleKind kind, int pp, int v, int m) {
  Schedule schedule{kind, pp, v, m, {}};
  const int last = pp * v - 1;
  for (int s = 0; s < pp; ++s) {
    std::vector<Action>& actions = schedule.stages.emplace_back();
    // What a compute sends after it, and what it needs before it.
    auto send_of = [&](const Compute& c, std::vector<Action>* out) {
      const int vs = c.chunk * pp + s;
      if (c.forward && vs < last) out->push_back({ActionKind::kSendActivation, c.microbatch, c.chunk, (s + 1) % pp});
      if (!c.forward && vs > 0) out->push_back({ActionKind::kSendGrad, c.microbatch, c.chunk, (s + pp - 1) % pp});
    };
    auto receive_of = [&](const Compute& c, std::vector<Action>* out) {
      const int vs = c.chunk * pp + s;
      if (c.forward && vs > 0) out->push_back({ActionKind::kRecvActivation, c.microbatch, c.chunk, (s + pp - 1) % pp});
      if (!c.forward && vs < last) out->push_back({ActionKind::kRecvGrad, c.microbatch, c.chunk, (s + 1) % pp});
    };
    // Both ends post a group's transfers in one canonical order (what, from which virtual stage,
    // which micro-batch), so that NCCL, which matches transfers between two ranks in posting
    // order, pairs them right when two go the same way in one group.
    auto flush = [&](std::vector<Action>& group) {
      std::sort(group.begin(), group.end(), [&](const Action& a, const Action& b) {
        TransferId x = transfer_id(schedule, s, a), y = transfer_id(schedule, s, b);
        return std::make_tuple(!x.activation, x.from_virtual_stage, x.microbatch) <
               std::make_tuple(!y.activation, y.from_virtual_stage, y.microbatch);
      });
      actions.insert(actions.end(), group.begin(), group.end());
      group.clear();
    };
    std::vector<Action> group;
    for (const Segment& segment : compute_segments(kind, pp, v, m, s)) {
      for (const Compute& c : segment) receive_of(c, &group);
      flush(group);
      for (const Compute& c : segment) {
        actions.push_back({c.forward ? ActionKind::kForward : ActionKind::kBackward, c.microbatch, c.chunk});
        send_of(c, &group);
      }
    }
    flush(group);
  }
  return schedule;
}

}  // namespace dstrain
