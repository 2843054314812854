#include "dstrain/parallel/deadline.h"
#include "dstrain/ckpt/checkpoint_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "dstrain/core/error.h"
#include "dstrain/core/files.h"
#include "dstrain/core/log.h"
#include "dstrain/core/text.h"
#include "dstrain/core/xxhash.h"

namespace dstrain {
namespace {

using Clock = std::chrono::steady_clock;
constexpr ExitCode kCode = ExitCode::kCheckpoint;

struct DatasetSpec {
  std::string name;
  torch::ScalarType dtype;
  std::vector<int64_t> shape;
};

// "name\tdtype\tdim,dim,...\n" per dataset.
std::string serialize(const std::vector<DatasetSpec>& specs) {
  std::string text;
  for (const DatasetSpec& s : specs) {
    text += s.name + "\t" + std::to_string(static_cast<int>(s.dtype)) + "\t";
    for (size_t i = 0; i < s.shape.size(); ++i) text += (i ? "," : "") + std::to_string(s.shape[i]);
    text += "\n";
  }
  return text;
}

std::vector<DatasetSpec> parse(const std::string& text) {
  std::vector<DatasetSpec> specs;
  for (size_t at = 0; at < text.size();) {
    const size_t end = text.find('\n', at), tab1 = text.find('\t', at), tab2 = text.find('\t', tab1 + 1);
    DatasetSpec s{text.substr(at, tab1 - at),
                  static_cast<torch::ScalarType>(std::stoi(text.substr(tab1 + 1, tab2 - tab1 - 1))), {}};
    for (size_t d = tab2 + 1; d < end;) {
      size_t comma = std::min(text.find(',', d), end);
      s.shape.push_back(std::stoll(text.substr(d, comma - d)));
      d = comma + 1;
    }
    specs.push_back(std::move(s));
    at = end + 1;
  }
  return specs;
}

int64_t bytes_of(const DatasetSpec& s) {
  int64_t n = static_cast<int64_t>(c10::elementSize(s.dtype));
  for (int64_t d : s.shape) n *= d;
  return n;
}

void write_all(int fd, const char* data, size_t size, uint64_t offset, const std::string& what) {
  while (size > 0) {
    const ssize_t n = ::pwrite(fd, data, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error(kCode, what + ": " + std::strerror(errno));
    data += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

// Durable before it becomes visible: the data, then the name.
void sync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) throw Error(kCode, path + ": " + std::strerror(errno));
  const int status = ::fsync(fd);
  ::close(fd);
  if (status != 0) throw Error(kCode, path + ": fsync: " + std::strerror(errno));
}

void replace_file(const std::string& tmp, const std::string& path) {
  std::string why;
  if (!files::rename(tmp, path, &why)) throw Error(kCode, "cannot rename " + tmp + " to " + path + ": " + why);
}

// The copy to host memory: after it, training may change the tensor.
torch::Tensor host_copy(const torch::Tensor& t) {
  return t.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous();
}

}  // namespace

std::vector<std::string> checkpoints_to_remove(const std::vector<std::string>& present, const RetentionPolicy& policy,
                                               int64_t current_step) {
  std::vector<std::pair<int64_t, std::string>> checkpoints;
  for (const std::string& name : present) {
    const int64_t step = step_of_checkpoint_file(name);
    if (step >= 0 && step <= current_step) checkpoints.emplace_back(step, name);
  }
  std::sort(checkpoints.rbegin(), checkpoints.rend());  // newest first: the current one
  std::vector<std::string> remove;
  for (size_t i = 1; i < checkpoints.size(); ++i) {
    const bool recent = policy.keep_last <= 0 || i < static_cast<size_t>(policy.keep_last);
    const bool milestone = policy.keep_every > 0 && checkpoints[i].first % policy.keep_every == 0;
    if (!recent && !milestone) remove.push_back(checkpoints[i].second);
  }
  return remove;
}

CheckpointWriter::CheckpointWriter(std::string dir, RetentionPolicy retention, MpiCommunicator& world,
                                   const Communicator& replicas, double timeout_s)
    : dir_(std::move(dir)), retention_(retention), world_(world), replicas_(replicas), timeout_s_(timeout_s) {}

CheckpointWriter::~CheckpointWriter() {
  if (thread_.joinable()) thread_.join();
}

double CheckpointWriter::begin(int64_t step, const NamedTensors& datasets, const std::vector<DatasetPiece>& owned,
                               CheckpointState state, const torch::Tensor& rng) {
  finish();
  const Clock::time_point start = Clock::now();
  job_ = Job{};
  job_.step = step;
  job_.path = dir_ + "/" + checkpoint_file_name(step);
  job_.tmp_path = job_.path + ".tmp";
  job_.started = start;

  // Every rank learns every dataset (the first of each set of replicas describes those they hold
  // whole; every rank those it holds pieces of).
  std::vector<DatasetSpec> described;
  if (replicas_.rank() == 0)
    for (const auto& [name, t] : datasets) described.push_back({name, t.scalar_type(), t.sizes().vec()});
  for (const DatasetPiece& piece : owned) described.push_back({piece.name, piece.values.scalar_type(), piece.shape});
  std::vector<DatasetSpec> all;
  for (const std::string& text : world_.all_gather_strings(serialize(described)))
    for (DatasetSpec& s : parse(text)) all.push_back(std::move(s));
  std::sort(all.begin(), all.end(), [](const DatasetSpec& a, const DatasetSpec& b) { return a.name < b.name; });
  all.erase(std::unique(all.begin(), all.end(), [](const DatasetSpec& a, const DatasetSpec& b) { return a.name == b.name; }),
            all.end());

  // The replicas share their datasets, largest first to the least loaded: the same split on each
  // of them.
  std::vector<size_t> order(datasets.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return datasets[a].second.nbytes() > datasets[b].second.nbytes(); });
  std::vector<int64_t> load(static_cast<size_t>(replicas_.size()), 0);
  for (size_t i : order) {
    const size_t writer = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[writer] += static_cast<int64_t>(datasets[i].second.nbytes());
    if (static_cast<int>(writer) == replicas_.rank())
      job_.mine.push_back({datasets[i].first, host_copy(datasets[i].second), datasets[i].second.sizes().vec(), 0});
  }
  for (const DatasetPiece& piece : owned)
    job_.mine.push_back({piece.name, host_copy(piece.values), piece.shape, piece.offset, piece.rows, piece.stride});

