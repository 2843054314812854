#include "dstrain/pipeline/schedule.h"

#include <algorithm>
#include <deque>
#include <tuple>

#include "dstrain/core/error.h"

namespace dstrain {
namespace {

struct Compute {
  ActionKind kind;  // kForward, kBackward or kWeight
  int microbatch, chunk;
  bool paired = false;  // a forward paired with the backward pass after it (Action::paired)
};

// The compute actions of stage `s`, in segments: a segment's computes run back to back, and the
// transfers between two segments (the sends of the one before, the receives of the one after)
// form one group. 1F1B alternates single forwards and backwards with a group in between, as
// Megatron's send_forward_recv_backward / send_backward_recv_forward do; the interleaved steady
// state pairs a forward with a backward and exchanges everything after the pair, as Megatron's
// send_forward_backward_recv_forward_backward does (a group between them would deadlock).
using Segment = std::vector<Compute>;

Compute forward_of(int microbatch, int chunk) { return {ActionKind::kForward, microbatch, chunk}; }
Compute backward_of(int microbatch, int chunk) { return {ActionKind::kBackward, microbatch, chunk}; }
Compute weight_of(int microbatch, int chunk) { return {ActionKind::kWeight, microbatch, chunk}; }

std::vector<Segment> one_f_one_b_segments(ScheduleKind kind, int pp, int v, int m, int s) {
  // Micro-batches go through the chunks in groups of pp (Narayanan et al. 2021, as Megatron-Core
  // orders them): forward k runs chunk (k / pp) mod v, backward k runs the chunks in reverse.
  // With one chunk, forward k is simply micro-batch k.
  auto microbatch_of = [&](int k) { return (k / (pp * v)) * pp + k % pp; };
  auto forward = [&](int k) { return forward_of(microbatch_of(k), (k / pp) % v); };
  auto backward = [&](int k) { return backward_of(microbatch_of(k), v - 1 - (k / pp) % v); };
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

// ZB-H1 (Qi et al. 2024, §2.1): 1F1B's order of forwards and input-gradient backwards, with stage
// s holding back the weight gradients of its first s micro-batches, which fill the cool-down,
// where 1F1B's stages wait: its bubble is (pp − 1)(F + B − W) against 1F1B's (pp − 1)(F + B + W),
// for 1F1B's peak memory (every stage keeps at most pp micro-batches' activations).
std::vector<Segment> zb_h1_segments(int pp, int m, int s) {
  std::vector<Segment> segments;
  int weights = 0, backwards = 0;
  for (const Segment& segment : one_f_one_b_segments(ScheduleKind::kOneFOneB, pp, 1, m, s)) {
    segments.push_back(segment);
    if (segment[0].kind == ActionKind::kBackward && backwards++ >= s) segments.push_back({weight_of(weights++, 0)});
  }
  while (weights < m) segments.push_back({weight_of(weights++, 0)});
  return segments;
}

// Per chunk, the next micro-batch of each kind of action, in micro-batch order.
struct ChunkCounters {
  int forward = 0, backward = 0, weight = 0;
};

// ZB-V (Qi et al. 2024, §6): two chunks per stage in a V; under equal F, B and W times the stages
// never wait once started, for 1F1B's peak memory. The order is the paper's handcrafted one, on
// max(m, 2 pp − 1) micro-batches of which those past m are left out.
std::vector<Segment> zbv_segments(int pp, int m, int s) {
  const int n = std::max(m, 2 * pp - 1);
  ChunkCounters c[2];
  std::vector<Segment> segments;
  auto emit = [&](ActionKind kind, int chunk) {
    int& next = kind == ActionKind::kForward ? c[chunk].forward
                : kind == ActionKind::kBackward ? c[chunk].backward : c[chunk].weight;
    const int microbatch = next++;
    if (microbatch < m) segments.push_back({{kind, microbatch, chunk}});
  };
  const ActionKind F = ActionKind::kForward, B = ActionKind::kBackward, W = ActionKind::kWeight;
  for (int i = 0; i < 2 * (pp - s) - 1; ++i) emit(F, 0);
  for (int i = 0; i < s; ++i) emit(F, 1), emit(F, 0);
  for (int i = 0; i < pp - s; ++i) emit(F, 1), emit(B, 1), emit(W, 1);
  while (c[1].forward < c[0].forward || c[0].forward < n) {
    if (c[0].forward < n) emit(F, 0);
    emit(B, 0), emit(W, 0), emit(F, 1), emit(B, 1), emit(W, 1);
  }
  for (int i = 0; i < s; ++i) emit(B, 0), emit(B, 1);
  for (int i = 0; i < pp - s; ++i) emit(B, 0), emit(W, 0);
  while (c[1].weight < n) emit(W, 1);
  while (c[0].weight < n) emit(W, 0);
  return segments;
}

// DualPipeV (DeepSeek-V3's DualPipe in its V form, deepseek-ai/DualPipe): two chunks per stage in
// a V; in the steady state a forward on one chunk is paired with a whole backward pass on the
// other (Action::paired: the executor may run them side by side, so that one's expert all-to-all
// travels while the other computes); the last backward passes are
// split, and their weight gradients, kept in one queue for both chunks, fill the cool-down.
// Bubble (pp − 1)(F&B + B − 3W) for B the whole backward pass.
std::vector<Segment> dualpipev_segments(int pp, int m, int s) {
  ChunkCounters c[2];
  std::deque<Compute> deferred;  // split backward passes whose weight gradients wait
  std::vector<Segment> segments;
  auto forward = [&](int chunk) { return forward_of(c[chunk].forward++, chunk); };
  auto whole_backward = [&](int chunk) {  // B and at once its W
    const int microbatch = c[chunk].backward++;
    return Segment{backward_of(microbatch, chunk), weight_of(microbatch, chunk)};
  };
  auto split_backward = [&](int chunk) {
    const Compute b = backward_of(c[chunk].backward++, chunk);
    deferred.push_back(weight_of(b.microbatch, chunk));
    return Segment{b};
  };
  auto oldest_weight = [&] {
    const Compute w = deferred.front();
    deferred.pop_front();
    return Segment{w};
  };
  auto paired = [&](int forward_chunk, int backward_chunk) {
    Segment pair{forward(forward_chunk)};
    pair.front().paired = true;
    for (const Compute& b : whole_backward(backward_chunk)) pair.push_back(b);
    return pair;
  };
  for (int i = 0; i < 2 * (pp - s - 1); ++i) segments.push_back({forward(0)});
  for (int i = 0; i <= s; ++i) segments.push_back({forward(0)}), segments.push_back({forward(1)});
  for (int i = 0; i < pp - s - 1; ++i)
    segments.push_back(split_backward(1)), segments.push_back(oldest_weight()), segments.push_back({forward(1)});
  for (int i = 0; i < m - 2 * pp + s + 1; ++i) {
    if (i == 0 && s == pp - 1) {  // its backward needs the forward just before it, on the same stage
      segments.push_back({forward(0)});
      segments.push_back(whole_backward(1));
    } else {
      segments.push_back(paired(0, 1));
    }
    segments.push_back(paired(1, 0));
  }
  for (int i = 0; i < pp - s - 1; ++i) segments.push_back(whole_backward(1)), segments.push_back(paired(1, 0));
  // The last s + 1 of these 2 (s + 1) backward passes are split.
  int whole = s + 1;
  for (int i = 0; i <= s; ++i)
    for (int chunk : {1, 0}) segments.push_back(whole-- > 0 ? whole_backward(chunk) : split_backward(chunk));
  for (int i = 0; i < pp - s - 1; ++i) segments.push_back(oldest_weight()), segments.push_back(split_backward(0));
  while (!deferred.empty()) segments.push_back(oldest_weight());
  return segments;
}

std::vector<Segment> compute_segments(ScheduleKind kind, int pp, int v, int m, int s, bool v_shape) {
  if (kind == ScheduleKind::kForwardOnly && v_shape) {  // each chunk in turn: the V turns on the last stage
    std::vector<Segment> segments;
    for (int chunk : {0, 1})
      for (int k = 0; k < m; ++k) segments.push_back({forward_of(k, chunk)});
    return segments;
  }
  switch (kind) {
    case ScheduleKind::kZbH1: return zb_h1_segments(pp, m, s);
    case ScheduleKind::kZbV: return zbv_segments(pp, m, s);
    case ScheduleKind::kDualPipeV: return dualpipev_segments(pp, m, s);
    default: return one_f_one_b_segments(kind, pp, v, m, s);
  }
}

}  // namespace

bool v_shaped(ScheduleKind kind) { return kind == ScheduleKind::kZbV || kind == ScheduleKind::kDualPipeV; }

int default_virtual_stages(ScheduleKind kind) { return v_shaped(kind) || kind == ScheduleKind::kInterleaved ? 2 : 1; }

bool splits_backward(ScheduleKind kind) {
  return kind == ScheduleKind::kZbH1 || kind == ScheduleKind::kZbV || kind == ScheduleKind::kDualPipeV;
}

const EnumNames<ScheduleKind>& schedule_names() {
  static const EnumNames<ScheduleKind> names = [] {
    EnumNames<ScheduleKind> training;
    for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kInterleaved,
                              ScheduleKind::kZbH1, ScheduleKind::kZbV, ScheduleKind::kDualPipeV})
      training.emplace_back(schedule_name(kind), kind);
    return training;
  }();
  return names;
}

