#include "dstrain/parallel/mpi_communicator.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <mutex>
#include <optional>
#include <thread>

#include "dstrain/parallel/compute_lane.h"
#include "dstrain/parallel/mpi_check.h"
#include "dstrain/parallel/mpi_progress.h"
#include "dstrain/parallel/peer_health.h"

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

// MPI counts are ints; a message that does not fit is a bug of the caller (which splits it).
int checked_count(int64_t count) {
  if (count > INT32_MAX)
    throw Error(ExitCode::kInternal, "MPI backend: a message of " + std::to_string(count) +
                                         " units exceeds MPI's int count");
  return static_cast<int>(count);
}

// An all-to-all's rows per rank as MPI counts and displacements, checked against the tensor.
struct RowSplit {
  std::vector<int> counts, displacements;
  int64_t row_bytes = 0;
};

RowSplit row_split(const torch::Tensor& t, const std::vector<int64_t>& rows, int size, const char* what) {
  if (t.dim() == 0 || static_cast<int>(rows.size()) != size)
    throw Error(ExitCode::kInternal, std::string(what) + ": one row count per rank needed");
  RowSplit split;
  split.row_bytes = t.element_size() * c10::multiply_integers(t.sizes().slice(1));
  int64_t at = 0;
  for (int64_t count : rows) {
    split.displacements.push_back(checked_count(at));
    split.counts.push_back(checked_count(count));
    at += count;
  }
  if (at != t.size(0))
    throw Error(ExitCode::kInternal, std::string(what) + ": the row counts add up to " + std::to_string(at) +
                                         ", the tensor has " + std::to_string(t.size(0)));
  return split;
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
  const torch::Tensor& host() const { return host_; }  // the memory MPI reads or writes
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

MpiCommunicator::MpiCommunicator(MPI_Comm comm, double timeout_s) : comm_(comm), timeout_s_(timeout_s) {
  // Report failures as error codes (turned into exceptions) instead of aborting inside MPI.
  MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
  world_ranks_ = peer_health::world_ranks_of(comm_);  // for messages that name a peer
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF && comm_ != MPI_COMM_NULL)
    MPI_Comm_free(&comm_);  // status ignored: a destructor cannot report it
}

Error MpiCommunicator::timeout_error(const std::string& what) const {
  return comm_error(peer_health::timed_out(what, world_ranks_, timeout_s_));
}

std::string MpiCommunicator::describe_group() const { return peer_health::describe_group(world_ranks_); }

void MpiCommunicator::wait(std::vector<MPI_Request>& requests, const std::function<std::string()>& what) {
  wait_until(
      [&] {
        int done = 0;
        MPI_CHECK(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE));
        return done != 0;
      },
      what);
}

void MpiCommunicator::wait_until(const std::function<bool()>& done, const std::function<std::string()>& what) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const peer_health::Waiting waiting(what);  // what a peer that asks is told
  for (int polls = 0;; ++polls) {
    if (done()) return;
    peer_health::answer();
    if (std::chrono::duration<double>(Clock::now() - start).count() > timeout_s_) throw timeout_error(what());
    // Spin briefly (most operations finish at once), then leave the core to the others; at once
    // while a side lane runs, whose other thread has work for it.
    if (polls > (side_lane_running() ? 2 : 1000)) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void MpiCommunicator::all_reduce(torch::Tensor& tensor, ReduceOp op) {
  require_contiguous(tensor, "all_reduce");
  Reduction reduction = reduction_for(tensor, op);
  // In pieces: MPI counts are ints, and a GPU tensor is staged through host memory a piece at a
  // time (a 7B model's gradients would otherwise need 28 GB of pinned memory at once).
  constexpr int64_t kPiece = int64_t{1} << 28;
  torch::Tensor flat = tensor.view({-1});
  for (int64_t start = 0; start < flat.numel(); start += kPiece) {
    const int64_t count = std::min(kPiece, flat.numel() - start);
    torch::Tensor piece = flat.narrow(0, start, count);
    HostView host(piece, /*copy_in=*/true);
    std::vector<MPI_Request> request(1);
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, host.data(), static_cast<int>(count), reduction.type, reduction.op, comm_,
                             request.data()));
    wait(request, [&] { return "all_reduce of " + std::to_string(tensor.numel()) + " elements over " + describe_group(); });
    host.copy_out();
  }
  finish_average(tensor, op, size_);
}

