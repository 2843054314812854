#include "dstrain/ckpt/safetensors.h"

#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "dstrain/ckpt/format.h"
#include "dstrain/core/error.h"
#include "dstrain/core/files.h"

namespace dstrain {
namespace {

constexpr ExitCode kCode = ExitCode::kCheckpoint;
// The reference implementation refuses larger headers; so does this one, before reading it.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

// Bytes per element of every dtype the format defines with whole bytes; 0: unknown.
uint64_t element_bytes(const std::string& dtype) {
  static const std::map<std::string, uint64_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1}, {"I16", 2}, {"U16", 2},
      {"F16", 2},  {"BF16", 2}, {"I32", 4}, {"U32", 4},     {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

bool host_is_little_endian() {
  const uint16_t one = 1;
  unsigned char first = 0;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

// The number of elements, or false when it does not fit in 64 bits.
bool element_count(const std::vector<int64_t>& shape, uint64_t* count) {
  uint64_t n = 1;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  *count = n;
  return true;
}

// One tensor's record of the header, checked against the buffer of `buffer_bytes`.
SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& record,
                             uint64_t buffer_bytes) {
  const std::string where = path + ": tensor " + name;
  if (!record.is_object()) throw Error(kCode, where + ": its header record is not a JSON object");
  SafetensorsEntry e;
  e.name = name;
  auto dtype = record.find("dtype");
  if (dtype == record.end() || !dtype->is_string()) throw Error(kCode, where + ": no \"dtype\" string in the header");
  e.dtype = dtype->get<std::string>();
  const uint64_t size = element_bytes(e.dtype);
  if (size == 0) throw Error(kCode, where + ": unknown dtype \"" + e.dtype + "\"");
  auto shape = record.find("shape");
  if (shape == record.end() || !shape->is_array()) throw Error(kCode, where + ": no \"shape\" array in the header");
  for (const nlohmann::json& d : *shape) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      throw Error(kCode, where + ": \"shape\" must hold non-negative integers, not " + shape->dump());
    e.shape.push_back(d.get<int64_t>());
  }
  auto offsets = record.find("data_offsets");
  if (offsets == record.end() || !offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
      !(*offsets)[1].is_number_unsigned())
    throw Error(kCode, where + ": \"data_offsets\" must be two non-negative integers [begin, end]");
  e.begin = (*offsets)[0].get<uint64_t>();
  e.end = (*offsets)[1].get<uint64_t>();
  uint64_t count = 0, bytes = 0;
  if (!element_count(e.shape, &count) || __builtin_mul_overflow(count, size, &bytes))
    throw Error(kCode, where + ": shape " + shape_text(e.shape) + " is too large");
  const std::string span = "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
  if (e.end < e.begin) throw Error(kCode, where + ": " + span + " end before they begin");
  if (e.end - e.begin != bytes)
    throw Error(kCode, where + ": " + span + " span " + std::to_string(e.end - e.begin) + " bytes; shape " +
                           shape_text(e.shape) + " of " + e.dtype + " needs " + std::to_string(bytes));
  if (e.end > buffer_bytes)
    throw Error(kCode, where + ": " + span + " reach beyond the end of the data (" + std::to_string(buffer_bytes) +
                           " bytes; a truncated file?)");
  return e;
}

void write_all(std::FILE* file, const void* data, size_t size, const std::string& path) {
  if (size > 0 && std::fwrite(data, 1, size, file) != size)
    throw Error(kCode, path + ": cannot write: " + std::strerror(errno));
}

}  // namespace

const char* safetensors_dtype_name(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kBFloat16: return "BF16";
    case torch::kFloat16: return "F16";
    case torch::kFloat32: return "F32";
    default: throw Error(ExitCode::kUsage, std::string("safetensors: dtype ") + c10::toString(dtype) + " is not written");
  }
}

