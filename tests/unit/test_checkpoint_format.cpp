#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "dstrain/ckpt/checkpoint_writer.h"
#include "dstrain/ckpt/format.h"
#include "dstrain/ckpt/model_shape.h"
#include "dstrain/ckpt/training_checkpoint.h"
#include "dstrain/core/xxhash.h"
#include "dstrain/core/h5.h"
#include "test_util.h"

using namespace dstrain;

namespace {

// Every field of the checkpoint state away from its default.
CheckpointState sample_state() {
  CheckpointState s;
  s.step = 12;
  s.consumed_samples = 96;
  s.tokens = 6144;
  s.optimizer_steps = 11;
  s.loss_scale = 32768;
  s.loss_scale_clean_steps = 3;
  s.skipped_steps = 1;
  s.global_batch = 8;
  s.seq_len = 64;
  s.config = "[model]\npreset = tiny\n";
  s.model_shape = "vocab_size = 256\nhidden_size = 32\n";
  s.corpus_path = "data/train.h5";
  s.corpus_checksum = "0123456789abcdef";
  s.tokenizer = "byte";
  s.world_size = 4;
  s.dp = 2;
  s.pp = 2;
  s.virtual_stages = 1;
  s.schedule = "1f1b";
  s.stage_layers = "1,1";
  s.rng = torch::arange(8, torch::kUInt8).reshape({4, 2});
  return s;
}

// sample_state()'s checksum, worked out apart from dstrain (XXH64 of the values' bytes, texts
// after their u64 length, in the order files have always been checksummed in).
const char* kSampleChecksum = "2258a385ff8333a5";
const char* kSampleChecksumWithoutTokenizer = "7a863501d44a1103";

h5::Handle open_file(const std::string& path, unsigned flags) {
  return h5::Handle(h5::check_id(H5Fopen(path.c_str(), flags, H5P_DEFAULT), ExitCode::kInternal, path), H5Fclose);
}

CheckpointState read_state(const std::string& path) {
  const h5::Handle file = open_file(path, H5F_ACC_RDONLY);
  return read_checkpoint_state(file.get(), path);
}

// Edits the /trainer of the checkpoint file `path` as an older dstrain would have written it.
void edit_trainer(const std::string& path, const std::vector<std::string>& removed, const std::string& checksum) {
  const h5::Handle file = open_file(path, H5F_ACC_RDWR);
  h5::Handle trainer(h5::check_id(H5Gopen2(file.get(), "trainer", H5P_DEFAULT), ExitCode::kInternal, path), H5Gclose);
  for (const std::string& name : removed)
    h5::check(H5Adelete(trainer.get(), name.c_str()), ExitCode::kInternal, name);
  if (!checksum.empty()) {
    h5::check(H5Adelete(trainer.get(), kChecksumAttribute), ExitCode::kInternal, kChecksumAttribute);
    h5::write_attribute_string(trainer.get(), kChecksumAttribute, checksum, ExitCode::kInternal);
  }
}

}  // namespace

TEST(CheckpointFormat, FileNamesCarryTheStep) {
  EXPECT_EQ(checkpoint_file_name(120), "step_00000120.h5");
  EXPECT_EQ(step_of_checkpoint_file("step_00000120.h5"), 120);
  EXPECT_EQ(step_of_checkpoint_file("step_00000120.h5.tmp"), -1);
  EXPECT_EQ(step_of_checkpoint_file("latest"), -1);
  EXPECT_EQ(step_of_checkpoint_file("step_0000012x.h5"), -1);
}

// The newest keep_last stay, and milestones (multiples of keep_every) stay for good.
TEST(CheckpointFormat, RetentionKeepsTheNewestAndTheMilestones) {
  std::vector<std::string> present = {"latest", "step_00000005.h5", "step_00000010.h5", "step_00000015.h5",
                                      "step_00000020.h5", "step_00000025.h5", "step_00000030.h5.tmp"};
  EXPECT_EQ(checkpoints_to_remove(present, {2, 0}, 25),
            (std::vector<std::string>{"step_00000015.h5", "step_00000010.h5", "step_00000005.h5"}));
  EXPECT_EQ(checkpoints_to_remove(present, {2, 10}, 25),
            (std::vector<std::string>{"step_00000015.h5", "step_00000005.h5"}));
  EXPECT_TRUE(checkpoints_to_remove(present, {0, 0}, 25).empty());  // keep all
  EXPECT_EQ(checkpoints_to_remove(present, {1, 0}, 25).size(), 4u);
  // A run resumed from step 10 writes step 15: the later 20 and 25 of the first run stay, are
  // not counted, and 15 (which `latest` now names) is kept even by keep_last = 1.
  EXPECT_EQ(checkpoints_to_remove(present, {1, 0}, 15),
            (std::vector<std::string>{"step_00000010.h5", "step_00000005.h5"}));
}

// The attributes keep their names, and the checksum the bytes and order of the files written so
// far: any other would fail the check of every existing checkpoint.
TEST(CheckpointFormat, StateKeepsTheAttributesAndChecksumOfExistingFiles) {
  std::vector<std::string> names;
  for (const StateField& field : checkpoint_state_fields()) names.push_back(field.name);
  EXPECT_EQ(names, (std::vector<std::string>{"step", "consumed_samples", "tokens", "optimizer_steps", "loss_scale",
                                             "loss_scale_clean_steps", "skipped_steps", "global_batch", "seq_len",
                                             "config", "model_shape", "corpus_path", "corpus_checksum", "tokenizer",
                                             "world_size", "dp", "pp", "virtual_stages", "schedule",
                                             "stage_layers"}));
  EXPECT_EQ(state_checksum(sample_state()), kSampleChecksum);
}