namespace {

// How an operation under way is waited for: until `done`, within the communicator's timeout.
using WaitUntil = std::function<void(const std::function<bool()>& done)>;

// An MPI request that the progress thread (mpi_progress.h) keeps moving, if it runs.
std::unique_ptr<mpi_progress::Watched> started(const std::function<void(MPI_Request*)>& start) {
  MPI_Request request = MPI_REQUEST_NULL;
  start(&request);
  return std::make_unique<mpi_progress::Watched>(request);
}

// Operations let go of before they completed (an error unwound past their owner): MPI still reads
// or writes their memory, so it lives on here with their requests until a later look finds them
// complete; the progress thread, where it runs, keeps moving them meanwhile. Never destroyed: MPI
// may hold them up to its finalisation. (A collective's request may not be freed; freeing a
// send's would still leave its memory to keep.)
struct Unfinished {
  std::unique_ptr<mpi_progress::Watched> request;
  std::vector<torch::Tensor> memory;
};

bool completed(mpi_progress::Watched& request) {
  try {
    return request.test();
  } catch (const std::exception&) {
    return true;  // failed: MPI is done with its memory
  }
}

void keep_until_complete(std::unique_ptr<mpi_progress::Watched> request, std::vector<torch::Tensor> memory) {
  static std::mutex& mutex = *new std::mutex;
  static std::vector<Unfinished>& unfinished = *new std::vector<Unfinished>;
  int finalized = 0;
  if (MPI_Finalized(&finalized) != MPI_SUCCESS || finalized) return;  // nothing reads or writes them now
  std::lock_guard<std::mutex> lock(mutex);
  unfinished.erase(std::remove_if(unfinished.begin(), unfinished.end(),
                                  [](Unfinished& u) { return completed(*u.request); }),
                   unfinished.end());
  if (request && !completed(*request)) unfinished.push_back({std::move(request), std::move(memory)});
}

// A nonblocking collective of host-staged tensors (at most 2^31 - 1 elements): `output` in place
// (all-reduce) or from `input` (reduce-scatter, all-gather). wait() completes it and copies the
// result back (an average divided, for ReduceOp::kAvg).
class MpiCollective final : public Work {
 public:
  using Start = std::function<void(const void* input, void* output, MPI_Request* request)>;
  MpiCollective(WaitUntil wait, torch::Tensor output, const torch::Tensor* input, ReduceOp op, int size,
                const Start& start)
      : wait_(std::move(wait)), output_(std::move(output)), out_(output_, /*copy_in=*/input == nullptr), op_(op),
        size_(size) {
    if (input) in_.emplace(*input, /*copy_in=*/true);
    request_ = started([&](MPI_Request* request) { start(in_ ? in_->data() : MPI_IN_PLACE, out_.data(), request); });
  }
  ~MpiCollective() override {
    std::vector<torch::Tensor> memory = {out_.host()};
    if (in_) memory.push_back(in_->host());
    keep_until_complete(std::move(request_), std::move(memory));
  }
  MpiCollective(const MpiCollective&) = delete;
  MpiCollective& operator=(const MpiCollective&) = delete;
  void wait() override {
    wait_([this] { return request_->test(); });
    out_.copy_out();
    finish_average(output_, op_, size_);
  }
  bool ready() override { return request_->test(); }  // a completed request stays complete

 private:
  WaitUntil wait_;
  torch::Tensor output_;
  HostView out_;
  std::optional<HostView> in_;
  ReduceOp op_;
  int size_;
  std::unique_ptr<mpi_progress::Watched> request_;
};

}  // namespace