  // Rank 0 keeps every rank's generator state.
  const std::vector<std::string> states = world_.all_gather_strings(
      std::string(static_cast<const char*>(rng.data_ptr()), static_cast<size_t>(rng.nbytes())));
  if (world_.rank() == 0) {
    for (const std::string& s : states)
      if (s.size() != states[0].size()) throw Error(ExitCode::kInternal, "checkpoint: ranks' generator states differ in size");
    state.rng = torch::empty({static_cast<int64_t>(states.size()), static_cast<int64_t>(states[0].size())}, torch::kUInt8);
    for (size_t r = 0; r < states.size(); ++r)
      std::memcpy(state.rng[static_cast<int64_t>(r)].data_ptr(), states[r].data(), states[r].size());
  }
  job_.state = std::move(state);

  // The file and its datasets, created together by every rank through MPI-IO; HDF5 places each
  // dataset (contiguous, allocated now, never filled) and tells where.
  std::string why;
  if (world_.rank() == 0 && !files::make_directories(dir_, &why))
    throw config_error("ckpt.dir", dir_, "cannot create this directory (" + why + ")");
  world_.barrier();
  {
    Deadline deadline("checkpoint of step " + std::to_string(step) + ": the collective creation of " +
                                job_.tmp_path,
                            timeout_s_, "a rank's write failed there (a full file system?) or a rank stopped",
                            kCode);
    deadline.remove_on_expiry(job_.tmp_path);
    std::lock_guard<std::recursive_mutex> lock(h5::h5_mutex());
    h5::quiet_errors();
    h5::Handle fapl(h5::check_id(H5Pcreate(H5P_FILE_ACCESS), kCode, "H5Pcreate"), H5Pclose);
    h5::check(H5Pset_fapl_mpio(fapl.get(), MPI_COMM_WORLD, MPI_INFO_NULL), kCode, "H5Pset_fapl_mpio");
    h5::Handle file(h5::check_id(H5Fcreate(job_.tmp_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), kCode,
                                 "cannot create " + job_.tmp_path),
                    H5Fclose);
    h5::Handle lcpl(h5::check_id(H5Pcreate(H5P_LINK_CREATE), kCode, "H5Pcreate"), H5Pclose);
    h5::check(H5Pset_create_intermediate_group(lcpl.get(), 1), kCode, "H5Pset_create_intermediate_group");
    h5::Handle dcpl(h5::check_id(H5Pcreate(H5P_DATASET_CREATE), kCode, "H5Pcreate"), H5Pclose);
    h5::check(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS), kCode, "H5Pset_layout");
    h5::check(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY), kCode, "H5Pset_alloc_time");
    h5::check(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), kCode, "H5Pset_fill_time");
    for (const DatasetSpec& spec : all) {
      std::vector<hsize_t> dims(spec.shape.begin(), spec.shape.end());
      h5::Handle space(h5::check_id(dims.empty() ? H5Screate(H5S_SCALAR)
                                                 : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                                    kCode, "H5Screate"),
                       H5Sclose);
      h5::Handle type = stored_type(spec.dtype);
      const std::string where = job_.tmp_path + ": /" + spec.name;
      h5::Handle dataset(h5::check_id(H5Dcreate2(file.get(), ("/" + spec.name).c_str(), type.get(), space.get(),
                                                 lcpl.get(), dcpl.get(), H5P_DEFAULT),
                                      kCode, "creating " + where),
                         H5Dclose);
      const haddr_t offset = H5Dget_offset(dataset.get());
      if (offset == HADDR_UNDEF && bytes_of(spec) > 0) throw Error(kCode, where + ": HDF5 placed no storage for it");
      job_.offsets[spec.name] = offset;
    }
  }
  job_.blocked_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  in_flight_ = true;
  written_ = false;
  thread_ = std::thread([this] { write_share(); });
  return job_.blocked_seconds;
}

