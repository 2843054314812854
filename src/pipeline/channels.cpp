#include "dstrain/pipeline/channels.h"

#include <string>

#include "dstrain/core/error.h"

namespace dstrain {

std::vector<Channel> channels_of(const Schedule& schedule) {
  std::vector<Channel> channels;
  const int last = schedule.last_virtual_stage();
  for (const bool activation : {true, false}) {
    for (int from = 0; from <= last; ++from) {
      const int to = activation ? from + 1 : from - 1;  // activations go forward, gradients back
      if (to < 0 || to > last) continue;
      const int sender = schedule.stage_of(from), receiver = schedule.stage_of(to);
      if (sender != receiver) channels.push_back({activation, from, sender, receiver});
    }
  }
  return channels;
}

PipelineChannels::PipelineChannels(const Schedule& schedule, Communicator& pp_group, const torch::Device& device)
    : stage_(pp_group.rank()) {
  for (const Channel& channel : channels_of(schedule)) {
    std::unique_ptr<Communicator> group = pp_group.make_subgroup({channel.sender, channel.receiver});
    if (!group) continue;
    // NCCL connects two ranks at their first transfer, the host waiting for the peer: here, while
    // the set-up's deadline watches, rather than in a step.
    const bool sender = channel.sender == stage_;
    std::vector<Transfer> first = {{sender, torch::zeros({1}, torch::dtype(torch::kFloat32).device(device)),
                                    sender ? 1 : 0, /*tag=*/0}};
    group->exchange(first);
    links_.emplace(std::make_pair(channel.activation, channel.from_virtual_stage), Link{channel, std::move(group)});
  }
}

std::pair<PipelineChannels::Link*, Transfer> PipelineChannels::on_link(const TransferId& id,
                                                                       const Transfer& transfer) {
  const auto found = links_.find({id.activation, id.from_virtual_stage});
  const int peer = found == links_.end() ? -1
                   : transfer.send      ? found->second.channel.receiver
                                        : found->second.channel.sender;
  if (peer != transfer.peer || peer == stage_)
    throw Error(ExitCode::kInternal, "pipeline: stage " + std::to_string(stage_) + " has no channel for " +
                                         (id.activation ? "activations" : "gradients") + " from virtual stage " +
                                         std::to_string(id.from_virtual_stage) + " with stage " +
                                         std::to_string(transfer.peer));
  Transfer on_channel = transfer;
  on_channel.peer = transfer.send ? 1 : 0;
  return {&found->second, on_channel};
}

std::unique_ptr<Work> PipelineChannels::send_async(const TransferId& id, const Transfer& transfer) {
  auto [link, on_channel] = on_link(id, transfer);
  return link->group->send_async(on_channel.tensor, on_channel.peer, on_channel.tag);
}

void PipelineChannels::exchange(std::vector<Transfer>& transfers, const std::vector<TransferId>& ids) {
  // One group per channel, started in the channels' order (the same on every stage), every group
  // started before any is waited for.
  std::map<std::pair<bool, int>, std::vector<Transfer>> by_channel;
  for (size_t i = 0; i < transfers.size(); ++i)
    by_channel[{ids.at(i).activation, ids.at(i).from_virtual_stage}].push_back(on_link(ids[i], transfers[i]).second);
  std::vector<std::unique_ptr<Work>> started;
  for (auto& [channel, group] : by_channel) started.push_back(links_.at(channel).group->exchange_async(group));
  for (auto& work : started) work->wait();
}

}  // namespace dstrain
