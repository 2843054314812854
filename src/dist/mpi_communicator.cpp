#include "dstrain/dist/mpi_communicator.h"

#include "dstrain/dist/mpi_check.h"

namespace dstrain {
namespace {

// Reductions need an MPI type that MPI can add; transfers move bytes and take any dtype.
MPI_Datatype reduction_type(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat32: return MPI_FLOAT;
    case torch::kFloat64: return MPI_DOUBLE;
    case torch::kInt64: return MPI_INT64_T;
    case torch::kInt32: return MPI_INT32_T;
    case torch::kUInt8: return MPI_UINT8_T;
    default:
      throw Error(ExitCode::kInternal, std::string("MPI backend: cannot reduce tensors of dtype ") +
                                           c10::toString(t.scalar_type()));
  }
}

MPI_Op reduction_op(ReduceOp op) { return op == ReduceOp::kMax ? MPI_MAX : MPI_SUM; }

void require_cpu_contiguous(const torch::Tensor& t, const char* what) {
  if (!t.device().is_cpu() || !t.is_contiguous())
    throw Error(ExitCode::kInternal, std::string("MPI backend: ") + what +
                                         " needs a contiguous CPU tensor");
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
  require_cpu_contiguous(tensor, "all_reduce");
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, tensor.data_ptr(), checked_count(tensor.numel()),
                          reduction_type(tensor), reduction_op(op), comm_));
  finish_average(tensor, op, size_);
}

void MpiCommunicator::reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) {
  require_cpu_contiguous(output, "reduce_scatter");
  require_cpu_contiguous(input, "reduce_scatter");
  if (input.numel() != output.numel() * size_ || input.scalar_type() != output.scalar_type())
    throw Error(ExitCode::kInternal, "reduce_scatter: input must hold size() chunks of output's shape");
  MPI_CHECK(MPI_Reduce_scatter_block(input.data_ptr(), output.data_ptr(),
                                     checked_count(output.numel()), reduction_type(input),
                                     reduction_op(op), comm_));
  finish_average(output, op, size_);
}

void MpiCommunicator::all_gather(torch::Tensor& output, const torch::Tensor& input) {
  require_cpu_contiguous(output, "all_gather");
  require_cpu_contiguous(input, "all_gather");
  if (output.numel() != input.numel() * size_ || input.scalar_type() != output.scalar_type())
    throw Error(ExitCode::kInternal, "all_gather: output must hold size() copies of input's shape");
  MPI_CHECK(MPI_Allgather(input.data_ptr(), checked_count(input.nbytes()), MPI_BYTE,
                          output.data_ptr(), checked_count(input.nbytes()), MPI_BYTE, comm_));
}

void MpiCommunicator::broadcast(torch::Tensor& tensor, int root) {
  require_cpu_contiguous(tensor, "broadcast");
  MPI_CHECK(MPI_Bcast(tensor.data_ptr(), checked_count(tensor.nbytes()), MPI_BYTE, root, comm_));
}

void MpiCommunicator::send(const torch::Tensor& tensor, int peer) {
  require_cpu_contiguous(tensor, "send");
  MPI_CHECK(MPI_Send(tensor.data_ptr(), checked_count(tensor.nbytes()), MPI_BYTE, peer, 0, comm_));
}

void MpiCommunicator::recv(torch::Tensor& tensor, int peer) {
  require_cpu_contiguous(tensor, "recv");
  MPI_CHECK(MPI_Recv(tensor.data_ptr(), checked_count(tensor.nbytes()), MPI_BYTE, peer, 0, comm_,
                     MPI_STATUS_IGNORE));
}

void MpiCommunicator::barrier() { MPI_CHECK(MPI_Barrier(comm_)); }

}  // namespace dstrain