// What the writer stores the reader reads back and verifies. A file without an optional attribute
// reads it as its default, verified against the checksum of the others where it has one; a
// changed value fails the check.
TEST(CheckpointFormat, StateReadsBackAndOlderFilesWithoutOptionalAttributes) {
  h5::quiet_errors();
  test::TempDir dir;
  const std::string path = dir.path("state.h5");
  {
    h5::Handle file(h5::check_id(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
                                 ExitCode::kInternal, path),
                    H5Fclose);
    write_checkpoint_state(file.get(), sample_state(), path);
  }
  CheckpointState read = read_state(path);
  EXPECT_EQ(state_checksum(read), kSampleChecksum);
  EXPECT_EQ(read.step, 12);
  EXPECT_EQ(read.loss_scale, 32768);
  EXPECT_EQ(read.tokenizer, "byte");
  EXPECT_EQ(read.stage_layers, "1,1");
  EXPECT_FALSE(read.rng.defined());  // a dataset, read by CheckpointReader with the others

  edit_trainer(path, {"tokenizer"}, kSampleChecksumWithoutTokenizer);
  read = read_state(path);
  EXPECT_EQ(read.tokenizer, "");
  EXPECT_EQ(read.corpus_checksum, "0123456789abcdef");

  edit_trainer(path, {}, kSampleChecksum);  // the checksum of other values
  test::expect_error([&] { read_state(path); }, ExitCode::kCheckpoint,
                     {path + ": /trainer: its attributes", "do not match their checksum"});

  edit_trainer(path, {kChecksumAttribute}, "");  // the earliest files: no checksum of /trainer
  EXPECT_EQ(read_state(path).tokenizer, "");
}

// A checkpoint of another model is refused naming the first key that differs, its value there
// (in the checkpoint) and here.
TEST(CheckpointFormat, ModelShapesCompareKeyByKey) {
  ModelConfig model;
  model.vocab_size = 256;
  model.hidden_size = 32;
  model.num_layers = 2;
  const std::string here = model_shape_text(model);
  EXPECT_EQ(here.rfind("vocab_size = 256\nhidden_size = 32\n", 0), 0u) << here;
  EXPECT_EQ(model_shape_difference(here, here), "");
  model.hidden_size = 64;
  EXPECT_EQ(model_shape_difference(here, model_shape_text(model)), "model.hidden_size = 32 there, 64 here");
  EXPECT_EQ(model_shape_difference("vocab_size = 256\n", here), "model.hidden_size = ? there, 32 here");
}

// Tensor parallelism's blocks of columns, with ZeRO-1's shards of them: each rank's elements become
// pieces of the whole dataset (runs and blocks of rows), which together tile it, and whose
// checksums find a changed element.
TEST(CheckpointFormat, BlocksOfColumnsTileTheDatasetAndAreChecksummed) {
  const torch::Tensor whole = torch::arange(24, torch::kFloat32).view({4, 6});
  std::vector<dstrain::DatasetPiece> pieces;
  for (int64_t index : {0, 1}) {
    const torch::Tensor mine = whole.narrow(1, index * 3, 3).contiguous();  // [4, 3]
    for (const auto& [offset, count] : {std::pair<int64_t, int64_t>{0, 2}, {2, 7}, {9, 3}}) {  // ZeRO-1's shards
      dstrain::OptimizerStateView state{"w", mine, mine, mine, mine, {4, 3}, offset};
      state.master = mine.view({-1}).narrow(0, offset, count);
      state.exp_avg = state.exp_avg_sq = state.master;
      dstrain::TensorParallelPlacement placement;
      placement.part = [index](const std::string&) { return dstrain::TensorPart{1, index, 2}; };
      for (const dstrain::DatasetPiece& piece : dstrain::checkpoint_contents({}, {state}, true, placement).owned)
        if (piece.name == "optim/w/exp_avg") pieces.push_back(piece);
    }
  }
  std::vector<std::string> records;
  torch::Tensor rebuilt = torch::full({24}, -1.0f);
  for (const dstrain::DatasetPiece& piece : pieces) {
    EXPECT_EQ(piece.shape, (std::vector<int64_t>{4, 6}));
    const int64_t width = piece.values.numel() / piece.rows;
    for (int64_t r = 0; r < piece.rows; ++r)
      rebuilt.narrow(0, piece.offset + r * piece.stride, width).copy_(piece.values.narrow(0, r * width, width));
    const uint64_t hash = dstrain::xxh64(piece.values.data_ptr(), piece.values.nbytes());
    records.push_back(piece.rows > 1 ? dstrain::block_checksum(piece.offset, width, piece.rows, piece.stride, hash)
                                     : dstrain::piece_checksum(piece.offset, width, hash));
  }
  EXPECT_TRUE(torch::equal(rebuilt, whole.view({-1})));
  EXPECT_TRUE(std::any_of(pieces.begin(), pieces.end(), [](const auto& p) { return p.rows > 1; }));
  const std::string recorded = dstrain::join_piece_checksums(records);
  std::string problem;
  EXPECT_EQ(dstrain::checksum_pieces(recorded, 24, &problem).size(), records.size()) << problem;
  EXPECT_EQ(dstrain::checksum_mismatch(whole, recorded), "");
  torch::Tensor damaged = whole.clone();
  damaged[1][4] = 100.0f;  // in rank 1's block of columns, inside a block of two rows
  EXPECT_NE(dstrain::checksum_mismatch(damaged, recorded).find("rows"), std::string::npos);
  // Pieces that overlap, or leave a gap, do not tile the dataset.
  records.push_back(dstrain::block_checksum(0, 3, 2, 6, 0));
  EXPECT_TRUE(dstrain::checksum_pieces(dstrain::join_piece_checksums(records), 24, &problem).empty());
  EXPECT_NE(problem.find("do not cover"), std::string::npos);
}
