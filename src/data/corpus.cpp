#include "dstrain/data/corpus.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <functional>

#include "dstrain/core/files.h"
#include "dstrain/core/xxhash.h"

namespace dstrain {
namespace {

constexpr ExitCode kCode = ExitCode::kData;
constexpr hsize_t kChunkTokens = 1 << 20;  // 2-4 MB chunks: large sequential reads and writes
constexpr size_t kFlushTokens = 1 << 20;  // 4 MB buffered: prep runs in bounded memory

hid_t token_type_for(uint64_t vocab_size) {
  return vocab_size <= 65536 ? H5T_STD_U16LE : H5T_STD_U32LE;
}

// Writes into `path`; a failure on a full file system says so (HDF5's message says only that the
// write failed).
template <typename Write>
void writing(const std::string& path, Write&& write) {
  try {
    write();
  } catch (const Error& e) {
    throw Error(e.code(), e.what() + files::full_disk_note(path));
  }
}

}  // namespace

CorpusWriter::CorpusWriter(const std::string& path, uint64_t vocab_size, uint64_t eod_id,
                           const std::string& tokenizer)
    : path_(path), tmp_path_(path + ".tmp"), token_type_(token_type_for(vocab_size)) {
  std::lock_guard<std::recursive_mutex> lock(h5::h5_mutex());
  h5::quiet_errors();
  info_ = CorpusInfo{path, 0, 0, vocab_size, eod_id, tokenizer};
  file_ = h5::Handle(h5::check_id(H5Fcreate(tmp_path_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
                                  kCode, "cannot create " + tmp_path_),
                     H5Fclose);
  hsize_t initial = 0, unlimited = H5S_UNLIMITED;
  h5::Handle space(h5::check_id(H5Screate_simple(1, &initial, &unlimited), kCode, "H5Screate_simple"),
                   H5Sclose);
  h5::Handle props(h5::check_id(H5Pcreate(H5P_DATASET_CREATE), kCode, "H5Pcreate"), H5Pclose);
  h5::check(H5Pset_chunk(props.get(), 1, &kChunkTokens), kCode, "H5Pset_chunk");
  tokens_ = h5::Handle(h5::check_id(H5Dcreate2(file_.get(), "tokens", token_type_, space.get(),
                                               H5P_DEFAULT, props.get(), H5P_DEFAULT),
                                    kCode, tmp_path_ + ": creating /tokens"),
                       H5Dclose);
}

CorpusWriter::~CorpusWriter() {
  if (closed_) return;
  std::lock_guard<std::recursive_mutex> lock(h5::h5_mutex());
  tokens_.reset();
  file_.reset();
  std::remove(tmp_path_.c_str());
}

void CorpusWriter::add_document(const std::vector<uint32_t>& tokens) {
  pending_.insert(pending_.end(), tokens.begin(), tokens.end());
  pending_.push_back(static_cast<uint32_t>(info_.eod_id));
  offsets_.push_back(n_tokens_ + pending_.size());
  if (pending_.size() >= kFlushTokens) flush();
}

void CorpusWriter::append_tokens(const uint32_t* tokens, size_t count) {
  pending_.insert(pending_.end(), tokens, tokens + count);
  if (pending_.size() >= kFlushTokens) flush();
}

void CorpusWriter::end_document() { offsets_.push_back(n_tokens_ + pending_.size()); }

void CorpusWriter::flush() {
  if (pending_.empty()) return;
  writing(tmp_path_, [&] { write_pending(); });
  n_tokens_ += pending_.size();
  pending_.clear();
}

void CorpusWriter::write_pending() {
  std::lock_guard<std::recursive_mutex> lock(h5::h5_mutex());
  hsize_t start = n_tokens_, count = pending_.size(), new_size = n_tokens_ + pending_.size();
  h5::check(H5Dset_extent(tokens_.get(), &new_size), kCode, tmp_path_ + ": extending /tokens");
  h5::Handle file_space(h5::check_id(H5Dget_space(tokens_.get()), kCode, "H5Dget_space"), H5Sclose);
  h5::check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr),
            kCode, "H5Sselect_hyperslab");
  h5::Handle memory_space(h5::check_id(H5Screate_simple(1, &count, nullptr), kCode, "H5Screate_simple"),
                          H5Sclose);
  // HDF5 converts the uint32 buffer to the file's uint16 when the vocabulary is small.
  h5::check(H5Dwrite(tokens_.get(), H5T_NATIVE_UINT32, memory_space.get(), file_space.get(),
                     H5P_DEFAULT, pending_.data()),
            kCode, tmp_path_ + ": writing tokens");
}

