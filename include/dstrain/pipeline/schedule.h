// Pipeline schedules as plain data: for every stage, the list of what it does in one training step.
//
// The model is cut into pp × v consecutive pieces, "virtual stages". Rank (stage) s holds v model
// chunks: chunk c is virtual stage c × pp + s, as in Megatron-Core's interleaving. A stage's list
// alternates compute actions (forward or backward of one micro-batch on one chunk) with groups of
// point-to-point transfers: the sends that follow a compute action and the receive that the next
// one needs are posted together and complete together (batched isend/irecv, ncclGroupStart/End),
// so that two neighbours exchanging activations and gradients never wait on each other.
#pragma once

#include <string>
#include <vector>

namespace dstrain {

enum class ActionKind { kForward, kBackward, kSendActivation, kRecvActivation, kSendGrad, kRecvGrad };

struct Action {
  ActionKind kind;
  int microbatch;
  int chunk;     // this stage's chunk (0 .. v-1); for transfers, the chunk that sends or receives
  int peer = -1; // transfers: the other stage

  bool is_compute() const { return kind == ActionKind::kForward || kind == ActionKind::kBackward; }
  bool operator==(const Action& o) const {
    return kind == o.kind && microbatch == o.microbatch && chunk == o.chunk && peer == o.peer;
  }
};

enum class ScheduleKind { kGPipe, kOneFOneB, kInterleaved, kForwardOnly };

struct Schedule {
  ScheduleKind kind;
  int pp = 1, virtual_stages = 1, microbatches = 1;
  std::vector<std::vector<Action>> stages;  // [stage] → actions in order

  int virtual_stage(int stage, int chunk) const { return chunk * pp + stage; }
  int last_virtual_stage() const { return pp * virtual_stages - 1; }
};

// "gpipe" | "1f1b" | "interleaved"; throws Error(kUsage) naming parallel.schedule otherwise.
ScheduleKind schedule_kind_named(const std::string& name);
const char* schedule_name(ScheduleKind kind);

// Checks that the combination can run and throws Error(kUsage) naming the key otherwise:
// interleaved needs virtual_stages ≥ 2 and micro-batches (train.grad_accum) a multiple of pp;
// gpipe and 1f1b run one chunk per stage (virtual_stages = 1).
void check_schedule(ScheduleKind kind, int pp, int virtual_stages, int microbatches);

// The training step of `kind`; kForwardOnly is evaluation (every forward, no backward).
Schedule make_schedule(ScheduleKind kind, int pp, int virtual_stages, int microbatches);

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
// The same number at both ends (an MPI tag: 0 .. 32767).
int transfer_tag(const Schedule& schedule, const TransferId& id);

}  // namespace dstrain
