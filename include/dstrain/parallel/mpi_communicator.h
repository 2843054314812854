// The MPI backend: MPI's nonblocking operations, waited for up to a timeout (a hung or dead peer
// becomes a communication error naming the operation and the peer, not a hang); GPU tensors are
// staged through pinned host memory.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

#include "dstrain/core/error.h"
#include "dstrain/parallel/communicator.h"

namespace dstrain {

// The MPI communicator of `members` (ranks of `group`, in that order), collective over `group`:
// MPI_COMM_NULL on the ranks that are not members (Communicator::make_subgroup of both backends).
MPI_Comm split_members(MPI_Comm group, const std::vector<int>& members);

class MpiCommunicator : public Communicator {
 public:
  // Takes ownership of `comm` (freed on destruction unless it is MPI_COMM_WORLD/SELF).
  explicit MpiCommunicator(MPI_Comm comm, double timeout_s = 600);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Backend backend() const override { return Backend::kMpi; }
  MPI_Comm comm() const { return comm_; }

  void all_reduce(torch::Tensor& tensor, ReduceOp op) override;
  std::unique_ptr<Work> all_reduce_async(torch::Tensor& tensor, ReduceOp op) override;
  bool callable_from_any_thread() const override { return false; }
  void reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) override;
  std::unique_ptr<Work> reduce_scatter_async(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) override;
  void all_gather(torch::Tensor& output, const torch::Tensor& input) override;
  std::unique_ptr<Work> all_gather_async(torch::Tensor& output, const torch::Tensor& input) override;
  void broadcast(torch::Tensor& tensor, int root) override;
  void all_to_all(torch::Tensor& output, const torch::Tensor& input, const std::vector<int64_t>& send_rows,
                  const std::vector<int64_t>& recv_rows) override;
  void send(const torch::Tensor& tensor, int peer) override;
  void recv(torch::Tensor& tensor, int peer) override;
  void exchange(std::vector<Transfer>& transfers) override;
  std::unique_ptr<Work> exchange_async(std::vector<Transfer>& transfers) override;
  std::unique_ptr<Work> send_async(const torch::Tensor& tensor, int peer, int tag) override;
  std::unique_ptr<Communicator> make_subgroup(const std::vector<int>& members) override;
  void barrier() override;
  void synchronize() override {}

  // Host-side exchanges of text (start-up decisions, checkpoint metadata), with the same timeout.
  std::string broadcast_string(const std::string& text, int root);
  std::vector<std::string> all_gather_strings(const std::string& text);  // in rank order

 private:
  // Completes `requests`, or throws a communication error describing `what` after the timeout.
  void wait(std::vector<MPI_Request>& requests, const std::function<std::string()>& what);
  // Polls `done` until it holds, answering peers' pings, or throws the same error.
  void wait_until(const std::function<bool()>& done, const std::function<std::string()>& what);
  std::string describe_group() const;
  // A timeout of `what`: naming first the members that no longer answer (peer_health.h).
  Error timeout_error(const std::string& what) const;

  MPI_Comm comm_;
  double timeout_s_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> world_ranks_;  // of the members, in group order
};

}  // namespace dstrain
