#include "dstrain/ckpt/checkpoint_reader.h"

#include <fcntl.h>
#include <cerrno>
#include <cstring>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "dstrain/ckpt/format.h"
#include "dstrain/core/error.h"
#include "dstrain/core/files.h"
#include "dstrain/core/log.h"

namespace dstrain {
namespace {

constexpr ExitCode kCode = ExitCode::kCheckpoint;

herr_t collect_dataset(hid_t, const char* name, const H5O_info_t* info, void* out) {
  if (info->type == H5O_TYPE_DATASET) static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}

std::string latest_in(const std::string& dir) {
  std::ifstream in(dir + "/latest");
  std::string name;
  std::getline(in, name);
  if (name.empty()) throw Error(kCode, dir + "/latest: empty or unreadable");
  if (step_of_checkpoint_file(name) < 0)  // (its text may not even be printable)
    throw Error(kCode, dir + "/latest: does not name a checkpoint file (step_NNNNNNNN.h5): damaged? (set ckpt.resume "
                       "to a checkpoint file, or to none to start afresh)");
  const std::string path = dir + "/" + name;
  if (!files::is_regular_file(path))
    throw Error(kCode, dir + "/latest names " + name + ", which does not exist (set ckpt.resume to a checkpoint "
                       "file, or to none to start afresh)");
  return path;
}

// The newest checkpoint file in `dir`, its name; "" when there is none.
std::string newest_checkpoint_file(const std::string& dir) {
  std::string newest;  // step_NNNNNNNN.h5 sorts by step
  for (const std::string& name : files::directory_entries(dir))
    if (step_of_checkpoint_file(name) >= 0) newest = std::max(newest, name);
  return newest;
}

// ckpt.resume = auto in a checkpoint directory holding checkpoints but no `latest` (copied there,
// or left by a crash between a run's first checkpoint and its `latest`): the newest of them, as
// torchtitan resumes from its newest step folder. A file named step_N.h5 is complete: a save
// writes NAME.tmp and renames it only once every rank's data and the checksums are in. (Starting
// afresh instead would let the run's saves replace them.)
std::string newest_without_latest(const std::string& dir) {
  const std::string newest = newest_checkpoint_file(dir);
  if (newest.empty()) return "";
  log::warning("ckpt.dir = ", dir, " holds checkpoints but no `latest`: resuming from the newest, ", newest,
               " (ckpt.resume = none would start afresh, its checkpoints replacing those of the same steps)");
  return dir + "/" + newest;
}

}  // namespace

std::string resolve_checkpoint(const std::string& path, const std::string& key) {
  if (files::exists(path + "/latest")) return latest_in(path);
  if (files::is_regular_file(path)) return path;
  if (!files::is_directory(path)) throw Error(kCode, key + " = " + path + ": no such checkpoint file");
  const std::string newest = newest_checkpoint_file(path);
  if (newest.empty()) throw Error(kCode, key + " = " + path + ": a directory without a checkpoint (no `latest` file in it)");
  throw Error(kCode, key + " = " + path + ": holds checkpoints but no `latest` to choose one; give one of them, " +
                         "the newest being " + path + "/" + newest);
}

std::string resolve_resume(const ResumeFrom& resume, const std::string& dir) {
  switch (resume.kind) {
    case ResumeFrom::kNone: return "";
    case ResumeFrom::kAuto: return files::exists(dir + "/latest") ? latest_in(dir) : newest_without_latest(dir);
    case ResumeFrom::kPath: break;
  }
  return resolve_checkpoint(resume.path, "ckpt.resume");
}

CheckpointReader::CheckpointReader(const std::string& path) : path_(path) {
  std::lock_guard<std::recursive_mutex> lock(h5::h5_mutex());
  h5::quiet_errors();
  if (!files::is_regular_file(path)) throw Error(kCode, path + ": no such checkpoint file");
  file_ = h5::Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (file_.get() < 0)
    throw Error(kCode, path + ": not a readable HDF5 file (truncated or damaged?): " + h5::last_error_message());
  const hid_t file = file_.get();
  h5::Handle root(h5::check_id(H5Gopen2(file, "/", H5P_DEFAULT), kCode, path), H5Gclose);
  if (H5Aexists(root.get(), "format") <= 0 ||
      h5::read_attribute_string(root.get(), "format", kCode, path) != kCheckpointFormat) {
    // What ckpt.save_final wrote in earlier versions: /model without a configuration or trainer state.
    const bool parameter_file = H5Lexists(file, "model", H5P_DEFAULT) > 0 && H5Lexists(file, "trainer", H5P_DEFAULT) <= 0;
    throw Error(kCode, path + (parameter_file ? ": model parameters without a configuration, not a checkpoint; give "
                                                "the run's checkpoints/ directory or one of its files"
                                              : ": not a complete dstrain checkpoint (no format attribute)"));
  }
  const uint64_t version = h5::read_attribute_u64(root.get(), "format_version", kCode, path);
  if (version < 1 || version > kCheckpointFormatVersion)
    throw Error(kCode, path + ": checkpoint format version " + std::to_string(version) + "; this dstrain reads 1 to " +
                           std::to_string(kCheckpointFormatVersion));

  state_ = read_checkpoint_state(file, path);

  std::vector<std::string> names;
  h5::check(H5Ovisit(file, H5_INDEX_NAME, H5_ITER_INC, collect_dataset, &names), kCode, path + ": listing datasets");
  for (const std::string& name : names) {
    const std::string at = path + ": /" + name;
    h5::Handle dataset(h5::check_id(H5Dopen2(file, name.c_str(), H5P_DEFAULT), kCode, at), H5Dclose);
    h5::Handle type(h5::check_id(H5Dget_type(dataset.get()), kCode, at), H5Tclose);
    h5::Handle space(h5::check_id(H5Dget_space(dataset.get()), kCode, at), H5Sclose);
    const int rank = H5Sget_simple_extent_ndims(space.get());
    if (rank < 0) throw Error(kCode, at + ": unreadable shape");
    std::vector<hsize_t> dims(static_cast<size_t>(rank));
    h5::check(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), kCode, at);
    DatasetInfo info{name, dtype_of_stored(type.get(), at), std::vector<int64_t>(dims.begin(), dims.end()), ""};
    if (H5Aexists(dataset.get(), kChecksumAttribute) <= 0) throw Error(kCode, at + ": no checksum (incomplete checkpoint?)");
    info.checksum = h5::read_attribute_string(dataset.get(), kChecksumAttribute, kCode, at);
    datasets_.push_back(std::move(info));
  }
  const DatasetInfo* rng = find("trainer/rng_cpu");
  if (!rng) throw Error(kCode, path + ": /trainer/rng_cpu is missing");
  state_.rng = read("trainer/rng_cpu");
}