ScheduleKind schedule_kind_named(const std::string& name) {
  for (const auto& [text, kind] : schedule_names())
    if (name == text) return kind;
  throw config_error("parallel.schedule", name, "expected gpipe, 1f1b, interleaved, zb-h1, zbv or dualpipev");
}

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe: return "gpipe";
    case ScheduleKind::kOneFOneB: return "1f1b";
    case ScheduleKind::kInterleaved: return "interleaved";
    case ScheduleKind::kZbH1: return "zb-h1";
    case ScheduleKind::kZbV: return "zbv";
    case ScheduleKind::kDualPipeV: return "dualpipev";
    case ScheduleKind::kForwardOnly: return "forward-only";
  }
  return "?";
}

void check_schedule(ScheduleKind kind, int pp, int v, int m) {
  const std::string name = schedule_name(kind);
  if (kind == ScheduleKind::kInterleaved) {
    if (v < 2)
      throw config_error("parallel.virtual_stages", std::to_string(v),
                         "the interleaved schedule needs at least 2 chunks per stage");
    if (m < pp || m % pp != 0)
      throw config_error("train.grad_accum", std::to_string(m),
                         "the interleaved schedule needs micro-batches in multiples of parallel.pp = " +
                             std::to_string(pp) + " (train.grad_accum is the number of micro-batches)");
  } else if (v_shaped(kind)) {
    if (v != 2)
      throw config_error("parallel.virtual_stages", std::to_string(v),
                         "the " + name + " schedule runs two chunks per stage in a V; use 2");
    if (kind == ScheduleKind::kDualPipeV && m < 2 * pp)
      throw config_error("train.grad_accum", std::to_string(m),
                         "the dualpipev schedule needs at least 2 × parallel.pp = " + std::to_string(2 * pp) +
                             " micro-batches (train.grad_accum is the number of micro-batches)");
  } else if (v != 1) {
    throw config_error("parallel.virtual_stages", std::to_string(v),
                       "the " + name + " schedule runs one chunk per stage; use 1, or parallel.schedule = " +
                           "interleaved, zbv or dualpipev");
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

Schedule make_schedule(ScheduleKind kind, int pp, int v, int m, bool v_shape) {
  Schedule schedule{kind, pp, v, m, v_shape || v_shaped(kind), {}};
  const int last = pp * v - 1;
  for (int s = 0; s < pp; ++s) {
    std::vector<Action>& actions = schedule.stages.emplace_back();
    // What a compute sends after it, and what it needs before it. A neighbour on the same stage
    // (the V's turn) gets the tensor from the executor directly.
    auto add = [&](ActionKind kind, const Compute& c, int peer_virtual_stage, std::vector<Action>* out) {
      const int peer = schedule.stage_of(peer_virtual_stage);
      if (peer != s) out->push_back({kind, c.microbatch, c.chunk, peer});
    };
    auto send_of = [&](const Compute& c, std::vector<Action>* out) {
      const int vs = schedule.virtual_stage(s, c.chunk);
      if (c.kind == ActionKind::kForward && vs < last) add(ActionKind::kSendActivation, c, vs + 1, out);
      if (c.kind == ActionKind::kBackward && vs > 0) add(ActionKind::kSendGrad, c, vs - 1, out);
    };
    auto receive_of = [&](const Compute& c, std::vector<Action>* out) {
      const int vs = schedule.virtual_stage(s, c.chunk);
      if (c.kind == ActionKind::kForward && vs > 0) add(ActionKind::kRecvActivation, c, vs - 1, out);
      if (c.kind == ActionKind::kBackward && vs < last) add(ActionKind::kRecvGrad, c, vs + 1, out);
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
    for (const Segment& segment : compute_segments(kind, pp, v, m, s, schedule.v_shape)) {
      for (const Compute& c : segment) receive_of(c, &group);
      flush(group);
      for (const Compute& c : segment) {
        actions.push_back({c.kind, c.microbatch, c.chunk, -1, c.paired});
        send_of(c, &group);
      }
    }
    flush(group);
  }
  return schedule;
}

}  // namespace dstrain
