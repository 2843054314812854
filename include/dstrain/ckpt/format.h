// The checkpoint file (docs/checkpoints.md): one HDF5 file per checkpoint,
//   /model/<hf name>                      every parameter, full shape, in its dtype
//   /optim/<hf name>/master               fp32 master weight (bf16/fp16 models only)
//   /optim/<hf name>/exp_avg, exp_avg_sq  AdamW moments, fp32
//   /trainer                              attributes: step, data position, optimizer and loss-scale
//                                         state, effective configuration, layout, corpus identity;
//                                         dataset rng_cpu: every rank's generator state
// Every dataset carries its XXH64 checksum as the attribute "xxh64": of all its bytes
// ("0123456789abcdef"), or, for a dataset written in pieces by several ranks (ZeRO-1's optimizer
// shards), of each piece: "OFFSET+COUNT:HASH,..." in elements of the flattened dataset, the
// pieces covering it exactly (format version 2). A piece may also be a block of rows of equal
// width, "OFFSET+WIDTHxROWS/STRIDE:HASH": elements OFFSET + r × STRIDE ... + WIDTH - 1 for r <
// ROWS, hashed in that order (tensor parallelism's column blocks; format version 3). The file
// names the format and its version. bf16 and fp16 are stored as 16-bit HDF5 floating-point types,
// which h5dump and h5py read as numbers.
#pragma once

#include "dstrain/core/torch_api.h"

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "dstrain/core/h5.h"

namespace dstrain {

constexpr const char* kCheckpointFormat = "dstrain-checkpoint";
// 1: no piecewise checksums, 2: no blocks of rows; both still read
constexpr uint64_t kCheckpointFormatVersion = 3;
constexpr const char* kChecksumAttribute = "xxh64";

// Everything but the tensors: what a resumed run continues from and checks against.
struct CheckpointState {
  int64_t step = 0;
  uint64_t consumed_samples = 0, tokens = 0, optimizer_steps = 0;
  double loss_scale = 0, loss_scale_clean_steps = 0, skipped_steps = 0;  // fp16 only
  uint64_t global_batch = 0, seq_len = 0;
  std::string config;          // the effective configuration (config.ini)
  std::string model_shape;     // the model keys that fix the tensors' shapes, "key = value" lines
  std::string corpus_path, corpus_checksum;
  // The training corpus's tokenizer, as the corpus names it (byte, bpe:FILE:HASH): what the model's
  // token ids mean. Empty where unknown: imported weights, or checkpoints from before it was kept.
  std::string tokenizer;
  uint64_t world_size = 1, dp = 1, pp = 1, virtual_stages = 1;
  std::string schedule, stage_layers;
  torch::Tensor rng;  // uint8 [world_size, bytes]: each rank's CPU generator state
};

// One attribute of /trainer: its name and the field of CheckpointState it holds. The list of them
// (checkpoint_state_fields) is the one description of the attributes that the writer, the reader,
// the state's checksum and `dstrain ckpt inspect` all follow, so that a new field is one more entry.
using StateMember = std::variant<int64_t CheckpointState::*, uint64_t CheckpointState::*, double CheckpointState::*,
                                 std::string CheckpointState::*>;
struct StateField {
  const char* name;
  StateMember member;
  // Absent from older files: read as the field's default, and not in the checksum of a file
  // without it. Every field added to the format is optional, so that existing checkpoints still
  // read and verify.
  bool optional = false;
};
// Every attribute, in the order the checksum feeds them: numbers as their bytes, texts as their
// length (u64) and bytes. Another order or type would fail every existing checkpoint's check.
// int64 fields are stored as u64. rng is a dataset, not listed.
const std::vector<StateField>& checkpoint_state_fields();

// The HDF5 type a tensor of `dtype` is stored as, and back.
h5::Handle stored_type(torch::ScalarType dtype);
torch::ScalarType dtype_of_stored(hid_t type, const std::string& context);

// The XXH64 (16 hex digits) of every attribute value of /trainer, in checkpoint_state_fields'
// order: /trainer's own xxh64 attribute, which the reader checks (a changed step or sample count
// would resume the data order elsewhere, silently). The rng_cpu dataset has its own.
std::string state_checksum(const CheckpointState& state);

// Completes a checkpoint file: the group /trainer with the state's attributes and its dataset
// rng_cpu (checksummed), and the format attributes of "/", which mark the file a checkpoint.
// Throws Error(kCheckpoint) naming `path`.
void write_checkpoint_state(hid_t file, const CheckpointState& state, const std::string& path);
// The attributes of /trainer, checked against its checksum where the file has one; rng is left
// to the caller (a dataset, read with the others). Throws Error(kCheckpoint) naming `path`.
CheckpointState read_checkpoint_state(hid_t file, const std::string& path);

// The checksum record of one piece of a dataset written in pieces, "OFFSET+COUNT:HASH"; pieces
// records join with commas (join_piece_checksums sorts them by offset).
std::string piece_checksum(int64_t offset, int64_t count, uint64_t hash);
// The record of a block of `rows` rows of `width` elements, `stride` apart.
std::string block_checksum(int64_t offset, int64_t width, int64_t rows, int64_t stride, uint64_t hash);
std::string join_piece_checksums(std::vector<std::string> pieces);
// "" when `values` (the whole dataset, as stored) match the recorded checksum; else what differs.
std::string checksum_mismatch(const torch::Tensor& values, const std::string& recorded);

// One checksummed piece of a dataset: elements [offset, offset + count) of it flattened, or a
// block of `rows` rows of count / rows elements, `stride` apart, from `offset`.
struct ChecksumPiece {
  int64_t offset = 0, count = 0;
  std::string hash;  // 16 hex digits
  int64_t rows = 1, stride = 0;

  bool block() const { return rows > 1; }
};
// The pieces a recorded checksum describes, by offset, tiling the `elements` of the dataset (one
// piece for a whole-dataset record). Empty, with `problem` set, when the record is unreadable or
// its pieces do not tile the dataset.
std::vector<ChecksumPiece> checksum_pieces(const std::string& recorded, int64_t elements, std::string* problem);
// "" when `bytes` (piece `piece` as stored, element_size bytes an element) match its checksum.
std::string piece_mismatch(const char* bytes, int64_t element_size, const ChecksumPiece& piece);

// "fp32", "bf16", ...: as the configuration names them.
const char* dtype_name(torch::ScalarType dtype);
// "[64, 32]": a shape in messages.
std::string shape_text(const std::vector<int64_t>& shape);

// "step_00000120.h5"; the step of such a name, or -1.
std::string checkpoint_file_name(int64_t step);
int64_t step_of_checkpoint_file(const std::string& name);

}  // namespace dstrain