CheckpointReader::~CheckpointReader() {
  std::lock_guard<std::recursive_mutex> lock(h5::h5_mutex());
  file_.reset();
}

const CheckpointReader::DatasetInfo* CheckpointReader::find(const std::string& name) const {
  for (const DatasetInfo& d : datasets_)
    if (d.name == name) return &d;
  return nullptr;
}

torch::Tensor CheckpointReader::read(const std::string& name) const {
  const DatasetInfo* info = find(name);
  if (!info) throw Error(kCode, path_ + ": /" + name + " is missing");
  std::lock_guard<std::recursive_mutex> lock(h5::h5_mutex());
  const std::string at = path_ + ": /" + name;
  h5::Handle dataset(h5::check_id(H5Dopen2(file_.get(), name.c_str(), H5P_DEFAULT), kCode, at), H5Dclose);
  h5::Handle type = stored_type(info->dtype);  // the bytes as stored: the checksum covers them
  torch::Tensor values = torch::empty(info->shape, torch::dtype(info->dtype));
  h5::check(H5Dread(dataset.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data_ptr()), kCode,
            at + ": reading (truncated file?)");
  const std::string mismatch = checksum_mismatch(values, info->checksum);
  if (!mismatch.empty())
    throw Error(kCode, at + ": the data do not match the checksum (" + mismatch + "): the file is damaged");
  return values;
}

