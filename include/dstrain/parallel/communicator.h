// Collectives and point-to-point transfers on torch tensors over one group of ranks. The trainer,
// optimizer and pipeline speak only this interface; MPI (CPU) and NCCL (GPU) implement it.
#pragma once

#include "dstrain/core/torch_api.h"

#include <memory>
#include <string>
#include <vector>

#include "dstrain/parallel/backend.h"

namespace dstrain {

enum class ReduceOp { kSum, kAvg, kMax };

// An operation under way (Communicator::all_reduce_async, reduce_scatter_async, all_gather_async).
class Work {
 public:
  virtual ~Work() = default;
  // Completes the operation; afterwards the caller's later computation sees its result.
  virtual void wait() = 0;
  // Whether it has completed, without waiting (wait() still completes it). Asking lets it
  // advance too: MPI moves a nonblocking collective on only inside MPI calls, so a caller that
  // asks now and then while it computes keeps the operation going. From the thread that started it.
  virtual bool ready() = 0;
};

// One point-to-point transfer of a group (Communicator::exchange).
struct Transfer {
  bool send;            // else receive into `tensor`
  torch::Tensor tensor;
  int peer;
  int tag;              // equal at both ends; tells apart transfers between the same two ranks
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Backend backend() const = 0;

  // Operations are ordered with the caller's computation: on the CPU they have finished when
  // they return; on a GPU they are queued so that later kernels see their result.
  // In place on a contiguous tensor; every rank ends with the same result.
  virtual void all_reduce(torch::Tensor& tensor, ReduceOp op) = 0;
  // Starts an all-reduce and returns at once; `tensor` must stay untouched until wait(). For
  // gradient buckets, which are reduced while the backward pass goes on.
  virtual std::unique_ptr<Work> all_reduce_async(torch::Tensor& tensor, ReduceOp op) = 0;
  // Whether operations may be started from a thread other than the one that made the
  // communicator (the autograd engine's GPU threads): NCCL yes, MPI no (a communicator's
  // operations are started from one thread, a lane's (compute_lane.h); only mpi_progress.h's
  // thread tests them besides).
  virtual bool callable_from_any_thread() const = 0;
  // `input` holds size() equal chunks along dim 0; rank r receives the reduction of chunk r.
  virtual void reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) = 0;
  // Starts one and returns at once (ZeRO-1's gradient buckets); both tensors stay untouched until wait().
  virtual std::unique_ptr<Work> reduce_scatter_async(torch::Tensor& output, const torch::Tensor& input,
                                                     ReduceOp op) = 0;
  // `output` receives every rank's `input`, concatenated along dim 0 in rank order.
  virtual void all_gather(torch::Tensor& output, const torch::Tensor& input) = 0;
  // Starts one and returns at once (ZeRO-1's updated shards, bucket after bucket); both tensors
  // stay untouched until wait().
  virtual std::unique_ptr<Work> all_gather_async(torch::Tensor& output, const torch::Tensor& input) = 0;
  virtual void broadcast(torch::Tensor& tensor, int root) = 0;
  // Rows (slices along dim 0) to every rank and from every rank, in rank order: `input`'s first
  // send_rows[0] rows go to rank 0, the next send_rows[1] to rank 1, ...; `output` receives
  // recv_rows[q] rows from each rank q, in rank order. Each rank's send_rows[p] must equal rank
  // p's recv_rows[this rank] (exchanged beforehand: expert parallelism's token dispatch). Both
  // contiguous, of one dtype and row shape; zero rows to or from a rank is allowed.
  virtual void all_to_all(torch::Tensor& output, const torch::Tensor& input, const std::vector<int64_t>& send_rows,
                          const std::vector<int64_t>& recv_rows) = 0;
  // Shapes and dtypes are agreed beforehand (fixed by the config): no metadata travels.
  virtual void send(const torch::Tensor& tensor, int peer) = 0;
  virtual void recv(torch::Tensor& tensor, int peer) = 0;
  // Posts every transfer of the group at once, so that two ranks sending to each other do not
  // wait on each other, and completes them all (MPI: before returning; NCCL: in order with the
  // caller's stream). Between two ranks, transfers in one direction are matched in the order they
  // are posted (NCCL has no tags); the tag must agree at both ends all the same.
  virtual void exchange(std::vector<Transfer>& transfers) = 0;
  // The same, started and returned at once (context parallelism's ring passes, which go on while
  // the rank computes attention on what it holds); every tensor stays untouched until wait(), and
  // received tensors hold their data after it.
  virtual std::unique_ptr<Work> exchange_async(std::vector<Transfer>& transfers) = 0;
  // Starts sending `tensor` (kept until the send completes) and returns at once: the sender goes
  // on computing whether or not the receiver has posted its receive yet, which the zero-bubble
  // schedules need. The receiver's exchange matches it by tag (MPI), or by its place among the
  // transfers between the two ranks in that direction (NCCL: on the communicator's own stream, so
  // a receive posted after it waits until it has gone). A communicator on which the sends and
  // the receives follow one order at both ends therefore never holds a receive behind a send: the
  // pipeline gives each channel one (pipeline/channels.h).
  virtual std::unique_ptr<Work> send_async(const torch::Tensor& tensor, int peer, int tag) = 0;
  // A communicator of this backend and timeout over `members` (ranks of this group; member i is
  // rank i there), made by every rank of this group together, each passing the same list; nullptr
  // on the ranks that are not members.
  virtual std::unique_ptr<Communicator> make_subgroup(const std::vector<int>& members) = 0;
  virtual void barrier() = 0;
  // Waits until every operation issued so far has completed. A backend that queues work on the
  // GPU (NCCL) ends a hung operation after its timeout with a communication error (exit code 5)
  // instead of waiting forever; the MPI backend is blocking and has nothing to wait for.
  virtual void synchronize() = 0;
};

}  // namespace dstrain