std::unique_ptr<Work> MpiCommunicator::all_reduce_async(torch::Tensor& tensor, ReduceOp op) {
  require_contiguous(tensor, "all_reduce_async");
  const Reduction reduction = reduction_for(tensor, op);
  const int count = checked_count(tensor.numel());
  auto wait_here = [this, count](const std::function<bool()>& done) {
    wait_until(done, [&] { return "all_reduce of " + std::to_string(count) + " elements over " + describe_group(); });
  };
  return std::make_unique<MpiCollective>(wait_here, tensor, nullptr, op, size_,
                                        [&](const void* in, void* out, MPI_Request* request) {
                                          MPI_CHECK(MPI_Iallreduce(in, out, count, reduction.type, reduction.op,
                                                                   comm_, request));
                                        });
}

std::unique_ptr<Work> MpiCommunicator::reduce_scatter_async(torch::Tensor& output, const torch::Tensor& input,
                                                            ReduceOp op) {
  require_contiguous(output, "reduce_scatter");
  require_contiguous(input, "reduce_scatter");
  if (input.numel() != output.numel() * size_ || input.scalar_type() != output.scalar_type())
    throw Error(ExitCode::kInternal, "reduce_scatter: input must hold size() chunks of output's shape");
  const Reduction reduction = reduction_for(input, op);
  const int count = checked_count(output.numel());
  auto wait_here = [this, count](const std::function<bool()>& done) {
    wait_until(done, [&] {
      return "reduce_scatter of " + std::to_string(count) + " elements per rank over " + describe_group();
    });
  };
  return std::make_unique<MpiCollective>(wait_here, output, &input, op, size_,
                                        [&](const void* in, void* out, MPI_Request* request) {
                                          MPI_CHECK(MPI_Ireduce_scatter_block(in, out, count, reduction.type,
                                                                              reduction.op, comm_, request));
                                        });
}

void MpiCommunicator::reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) {
  reduce_scatter_async(output, input, op)->wait();
}

std::unique_ptr<Work> MpiCommunicator::all_gather_async(torch::Tensor& output, const torch::Tensor& input) {
  require_contiguous(output, "all_gather");
  require_contiguous(input, "all_gather");
  if (output.numel() != input.numel() * size_ || input.scalar_type() != output.scalar_type())
    throw Error(ExitCode::kInternal, "all_gather: output must hold size() copies of input's shape");
  const int bytes = checked_count(input.nbytes());
  auto wait_here = [this](const std::function<bool()>& done) {
    wait_until(done, [&] { return "all_gather over " + describe_group(); });
  };
  // kSum: nothing to divide afterwards.
  return std::make_unique<MpiCollective>(wait_here, output, &input, ReduceOp::kSum, size_,
                                         [&](const void* in, void* out, MPI_Request* request) {
                                           MPI_CHECK(MPI_Iallgather(in, bytes, MPI_BYTE, out, bytes, MPI_BYTE, comm_,
                                                                    request));
                                         });
}

void MpiCommunicator::all_gather(torch::Tensor& output, const torch::Tensor& input) {
  all_gather_async(output, input)->wait();
}

void MpiCommunicator::broadcast(torch::Tensor& tensor, int root) {
  require_contiguous(tensor, "broadcast");
  HostView host(tensor, /*copy_in=*/rank_ == root);
  std::vector<MPI_Request> request(1);
  MPI_CHECK(MPI_Ibcast(host.data(), checked_count(tensor.nbytes()), MPI_BYTE, root, comm_, request.data()));
  wait(request, [&] { return "broadcast from world rank " + std::to_string(world_ranks_[root]) + " over " + describe_group(); });
  host.copy_out();
}