namespace {

// As the format's reference implementation checks: the tensors tile the data exactly, in the
// order of their offsets, from its first byte to its last; no hole, no overlap, nothing after.
// (A header length off by one, its JSON still whole, would otherwise shift every tensor.)
void check_tiling(const std::string& path, const std::vector<SafetensorsEntry>& entries, uint64_t buffer_bytes) {
  std::vector<const SafetensorsEntry*> by_offset;
  for (const SafetensorsEntry& e : entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry* e : by_offset) {
    if (e->begin < covered)
      throw Error(kCode, path + ": tensors " + previous->name + " and " + e->name + " overlap in the data (offsets " +
                             std::to_string(covered) + " and " + std::to_string(e->begin) + ")");
    if (e->begin > covered)
      throw Error(kCode, path + ": bytes " + std::to_string(covered) + " to " + std::to_string(e->begin) +
                             " of the data, before tensor " + e->name + ", belong to no tensor (a damaged header?)");
    covered = e->end;
    previous = e;
  }
  if (covered != buffer_bytes)
    throw Error(kCode, path + ": the tensors end at byte " + std::to_string(covered) + " of the data, which holds " +
                           std::to_string(buffer_bytes) + " (a wrong header length, or bytes appended)");
}

}  // namespace

uint64_t safetensors_bytes(const SafetensorsSpec& spec) {
  uint64_t count = 1;
  for (int64_t d : spec.shape) count *= static_cast<uint64_t>(d);
  return count * c10::elementSize(spec.dtype);
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  if (!host_is_little_endian()) throw Error(ExitCode::kInternal, "safetensors: this reader needs a little-endian host");
  struct stat info;
  if (::stat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) throw Error(kCode, path + ": no such file");
  const uint64_t file_bytes = static_cast<uint64_t>(info.st_size);
  std::ifstream in(path, std::ios::binary);
  unsigned char length[8];
  if (file_bytes < 8 || !in.read(reinterpret_cast<char*>(length), 8))
    throw Error(kCode, path + ": too short for a safetensors file (" + std::to_string(file_bytes) + " bytes)");
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = header_bytes << 8 | length[i];
  if (header_bytes > file_bytes - 8)
    throw Error(kCode, path + ": the header length " + std::to_string(header_bytes) + " reaches beyond the end of the " +
                           std::to_string(file_bytes) + "-byte file (not a safetensors file, or truncated)");
  if (header_bytes > kMaxHeaderBytes)
    throw Error(kCode, path + ": a header of " + std::to_string(header_bytes) + " bytes (at most " +
                           std::to_string(kMaxHeaderBytes) + " expected): not a safetensors file?");
  std::string text(header_bytes, '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(header_bytes)))
    throw Error(kCode, path + ": cannot read the header");
  data_start_ = 8 + header_bytes;
  const nlohmann::json header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object())
    throw Error(kCode, path + ": the header is not a JSON object (damaged, or not a safetensors file)");
  const uint64_t buffer_bytes = file_bytes - data_start_;
  for (const auto& [name, record] : header.items()) {
    if (name == "__metadata__") {
      if (!record.is_object()) throw Error(kCode, path + ": \"__metadata__\" is not a JSON object");
      for (const auto& [key, value] : record.items()) {
        if (!value.is_string()) throw Error(kCode, path + ": \"__metadata__\" value of \"" + key + "\" is not a string");
        metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    entries_.push_back(parse_entry(path, name, record, buffer_bytes));
  }
  check_tiling(path, entries_, buffer_bytes);
  std::sort(entries_.begin(), entries_.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.name < b.name; });
}

const SafetensorsEntry* SafetensorsReader::find(const std::string& name) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                             [](const SafetensorsEntry& e, const std::string& n) { return e.name < n; });
  return it != entries_.end() && it->name == name ? &*it : nullptr;
}

const SafetensorsEntry& SafetensorsReader::entry(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  if (!e) throw Error(kCode, path_ + ": no tensor " + name);
  return *e;
}

torch::Tensor SafetensorsReader::read_bytes(const SafetensorsEntry& e, torch::ScalarType dtype) const {
  torch::Tensor values = torch::empty(e.shape, torch::dtype(dtype));
  std::ifstream in(path_, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(data_start_ + e.begin));
  if (!in || !in.read(static_cast<char*>(values.data_ptr()), static_cast<std::streamsize>(e.end - e.begin)))
    throw Error(kCode, path_ + ": tensor " + e.name + ": cannot read its data (truncated file?)");
  return values;
}

