// Reads a checkpoint (format.h): the trainer state, and datasets by name, each verified against
// its checksum. Opened read-only by every rank at once, each reading what it needs.
#pragma once

#include "dstrain/core/torch_api.h"

#include <string>
#include <vector>

#include "dstrain/ckpt/ckpt_config.h"
#include "dstrain/ckpt/format.h"

namespace dstrain {

// ckpt.resume → the checkpoint file to start from, or "" to start afresh. none: "";
// auto: the one `latest` in `dir` names, or without a `latest` the newest checkpoint file there
// (with a warning), or ""; a directory: its `latest`; a file: itself. Throws Error(kCheckpoint)
// when a named file is missing.
std::string resolve_resume(const ResumeFrom& resume, const std::string& dir);
// A checkpoint file, or a checkpoint directory: the file its `latest` names. Throws
// Error(kCheckpoint) naming `key` (the option that gave `path`) when there is no such file.
std::string resolve_checkpoint(const std::string& path, const std::string& key);

class CheckpointReader {
 public:
  // Throws Error(kCheckpoint) naming the file when it is missing, not HDF5 (or truncated), or not
  // a complete dstrain checkpoint of a format version this build reads.
  explicit CheckpointReader(const std::string& path);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& path() const { return path_; }
  const CheckpointState& state() const { return state_; }

  struct DatasetInfo {
    std::string name;  // "model/<hf name>", "optim/<hf name>/exp_avg", "trainer/rng_cpu"
    torch::ScalarType dtype;
    std::vector<int64_t> shape;
    std::string checksum;  // as recorded
  };
  const std::vector<DatasetInfo>& datasets() const { return datasets_; }
  const DatasetInfo* find(const std::string& name) const;

  // A CPU tensor of the stored dtype. Throws Error(kCheckpoint) naming the dataset when it is
  // missing or its data do not match the checksum.
  torch::Tensor read(const std::string& name) const;
  // Elements [offset, offset + count) of the dataset flattened (a ZeRO-1 rank's shard): only the
  // pieces it was written in (format version 2) that hold them are read and checked against
  // their checksums, so that ranks resuming a sharded optimizer together read the file about
  // once, not once each. A dataset checksummed whole, or in blocks of rows, is read whole.
  torch::Tensor read_range(const std::string& name, int64_t offset, int64_t count) const;
  // Columns [first, first + width) of a 2-D dataset, [rows, width] (tensor parallelism's block of
  // a row-parallel weight): where every piece it was written in lies within a band of columns
  // (blocks of rows, runs within a row: format version 3), only the pieces that hold those columns
  // are read, each checked against its checksum; otherwise the whole dataset.
  torch::Tensor read_columns(const std::string& name, int64_t first, int64_t width) const;
  // Reads every dataset; the names of those whose data do not match their checksum.
  std::vector<std::string> verify() const;

 private:
  std::string path_;
  h5::Handle file_;
  CheckpointState state_;
  std::vector<DatasetInfo> datasets_;
};

}  // namespace dstrain