void MpiCommunicator::all_to_all(torch::Tensor& output, const torch::Tensor& input,
                                 const std::vector<int64_t>& send_rows, const std::vector<int64_t>& recv_rows) {
  require_contiguous(output, "all_to_all");
  require_contiguous(input, "all_to_all");
  const RowSplit sent = row_split(input, send_rows, size_, "all_to_all input");
  const RowSplit received = row_split(output, recv_rows, size_, "all_to_all output");
  if (input.scalar_type() != output.scalar_type() || sent.row_bytes != received.row_bytes)
    throw Error(ExitCode::kInternal, "all_to_all: input and output rows differ in dtype or shape");
  // Counts in rows of one derived type, so that a message may exceed 2^31 bytes.
  MPI_Datatype row = MPI_DATATYPE_NULL;
  MPI_CHECK(MPI_Type_contiguous(checked_count(std::max<int64_t>(sent.row_bytes, 1)), MPI_BYTE, &row));
  MPI_CHECK(MPI_Type_commit(&row));
  HostView in(input, /*copy_in=*/true), out(output, /*copy_in=*/false);
  std::vector<MPI_Request> request(1);
  const int status = MPI_Ialltoallv(in.data(), sent.counts.data(), sent.displacements.data(), row, out.data(),
                                    received.counts.data(), received.displacements.data(), row, comm_, request.data());
  MPI_Type_free(&row);  // MPI keeps what the operation under way needs
  if (status != MPI_SUCCESS) throw_mpi_error(status, "MPI_Ialltoallv", __FILE__, __LINE__);
  wait(request, [&] {
    return "all_to_all of " + std::to_string(input.size(0)) + " rows out, " + std::to_string(output.size(0)) +
           " in, over " + describe_group();
  });
  out.copy_out();
}

void MpiCommunicator::send(const torch::Tensor& tensor, int peer) {
  std::vector<Transfer> one = {{true, tensor, peer, 0}};
  exchange(one);
}

void MpiCommunicator::recv(torch::Tensor& tensor, int peer) {
  std::vector<Transfer> one = {{false, tensor, peer, 0}};
  exchange(one);
}

void MpiCommunicator::exchange(std::vector<Transfer>& transfers) { exchange_async(transfers)->wait(); }

namespace {

// Point-to-point transfers under way, each kept moving by the progress thread if it runs; wait()
// completes them all and copies what arrived into place. A timeout names what is still missing,
// and from or to whom.
class MpiTransfers final : public Work {
 public:
  using WaitNaming = std::function<void(const std::function<bool()>& done, const std::function<std::string()>& what)>;
  MpiTransfers(WaitNaming wait, const std::vector<Transfer>& transfers, const std::vector<int>& world_ranks,
               MPI_Comm comm)
      : wait_(std::move(wait)), transfers_(transfers), world_ranks_(world_ranks) {
    host_.reserve(transfers_.size());
    for (const Transfer& t : transfers_) {
      require_contiguous(t.tensor, "exchange");
      host_.emplace_back(t.tensor, /*copy_in=*/t.send);
      void* data = host_.back().data();
      const int bytes = checked_count(t.tensor.nbytes());
      requests_.push_back(started([&](MPI_Request* request) {
        if (t.send)
          MPI_CHECK(MPI_Isend(data, bytes, MPI_BYTE, t.peer, t.tag, comm, request));
        else
          MPI_CHECK(MPI_Irecv(data, bytes, MPI_BYTE, t.peer, t.tag, comm, request));
      }));
    }
  }
  ~MpiTransfers() override {
    for (size_t i = 0; i < requests_.size(); ++i) keep_until_complete(std::move(requests_[i]), {host_[i].host()});
  }
  MpiTransfers(const MpiTransfers&) = delete;
  MpiTransfers& operator=(const MpiTransfers&) = delete;
  void wait() override {
    wait_([this] { return ready(); }, [this] { return missing(); });
    for (size_t i = 0; i < transfers_.size(); ++i)
      if (!transfers_[i].send) host_[i].copy_out();
  }
  bool ready() override {
    bool all = true;
    for (auto& request : requests_) all = request->test() && all;  // each tested, to move each on
    return all;
  }

 private:
  std::string missing() const {
    std::string text = "point-to-point transfers";
    for (size_t i = 0; i < transfers_.size(); ++i)
      if (!requests_[i]->seen_complete())
        text += std::string(transfers_[i].send ? " (send to" : " (receive from") + " world rank " +
                std::to_string(world_ranks_[transfers_[i].peer]) + ", tag " + std::to_string(transfers_[i].tag) + ")";
    return text;
  }

  WaitNaming wait_;
  std::vector<Transfer> transfers_;
  const std::vector<int>& world_ranks_;
  std::vector<HostView> host_;
  std::vector<std::unique_ptr<mpi_progress::Watched>> requests_;
};

}  // namespace

