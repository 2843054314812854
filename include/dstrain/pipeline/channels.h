// The point-to-point links of a schedule whose sends go without waiting for their receivers (the
// zero-bubble ones): a communicator of its own for each channel (schedule.h's same_channel:
// activations or gradients sent by one virtual stage), over the two stages at its ends.
//
// Both ends post a channel's transfers in the same order, and the channels go their own ways: a
// send still waiting for its receiver holds back nothing but the later transfers of its channel,
// which wait for it at the other end too. On one communicator for every channel, a backend that
// matches transfers in posting order (NCCL has no tags) would queue a receive behind such a send
// and deadlock ZB-V and DualPipeV (the simulator shows it). The MPI backend, which matches by tag,
// takes the same links, so that the one path is tested wherever MPI runs.
#pragma once

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "dstrain/parallel/communicator.h"
#include "dstrain/pipeline/schedule.h"

namespace dstrain {

struct Channel {
  bool activation;         // else gradients
  int from_virtual_stage;  // the sender's
  int sender, receiver;    // stages
};

// The channels that carry a transfer in `schedule`'s placement (not within a stage: a V's turn),
// in the same order on every stage; the same for any number of micro-batches.
std::vector<Channel> channels_of(const Schedule& schedule);

class PipelineChannels {
 public:
  // Collective over `pp_group` (its rank is the stage): each channel's communicator is made by
  // every stage together, in channels_of's order, and its two stages connected by a first
  // transfer of one element on `device`.
  PipelineChannels(const Schedule& schedule, Communicator& pp_group, const torch::Device& device);

  // Starts the send of transfer `id` (`transfer`: a send to a stage) on its channel.
  std::unique_ptr<Work> send_async(const TransferId& id, const Transfer& transfer);
  // Completes `transfers` (transfer i is `ids[i]`; peers are stages), each on its channel, as
  // Communicator::exchange does: started all at once, so that their order across channels does
  // not matter.
  void exchange(std::vector<Transfer>& transfers, const std::vector<TransferId>& ids);

 private:
  struct Link {
    Channel channel;
    std::unique_ptr<Communicator> group;  // rank 0 the sender, rank 1 the receiver
  };
  // The link of `id`, with `transfer` addressed to its peer there; throws if the peer is not the
  // channel's other end.
  std::pair<Link*, Transfer> on_link(const TransferId& id, const Transfer& transfer);

  int stage_;
  std::map<std::pair<bool, int>, Link> links_;  // (activation, from_virtual_stage) → this stage's links
};

}  // namespace dstrain
