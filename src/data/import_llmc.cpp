#include "import_llmc.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <vector>

#include "dstrain/core/error.h"

namespace dstrain::llmc {
namespace {

uint64_t size_of(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

}  // namespace

bool looks_like_shard(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  int32_t magic = 0;
  return file.read(reinterpret_cast<char*>(&magic), sizeof magic) && magic == kMagic;
}

ShardHeader read_header(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw data_error(path + ": cannot open the llm.c shard");
  std::vector<int32_t> header(kHeaderInts);
  if (!file.read(reinterpret_cast<char*>(header.data()), kHeaderInts * sizeof(int32_t)))
    throw data_error(path + ": shorter than the llm.c header (" + std::to_string(kHeaderInts * 4) + " bytes)");
  if (header[0] != kMagic)
    throw data_error(path + ": header[0] = " + std::to_string(header[0]) + ": expected llm.c's magic " +
                     std::to_string(kMagic) + " (not an llm.c token shard)");
  ShardHeader h;
  h.version = header[1];
  if (h.version != 1 && h.version != 2)
    throw data_error(path + ": header[1] (version) = " + std::to_string(h.version) +
                     ": expected 1 (uint16 tokens) or 2 (uint32 tokens)");
  h.token_bytes = h.version == 1 ? 2 : 4;
  if (header[2] < 0) throw data_error(path + ": header[2] (number of tokens) = " + std::to_string(header[2]) + " is negative");
  h.n_tokens = static_cast<uint64_t>(static_cast<uint32_t>(header[2]));
  const uint64_t expected = kHeaderInts * 4 + h.n_tokens * h.token_bytes, actual = size_of(path);
  if (actual != expected)
    throw data_error(path + ": " + std::to_string(actual) + " bytes, but the header announces " +
                     std::to_string(h.n_tokens) + " tokens of " + std::to_string(h.token_bytes) + " bytes (" +
                     std::to_string(expected) + " bytes with the header): truncated or not an llm.c shard");
  return h;
}

CorpusInfo import_shards(const ImportOptions& options) {
  std::vector<ShardHeader> headers;
  for (const std::string& input : options.inputs) headers.push_back(read_header(input));
  const bool all_v1 = std::all_of(headers.begin(), headers.end(), [](const ShardHeader& h) { return h.version == 1; });
  if (!all_v1 && (options.eod_id < 0 || options.vocab_size < 0))
    throw config_error(options.eod_id < 0 ? "--eod-id" : "--vocab-size", "",
                       "give it for version 2 (uint32) shards: GPT-2's defaults apply to version 1 only");
  const uint64_t eod = options.eod_id >= 0 ? static_cast<uint64_t>(options.eod_id) : 50256;
  const uint64_t vocab = options.vocab_size >= 0 ? static_cast<uint64_t>(options.vocab_size) : 50257;
  if (eod >= vocab)
    throw config_error("--eod-id", std::to_string(eod), "below --vocab-size (" + std::to_string(vocab) + ")");

  CorpusWriter writer(options.output, vocab, eod, options.tokenizer_name.empty() ? "llm.c" : options.tokenizer_name);
  constexpr uint64_t kBlock = 1 << 20;
  std::vector<uint32_t> tokens;
  std::vector<char> raw;
  bool in_document = false;
  const uint32_t eod_token = static_cast<uint32_t>(eod);
  for (size_t f = 0; f < options.inputs.size(); ++f) {
    const std::string& path = options.inputs[f];
    std::ifstream file(path, std::ios::binary);
    file.seekg(static_cast<std::streamoff>(kHeaderInts * 4));
    for (uint64_t done = 0; done < headers[f].n_tokens;) {
      const uint64_t count = std::min(kBlock, headers[f].n_tokens - done);
      raw.resize(count * headers[f].token_bytes);
      if (!file.read(raw.data(), static_cast<std::streamsize>(raw.size())))
        throw data_error(path + ": read error at token " + std::to_string(done));
      tokens.resize(count);
      for (uint64_t i = 0; i < count; ++i) {
        if (headers[f].token_bytes == 2) {
          uint16_t t;
          std::memcpy(&t, raw.data() + 2 * i, 2);
          tokens[i] = t;
        } else {
          std::memcpy(&tokens[i], raw.data() + 4 * i, 4);
        }
        if (tokens[i] >= vocab)
          throw data_error(path + ": token " + std::to_string(tokens[i]) + " at position " + std::to_string(done + i) +
                           " is outside --vocab-size " + std::to_string(vocab));
      }
      // The end-of-text token begins a document: it closes the one before, if any.
      uint64_t start = 0;
      for (uint64_t i = 0; i < count; ++i) {
        if (tokens[i] != eod_token) continue;
        writer.append_tokens(tokens.data() + start, i - start);
        if (in_document || i > start) {
          writer.append_tokens(&eod_token, 1);
          writer.end_document();
        }
        in_document = false;
        start = i + 1;
      }
      writer.append_tokens(tokens.data() + start, count - start);
      if (count > start) in_document = true;
      done += count;
    }
  }
  if (in_document) {
    writer.append_tokens(&eod_token, 1);
    writer.end_document();
  }
  if (writer.n_documents() == 0) throw data_error("the imported corpus would be empty: the shards hold no tokens");
  return writer.close();
}

}  // namespace dstrain::llmc