std::unique_ptr<Work> MpiCommunicator::exchange_async(std::vector<Transfer>& transfers) {
  auto wait_here = [this](const std::function<bool()>& done, const std::function<std::string()>& what) {
    wait_until(done, what);
  };
  return std::make_unique<MpiTransfers>(wait_here, transfers, world_ranks_, comm_);
}

namespace {

// A send under way; its staged tensor lives until it completes.
class MpiSend final : public Work {
 public:
  MpiSend(WaitUntil wait, const torch::Tensor& tensor, int bytes, int peer, int tag, MPI_Comm comm)
      : wait_(std::move(wait)), host_(tensor, /*copy_in=*/true) {
    request_ = started([&](MPI_Request* request) {
      MPI_CHECK(MPI_Isend(host_.data(), bytes, MPI_BYTE, peer, tag, comm, request));
    });
  }
  ~MpiSend() override { keep_until_complete(std::move(request_), {host_.host()}); }
  MpiSend(const MpiSend&) = delete;
  MpiSend& operator=(const MpiSend&) = delete;
  void wait() override {
    wait_([this] { return request_->test(); });
  }
  bool ready() override { return request_->test(); }

 private:
  WaitUntil wait_;
  HostView host_;
  std::unique_ptr<mpi_progress::Watched> request_;
};

}  // namespace

std::unique_ptr<Work> MpiCommunicator::send_async(const torch::Tensor& tensor, int peer, int tag) {
  require_contiguous(tensor, "send_async");
  const int world_peer = world_ranks_[peer];
  auto wait_here = [this, world_peer, tag](const std::function<bool()>& done) {
    wait_until(done, [&] {
      return "point-to-point send to world rank " + std::to_string(world_peer) + ", tag " + std::to_string(tag);
    });
  };
  return std::make_unique<MpiSend>(wait_here, tensor, checked_count(tensor.nbytes()), peer, tag, comm_);
}

MPI_Comm split_members(MPI_Comm group, const std::vector<int>& members) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(group, &rank));
  const auto place = std::find(members.begin(), members.end(), rank);
  const bool member = place != members.end();
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split(group, member ? 0 : MPI_UNDEFINED, member ? static_cast<int>(place - members.begin()) : 0,
                           &sub));
  return sub;
}

std::unique_ptr<Communicator> MpiCommunicator::make_subgroup(const std::vector<int>& members) {
  MPI_Comm sub = split_members(comm_, members);
  if (sub == MPI_COMM_NULL) return nullptr;
  return std::make_unique<MpiCommunicator>(sub, timeout_s_);
}

std::string MpiCommunicator::broadcast_string(const std::string& text, int root) {
  torch::Tensor length = torch::full({1}, static_cast<int64_t>(text.size()), torch::kInt64);
  broadcast(length, root);
  torch::Tensor bytes = torch::zeros({length.item<int64_t>()}, torch::kUInt8);
  if (rank_ == root) std::memcpy(bytes.data_ptr(), text.data(), text.size());
  broadcast(bytes, root);
  return std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel()));
}

std::vector<std::string> MpiCommunicator::all_gather_strings(const std::string& text) {
  torch::Tensor lengths = torch::empty({size_}, torch::kInt64);
  all_gather(lengths, torch::full({1}, static_cast<int64_t>(text.size()), torch::kInt64));
  const int64_t longest = lengths.max().item<int64_t>();
  torch::Tensor mine = torch::zeros({longest}, torch::kUInt8), all = torch::empty({longest * size_}, torch::kUInt8);
  std::memcpy(mine.data_ptr(), text.data(), text.size());
  all_gather(all, mine);
  std::vector<std::string> texts;
  for (int r = 0; r < size_; ++r)
    texts.emplace_back(static_cast<const char*>(all.data_ptr()) + r * longest, static_cast<size_t>(lengths[r].item<int64_t>()));
  return texts;
}

void MpiCommunicator::barrier() {
  std::vector<MPI_Request> request(1);
  MPI_CHECK(MPI_Ibarrier(comm_, request.data()));
  wait(request, [&] { return "barrier over " + describe_group(); });
}

}  // namespace dstrain