torch::Tensor SafetensorsReader::read(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  torch::ScalarType dtype;
  if (e.dtype == "BF16")
    dtype = torch::kBFloat16;
  else if (e.dtype == "F16")
    dtype = torch::kFloat16;
  else if (e.dtype == "F32")
    dtype = torch::kFloat32;
  else
    throw Error(kCode, path_ + ": tensor " + name + " has dtype " + e.dtype +
                           "; dstrain reads BF16, F16 and F32 (and F8_E4M3 with its block scales)");
  return read_bytes(e, dtype);
}

torch::Tensor SafetensorsReader::read_e4m3(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  if (e.dtype != kSafetensorsE4M3)
    throw Error(kCode, path_ + ": tensor " + name + " has dtype " + e.dtype + ", not " + kSafetensorsE4M3);
  return read_bytes(e, torch::kUInt8);
}

void write_safetensors(const std::string& path, std::vector<SafetensorsSpec> specs, const TensorSource& source,
                       const std::map<std::string, std::string>& metadata, bool rename) {
  if (!host_is_little_endian()) throw Error(ExitCode::kInternal, "safetensors: this writer needs a little-endian host");
  std::sort(specs.begin(), specs.end(), [](const SafetensorsSpec& a, const SafetensorsSpec& b) { return a.name < b.name; });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const SafetensorsSpec& s = specs[i];
    if (i > 0 && s.name == specs[i - 1].name) throw Error(ExitCode::kInternal, path + ": tensor " + s.name + " twice");
    const uint64_t bytes = safetensors_bytes(s);
    if (s.e4m3 && s.dtype != torch::kUInt8)
      throw Error(ExitCode::kInternal, path + ": tensor " + s.name + ": E4M3 codes come as uint8");
    nlohmann::ordered_json record;
    record["dtype"] = s.e4m3 ? kSafetensorsE4M3 : safetensors_dtype_name(s.dtype);
    record["shape"] = s.shape;
    record["data_offsets"] = {offset, offset + bytes};
    header[s.name] = std::move(record);
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data start 8-byte aligned
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));

  const std::string tmp = path + ".tmp";
  std::FILE* file = std::fopen(tmp.c_str(), "wb");
  if (!file) throw Error(kCode, tmp + ": cannot create: " + std::strerror(errno));
  try {
    write_all(file, length, 8, tmp);
    write_all(file, text.data(), text.size(), tmp);
    for (const SafetensorsSpec& s : specs) {
      torch::Tensor t = source(s.name);
      if (t.scalar_type() != s.dtype || t.sizes().vec() != s.shape)
        throw Error(ExitCode::kInternal, tmp + ": tensor " + s.name + " is not of the dtype and shape announced");
      t = t.to(torch::kCPU).contiguous();
      write_all(file, t.data_ptr(), t.nbytes(), tmp);
    }
    if (std::fflush(file) != 0 || ::fsync(fileno(file)) != 0)
      throw Error(kCode, tmp + ": cannot write: " + std::strerror(errno));
  } catch (...) {
    std::fclose(file);
    std::remove(tmp.c_str());
    throw;
  }
  if (std::fclose(file) != 0) {
    std::remove(tmp.c_str());
    throw Error(kCode, tmp + ": cannot write: " + std::strerror(errno));
  }
  std::string why;
  if (rename && !files::rename(tmp, path, &why)) {
    std::remove(tmp.c_str());
    throw Error(kCode, "cannot rename " + tmp + " to " + path + ": " + why);
  }
}

void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsSpec> specs;
  std::map<std::string, torch::Tensor> by_name;
  for (const auto& [name, t] : tensors) {
    specs.push_back({name, t.scalar_type(), t.sizes().vec()});
    by_name[name] = t;
  }
  write_safetensors(
      path, std::move(specs), [&](const std::string& name) { return by_name.at(name); }, metadata);
}

}  // namespace dstrain