torch::Tensor CheckpointReader::read_range(const std::string& name, int64_t offset, int64_t count) const {
  const DatasetInfo* info = find(name);
  if (!info) throw Error(kCode, path_ + ": /" + name + " is missing");
  const std::string at = path_ + ": /" + name;
  const int64_t elements = c10::multiply_integers(info->shape);
  if (offset < 0 || count < 0 || offset + count > elements)
    throw Error(kCode, at + ": elements " + std::to_string(offset) + "+" + std::to_string(count) + " asked of " +
                           std::to_string(elements));
  std::string problem;
  const std::vector<ChecksumPiece> pieces = checksum_pieces(info->checksum, elements, &problem);
  if (!problem.empty()) throw Error(kCode, at + ": the data do not match the checksum (" + problem + ")");
  // Blocks of rows (tensor parallelism's column blocks) interleave: read whole, every piece checked.
  if (std::any_of(pieces.begin(), pieces.end(), [](const ChecksumPiece& p) { return p.block(); }))
    return read(name).reshape({-1}).narrow(0, offset, count);
  // The pieces that hold the range, and the span of the dataset they cover.
  auto first = std::find_if(pieces.begin(), pieces.end(), [&](const ChecksumPiece& p) { return p.offset + p.count > offset; });
  auto last = std::find_if(first, pieces.end(), [&](const ChecksumPiece& p) { return p.offset >= offset + count; });
  if (count == 0 || first == pieces.end()) return torch::empty({0}, torch::dtype(info->dtype));
  const int64_t span_start = first->offset, span_end = std::prev(last)->offset + std::prev(last)->count;
  haddr_t address = HADDR_UNDEF;
  if (span_end - span_start < elements) {
    std::lock_guard<std::recursive_mutex> lock(h5::h5_mutex());
    h5::Handle dataset(h5::check_id(H5Dopen2(file_.get(), name.c_str(), H5P_DEFAULT), kCode, at), H5Dclose);
    address = H5Dget_offset(dataset.get());  // contiguous storage, as the writer lays it out
  }
  if (address == HADDR_UNDEF) return read(name).reshape({-1}).narrow(0, offset, count);

  torch::Tensor span = torch::empty({span_end - span_start}, torch::dtype(info->dtype));
  const int64_t element = static_cast<int64_t>(span.element_size());
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(kCode, at + ": cannot open the file again to read its part");
  char* out = static_cast<char*>(span.data_ptr());
  size_t done = 0, total = span.nbytes();
  const off_t base = static_cast<off_t>(address) + static_cast<off_t>(span_start * element);
  int error = 0;
  while (done < total) {
    const ssize_t n = ::pread(fd, out + done, total - done, base + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = n < 0 ? errno : 0;
      break;
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  if (done < total)
    throw Error(kCode, at + ": reading elements " + std::to_string(span_start) + "+" +
                           std::to_string(span_end - span_start) + ": " +
                           (error ? std::strerror(error) : "the file ends first (truncated?)"));
  for (auto piece = first; piece != last; ++piece) {
    const std::string mismatch = piece_mismatch(out + (piece->offset - span_start) * element, element, *piece);
    if (!mismatch.empty())
      throw Error(kCode, at + ": the data do not match the checksum (" + mismatch + "): the file is damaged");
  }
  return span.narrow(0, offset - span_start, count);
}

namespace {

// The columns [first, first + width) a piece of a dataset with rows of `row` elements covers: a
// block of rows, or a run within one row (a run across rows covers them all: {0, row}).
std::pair<int64_t, int64_t> columns_of(const ChecksumPiece& piece, int64_t row) {
  const int64_t first = piece.offset % row, width = piece.count / piece.rows;
  if (piece.block() ? piece.stride == row : first + width <= row) return {first, width};
  return {0, row};
}

}  // namespace

torch::Tensor CheckpointReader::read_columns(const std::string& name, int64_t first, int64_t width) const {
  const DatasetInfo* info = find(name);
  if (!info) throw Error(kCode, path_ + ": /" + name + " is missing");
  const std::string at = path_ + ": /" + name;
  if (info->shape.size() != 2 || first < 0 || width < 0 || first + width > info->shape[1])
    throw Error(kCode, at + ": columns " + std::to_string(first) + "+" + std::to_string(width) + " asked of shape " +
                           shape_text(info->shape));
  const int64_t rows = info->shape[0], row = info->shape[1];
  std::string problem;
  const std::vector<ChecksumPiece> pieces = checksum_pieces(info->checksum, rows * row, &problem);
  if (!problem.empty()) throw Error(kCode, at + ": the data do not match the checksum (" + problem + ")");
  // One piece is the dataset whole; a piece wider than a band of columns spans other ranks' blocks.
  const bool banded = pieces.size() > 1 && std::all_of(pieces.begin(), pieces.end(), [&](const ChecksumPiece& p) {
                        return columns_of(p, row).second < row;
                      });
  if (!banded) return read(name).narrow(1, first, width).contiguous();

  torch::Tensor out = torch::empty({rows, width}, torch::dtype(info->dtype));
  std::lock_guard<std::recursive_mutex> lock(h5::h5_mutex());
  h5::Handle dataset(h5::check_id(H5Dopen2(file_.get(), name.c_str(), H5P_DEFAULT), kCode, at), H5Dclose);
  h5::Handle type = stored_type(info->dtype);
  h5::Handle file_space(h5::check_id(H5Dget_space(dataset.get()), kCode, at), H5Sclose);
  for (const ChecksumPiece& piece : pieces) {
    const auto [column, columns] = columns_of(piece, row);
    const int64_t from = std::max(first, column), to = std::min(first + width, column + columns);
    if (from >= to) continue;  // another rank's block
    // The piece whole (its checksum covers all of it), as a hyperslab of its rows.
    const hsize_t start[2] = {static_cast<hsize_t>(piece.offset / row), static_cast<hsize_t>(column)};
    const hsize_t count[2] = {static_cast<hsize_t>(piece.rows), static_cast<hsize_t>(columns)};
    torch::Tensor values = torch::empty({piece.rows, columns}, torch::dtype(info->dtype));
    h5::check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr), kCode, at);
    h5::Handle memory_space(h5::check_id(H5Screate_simple(2, count, nullptr), kCode, at), H5Sclose);
    h5::check(H5Dread(dataset.get(), type.get(), memory_space.get(), file_space.get(), H5P_DEFAULT, values.data_ptr()),
              kCode, at + ": reading (truncated file?)");
    const std::string mismatch =
        piece_mismatch(static_cast<const char*>(values.data_ptr()), values.element_size(), piece);
    if (!mismatch.empty())
      throw Error(kCode, at + ": the data do not match the checksum (" + mismatch + "): the file is damaged");
    out.narrow(0, static_cast<int64_t>(start[0]), piece.rows)
        .narrow(1, from - first, to - from)
        .copy_(values.narrow(1, from - column, to - from));
  }
  return out;
}

std::vector<std::string> CheckpointReader::verify() const {
  std::vector<std::string> bad;
  for (const DatasetInfo& d : datasets_) {
    try {
      read(d.name);
    } catch (const Error& e) {
      bad.push_back(e.what());
    }
  }
  return bad;
}

}  // namespace dstrain