void CheckpointWriter::write_share() {
  try {
    const int fd = ::open(job_.tmp_path.c_str(), O_WRONLY);
    if (fd < 0) throw Error(kCode, job_.tmp_path + ": " + std::strerror(errno));
    try {
      for (const DatasetPiece& piece : job_.mine) {
        const torch::Tensor& t = piece.values;
        const char* data = static_cast<const char*>(t.data_ptr());
        const uint64_t element = t.element_size(), row_bytes = t.nbytes() / static_cast<uint64_t>(piece.rows);
        for (int64_t r = 0; r < piece.rows; ++r) {
          const uint64_t first = static_cast<uint64_t>(piece.offset + r * piece.stride);
          write_all(fd, data + static_cast<uint64_t>(r) * row_bytes, row_bytes,
                    job_.offsets.at(piece.name) + first * element, job_.tmp_path + ": writing /" + piece.name);
        }
        const uint64_t hash = xxh64(data, t.nbytes());
        const bool whole = piece.offset == 0 && t.numel() == c10::multiply_integers(piece.shape);
        const std::string record =
            whole ? hex64(hash)
            : piece.rows > 1 ? block_checksum(piece.offset, t.numel() / piece.rows, piece.rows, piece.stride, hash)
                             : piece_checksum(piece.offset, t.numel(), hash);
        std::string& checksums = job_.checksums[piece.name];  // (a rank may write several pieces of one)
        checksums += (checksums.empty() ? "" : ",") + record;
      }
      if (::fsync(fd) != 0) throw Error(kCode, job_.tmp_path + ": fsync: " + std::strerror(errno));
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
  } catch (const std::exception& e) {
    job_.error = e.what();
  }
  job_.mine.clear();  // the host copies are no longer needed
  written_ = true;
}

void CheckpointWriter::poll() {
  if (!in_flight_) return;
  torch::Tensor everyone_written = torch::full({1}, written_ ? 1 : 0, torch::kInt32);
  // The minimum over ranks: 1 only when every rank has written its share.
  everyone_written.neg_();
  world_.all_reduce(everyone_written, ReduceOp::kMax);
  if (-everyone_written.item<int>() == 1) complete();
}

void CheckpointWriter::finish() {
  if (!in_flight_) return;
  if (thread_.joinable()) thread_.join();
  complete();
}

void CheckpointWriter::complete() {
  if (thread_.joinable()) thread_.join();
  in_flight_ = false;
  torch::Tensor failed = torch::full({1}, job_.error.empty() ? 0 : 1, torch::kInt32);
  world_.all_reduce(failed, ReduceOp::kMax);
  if (!job_.error.empty()) {
    // The partial file goes before the job ends: on a full disk it would keep the disk full.
    std::remove(job_.tmp_path.c_str());
    throw Error(kCode, "checkpoint of step " + std::to_string(job_.step) + ": " + job_.error);
  }
  if (failed.item<int>() != 0) return;  // the rank that failed says so and ends the job
  std::string mine;
  for (const auto& [name, checksum] : job_.checksums) mine += name + "\t" + checksum + "\n";
  std::map<std::string, std::vector<std::string>> records;  // a dataset's, from every rank that wrote some of it
  for (const std::string& text : world_.all_gather_strings(mine)) {
    for (size_t at = 0; at < text.size();) {
      const size_t tab = text.find('\t', at), end = text.find('\n', at);
      std::vector<std::string>& pieces = records[text.substr(at, tab - at)];
      for (size_t piece = tab + 1; piece < end;) {  // a rank's pieces of one dataset, one by one
        const size_t comma = std::min(text.find(',', piece), end);
        pieces.push_back(text.substr(piece, comma - piece));
        piece = comma + 1;
      }
      at = end + 1;
    }
  }
  std::map<std::string, std::string> checksums;
  for (auto& [name, pieces] : records)
    checksums[name] = pieces.size() == 1 && pieces[0].find(':') == std::string::npos ? pieces[0]
                                                                                      : join_piece_checksums(pieces);
  if (world_.rank() == 0) finalize_on_rank0(checksums);
}

void CheckpointWriter::finalize_on_rank0(const std::map<std::string, std::string>& checksums) {
  const CheckpointState& s = job_.state;
  {
    std::lock_guard<std::recursive_mutex> lock(h5::h5_mutex());
    h5::quiet_errors();
    h5::Handle file(h5::check_id(H5Fopen(job_.tmp_path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), kCode,
                                 "cannot reopen " + job_.tmp_path),
                    H5Fclose);
    for (const auto& [name, checksum] : checksums) {
      h5::Handle dataset(h5::check_id(H5Dopen2(file.get(), ("/" + name).c_str(), H5P_DEFAULT), kCode,
                                      job_.tmp_path + ": /" + name),
                         H5Dclose);
      h5::write_attribute_string(dataset.get(), kChecksumAttribute, checksum, kCode);
    }
    write_checkpoint_state(file.get(), s, job_.tmp_path);
    h5::check(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), kCode, job_.tmp_path + ": flushing");
  }
  sync_path(job_.tmp_path, O_RDONLY);
  replace_file(job_.tmp_path, job_.path);
  sync_path(dir_, O_RDONLY | O_DIRECTORY);
  // `latest`: replaced in one rename, so that it always names a complete checkpoint.
  const std::string latest = dir_ + "/latest";
  {
    const int fd = ::open((latest + ".tmp").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) throw Error(kCode, latest + ".tmp: " + std::strerror(errno));
    const std::string text = checkpoint_file_name(job_.step) + "\n";
    try {
      write_all(fd, text.data(), text.size(), 0, latest + ".tmp");
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::fsync(fd);
    ::close(fd);
  }
  replace_file(latest + ".tmp", latest);
  sync_path(dir_, O_RDONLY | O_DIRECTORY);
  // Retention, and the remains of saves that crashed.
  const std::vector<std::string> entries = files::directory_entries(dir_);
  for (const std::string& name : checkpoints_to_remove(entries, retention_, job_.step))
    files::remove_tree(dir_ + "/" + name);
  for (const std::string& name : entries)
    if (ends_with(name, ".h5.tmp") && step_of_checkpoint_file(name.substr(0, name.size() - 4)) >= 0)
      files::remove_tree(dir_ + "/" + name);
  const double seconds = std::chrono::duration<double>(Clock::now() - job_.started).count();
  char text[160];
  std::snprintf(text, sizeof text, "checkpoint of step %lld: %s (training blocked %.2f s, written in %.2f s)",
                static_cast<long long>(job_.step), job_.path.c_str(), job_.blocked_seconds, seconds);
  log::info(text);
}

namespace {

// A write that failed (a full disk, typically): the file is closed (a file HDF5 cannot close is
// noted by the handle) and removed.
void abandon_file(h5::Handle& file, const std::string& path) {
  file.reset();
  std::remove(path.c_str());
}

// HDF5's own message for a write that found its file system full says only that a write or flush
// failed: the file system's free space (before the partial file goes) says why.
Error with_space_left(const Error& error, const std::string& path) {
  return Error(error.code(), std::string(error.what()) + files::full_disk_note(path));
}

}  // namespace

void write_checkpoint_file(const std::string& path, const std::vector<std::string>& names,
                           const std::function<torch::Tensor(const std::string&)>& source,
                           const CheckpointState& state) {
  const std::string tmp = path + ".tmp";
  std::lock_guard<std::recursive_mutex> lock(h5::h5_mutex());
  h5::Handle file;
  try {
    h5::quiet_errors();
    file = h5::Handle(h5::check_id(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), kCode,
                                   "cannot create " + tmp),
                      H5Fclose);
    h5::Handle lcpl(h5::check_id(H5Pcreate(H5P_LINK_CREATE), kCode, "H5Pcreate"), H5Pclose);
    h5::check(H5Pset_create_intermediate_group(lcpl.get(), 1), kCode, "H5Pset_create_intermediate_group");
    for (const std::string& name : names) {
      const torch::Tensor t = host_copy(source(name));
      const std::string where = tmp + ": /" + name;
      std::vector<hsize_t> dims(t.sizes().begin(), t.sizes().end());
      h5::Handle space(h5::check_id(dims.empty() ? H5Screate(H5S_SCALAR)
                                                 : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                                    kCode, "H5Screate"),
                       H5Sclose);
      h5::Handle type = stored_type(t.scalar_type());
      h5::Handle dataset(h5::check_id(H5Dcreate2(file.get(), ("/" + name).c_str(), type.get(), space.get(), lcpl.get(),
                                                 H5P_DEFAULT, H5P_DEFAULT),
                                      kCode, "creating " + where),
                         H5Dclose);
      if (t.numel() > 0)
        h5::check(H5Dwrite(dataset.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data_ptr()), kCode,
                  "writing " + where);
      h5::write_attribute_string(dataset.get(), kChecksumAttribute, hex64(xxh64(t.data_ptr(), t.nbytes())), kCode);
    }
    write_checkpoint_state(file.get(), state, tmp);
    h5::check(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), kCode, tmp + ": flushing");
    // Closing writes the last metadata, which may not fit either.
    if (H5Fclose(file.get()) < 0) throw Error(kCode, tmp + ": closing: " + h5::last_error_message());
    file.release();
  } catch (const Error& error) {
    const Error explained = with_space_left(error, tmp);
    abandon_file(file, tmp);
    throw explained;
  } catch (...) {
    abandon_file(file, tmp);
    throw;
  }
  std::string why;
  try {
    sync_path(tmp, O_RDONLY);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  if (!files::rename(tmp, path, &why)) {
    std::remove(tmp.c_str());
    throw Error(kCode, "cannot rename " + tmp + " to " + path + ": " + why);
  }
  sync_path(files::parent(path).empty() ? "." : files::parent(path), O_RDONLY | O_DIRECTORY);  // the rename itself
}

}  // namespace dstrain
