// The zero-bubble schedules over communicators that match transfers as NCCL does (no tags, in the
// order they are posted, each communicator's operations one after the other on a queue of their
// own, as on a CUDA stream, a send done only once its receive has started): the real executor and
// its channels (pipeline/channels.h) on 2–4 real ranks, a toy model's gradients and losses checked
// against the whole model computed on one rank. With one queue for every channel, ZB-V deadlocks
// here (a send holds back a receive of another channel), which the queue's bound turns into an
// error: the control case checks that it does.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dstrain/parallel/mpi_communicator.h"
#include "dstrain/pipeline/executor.h"
#include "dstrain/pipeline/weight_gradient_store.h"
#include "unused_communicator.h"

using namespace dstrain;

namespace {

// Transfers posted on this communicator run one group after the other on its own thread (the
// stream); a caller waits for a group's completion only through its Work. A group that has not
// completed after `bound_s` ends with an error. With `one_queue`, its subgroups post on its own
// queue instead of theirs, as if every channel shared one communicator.
class StreamOrderedGroup final : public test::UnusedCommunicator {
 public:
  StreamOrderedGroup(MPI_Comm comm, double bound_s, bool one_queue = false)
      : UnusedCommunicator(kUnused), comm_(comm), bound_s_(bound_s), one_queue_(one_queue) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    stream_ = std::thread([this] { run(); });
  }
  // A subgroup on `owner`'s queue: ranks `members` of the owner.
  StreamOrderedGroup(StreamOrderedGroup& owner, std::vector<int> members)
      : UnusedCommunicator(kUnused), owner_(&owner), members_(std::move(members)) {
    rank_ = static_cast<int>(std::find(members_.begin(), members_.end(), owner.rank_) - members_.begin());
    size_ = static_cast<int>(members_.size());
  }
  ~StreamOrderedGroup() override {
    if (owner_) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    queued_.notify_all();
    stream_.join();
    MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Backend backend() const override { return Backend::kNccl; }
  bool callable_from_any_thread() const override { return false; }
  void exchange(std::vector<Transfer>& transfers) override { exchange_async(transfers)->wait(); }
  std::unique_ptr<Work> exchange_async(std::vector<Transfer>& transfers) override { return post(transfers); }
  std::unique_ptr<Work> send_async(const torch::Tensor& tensor, int peer, int tag) override {
    return post({Transfer{true, tensor, peer, tag}});
  }
  std::unique_ptr<Communicator> make_subgroup(const std::vector<int>& members) override {
    if (one_queue_) {
      const bool member = std::find(members.begin(), members.end(), rank_) != members.end();
      return member ? std::make_unique<StreamOrderedGroup>(*this, members) : nullptr;
    }
    MPI_Comm sub = split_members(comm_, members);
    return sub == MPI_COMM_NULL ? nullptr : std::make_unique<StreamOrderedGroup>(sub, bound_s_);
  }
  void barrier() override { MPI_Barrier(comm_); }
  void synchronize() override {}

 private:
  struct Group {
    std::vector<Transfer> transfers;
    bool done = false;
    std::string failure;
  };
  class GroupWork final : public Work {
   public:
    GroupWork(StreamOrderedGroup& owner, std::shared_ptr<Group> group) : owner_(owner), group_(std::move(group)) {}
    void wait() override {
      std::unique_lock<std::mutex> lock(owner_.mutex_);
      owner_.finished_.wait(lock, [&] { return group_->done; });
      if (!group_->failure.empty()) throw std::runtime_error(group_->failure);
    }
    bool ready() override {
      std::lock_guard<std::mutex> lock(owner_.mutex_);
      if (!group_->failure.empty()) throw std::runtime_error(group_->failure);
      return group_->done;
    }

   private:
    StreamOrderedGroup& owner_;
    std::shared_ptr<Group> group_;
  };

  static constexpr const char* kUnused = "the pipeline's transfers do not call this";

  std::unique_ptr<Work> post(std::vector<Transfer> transfers) {
    if (owner_) {
      for (Transfer& t : transfers) t.peer = members_.at(static_cast<size_t>(t.peer));
      return owner_->post(std::move(transfers));
    }
    auto group = std::make_shared<Group>();
    group->transfers = std::move(transfers);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(group);
    }
    queued_.notify_all();
    return std::make_unique<GroupWork>(*this, group);
  }

