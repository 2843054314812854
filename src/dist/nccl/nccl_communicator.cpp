#include "dstrain/dist/nccl_communicator.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <cstdio>
#include <thread>
#include <vector>

#include "dstrain/core/error.h"
#include "dstrain/dist/mpi_check.h"

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

// An all-reduce queued on the communicator's stream: the caller's stream waits for it.
class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<at::cuda::CUDAEvent> done, torch::Device device) : done_(std::move(done)), device_(device) {}
  void wait() override { done_->block(c10::cuda::getCurrentCUDAStream(device_.index())); }

 private:
  std::shared_ptr<at::cuda::CUDAEvent> done_;
  torch::Device device_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MPI_Comm group, const torch::Device& device, double timeout_s)
      : device_(device),
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device.index())),
        timeout_s_(timeout_s) {
    MPI_CHECK(MPI_Comm_dup(group, &mpi_));
    try {
      MPI_CHECK(MPI_Comm_set_errhandler(mpi_, MPI_ERRORS_RETURN));
      MPI_CHECK(MPI_Comm_rank(mpi_, &rank_));
      MPI_CHECK(MPI_Comm_size(mpi_, &size_));
      c10::cuda::CUDAGuard guard(device_);
      ncclUniqueId id;
      if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
      MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, mpi_));
      NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_));
    } catch (...) {
      MPI_Comm_free(&mpi_);  // status ignored: already failing
      throw;
    }
  }

  ~NcclCommunicator() override {
    // Statuses ignored: a destructor cannot report them, and an aborted communicator is gone.
    if (comm_) {
      cudaStreamSynchronize(stream_.stream());
      ncclCommDestroy(comm_);
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&mpi_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }

  void all_reduce(torch::Tensor& t, ReduceOp op) override {
    require_on_device(t, "all_reduce");
    run([&](cudaStream_t s) {
      NCCL_CHECK(ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t), nccl_op(op), comm_, s));
    });
  }

  std::unique_ptr<Work> all_reduce_async(torch::Tensor& t, ReduceOp op) override {
    require_on_device(t, "all_reduce_async");
    auto done = std::make_shared<at::cuda::CUDAEvent>();
    enqueue_on_own_stream([&](cudaStream_t s) {
      NCCL_CHECK(ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t), nccl_op(op), comm_, s));
    }, *done);
    return std::make_unique<NcclWork>(done, device_);
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
    auto done = std::make_shared<at::cuda::CUDAEvent>();
    enqueue_on_own_stream([&](cudaStream_t s) {
      NCCL_CHECK(ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(), nccl_type(output),
                                   nccl_op(op), comm_, s));
    }, *done);
    return std::make_unique<NcclWork>(done, device_);
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

  void broadcast(torch::Tensor& t, int root) override {
    require_on_device(t, "broadcast");
    run([&](cudaStream_t s) {
      NCCL_CHECK(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), ncclUint8, root, comm_, s));
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
    run([&](cudaStream_t s) {
      NCCL_CHECK(ncclGroupStart());
      for (Transfer& t : transfers) {
        if (t.send)
          NCCL_CHECK(ncclSend(t.tensor.data_ptr(), t.tensor.nbytes(), ncclUint8, t.peer, comm_, s));
        else
          NCCL_CHECK(ncclRecv(t.tensor.data_ptr(), t.tensor.nbytes(), ncclUint8, t.peer, comm_, s));
      }
      NCCL_CHECK(ncclGroupEnd());
    });
  }

  void barrier() override {
    synchronize();
    MPI_CHECK(MPI_Barrier(mpi_));
  }

  void synchronize() override {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point start = Clock::now();
    while (!last_done_.query()) {
      check_async_error();
      if (std::chrono::duration<double>(Clock::now() - start).count() > timeout_s_) {
        abort();
        char limit[32];
        std::snprintf(limit, sizeof limit, "%g", timeout_s_);
        throw comm_error("NCCL: an operation on " + std::to_string(size_) + " ranks did not finish within " +
                         "comm.timeout_s = " + limit + " s (a peer rank died or hangs); the communicator was aborted");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    check_async_error();
  }

 private:
  // The collective runs on this communicator's own stream: it starts when the computation
  // queued so far on the caller's stream is done, and the caller's later kernels wait for it.
  // (Because they wait, a tensor freed by the caller cannot be reused before NCCL is done with
  // it, and no recordStream is needed.)
  template <typename Enqueue>
  void run(Enqueue&& enqueue) {
    enqueue_on_own_stream(enqueue, last_done_);
    last_done_.block(c10::cuda::getCurrentCUDAStream(device_.index()));
  }

  // The operation on this communicator's own stream, after the work queued so far on the
  // caller's stream; `done` is recorded after it (and is what a caller's stream waits for).
  template <typename Enqueue>
  void enqueue_on_own_stream(Enqueue&& enqueue, at::cuda::CUDAEvent& done) {
    if (!comm_) throw comm_error("NCCL: the communicator was aborted after an earlier failure");
    std::lock_guard<std::mutex> lock(mutex_);  // the autograd engine's threads may call too
    c10::cuda::CUDAGuard guard(device_);
    c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_.index());
    at::cuda::CUDAEvent inputs_ready;
    inputs_ready.record(compute);
    inputs_ready.block(stream_);
    enqueue(stream_.stream());
    done.record(stream_);
    if (&done != &last_done_) last_done_.record(stream_);
    check_async_error();
  }

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

  void require_on_device(const torch::Tensor& t, const char* what) const {
    if (t.device() != device_ || !t.is_contiguous())
      throw Error(ExitCode::kInternal, std::string("NCCL backend: ") + what +
                                           " needs a contiguous tensor on " + device_.str());
  }

  std::mutex mutex_;
  torch::Device device_;
  c10::cuda::CUDAStream stream_;
  at::cuda::CUDAEvent last_done_;
  double timeout_s_;
  MPI_Comm mpi_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm group, const torch::Device& device,
                                                     double timeout_s) {
  return std::make_unique<NcclCommunicator>(group, device, timeout_s);
}

}  // namespace dstrain
