// Pipeline schedules as plain data: for every stage, the list of what it does in one training step.
//
// The model is cut into pp × v consecutive pieces, "virtual stages". Rank (stage) s holds v model
// chunks. Interleaved (Megatron-Core's placement): chunk c is virtual stage c × pp + s. In a V
// (zbv, dualpipev; v = 2): chunk 0 is virtual stage s and chunk 1 virtual stage 2 pp − 1 − s, so
// that stage 0 holds the first and the last, and the middle two meet on the last stage, which
// hands the activation from one chunk to the other without a transfer.
//
// A stage's list alternates compute actions (forward, backward or weight-gradient of one
// micro-batch on one chunk) with groups of point-to-point transfers: the sends that follow a
// compute action and the receive that the next one needs are posted together and complete
// together (batched isend/irecv, ncclGroupStart/End), so that two neighbours exchanging
// activations and gradients never wait on each other.
//
// Zero-bubble schedules (zb-h1, zbv, dualpipev) split the backward pass: kBackward computes the
// gradient of the chunk's input (B, what the previous virtual stage waits for) and kWeight, later,
// the gradients of its weights (W). Elsewhere kBackward is the whole backward pass.
#pragma once

#include <string>
#include <vector>

#include "dstrain/core/config.h"

namespace dstrain {

enum class ActionKind { kForward, kBackward, kSendActivation, kRecvActivation, kSendGrad, kRecvGrad, kWeight };

struct Action {
  ActionKind kind;
  int microbatch;
  int chunk;     // this stage's chunk (0 .. v-1); for transfers, the chunk that sends or receives
  int peer = -1; // transfers: the other stage
  // A forward that DualPipeV pairs with the backward pass after it (and its weight gradients):
  // the two may run side by side (parallel/side_lane.h).
  bool paired = false;

  bool is_compute() const {
    return kind == ActionKind::kForward || kind == ActionKind::kBackward || kind == ActionKind::kWeight;
  }
  bool operator==(const Action& o) const {
    return kind == o.kind && microbatch == o.microbatch && chunk == o.chunk && peer == o.peer;
  }
};

enum class ScheduleKind { kGPipe, kOneFOneB, kInterleaved, kZbH1, kZbV, kDualPipeV, kForwardOnly };

// Whether the schedule places two chunks per stage in a V, and whether it splits backward passes.
bool v_shaped(ScheduleKind kind);
bool splits_backward(ScheduleKind kind);
// The chunks per stage a schedule runs when none are asked for: two in a V, two interleaved (the
// fewest that interleave), one otherwise.
int default_virtual_stages(ScheduleKind kind);

struct Schedule {
  ScheduleKind kind;
  int pp = 1, virtual_stages = 1, microbatches = 1;
  bool v_shape = false;  // the placement; the forward-only schedule of a V schedule has it too
  std::vector<std::vector<Action>> stages;  // [stage] → actions in order

  int virtual_stage(int stage, int chunk) const {
    return v_shape && chunk == 1 ? 2 * pp - 1 - stage : chunk * pp + stage;
  }
  int stage_of(int virtual_stage) const {
    return v_shape && virtual_stage >= pp ? 2 * pp - 1 - virtual_stage : virtual_stage % pp;
  }
  int chunk_of(int virtual_stage) const { return virtual_stage / pp; }
  int last_virtual_stage() const { return pp * virtual_stages - 1; }
  bool splits_backward() const { return dstrain::splits_backward(kind); }
  // Whether sends go without waiting for their receiver (Communicator::send_async), which the
  // zero-bubble schedules' orders assume; the others wait for whole groups.
  bool sends_without_waiting() const { return splits_backward(); }
};

// parallel.schedule's names (the training schedules: gpipe, 1f1b, interleaved, zb-h1, zbv, dualpipev).
const EnumNames<ScheduleKind>& schedule_names();
// One of schedule_names(); throws Error(kUsage) naming parallel.schedule otherwise.
ScheduleKind schedule_kind_named(const std::string& name);
const char* schedule_name(ScheduleKind kind);

// Checks that the combination can run and throws Error(kUsage) naming the key otherwise:
// interleaved needs virtual_stages ≥ 2 and micro-batches (train.grad_accum) a multiple of pp;
// zbv and dualpipev run two chunks per stage (virtual_stages = 2), dualpipev at least 2 pp
// micro-batches; the others one chunk per stage.
void check_schedule(ScheduleKind kind, int pp, int virtual_stages, int microbatches);

// The training step of `kind`; kForwardOnly is evaluation (every forward, no backward), in the V
// placement when `v_shape`.
Schedule make_schedule(ScheduleKind kind, int pp, int virtual_stages, int microbatches, bool v_shape = false);

// A transfer as both of its ends know it: an activation or a gradient, of which micro-batch,
// sent by which virtual stage.
struct TransferId {
  bool activation;
  int microbatch;
  int from_virtual_stage;
  bool operator==(const TransferId& o) const {
    return activation == o.activation && microbatch == o.microbatch && from_virtual_stage == o.from_virtual_stage;
  }
};
TransferId transfer_id(const Schedule& schedule, int stage, const Action& transfer);
// Transfers of one channel (activations or gradients, from one virtual stage: one direction) are
// posted in the same order at both ends in every schedule. A backend without tags (NCCL) can match
// them in posting order per channel even where the sends do not wait for their receivers.
inline bool same_channel(const TransferId& a, const TransferId& b) {
  return a.activation == b.activation && a.from_virtual_stage == b.from_virtual_stage;
}
// The same number at both ends (an MPI tag: 0 .. 32767).
int transfer_tag(const Schedule& schedule, const TransferId& id);

}  // namespace dstrain
