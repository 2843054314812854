// Text → token ids. Corpora record the tokenizer's name so that a model and its data agree.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dstrain {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string name() const = 0;
  virtual uint32_t vocab_size() const = 0;
  virtual uint32_t eod_id() const = 0;
  // The token that starts every document and prompt, if the tokenizer has one.
  virtual std::optional<uint32_t> bos_id() const { return std::nullopt; }
  virtual std::vector<uint32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<uint32_t>& ids) const = 0;
  // Whether text cut anywhere encodes, piece by piece, as the whole does.
  virtual bool encodes_bytewise() const { return false; }
};

// One token per byte (ids 0-255) and an end-of-document token (256): any byte string, valid
// UTF-8 or not, round-trips exactly.
class ByteTokenizer : public Tokenizer {
 public:
  std::string name() const override { return "byte"; }
  uint32_t vocab_size() const override { return 257; }
  uint32_t eod_id() const override { return 256; }
  std::vector<uint32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<uint32_t>& ids) const override;
  bool encodes_bytewise() const override { return true; }
};

// "byte", or the path of a Hugging Face tokenizer.json (byte-level BPE, see bpe_tokenizer.h) with
// `eod_token` naming its end-of-document token (empty: a usual one). Throws Error(kUsage) naming
// the option or the file's field for anything else.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name, const std::string& eod_token = "");

// What of a tokenizer's recorded name fixes its token ids: "byte", or a tokenizer.json's content
// hash ("bpe:HASH", whatever the file was called); "" for names that do not say (an imported
// corpus names its source: llm.c, megatron, ...). Two names with identities mean the same ids
// exactly when the identities are equal.
std::string tokenizer_identity(const std::string& name);

}  // namespace dstrain