CorpusInfo CorpusWriter::close() {
  flush();
  writing(tmp_path_, [&] { write_offsets_and_attributes(); });
  std::string why;
  if (!files::rename(tmp_path_, path_, &why)) throw data_error("cannot rename " + tmp_path_ + " to " + path_ + ": " + why);
  closed_ = true;
  info_.n_tokens = n_tokens_;
  info_.n_documents = offsets_.size() - 1;
  return info_;
}

void CorpusWriter::write_offsets_and_attributes() {
  std::lock_guard<std::recursive_mutex> lock(h5::h5_mutex());
  hsize_t n_offsets = offsets_.size();
  h5::Handle space(h5::check_id(H5Screate_simple(1, &n_offsets, nullptr), kCode, "H5Screate_simple"),
                   H5Sclose);
  h5::Handle offsets(h5::check_id(H5Dcreate2(file_.get(), "doc_offsets", H5T_STD_U64LE, space.get(),
                                             H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                                  kCode, tmp_path_ + ": creating /doc_offsets"),
                     H5Dclose);
  h5::check(H5Dwrite(offsets.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, offsets_.data()),
            kCode, tmp_path_ + ": writing /doc_offsets");
  hid_t root = file_.get();
  h5::write_attribute_string(root, "format", "dstrain-corpus", kCode);
  h5::write_attribute_u64(root, "format_version", kCorpusFormatVersion, kCode);
  h5::write_attribute_u64(root, "vocab_size", info_.vocab_size, kCode);
  h5::write_attribute_u64(root, "eod_id", info_.eod_id, kCode);
  h5::write_attribute_string(root, "tokenizer", info_.tokenizer, kCode);
  offsets.reset();
  tokens_.reset();
  h5::check(H5Fflush(file_.get(), H5F_SCOPE_GLOBAL), kCode, tmp_path_ + ": flushing");
  file_.reset();
}

CorpusReader::CorpusReader(const std::string& path) {
  std::lock_guard<std::recursive_mutex> lock(h5::h5_mutex());
  h5::quiet_errors();
  info_.path = path;
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) throw data_error(path + ": no such corpus file");
  if (!h5::is_hdf5_file(path)) throw data_error(path + ": not an HDF5 file (make corpora with `dstrain prep`)");
  file_ = h5::Handle(h5::check_id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), kCode,
                                  path + ": not a readable HDF5 file (truncated or damaged?)"),
                     H5Fclose);
  hid_t root = file_.get();
  if (!h5::has_link(root, "tokens") || !h5::has_link(root, "doc_offsets"))
    throw data_error(path + ": not a dstrain corpus (expected datasets /tokens and /doc_offsets)");
  uint64_t version = h5::read_attribute_u64(root, "format_version", kCode, path);
  if (version != kCorpusFormatVersion)
    throw data_error(path + ": corpus format version " + std::to_string(version) +
                     ", this dstrain reads version " + std::to_string(kCorpusFormatVersion));
  info_.vocab_size = h5::read_attribute_u64(root, "vocab_size", kCode, path);
  info_.eod_id = h5::read_attribute_u64(root, "eod_id", kCode, path);
  info_.tokenizer = h5::read_attribute_string(root, "tokenizer", kCode, path);
  tokens_ = h5::Handle(h5::check_id(H5Dopen2(root, "tokens", H5P_DEFAULT), kCode, path + ": /tokens"),
                       H5Dclose);
  h5::Handle space(h5::check_id(H5Dget_space(tokens_.get()), kCode, path + ": /tokens"), H5Sclose);
  h5::Handle type(h5::check_id(H5Dget_type(tokens_.get()), kCode, path + ": /tokens"), H5Tclose);
  if (H5Sget_simple_extent_ndims(space.get()) != 1 || H5Tget_class(type.get()) != H5T_INTEGER ||
      H5Tget_sign(type.get()) != H5T_SGN_NONE || H5Tget_size(type.get()) > 4)
    throw data_error(path + ": /tokens must be a 1-D dataset of uint16 or uint32");
  hsize_t n_tokens = 0;
  h5::check(H5Sget_simple_extent_dims(space.get(), &n_tokens, nullptr), kCode, path + ": /tokens");
  info_.n_tokens = n_tokens;
  std::vector<uint64_t> offsets = read_doc_offsets();
  if (offsets.empty() || offsets.front() != 0 || offsets.back() != n_tokens)
    throw data_error(path + ": /doc_offsets must start at 0 and end at the number of tokens (" +
                     std::to_string(n_tokens) + ")");
  // A document that ends before it starts would give a negative length (and, unsigned, a huge one).
  const auto backwards = std::adjacent_find(offsets.begin(), offsets.end(), std::greater<uint64_t>());
  if (backwards != offsets.end())
    throw data_error(path + ": /doc_offsets[" + std::to_string(backwards - offsets.begin() + 1) + "] = " +
                     std::to_string(*(backwards + 1)) + " comes before the entry ahead of it (" +
                     std::to_string(*backwards) + "): offsets must not decrease");
  info_.n_documents = offsets.size() - 1;
  if (info_.eod_id >= info_.vocab_size)
    throw data_error(path + ": eod_id " + std::to_string(info_.eod_id) + " is outside vocab_size " +
                     std::to_string(info_.vocab_size));
}

