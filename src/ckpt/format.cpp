#include "dstrain/ckpt/format.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <utility>

#include "dstrain/core/error.h"
#include "dstrain/core/xxhash.h"

namespace dstrain {
namespace {

constexpr ExitCode kCode = ExitCode::kCheckpoint;

// A 16-bit float with the given exponent and mantissa widths, little-endian, sign in bit 15.
h5::Handle half_type(size_t exponent_bits, size_t mantissa_bits, size_t bias) {
  h5::Handle type(h5::check_id(H5Tcopy(H5T_IEEE_F32LE), kCode, "H5Tcopy"), H5Tclose);
  h5::check(H5Tset_fields(type.get(), 15, mantissa_bits, exponent_bits, 0, mantissa_bits), kCode, "H5Tset_fields");
  h5::check(H5Tset_size(type.get(), 2), kCode, "H5Tset_size");
  h5::check(H5Tset_ebias(type.get(), bias), kCode, "H5Tset_ebias");
  return type;
}

}  // namespace

h5::Handle stored_type(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat32: return h5::Handle(H5Tcopy(H5T_IEEE_F32LE), H5Tclose);
    case torch::kFloat64: return h5::Handle(H5Tcopy(H5T_IEEE_F64LE), H5Tclose);
    case torch::kBFloat16: return half_type(8, 7, 127);
    case torch::kFloat16: return half_type(5, 10, 15);
    case torch::kInt64: return h5::Handle(H5Tcopy(H5T_STD_I64LE), H5Tclose);
    case torch::kUInt8: return h5::Handle(H5Tcopy(H5T_STD_U8LE), H5Tclose);
    default:
      throw Error(ExitCode::kInternal, std::string("checkpoint: no stored type for dtype ") + c10::toString(dtype));
  }
}

torch::ScalarType dtype_of_stored(hid_t type, const std::string& context) {
  const H5T_class_t kind = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  if (kind == H5T_FLOAT && size == 4) return torch::kFloat32;
  if (kind == H5T_FLOAT && size == 8) return torch::kFloat64;
  if (kind == H5T_FLOAT && size == 2) return H5Tget_ebias(type) == 127 ? torch::kBFloat16 : torch::kFloat16;
  if (kind == H5T_INTEGER && size == 8 && H5Tget_sign(type) == H5T_SGN_2) return torch::kInt64;
  if (kind == H5T_INTEGER && size == 1 && H5Tget_sign(type) == H5T_SGN_NONE) return torch::kUInt8;
  throw Error(kCode, context + ": a data type a checkpoint does not use");
}

const std::vector<StateField>& checkpoint_state_fields() {
  static const std::vector<StateField> fields = {
      {"step", &CheckpointState::step},
      {"consumed_samples", &CheckpointState::consumed_samples},
      {"tokens", &CheckpointState::tokens},
      {"optimizer_steps", &CheckpointState::optimizer_steps},
      {"loss_scale", &CheckpointState::loss_scale},
      {"loss_scale_clean_steps", &CheckpointState::loss_scale_clean_steps},
      {"skipped_steps", &CheckpointState::skipped_steps},
      {"global_batch", &CheckpointState::global_batch},
      {"seq_len", &CheckpointState::seq_len},
      {"config", &CheckpointState::config},
      {"model_shape", &CheckpointState::model_shape},
      {"corpus_path", &CheckpointState::corpus_path},
      {"corpus_checksum", &CheckpointState::corpus_checksum},
      {"tokenizer", &CheckpointState::tokenizer, /*optional=*/true},  // not in the earliest version 2 files
      {"world_size", &CheckpointState::world_size},
      {"dp", &CheckpointState::dp},
      {"pp", &CheckpointState::pp},
      {"virtual_stages", &CheckpointState::virtual_stages},
      {"schedule", &CheckpointState::schedule},
      {"stage_layers", &CheckpointState::stage_layers},
  };
  return fields;
}

