#include "dstrain/parallel/nccl_communicator.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "dstrain/core/accelerator.h"
#include "dstrain/core/error.h"
#include "dstrain/parallel/mpi_check.h"
#include "dstrain/parallel/mpi_communicator.h"
#include "dstrain/parallel/peer_health.h"
#include "dstrain/parallel/stall_watchdog.h"

namespace dstrain {
namespace {

[[noreturn]] void throw_nccl_error(ncclResult_t status, const char* call, const char* file, int line) {
  throw comm_error(std::string("NCCL call failed: ") + call + " (" + file + ":" + std::to_string(line) +
                   "): " + ncclGetErrorString(status) + ". Setting NCCL_DEBUG=WARN shows NCCL's own account.");
}

#define NCCL_CHECK(call)                                                          \
  do {                                                                            \
    ncclResult_t nccl_check_status_ = (call);                                     \
    if (nccl_check_status_ != ncclSuccess)                                        \
      throw_nccl_error(nccl_check_status_, #call, __FILE__, __LINE__);            \
  } while (0)

ncclDataType_t nccl_type(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat32: return ncclFloat32;
    case torch::kFloat64: return ncclFloat64;
    case torch::kBFloat16: return ncclBfloat16;
    case torch::kFloat16: return ncclFloat16;
    case torch::kInt64: return ncclInt64;
    case torch::kInt32: return ncclInt32;
    case torch::kUInt8: return ncclUint8;
    default:
      throw Error(ExitCode::kInternal, std::string("NCCL backend: no NCCL type for dtype ") +
                                           c10::toString(t.scalar_type()));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
  }
  return ncclSum;
}

// An operation queued on the communicator's stream: the caller's stream waits for it. Keeps a
// tensor the caller hands over (send_async's) until the operation is done with it.
class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<at::cuda::CUDAEvent> done, torch::Device device, torch::Tensor kept = {})
      : done_(std::move(done)), device_(device), kept_(std::move(kept)) {}
  // A kept tensor goes back to LibTorch's allocator only behind the operation, even when the
  // caller lets go of it unwaited (an error unwinding the pipeline).
  ~NcclWork() override {
    if (!kept_.defined()) return;
    try {
      wait();
    } catch (const std::exception&) {
      // a CUDA error: the computing thread meets it too, and reports it
    }
  }
  // The caller's stream waits: a kept tensor freed afterwards is reused only behind the operation.
  void wait() override { done_->block(c10::cuda::getCurrentCUDAStream(device_.index())); }
  bool ready() override { return done_->query(); }

 private:
  std::shared_ptr<at::cuda::CUDAEvent> done_;
  torch::Device device_;
  torch::Tensor kept_;
};

