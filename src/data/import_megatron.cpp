#include "import_megatron.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "dstrain/core/error.h"
#include "dstrain/core/text.h"

namespace dstrain::megatron {
namespace {

const char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};

uint64_t size_of(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// Megatron's dtype codes (megatron/core/datasets/indexed_dataset.py, DType): the integer ones.
bool token_type(uint8_t code, size_t* bytes, bool* is_signed) {
  switch (code) {
    case 1: *bytes = 1; *is_signed = false; return true;  // uint8
    case 2: *bytes = 1; *is_signed = true; return true;   // int8
    case 3: *bytes = 2; *is_signed = true; return true;   // int16
    case 4: *bytes = 4; *is_signed = true; return true;   // int32
    case 5: *bytes = 8; *is_signed = true; return true;   // int64
    case 8: *bytes = 2; *is_signed = false; return true;  // uint16
    default: return false;                                // 6, 7: floating point
  }
}

template <typename T>
void read_exactly(std::ifstream& file, T* out, size_t count, const std::string& path, const std::string& field) {
  if (!file.read(reinterpret_cast<char*>(out), static_cast<std::streamsize>(count * sizeof(T))))
    throw data_error(path + ": truncated in " + field);
}

}  // namespace

std::string prefix_of(const std::string& path) {
  for (const char* ext : {".bin", ".idx"})
    if (path.size() > 4 && ends_with(path, ext)) return path.substr(0, path.size() - 4);
  return path;
}

bool looks_like_index(const std::string& path) {
  std::ifstream file(prefix_of(path) + ".idx", std::ios::binary);
  char magic[9];
  return file.read(magic, 9) && std::memcmp(magic, kMagic, 9) == 0;
}

Index read_index(const std::string& prefix) {
  const std::string path = prefix + ".idx", bin = prefix + ".bin";
  std::ifstream file(path, std::ios::binary);
  if (!file) throw data_error(path + ": cannot open the Megatron index");
  Index index;
  index.prefix = prefix;
  char magic[9];
  read_exactly(file, magic, 9, path, "the magic");
  if (std::memcmp(magic, kMagic, 9) != 0) throw data_error(path + ": expected the magic MMIDIDX (not a Megatron index)");
  uint64_t version = 0, n_sequences = 0, n_documents = 0;
  read_exactly(file, &version, 1, path, "the version");
  if (version != 1) throw data_error(path + ": version " + std::to_string(version) + ": expected 1");
  read_exactly(file, &index.dtype_code, 1, path, "the dtype");
  if (!token_type(index.dtype_code, &index.token_bytes, &index.is_signed))
    throw data_error(path + ": dtype code " + std::to_string(index.dtype_code) +
                     ": expected an integer type (1-5 or 8)");
  read_exactly(file, &n_sequences, 1, path, "the sequence count");
  read_exactly(file, &n_documents, 1, path, "the document count");
  const uint64_t expected = 9 + 8 + 1 + 8 + 8 + n_sequences * 12 + n_documents * 8;
  if (size_of(path) != expected)
    throw data_error(path + ": " + std::to_string(size_of(path)) + " bytes, but " + std::to_string(n_sequences) +
                     " sequences and " + std::to_string(n_documents) + " document indices make " +
                     std::to_string(expected) + ": truncated or damaged");
  index.sequence_lengths.resize(n_sequences);
  index.sequence_pointers.resize(n_sequences);
  index.document_starts.resize(n_documents);
  read_exactly(file, index.sequence_lengths.data(), n_sequences, path, "the sequence lengths");
  read_exactly(file, index.sequence_pointers.data(), n_sequences, path, "the sequence pointers");
  read_exactly(file, index.document_starts.data(), n_documents, path, "the document indices");
  const uint64_t bin_size = size_of(bin);
  if (!std::ifstream(bin).good()) throw data_error(bin + ": missing (the tokens of " + path + ")");
  for (uint64_t s = 0; s < n_sequences; ++s) {
    const int64_t end = index.sequence_pointers[s] + int64_t{index.sequence_lengths[s]} * static_cast<int64_t>(index.token_bytes);
    if (index.sequence_lengths[s] < 0 || index.sequence_pointers[s] < 0 || static_cast<uint64_t>(end) > bin_size)
      throw data_error(path + ": sequence " + std::to_string(s) + " (pointer " + std::to_string(index.sequence_pointers[s]) +
                       ", length " + std::to_string(index.sequence_lengths[s]) + ") lies outside " + bin + " (" +
                       std::to_string(bin_size) + " bytes)");
  }
  if (n_documents == 0 || index.document_starts.front() != 0 ||
      index.document_starts.back() != static_cast<int64_t>(n_sequences) ||
      !std::is_sorted(index.document_starts.begin(), index.document_starts.end()))
    throw data_error(path + ": document indices must rise from 0 to the number of sequences (" +
                     std::to_string(n_sequences) + ")");
  return index;
}

CorpusInfo import_datasets(const ImportOptions& options) {
  if (options.eod_id < 0 || options.vocab_size < 0)
    throw config_error(options.eod_id < 0 ? "--eod-id" : "--vocab-size", "",
                       "give it: a Megatron dataset does not record its tokenizer");
  const uint64_t eod = static_cast<uint64_t>(options.eod_id), vocab = static_cast<uint64_t>(options.vocab_size);
  if (eod >= vocab) throw config_error("--eod-id", std::to_string(eod), "below --vocab-size (" + std::to_string(vocab) + ")");
  std::vector<Index> indices;
  for (const std::string& input : options.inputs) indices.push_back(read_index(prefix_of(input)));

  CorpusWriter writer(options.output, vocab, eod, options.tokenizer_name.empty() ? "megatron" : options.tokenizer_name);
  const uint32_t eod_token = static_cast<uint32_t>(eod);
  constexpr int64_t kBlock = 1 << 20;
  std::vector<char> raw;
  std::vector<uint32_t> tokens;
  for (const Index& index : indices) {
    const std::string bin = index.prefix + ".bin";
    std::ifstream file(bin, std::ios::binary);
    if (!file) throw data_error(bin + ": cannot open");
    for (size_t d = 0; d + 1 < index.document_starts.size(); ++d) {
      uint32_t last = eod_token + 1;  // anything but eod: an empty document gets nothing
      bool any = false;
      for (int64_t s = index.document_starts[d]; s < index.document_starts[d + 1]; ++s) {
        file.seekg(index.sequence_pointers[s]);
        for (int64_t done = 0; done < index.sequence_lengths[s];) {
          const int64_t count = std::min<int64_t>(kBlock, index.sequence_lengths[s] - done);
          raw.resize(static_cast<size_t>(count) * index.token_bytes);
          if (!file.read(raw.data(), static_cast<std::streamsize>(raw.size())))
            throw data_error(bin + ": read error in sequence " + std::to_string(s));
          tokens.resize(static_cast<size_t>(count));
          for (int64_t i = 0; i < count; ++i) {
            int64_t value = 0;
            const char* p = raw.data() + i * index.token_bytes;
            switch (index.token_bytes) {
              case 1: value = index.is_signed ? int64_t{static_cast<int8_t>(*p)} : int64_t{static_cast<uint8_t>(*p)}; break;
              case 2: { int16_t v16; uint16_t u16; std::memcpy(&v16, p, 2); std::memcpy(&u16, p, 2); value = index.is_signed ? v16 : u16; break; }
              case 4: { int32_t v32; std::memcpy(&v32, p, 4); value = v32; break; }
              default: std::memcpy(&value, p, 8);
            }
            if (value < 0 || static_cast<uint64_t>(value) >= vocab)
              throw data_error(bin + ": token " + std::to_string(value) + " in document " + std::to_string(d) +
                               " (sequence " + std::to_string(s) + ") is outside 0 .. --vocab-size " + std::to_string(vocab));
            tokens[static_cast<size_t>(i)] = static_cast<uint32_t>(value);
          }
          writer.append_tokens(tokens.data(), tokens.size());
          if (count > 0) last = tokens.back(), any = true;
          done += count;
        }
      }
      if (!any) continue;  // Megatron keeps empty documents; a dstrain corpus has none
      if (last != eod_token) writer.append_tokens(&eod_token, 1);
      writer.end_document();
    }
  }
  if (writer.n_documents() == 0) throw data_error("the imported corpus would be empty: the datasets hold no tokens");
  return writer.close();
}

}  // namespace dstrain::megatron