namespace {

// What the state's checksum covers of one value: a number's bytes as they lie in memory; a text's
// length before its bytes, which keeps "ab" + "c" apart from "a" + "bc".
template <typename Number>
void append_checksummed(std::string& bytes, Number value) {
  bytes.append(reinterpret_cast<const char*>(&value), sizeof value);
}
void append_checksummed(std::string& bytes, const std::string& text) {
  append_checksummed(bytes, static_cast<uint64_t>(text.size()));
  bytes += text;
}

void write_attribute(hid_t group, const char* name, int64_t value) {
  h5::write_attribute_u64(group, name, static_cast<uint64_t>(value), kCode);  // step: never negative
}
void write_attribute(hid_t group, const char* name, uint64_t value) {
  h5::write_attribute_u64(group, name, value, kCode);
}
void write_attribute(hid_t group, const char* name, double value) {
  h5::write_attribute_f64(group, name, value, kCode);
}
void write_attribute(hid_t group, const char* name, const std::string& value) {
  h5::write_attribute_string(group, name, value, kCode);
}

void read_attribute(hid_t group, const char* name, const std::string& where, int64_t* value) {
  *value = static_cast<int64_t>(h5::read_attribute_u64(group, name, kCode, where));
}
void read_attribute(hid_t group, const char* name, const std::string& where, uint64_t* value) {
  *value = h5::read_attribute_u64(group, name, kCode, where);
}
void read_attribute(hid_t group, const char* name, const std::string& where, double* value) {
  *value = h5::read_attribute_f64(group, name, kCode, where);
}
void read_attribute(hid_t group, const char* name, const std::string& where, std::string* value) {
  *value = h5::read_attribute_string(group, name, kCode, where);
}

// Whether `group` has the attribute `name`; attributes that cannot be listed are an error.
bool has_attribute(hid_t group, const char* name, const std::string& where) {
  const htri_t exists = H5Aexists(group, name);
  if (exists < 0) throw Error(kCode, where + ": cannot read its attributes");
  return exists > 0;
}

// The XXH64 of the fields of `s` that a file holds, in the table's order: all of them in a file
// written now; in an older one, not those added to the format since (it was checksummed without).
std::string checksum_of(const CheckpointState& s, const std::vector<const StateField*>& held) {
  std::string bytes;
  for (const StateField* field : held)
    std::visit([&](auto member) { append_checksummed(bytes, s.*member); }, field->member);
  return hex64(xxh64(bytes.data(), bytes.size()));
}

}  // namespace

std::string state_checksum(const CheckpointState& s) {
  std::vector<const StateField*> all;
  for (const StateField& field : checkpoint_state_fields()) all.push_back(&field);
  return checksum_of(s, all);
}

void write_checkpoint_state(hid_t file, const CheckpointState& s, const std::string& path) {
  h5::Handle trainer(h5::check_id(H5Gcreate2(file, "trainer", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), kCode,
                                  path + ": creating /trainer"),
                     H5Gclose);
  const hid_t g = trainer.get();
  for (const StateField& field : checkpoint_state_fields())
    std::visit([&](auto member) { write_attribute(g, field.name, s.*member); }, field.member);
  h5::write_attribute_string(g, kChecksumAttribute, state_checksum(s), kCode);
  {
    hsize_t dims[2] = {static_cast<hsize_t>(s.rng.size(0)), static_cast<hsize_t>(s.rng.size(1))};
    h5::Handle space(h5::check_id(H5Screate_simple(2, dims, nullptr), kCode, "H5Screate_simple"), H5Sclose);
    h5::Handle rng(h5::check_id(H5Dcreate2(g, "rng_cpu", H5T_STD_U8LE, space.get(), H5P_DEFAULT, H5P_DEFAULT,
                                           H5P_DEFAULT),
                                kCode, path + ": creating /trainer/rng_cpu"),
                   H5Dclose);
    h5::check(H5Dwrite(rng.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, s.rng.data_ptr()), kCode,
              path + ": writing /trainer/rng_cpu");
    h5::write_attribute_string(rng.get(), kChecksumAttribute, hex64(xxh64(s.rng.data_ptr(), s.rng.nbytes())), kCode);
  }
  h5::Handle root(h5::check_id(H5Gopen2(file, "/", H5P_DEFAULT), kCode, path), H5Gclose);
  h5::write_attribute_string(root.get(), "format", kCheckpointFormat, kCode);
  h5::write_attribute_u64(root.get(), "format_version", kCheckpointFormatVersion, kCode);
}