// A CUDA stream of the communicator's alone, of the highest priority. LibTorch's pool hands its
// 32 streams out in turn: two communicators on one stream would queue each other's operations (a
// pipeline channel's receive behind another channel's send that waits for its receiver).
class OwnedStream {
 public:
  explicit OwnedStream(c10::DeviceIndex device) {
    c10::cuda::CUDAGuard guard(device);
    int least = 0, greatest = 0;
    C10_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    C10_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
  }
  ~OwnedStream() { cudaStreamDestroy(stream_); }  // status ignored: a destructor cannot report it
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// The id travels with whether the group's first rank could make one, so that a failure there
// does not leave the others waiting inside ncclCommInitRank for a peer that never comes.
struct UniqueIdMessage {
  int ok = 0;
  ncclUniqueId id{};
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MPI_Comm group, const torch::Device& device, double timeout_s)
      : device_(device),
        owned_stream_(device.index()),
        stream_(c10::cuda::getStreamFromExternal(owned_stream_.get(), device.index())),
        timeout_s_(timeout_s) {
    MPI_CHECK(MPI_Comm_dup(group, &mpi_));
    try {
      MPI_CHECK(MPI_Comm_set_errhandler(mpi_, MPI_ERRORS_RETURN));
      MPI_CHECK(MPI_Comm_rank(mpi_, &rank_));
      MPI_CHECK(MPI_Comm_size(mpi_, &size_));
      world_ranks_ = peer_health::world_ranks_of(mpi_);
    } catch (...) {
      MPI_Comm_free(&mpi_);  // status ignored: already failing
      throw;
    }
    members_ = peer_health::describe_group(world_ranks_);
    // Creation is collective and blocks until every rank of the group has joined: the watchdog
    // (which finds mutex_ held meanwhile) ends the process if a peer never comes.
    // A new thread's CUDA calls go to GPU 0: without on_start, the watchdog's event queries would
    // open a context there (~0.5 GiB) for every rank of the node, and fail where GPUs are in
    // exclusive-process mode.
    watchdog_ = std::make_unique<StallWatchdog>(StallWatch{[this] { return what(); }, world_ranks_, timeout_s_,
                                                           [this] { return look(); },
                                                           [this] { accel::set_current_device(device_.index()); },
                                                           nullptr});
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      c10::cuda::CUDAGuard guard(device_);
      UniqueIdMessage message;
      ncclResult_t id_status = ncclSuccess;
      if (rank_ == 0) {
        id_status = ncclGetUniqueId(&message.id);
        message.ok = id_status == ncclSuccess;
      }
      MPI_CHECK(MPI_Bcast(&message, sizeof message, MPI_BYTE, 0, mpi_));
      if (!message.ok) {
        if (rank_ != 0) throw Error(ExitCode::kCommunication, "");  // the first rank reports it
        throw_nccl_error(id_status, "ncclGetUniqueId(&message.id)", __FILE__, __LINE__);
      }
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
      // Blocking calls whatever NCCL_COMM_BLOCKING says: every call below expects ncclSuccess,
      // never ncclInProgress.
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 1;
      NCCL_CHECK(ncclCommInitRankConfig(&comm_, size_, message.id, rank_, &config));
#else
      NCCL_CHECK(ncclCommInitRank(&comm_, size_, message.id, rank_));
#endif
      created_ = true;
    } catch (...) {
      watchdog_.reset();
      MPI_Comm_free(&mpi_);  // status ignored: already failing
      throw;
    }
  }

  ~NcclCommunicator() override {
    {
      // Statuses ignored: a destructor cannot report them, and an aborted communicator is gone.
      // The watchdog still runs: a destruction that hangs (ncclCommDestroy waits for the node's
      // other ranks) ends the process after comm.timeout_s too.
      std::lock_guard<std::mutex> lock(mutex_);
      if (comm_) {
        cudaStreamSynchronize(stream_.stream());
        ncclCommDestroy(comm_);
        comm_ = nullptr;
      }
    }
    watchdog_.reset();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&mpi_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Backend backend() const override { return Backend::kNccl; }

  void all_reduce(torch::Tensor& t, ReduceOp op) override {
    require_on_device(t, "all_reduce");
    run([&](cudaStream_t s) {
      NCCL_CHECK(ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t), nccl_op(op), comm_, s));
    });
  }

  std::unique_ptr<Work> all_reduce_async(torch::Tensor& t, ReduceOp op) override {
    require_on_device(t, "all_reduce_async");
    return start([&](cudaStream_t s) {
      NCCL_CHECK(ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t), nccl_op(op), comm_, s));
    });
  }

  bool callable_from_any_thread() const override { return true; }

  void reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) override {
    require_on_device(output, "reduce_scatter");
    require_on_device(input, "reduce_scatter");
    if (input.numel() != output.numel() * size_ || input.scalar_type() != output.scalar_type())
      throw Error(ExitCode::kInternal, "reduce_scatter: input must hold size() chunks of output's shape");
    run([&](cudaStream_t s) {
      NCCL_CHECK(ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(), nccl_type(output),
                                   nccl_op(op), comm_, s));
    });
  }

  std::unique_ptr<Work> reduce_scatter_async(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) override {
    require_on_device(output, "reduce_scatter_async");
    require_on_device(input, "reduce_scatter_async");
    if (input.numel() != output.numel() * size_ || input.scalar_type() != output.scalar_type())
      throw Error(ExitCode::kInternal, "reduce_scatter: input must hold size() chunks of output's shape");
    return start([&](cudaStream_t s) {
      NCCL_CHECK(ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(), nccl_type(output),
                                   nccl_op(op), comm_, s));
    });
  }

  void all_gather(torch::Tensor& output, const torch::Tensor& input) override {
    require_on_device(output, "all_gather");
    require_on_device(input, "all_gather");
    if (output.numel() != input.numel() * size_ || input.scalar_type() != output.scalar_type())
      throw Error(ExitCode::kInternal, "all_gather: output must hold size() copies of input's shape");
    run([&](cudaStream_t s) {
      NCCL_CHECK(ncclAllGather(input.data_ptr(), output.data_ptr(), input.nbytes(), ncclUint8, comm_, s));
    });
  }

  std::unique_ptr<Work> all_gather_async(torch::Tensor& output, const torch::Tensor& input) override {
    require_on_device(output, "all_gather_async");
    require_on_device(input, "all_gather_async");
    if (output.numel() != input.numel() * size_ || input.scalar_type() != output.scalar_type())
      throw Error(ExitCode::kInternal, "all_gather: output must hold size() copies of input's shape");
    return start([&](cudaStream_t s) {
      NCCL_CHECK(ncclAllGather(input.data_ptr(), output.data_ptr(), input.nbytes(), ncclUint8, comm_, s));
    });
  }

  void broadcast(torch::Tensor& t, int root) override {
    require_on_device(t, "broadcast");
    run([&](cudaStream_t s) {
      NCCL_CHECK(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), ncclUint8, root, comm_, s));
    });
  }

  // Grouped ncclSend/ncclRecv, one pair per rank with rows to move (NCCL has no all-to-all).
  void all_to_all(torch::Tensor& output, const torch::Tensor& input, const std::vector<int64_t>& send_rows,
                  const std::vector<int64_t>& recv_rows) override {
    require_on_device(output, "all_to_all");
    require_on_device(input, "all_to_all");
    if (static_cast<int>(send_rows.size()) != size_ || static_cast<int>(recv_rows.size()) != size_ ||
        input.scalar_type() != output.scalar_type())
      throw Error(ExitCode::kInternal, "all_to_all: one row count per rank, one dtype");
    const int64_t row_bytes = input.element_size() * c10::multiply_integers(input.sizes().slice(1));
    auto* in = static_cast<const char*>(input.data_ptr());
    auto* out = static_cast<char*>(output.data_ptr());
    run([&](cudaStream_t s) {
      NCCL_CHECK(ncclGroupStart());
      try {
        int64_t sent = 0, received = 0;
        for (int peer = 0; peer < size_; ++peer) {
          if (send_rows[peer] > 0)
            NCCL_CHECK(ncclSend(in + sent * row_bytes, send_rows[peer] * row_bytes, ncclUint8, peer, comm_, s));
          if (recv_rows[peer] > 0)
            NCCL_CHECK(ncclRecv(out + received * row_bytes, recv_rows[peer] * row_bytes, ncclUint8, peer, comm_, s));
          sent += send_rows[peer];
          received += recv_rows[peer];
        }
      } catch (...) {
        ncclGroupEnd();  // status ignored: already failing; the thread's group must not stay open
        throw;
      }
      NCCL_CHECK(ncclGroupEnd());
    });
  }

  void send(const torch::Tensor& t, int peer) override {
    require_on_device(t, "send");
    run([&](cudaStream_t s) { NCCL_CHECK(ncclSend(t.data_ptr(), t.nbytes(), ncclUint8, peer, comm_, s)); });
  }

  void recv(torch::Tensor& t, int peer) override {
    require_on_device(t, "recv");
    run([&](cudaStream_t s) { NCCL_CHECK(ncclRecv(t.data_ptr(), t.nbytes(), ncclUint8, peer, comm_, s)); });
  }

  void exchange(std::vector<Transfer>& transfers) override {
    for (const Transfer& t : transfers) require_on_device(t.tensor, "exchange");
    run([&](cudaStream_t s) { enqueue_transfers(transfers, s); });
  }

  // On the communicator's own stream, so that the caller's kernels run beside the transfers until
  // wait() makes its stream wait for them.
  std::unique_ptr<Work> exchange_async(std::vector<Transfer>& transfers) override {
    for (const Transfer& t : transfers) require_on_device(t.tensor, "exchange_async");
    return start([&](cudaStream_t s) { enqueue_transfers(transfers, s); });
  }

  // Queued on the communicator's own stream behind what was queued there before, so that it is
  // matched in posting order (NCCL has no tags); the caller's stream does not wait for it.
  std::unique_ptr<Work> send_async(const torch::Tensor& t, int peer, int) override {
    require_on_device(t, "send_async");
    return start([&](cudaStream_t s) {
      NCCL_CHECK(ncclSend(t.data_ptr(), t.nbytes(), ncclUint8, peer, comm_, s));
    }, t);
  }

  // A communicator of its own (stream, watchdog), set up through an MPI communicator of the
  // members, as this one was: one ncclCommInitRank among the members alone, so that ranks making
  // several subgroups in one order never wait for each other in a cycle.
  std::unique_ptr<Communicator> make_subgroup(const std::vector<int>& members) override {
    MPI_Comm sub = split_members(mpi_, members);
    if (sub == MPI_COMM_NULL) return nullptr;
    std::unique_ptr<Communicator> made;
    try {
      made = make_nccl_communicator(sub, device_, timeout_s_);
    } catch (...) {
      MPI_Comm_free(&sub);  // status ignored: already failing
      throw;
    }
    MPI_CHECK(MPI_Comm_free(&sub));  // the NCCL communicator keeps a copy of its own
    return made;
  }

  void barrier() override {
    synchronize();
    MPI_CHECK(MPI_Barrier(mpi_));
  }

  void synchronize() override {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point start = Clock::now();
    const std::function<std::string()> waiting_for = [this] { return what(); };
    const peer_health::Waiting waiting(waiting_for);  // what a rank that asks is told
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        check_async_error();
        if (last_done_.query()) return;
        peer_health::answer();  // MPI ranks asking who still answers (peer_health.h)
        if (std::chrono::duration<double>(Clock::now() - start).count() > timeout_s_) {
          abort();
          break;
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    // Named after the communicator is let go: the ranks asked may take seconds to answer.
    throw comm_error(peer_health::timed_out(what(), world_ranks_, timeout_s_) + "; the communicator was aborted");
  }

 private:
  // The collective runs on this communicator's own stream: it starts when the computation
  // queued so far on the caller's stream is done, and the caller's later kernels wait for it.
  // (Because they wait, a tensor freed by the caller cannot be reused before NCCL is done with
  // it, and no recordStream is needed.)
  template <typename Enqueue>
  void run(Enqueue&& enqueue) {
    enqueue_on_own_stream(enqueue, last_done_, /*caller_waits=*/true);
  }

  // The operation on this communicator's own stream, the caller's stream not waiting for it: its
  // Work, which keeps `kept` until the operation is done with it.
  template <typename Enqueue>
  std::unique_ptr<Work> start(Enqueue&& enqueue, torch::Tensor kept = {}) {
    auto done = std::make_shared<at::cuda::CUDAEvent>();
    enqueue_on_own_stream(enqueue, *done);
    return std::make_unique<NcclWork>(done, device_, std::move(kept));
  }

  // The operation on this communicator's own stream, after the work queued so far on the
  // caller's stream; `done` is recorded after it (and is what a caller's stream waits for: at
  // once with `caller_waits`).
  template <typename Enqueue>
  void enqueue_on_own_stream(Enqueue&& enqueue, at::cuda::CUDAEvent& done, bool caller_waits = false) {
    std::lock_guard<std::mutex> lock(mutex_);  // the autograd engine's threads may call too
    if (!comm_) throw comm_error("NCCL: the communicator was aborted after an earlier failure");
    last_enqueued_ = std::chrono::steady_clock::now();
    c10::cuda::CUDAGuard guard(device_);
    c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_.index());
    at::cuda::CUDAEvent inputs_ready;
    inputs_ready.record(compute);
    inputs_ready.block(stream_);
    enqueue(stream_.stream());
    done.record(stream_);
    if (&done != &last_done_) last_done_.record(stream_);
    if (caller_waits) done.block(compute);
    check_async_error();
  }

  // One NCCL group of sends and receives on stream `s`.
  void enqueue_transfers(std::vector<Transfer>& transfers, cudaStream_t s) {
    NCCL_CHECK(ncclGroupStart());
    try {
      for (Transfer& t : transfers) {
        if (t.send)
          NCCL_CHECK(ncclSend(t.tensor.data_ptr(), t.tensor.nbytes(), ncclUint8, t.peer, comm_, s));
        else
          NCCL_CHECK(ncclRecv(t.tensor.data_ptr(), t.tensor.nbytes(), ncclUint8, t.peer, comm_, s));
      }
    } catch (...) {
      ncclGroupEnd();  // status ignored: already failing; the thread's group must not stay open
      throw;
    }
    NCCL_CHECK(ncclGroupEnd());
  }

  // The two below with mutex_ held: the communicator may be aborted (freed) by another thread.
  void check_async_error() {
    if (!comm_) return;
    ncclResult_t async = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
    if (async != ncclSuccess) {
      std::string detail = ncclGetLastError(comm_);
      abort();
      throw comm_error(std::string("NCCL: asynchronous error: ") + ncclGetErrorString(async) +
                       (detail.empty() ? "" : " (" + detail + ")"));
    }
  }

  void abort() {
    if (comm_) ncclCommAbort(comm_);  // status ignored: we are already reporting a failure
    comm_ = nullptr;
  }

  std::string what() const {
    return (created_ ? "an NCCL operation on " : "the set-up of an NCCL communicator on ") + members_;
  }

  // How the communicator stands, for the watchdog (stall_watchdog.h), which must not block on it.
  CommunicatorState look() {
    using Kind = CommunicatorState::Kind;
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock()) return {Kind::kBusy, {}, ""};
    if (!comm_) return {};  // aborted: the thread that aborted it reports
    bool unfinished = false;
    try {
      unfinished = !last_done_.query();
    } catch (const std::exception&) {
      return {};  // a CUDA error: the computing thread meets it too, and reports it better
    }
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &async) != ncclSuccess || async != ncclSuccess)
      return {Kind::kFailed, {}, std::string("NCCL: asynchronous error: ") + ncclGetErrorString(async) + " (" +
                                     ncclGetLastError(comm_) + ")"};
    if (unfinished) return {Kind::kUnfinished, last_enqueued_, ""};
    return {};
  }

  void require_on_device(const torch::Tensor& t, const char* what) const {
    if (t.device() != device_ || !t.is_contiguous())
      throw Error(ExitCode::kInternal, std::string("NCCL backend: ") + what +
                                           " needs a contiguous tensor on " + device_.str());
  }

  std::mutex mutex_;  // guards comm_, last_done_ and last_enqueued_
  torch::Device device_;
  OwnedStream owned_stream_;  // destroyed after the destructor's body has let go of the communicator
  c10::cuda::CUDAStream stream_;
  at::cuda::CUDAEvent last_done_;
  std::chrono::steady_clock::time_point last_enqueued_;
  double timeout_s_;
  MPI_Comm mpi_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  ncclComm_t comm_ = nullptr;
  std::vector<int> world_ranks_;  // of the members, for messages that name a peer
  std::string members_;           // "4 ranks (world ranks 0,1,2,3)"
  std::atomic<bool> created_{false};  // read by the watchdog: what() names the set-up until then
  std::unique_ptr<StallWatchdog> watchdog_;  // last: stopped before the members above go
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm group, const torch::Device& device,
                                                     double timeout_s) {
  return std::make_unique<NcclCommunicator>(group, device, timeout_s);
}

}  // namespace dstrain
