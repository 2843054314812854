// Writes checkpoints while training goes on. A save blocks the step only for the copy of this
// rank's share of the tensors to host memory and the collective creation of the file's datasets
// (parallel HDF5 over MPI-IO, which also places every dataset in the file); a background thread
// then writes the data at those places, each rank its own share, and checksums it. When every
// rank is done, rank 0 records the checksums and the trainer state, renames NAME.tmp to NAME,
// points `latest` at it (replaced atomically too), and removes the checkpoints retention lets go.
// A crash at any moment leaves the previous checkpoint and `latest` as they were.
#pragma once

#include "dstrain/core/torch_api.h"

#include <atomic>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "dstrain/ckpt/format.h"
#include "dstrain/ckpt/parameter_file.h"
#include "dstrain/parallel/mpi_communicator.h"

namespace dstrain {

struct RetentionPolicy {
  int keep_last = 3;   // the newest K checkpoints (0: all)
  int keep_every = 0;  // and every checkpoint whose step is a multiple of N, for good (0: none)
};

// The checkpoints that `policy` removes from those present (file names) once the checkpoint of
// `current_step` is written: never that one, and never those of later steps (left by a run this
// one resumed before; not counted either), so that `latest` always names a file.
std::vector<std::string> checkpoints_to_remove(const std::vector<std::string>& present, const RetentionPolicy& policy,
                                               int64_t current_step);

// A part of a dataset that this rank alone holds (ZeRO-1's optimizer shards, tensor parallelism's
// blocks): the elements [offset, offset + values.numel()) of the flattened dataset of `shape`,
// or with `rows` > 1 that many rows of values.numel() / rows elements, `stride` apart from
// `offset` (a block of columns). The ranks' pieces of a dataset together cover it; each is
// checksummed on its own (format.h).
struct DatasetPiece {
  std::string name;
  torch::Tensor values;
  std::vector<int64_t> shape;
  int64_t offset = 0;
  int64_t rows = 1, stride = 0;
};

class CheckpointWriter {
 public:
  // `world`: every rank, which write the file together; `replicas`: the ranks holding copies of
  // this rank's replicated datasets, which share their writing. `timeout_s` bounds the collective
  // creation of each file (comm.timeout_s): a rank whose write failed there (a full disk) must not
  // leave the others waiting inside HDF5 for ever.
  CheckpointWriter(std::string dir, RetentionPolicy retention, MpiCommunicator& world, const Communicator& replicas,
                   double timeout_s = 600);
  ~CheckpointWriter();  // a save still being written is abandoned: NAME.tmp stays, `latest` unchanged
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Collective. `replicated`: what this rank's pipeline stage holds whole ("model/<name>",
  // "optim/<name>/exp_avg", ...; the same list on every rank of `replicas`, which share the
  // writing). `owned`: pieces this rank alone holds, which it writes itself. `rng`: this
  // rank's generator state. Finishes the previous save first, if one is in flight. Returns the
  // seconds the caller was blocked.
  double begin(int64_t step, const NamedTensors& replicated, const std::vector<DatasetPiece>& owned,
               CheckpointState state, const torch::Tensor& rng);
  // Collective and cheap: completes the save in flight if every rank has written its share.
  // Call at every step boundary.
  void poll();
  // Collective: waits for the save in flight and completes it.
  void finish();

  bool in_flight() const { return in_flight_; }

 private:
  struct Job {
    int64_t step = 0;
    std::string path, tmp_path;
    CheckpointState state;
    std::vector<DatasetPiece> mine;               // host copies this rank writes (a whole one: offset 0)
    std::map<std::string, uint64_t> offsets;      // where each dataset lies in the file
    std::map<std::string, std::string> checksums; // of what this rank wrote, as recorded (format.h)
    std::string error;                                        // of the writer thread
    double blocked_seconds = 0;
    std::chrono::steady_clock::time_point started;
  };
  void write_share();  // the background thread
  void complete();     // collective: the save in flight is written everywhere
  void finalize_on_rank0(const std::map<std::string, std::string>& checksums);

  std::string dir_;
  RetentionPolicy retention_;
  MpiCommunicator& world_;
  const Communicator& replicas_;
  double timeout_s_;
  bool in_flight_ = false;
  Job job_;
  std::atomic<bool> written_{false};
  std::thread thread_;
};

// A checkpoint written whole by one process, outside a training run (`dstrain ckpt import-hf`):
// the datasets `names` ("model/<hf name>"), asked of `source` one at a time and stored in the
// tensor's dtype, then `state`: the file a run would write, readable by everything that reads
// checkpoints. Written as PATH.tmp and renamed PATH when complete, so that an existing PATH stays
// as it was until then; on failure PATH.tmp is removed. Throws Error(kCheckpoint) naming the file.
void write_checkpoint_file(const std::string& path, const std::vector<std::string>& names,
                           const std::function<torch::Tensor(const std::string&)>& source,
                           const CheckpointState& state);

}  // namespace dstrain