CheckpointState read_checkpoint_state(hid_t file, const std::string& path) {
  const std::string where = path + ": /trainer";
  h5::Handle trainer(h5::check_id(H5Gopen2(file, "trainer", H5P_DEFAULT), kCode, where), H5Gclose);
  const hid_t g = trainer.get();
  CheckpointState s;
  std::vector<const StateField*> held;
  for (const StateField& field : checkpoint_state_fields()) {
    if (field.optional && !has_attribute(g, field.name, where)) continue;  // an older file: the default
    std::visit([&](auto member) { read_attribute(g, field.name, where, &(s.*member)); }, field.member);
    held.push_back(&field);
  }
  // The earliest version 2 files have no checksum of their attributes.
  if (has_attribute(g, kChecksumAttribute, where) &&
      h5::read_attribute_string(g, kChecksumAttribute, kCode, where) != checksum_of(s, held))
    throw Error(kCode, where + ": its attributes (step, samples consumed, configuration, ...) do not match their "
                               "checksum: the file was changed or damaged");
  return s;
}

std::string piece_checksum(int64_t offset, int64_t count, uint64_t hash) {
  return std::to_string(offset) + "+" + std::to_string(count) + ":" + hex64(hash);
}

std::string block_checksum(int64_t offset, int64_t width, int64_t rows, int64_t stride, uint64_t hash) {
  return std::to_string(offset) + "+" + std::to_string(width) + "x" + std::to_string(rows) + "/" +
         std::to_string(stride) + ":" + hex64(hash);
}

std::string join_piece_checksums(std::vector<std::string> pieces) {
  std::sort(pieces.begin(), pieces.end(), [](const std::string& a, const std::string& b) {
    return std::stoll(a) < std::stoll(b);
  });
  std::string joined;
  for (const std::string& piece : pieces) joined += (joined.empty() ? "" : ",") + piece;
  return joined;
}