std::vector<uint64_t> CorpusReader::read_doc_offsets() const {
  std::lock_guard<std::recursive_mutex> lock(h5::h5_mutex());
  const std::string& path = info_.path;
  h5::Handle dataset(h5::check_id(H5Dopen2(file_.get(), "doc_offsets", H5P_DEFAULT), kCode,
                                  path + ": /doc_offsets"),
                     H5Dclose);
  h5::Handle space(h5::check_id(H5Dget_space(dataset.get()), kCode, path + ": /doc_offsets"), H5Sclose);
  if (H5Sget_simple_extent_ndims(space.get()) != 1)
    throw data_error(path + ": /doc_offsets must be 1-D");
  hsize_t n = 0;
  h5::check(H5Sget_simple_extent_dims(space.get(), &n, nullptr), kCode, path + ": /doc_offsets");
  std::vector<uint64_t> offsets(n);
  if (n > 0)
    h5::check(H5Dread(dataset.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, offsets.data()),
              kCode, path + ": reading /doc_offsets");
  return offsets;
}

void CorpusReader::read(uint64_t offset, uint64_t count, uint32_t* out) const {
  if (offset + count > info_.n_tokens)
    throw data_error(info_.path + ": read of tokens [" + std::to_string(offset) + ", " +
                     std::to_string(offset + count) + ") past the end (" +
                     std::to_string(info_.n_tokens) + " tokens)");
  std::lock_guard<std::recursive_mutex> lock(h5::h5_mutex());
  hsize_t start = offset, n = count;
  h5::Handle file_space(h5::check_id(H5Dget_space(tokens_.get()), kCode, "H5Dget_space"), H5Sclose);
  h5::check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &n, nullptr),
            kCode, "H5Sselect_hyperslab");
  h5::Handle memory_space(h5::check_id(H5Screate_simple(1, &n, nullptr), kCode, "H5Screate_simple"),
                          H5Sclose);
  h5::check(H5Dread(tokens_.get(), H5T_NATIVE_UINT32, memory_space.get(), file_space.get(),
                    H5P_DEFAULT, out),
            kCode, info_.path + ": reading tokens at offset " + std::to_string(offset));
}

std::string corpus_fingerprint(const CorpusReader& corpus) {
  const CorpusInfo& info = corpus.info();
  std::string identity = std::to_string(info.n_tokens) + "," + std::to_string(info.n_documents) + "," +
                         std::to_string(info.vocab_size) + "," + std::to_string(info.eod_id) + "," + info.tokenizer;
  const uint64_t edge = std::min<uint64_t>(4096, info.n_tokens);
  std::vector<uint32_t> tokens(static_cast<size_t>(edge));
  for (uint64_t start : {uint64_t{0}, info.n_tokens - edge}) {
    if (edge == 0) break;
    corpus.read(start, edge, tokens.data());
    identity.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(uint32_t));
  }
  return hex64(xxh64(identity.data(), identity.size()));
}

}  // namespace dstrain
