#include "dstrain/dist/mpi_communicator.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "dstrain/dist/mpi_check.h"

namespace dstrain {
namespace {

// MPI has no 16-bit floating-point types: bf16 and fp16 travel as 16-bit words and are added by
// these operations (each sum rounded back to 16 bits, as NCCL does for these types).
template <typename Half>
void add_halves(void* in, void* inout, int* count, MPI_Datatype*) {
  const Half* a = static_cast<const Half*>(in);
  Half* b = static_cast<Half*>(inout);
  for (int i = 0; i < *count; ++i) b[i] = static_cast<Half>(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}
template <typename Half>
void max_halves(void* in, void* inout, int* count, MPI_Datatype*) {
  const Half* a = static_cast<const Half*>(in);
  Half* b = static_cast<Half*>(inout);
  for (int i = 0; i < *count; ++i)
    if (static_cast<float>(a[i]) > static_cast<float>(b[i])) b[i] = a[i];
}

MPI_Op half_op(MPI_User_function* function) {
  MPI_Op op = MPI_OP_NULL;
  MPI_CHECK(MPI_Op_create(function, /*commute=*/1, &op));
  return op;  // lives until MPI_Finalize
}

struct Reduction {
  MPI_Datatype type;
  MPI_Op op;
};

Reduction reduction_for(const torch::Tensor& t, ReduceOp op) {
  const bool max = op == ReduceOp::kMax;
  switch (t.scalar_type()) {
    case torch::kFloat32: return {MPI_FLOAT, max ? MPI_MAX : MPI_SUM};
    case torch::kFloat64: return {MPI_DOUBLE, max ? MPI_MAX : MPI_SUM};
    case torch::kInt64: return {MPI_INT64_T, max ? MPI_MAX : MPI_SUM};
    case torch::kInt32: return {MPI_INT32_T, max ? MPI_MAX : MPI_SUM};
    case torch::kUInt8: return {MPI_UINT8_T, max ? MPI_MAX : MPI_SUM};
    case torch::kBFloat16: {
      static MPI_Op sum = half_op(&add_halves<c10::BFloat16>), maximum = half_op(&max_halves<c10::BFloat16>);
      return {MPI_UINT16_T, max ? maximum : sum};
    }
    case torch::kFloat16: {
      static MPI_Op sum = half_op(&add_halves<c10::Half>), maximum = half_op(&max_halves<c10::Half>);
      return {MPI_UINT16_T, max ? maximum : sum};
    }
    default:
      throw Error(ExitCode::kInternal, std::string("MPI backend: cannot reduce tensors of dtype ") +
                                           c10::toString(t.scalar_type()));
  }
}

void require_contiguous(const torch::Tensor& t, const char* what) {
  if (!t.is_contiguous())
    throw Error(ExitCode::kInternal, std::string("MPI backend: ") + what + " needs a contiguous tensor");
}

int checked_count(int64_t count) {
  if (count > INT32_MAX)
    throw Error(ExitCode::kInternal, "MPI backend: message of " + std::to_string(count) +
                                         " elements exceeds MPI's int count; split it");
  return static_cast<int>(count);
}

void finish_average(torch::Tensor& t, ReduceOp op, int size) {
  if (op != ReduceOp::kAvg) return;
  if (!t.is_floating_point()) throw Error(ExitCode::kInternal, "MPI backend: average of an integer tensor");
  t.div_(size);
}

// MPI is not assumed to be CUDA-aware: a GPU tensor travels through a pinned host copy, so that
// several ranks can share one GPU (tests) and a CPU-only MPI works with GPU training.
class HostView {
 public:
  HostView(const torch::Tensor& tensor, bool copy_in) : tensor_(tensor) {
    if (tensor.device().is_cpu()) {
      host_ = tensor;
      return;
    }
    host_ = torch::empty(tensor.sizes(), tensor.options().device(torch::kCPU).pinned_memory(true));
    if (copy_in) host_.copy_(tensor);
  }
  void* data() { return host_.data_ptr(); }
  // Copies the result back to the GPU tensor (nothing to do for a CPU tensor).
  void copy_out() {
    if (!tensor_.device().is_cpu()) tensor_.copy_(host_);
  }

 private:
  torch::Tensor tensor_, host_;
};

}  // namespace

void throw_mpi_error(int status, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  MPI_Error_string(status, text, &length);
  throw comm_error(std::string("MPI call failed: ") + call + " (" + file + ":" +
                   std::to_string(line) + "): " + text);
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm) : comm_(comm) {
  // Report failures as error codes (turned into exceptions) instead of aborting inside MPI.
  MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF && comm_ != MPI_COMM_NULL)
    MPI_Comm_free(&comm_);  // status ignored: a destructor cannot report it
}

void MpiCommunicator::all_reduce(torch::Tensor& tensor, ReduceOp op) {
  require_contiguous(tensor, "all_reduce");
  Reduction reduction = reduction_for(tensor, op);
  HostView host(tensor, /*copy_in=*/true);
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, host.data(), checked_count(tensor.numel()), reduction.type,
                          reduction.op, comm_));
  host.copy_out();
  finish_average(tensor, op, size_);
}