namespace {

// "OFFSET+COUNT" or "OFFSET+WIDTHxROWS/STRIDE" (before the colon) into `piece`; false if unreadable.
bool parse_extent(const std::string& text, ChecksumPiece& piece) {
  const size_t plus = text.find('+'), times = text.find('x'), slash = text.find('/');
  if (plus == std::string::npos || plus == 0) return false;
  try {
    size_t used = 0;
    piece.offset = std::stoll(text.substr(0, plus), &used);
    if (used != plus) return false;
    if (times == std::string::npos) {
      piece.count = std::stoll(text.substr(plus + 1), &used);
      return used == text.size() - plus - 1;
    }
    if (slash == std::string::npos || times < plus || slash < times) return false;
    const int64_t width = std::stoll(text.substr(plus + 1, times - plus - 1));
    piece.rows = std::stoll(text.substr(times + 1, slash - times - 1));
    piece.stride = std::stoll(text.substr(slash + 1));
    piece.count = width * piece.rows;
    return width >= 0 && piece.rows >= 1 && piece.stride >= width;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

std::vector<ChecksumPiece> checksum_pieces(const std::string& recorded, int64_t elements, std::string* problem) {
  if (recorded.find(':') == std::string::npos) return {{0, elements, recorded}};
  std::vector<ChecksumPiece> pieces;
  std::vector<std::pair<int64_t, int64_t>> runs;  // every row of every piece: (first element, count)
  for (size_t at = 0; at < recorded.size();) {
    const size_t end = std::min(recorded.find(',', at), recorded.size());
    const std::string text = recorded.substr(at, end - at);
    const size_t colon = text.find(':');
    ChecksumPiece piece;
    if (colon == std::string::npos || !parse_extent(text.substr(0, colon), piece) || piece.count < 0) {
      *problem = "an unreadable checksum record \"" + text + "\"";
      return {};
    }
    piece.hash = text.substr(colon + 1);
    const int64_t width = piece.count / piece.rows;
    for (int64_t r = 0; r < piece.rows; ++r) runs.emplace_back(piece.offset + r * piece.stride, width);
    pieces.push_back(std::move(piece));
    at = end + 1;
  }
  // The rows, in order, must tile the dataset.
  std::sort(runs.begin(), runs.end());
  int64_t covered = 0;
  for (const auto& [first, count] : runs) {
    if (first != covered || first + count > elements) break;
    covered += count;
  }
  if (covered != elements) {
    *problem = "its pieces do not cover it (elements " + std::to_string(covered) + " onwards)";
    return {};
  }
  std::sort(pieces.begin(), pieces.end(),
            [](const ChecksumPiece& a, const ChecksumPiece& b) { return a.offset < b.offset; });
  return pieces;
}

std::string piece_mismatch(const char* bytes, int64_t element_size, const ChecksumPiece& piece) {
  const std::string actual = hex64(xxh64(bytes, static_cast<size_t>(piece.count * element_size)));
  if (actual == piece.hash) return "";
  return "elements " + std::to_string(piece.offset) + "+" + std::to_string(piece.count) +
         (piece.block() ? " in " + std::to_string(piece.rows) + " rows" : "") + ": xxh64 " + actual + ", recorded " +
         piece.hash;
}

std::string checksum_mismatch(const torch::Tensor& values, const std::string& recorded) {
  const auto* bytes = static_cast<const char*>(values.data_ptr());
  if (recorded.find(':') == std::string::npos) {
    const std::string actual = hex64(xxh64(bytes, values.nbytes()));
    return actual == recorded ? "" : "xxh64 " + actual + ", recorded " + recorded;
  }
  std::string problem;
  const int64_t element = static_cast<int64_t>(values.element_size());
  const torch::Tensor flat = values.reshape({-1});
  for (const ChecksumPiece& piece : checksum_pieces(recorded, values.numel(), &problem)) {
    std::string mismatch;
    if (piece.block()) {  // its rows, gathered in order
      const torch::Tensor rows =
          flat.as_strided({piece.rows, piece.count / piece.rows}, {piece.stride, 1},
                          flat.storage_offset() + piece.offset)
              .contiguous();
      mismatch = piece_mismatch(static_cast<const char*>(rows.data_ptr()), element, piece);
    } else {
      mismatch = piece_mismatch(bytes + piece.offset * element, element, piece);
    }
    if (!mismatch.empty()) return mismatch;
  }
  return problem;
}

const char* dtype_name(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat32: return "fp32";
    case torch::kFloat64: return "fp64";
    case torch::kBFloat16: return "bf16";
    case torch::kFloat16: return "fp16";
    case torch::kInt64: return "int64";
    case torch::kUInt8: return "uint8";
    default: return "?";
  }
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

std::string checkpoint_file_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld.h5", static_cast<long long>(step));
  return name;
}

int64_t step_of_checkpoint_file(const std::string& name) {
  if (name.size() != 16 || name.compare(0, 5, "step_") != 0 || name.compare(13, 3, ".h5") != 0) return -1;
  for (size_t i = 5; i < 13; ++i)
    if (name[i] < '0' || name[i] > '9') return -1;
  return std::strtoll(name.c_str() + 5, nullptr, 10);
}

}  // namespace dstrain