  void run() {
    while (true) {
      std::shared_ptr<Group> group;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        queued_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        group = queue_.front();
        queue_.pop_front();
      }
      const std::string failure = transfer(*group);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        group->done = true;
        group->failure = failure;
      }
      finished_.notify_all();
    }
  }

  // One tag for all: matched in posting order. A synchronous send is done only once its receive
  // has started, as an NCCL send waits for its receiver.
  std::string transfer(Group& group) {
    std::vector<MPI_Request> requests;
    for (Transfer& t : group.transfers) {
      MPI_Request request = MPI_REQUEST_NULL;
      const int bytes = static_cast<int>(t.tensor.nbytes());
      if (t.send)
        MPI_Issend(t.tensor.data_ptr(), bytes, MPI_BYTE, t.peer, 0, comm_, &request);
      else
        MPI_Irecv(t.tensor.data_ptr(), bytes, MPI_BYTE, t.peer, 0, comm_, &request);
      requests.push_back(request);
    }
    const auto start = std::chrono::steady_clock::now();
    while (true) {
      int done = 0;
      MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
      if (done) return "";
      if (std::chrono::steady_clock::now() - start > std::chrono::duration<double>(bound_s_)) {
        for (MPI_Request& request : requests) {
          if (request == MPI_REQUEST_NULL) continue;
          MPI_Cancel(&request);
          MPI_Request_free(&request);
        }
        return "a transfer group did not complete within " + std::to_string(bound_s_) +
               " s: its channel waits for another (a deadlock)";
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  double bound_s_ = 0;
  bool one_queue_ = false;
  StreamOrderedGroup* owner_ = nullptr;  // a subgroup on the owner's queue
  std::vector<int> members_;             // ... its ranks there
  int rank_ = 0, size_ = 1;
  std::mutex mutex_;
  std::condition_variable queued_, finished_;
  std::deque<std::shared_ptr<Group>> queue_;
  bool stopping_ = false;
  std::thread stream_;  // last: started once the rest is ready
};

constexpr int64_t kWidth = 3, kBatch = 2, kPositions = 4;

// Virtual stage k multiplies by its weights and squashes: tanh(x · w_k); the first takes the token
// ids as x; the last's objective is the mean square of its output minus the next tokens.
torch::Tensor weights_of(int virtual_stage) {
  return torch::tensor({0.3f + 0.1f * virtual_stage, -0.2f, 0.05f * virtual_stage});
}

torch::Tensor squashed(const torch::Tensor& input, const torch::Tensor& w) {
  const torch::Tensor x = input.is_floating_point() ? input : input.to(torch::kFloat32).unsqueeze(-1) * 0.1f;
  return torch::tanh(x * w);
}

torch::Tensor objective_of(const torch::Tensor& output, const torch::Tensor& tokens) {
  return (output.sum(-1) - tokens.narrow(1, 1, kPositions).to(torch::kFloat32) * 0.1f).pow(2).mean();
}

class ToyChunks final : public PipelineStage {
 public:
  ToyChunks(const Schedule& schedule, int stage) : schedule_(schedule), stage_(stage) {
    for (int chunk = 0; chunk < schedule.virtual_stages; ++chunk)
      weights.push_back(weights_of(schedule.virtual_stage(stage, chunk)).requires_grad_(true));
  }
  int chunks() const override { return schedule_.virtual_stages; }
  int64_t activation_width() const override { return kWidth; }
  std::vector<std::string> loss_names() const override { return {"fit"}; }
  void begin_pass(bool, const torch::Tensor&) override {}
  torch::Tensor forward(int chunk, const torch::Tensor& input) override { return squashed(input, weights[chunk]); }
  MicroBatchLosses losses(int chunk, const torch::Tensor& input, const torch::Tensor& tokens) override {
    const torch::Tensor fit = objective_of(squashed(input, weights[chunk]), tokens);
    return {fit, {fit}};
  }

  std::vector<torch::Tensor> weights;  // per chunk

 private:
  Schedule schedule_;
  int stage_;
};

torch::Tensor tokens_of(int microbatch) {
  return (torch::arange(kBatch * (kPositions + 1), torch::kInt64) * (microbatch + 1)).remainder(11).reshape(
      {kBatch, kPositions + 1});
}

// Whether the ranks can run stream-ordered pipelines: skips the test otherwise.
bool stages_available() {
  int threads = MPI_THREAD_SINGLE, pp = 1;
  MPI_Query_thread(&threads);
  MPI_Comm_size(MPI_COMM_WORLD, &pp);
  return threads == MPI_THREAD_MULTIPLE && pp >= 2;
}

struct ToyPipeline {
  explicit ToyPipeline(ScheduleKind kind, double bound_s = 30, bool one_queue = false)
      : stages(world_duplicate(), bound_s, one_queue),
        train(make_schedule(kind, stages.size(), v_shaped(kind) ? 2 : 1, 2 * stages.size())),
        model(train, stages.rank()) {}
  static MPI_Comm world_duplicate() {
    MPI_Comm world = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, &world);
    return world;
  }
  // One training step: the stage's loss sums.
  std::vector<torch::Tensor> step() {
    executor = std::make_unique<PipelineExecutor>(
        train, make_schedule(ScheduleKind::kForwardOnly, train.pp, train.virtual_stages, train.microbatches,
                             train.v_shape),
        stages.rank(), model, weight_gradients, stages,
        ActivationShape{kBatch, kPositions, torch::kFloat32, torch::kCPU});
    return executor->train_step(tokens_of, train.microbatches, torch::Tensor());
  }

  StreamOrderedGroup stages;
  Schedule train;
  ToyChunks model;
  WeightGradientStore weight_gradients;
  std::unique_ptr<PipelineExecutor> executor;  // first to go
};

void expect_like_one_rank(ScheduleKind kind) {
  if (!stages_available()) GTEST_SKIP() << "needs two ranks or more and MPI_THREAD_MULTIPLE (the stream threads)";
  ToyPipeline pipeline(kind);
  const Schedule& train = pipeline.train;
  const int rank = pipeline.stages.rank(), chunks = train.virtual_stages, microbatches = train.microbatches;
  ToyChunks& model = pipeline.model;
  std::vector<torch::Tensor> sums;
  try {
    sums = pipeline.step();
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
    MPI_Abort(MPI_COMM_WORLD, 1);  // the other stages wait for this one's transfers
  }

  // The whole model on this rank: every virtual stage in turn, every micro-batch.
  std::vector<torch::Tensor> whole;
  for (int k = 0; k <= train.last_virtual_stage(); ++k) whole.push_back(weights_of(k).requires_grad_(true));
  double fit = 0;
  for (int m = 0; m < microbatches; ++m) {
    torch::Tensor x = tokens_of(m).narrow(1, 0, kPositions);
    for (const torch::Tensor& w : whole) x = squashed(x, w);
    const torch::Tensor objective = objective_of(x, tokens_of(m)) / microbatches;
    fit += objective.item<double>();
    objective.backward();
  }
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const int k = train.virtual_stage(rank, chunk);
    const torch::Tensor grad = model.weights[chunk].grad();
    EXPECT_TRUE(grad.defined() && torch::allclose(grad, whole[k].grad(), 1e-5, 1e-7))
        << "virtual stage " << k << ": " << grad << " vs " << whole[k].grad();
  }
  if (pipeline.executor->has_loss()) EXPECT_NEAR(sums.at(0).item<double>(), fit, 1e-6 * fit);
  pipeline.stages.barrier();
}

}  // namespace

TEST(PipelineChannels, ZbH1OverStreamOrderedTransfersMatchesOneRank) { expect_like_one_rank(ScheduleKind::kZbH1); }
TEST(PipelineChannels, ZbVOverStreamOrderedTransfersMatchesOneRank) { expect_like_one_rank(ScheduleKind::kZbV); }
TEST(PipelineChannels, DualPipeVOverStreamOrderedTransfersMatchesOneRank) {
  expect_like_one_rank(ScheduleKind::kDualPipeV);
}

// The control: every channel on one queue, ZB-V's step ends with the queue's error on some rank.
TEST(PipelineChannels, ZbVWithEveryChannelOnOneQueueDeadlocks) {
  if (!stages_available()) GTEST_SKIP() << "needs two ranks or more and MPI_THREAD_MULTIPLE (the stream threads)";
  int failed = 0;
  {
    ToyPipeline pipeline(ScheduleKind::kZbV, /*bound_s=*/2, /*one_queue=*/true);
    try {
      pipeline.step();
    } catch (const std::exception& e) {
      failed = std::string(e.what()).find("a deadlock") != std::string::npos;
    }
  }  // the queue ends once every group left on it has completed or timed out
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(any_failed, 1);
}