void MpiCommunicator::reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) {
  require_contiguous(output, "reduce_scatter");
  require_contiguous(input, "reduce_scatter");
  if (input.numel() != output.numel() * size_ || input.scalar_type() != output.scalar_type())
    throw Error(ExitCode::kInternal, "reduce_scatter: input must hold size() chunks of output's shape");
  Reduction reduction = reduction_for(input, op);
  HostView in(input, /*copy_in=*/true), out(output, /*copy_in=*/false);
  MPI_CHECK(MPI_Reduce_scatter_block(in.data(), out.data(), checked_count(output.numel()), reduction.type,
                                     reduction.op, comm_));
  out.copy_out();
  finish_average(output, op, size_);
}

void MpiCommunicator::all_gather(torch::Tensor& output, const torch::Tensor& input) {
  require_contiguous(output, "all_gather");
  require_contiguous(input, "all_gather");
  if (output.numel() != input.numel() * size_ || input.scalar_type() != output.scalar_type())
    throw Error(ExitCode::kInternal, "all_gather: output must hold size() copies of input's shape");
  HostView in(input, /*copy_in=*/true), out(output, /*copy_in=*/false);
  MPI_CHECK(MPI_Allgather(in.data(), checked_count(input.nbytes()), MPI_BYTE, out.data(),
                          checked_count(input.nbytes()), MPI_BYTE, comm_));
  out.copy_out();
}

void MpiCommunicator::broadcast(torch::Tensor& tensor, int root) {
  require_contiguous(tensor, "broadcast");
  HostView host(tensor, /*copy_in=*/rank_ == root);
  MPI_CHECK(MPI_Bcast(host.data(), checked_count(tensor.nbytes()), MPI_BYTE, root, comm_));
  host.copy_out();
}

void MpiCommunicator::send(const torch::Tensor& tensor, int peer) {
  require_contiguous(tensor, "send");
  HostView host(tensor, /*copy_in=*/true);
  MPI_CHECK(MPI_Send(host.data(), checked_count(tensor.nbytes()), MPI_BYTE, peer, 0, comm_));
}

void MpiCommunicator::recv(torch::Tensor& tensor, int peer) {
  require_contiguous(tensor, "recv");
  HostView host(tensor, /*copy_in=*/false);
  MPI_CHECK(MPI_Recv(host.data(), checked_count(tensor.nbytes()), MPI_BYTE, peer, 0, comm_,
                     MPI_STATUS_IGNORE));
  host.copy_out();
}

void MpiCommunicator::exchange(std::vector<Transfer>& transfers) {
  std::vector<HostView> host;
  host.reserve(transfers.size());
  std::vector<MPI_Request> requests(transfers.size(), MPI_REQUEST_NULL);
  for (size_t i = 0; i < transfers.size(); ++i) {
    Transfer& t = transfers[i];
    require_contiguous(t.tensor, "exchange");
    host.emplace_back(t.tensor, /*copy_in=*/t.send);
    const int bytes = checked_count(t.tensor.nbytes());
    if (t.send)
      MPI_CHECK(MPI_Isend(host.back().data(), bytes, MPI_BYTE, t.peer, t.tag, comm_, &requests[i]));
    else
      MPI_CHECK(MPI_Irecv(host.back().data(), bytes, MPI_BYTE, t.peer, t.tag, comm_, &requests[i]));
  }
  MPI_CHECK(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE));
  for (size_t i = 0; i < transfers.size(); ++i)
    if (!transfers[i].send) host[i].copy_out();
}

void MpiCommunicator::barrier() { MPI_CHECK(MPI_Barrier(comm_)); }

}  // namespace dstrain
