// Byte-level BPE read from a Hugging Face tokenizer.json: GPT-2's shape (ByteLevel
// pre-tokenizer with its regex) and DeepSeek's (a Sequence of Split pre-tokenizers with Unicode
// regexes, then ByteLevel without regex), with added and special tokens.
//
// encode: added tokens are cut out of the text first (longest match at each position, as
// Hugging Face does), the rest is normalized where the file asks (NFC for Qwen's files), split
// into pieces by the pre-tokenizers, each piece's bytes become byte-level symbols, and merges
// are applied lowest rank first, leftmost first. Every byte has a symbol, so any byte string
// encodes, valid UTF-8 or not, and decode(encode(x)) == x (the normalized x with a normalizer).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dstrain/data/added_token_index.h"
#include "dstrain/data/regex_splitter.h"
#include "dstrain/data/unicode_normalizer.h"
#include "dstrain/data/tokenizer.h"

namespace dstrain {

class BpeTokenizer : public Tokenizer {
 public:
  // Reads tokenizer.json. `eod_token` names the end-of-document token (an added token's content
  // or a vocabulary entry); empty: the first of <|endoftext|>, <｜end▁of▁sentence｜>, </s>, <eos>
  // that exists. Throws Error(kUsage) naming the file and the field for anything it cannot use.
  static std::unique_ptr<BpeTokenizer> from_file(const std::string& path, const std::string& eod_token = "");
  static std::unique_ptr<BpeTokenizer> from_json(const std::string& json_text, const std::string& where,
                                                 const std::string& eod_token = "");

  std::string name() const override { return name_; }
  uint32_t vocab_size() const override { return vocab_size_; }
  uint32_t eod_id() const override { return eod_id_; }
  // The special token the file's post-processor puts before every sequence (TemplateProcessing,
  // as DeepSeek's and Llama 3's files have it: their beginning-of-sentence token).
  std::optional<uint32_t> bos_id() const override { return bos_id_; }
  std::vector<uint32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<uint32_t>& ids) const override;
  // Appends to `out` (no allocation per call once warm). Thread-safe.
  void encode_into(std::string_view text, std::vector<uint32_t>* out) const;

  // The id of a token string (byte-level form, or an added token's content); -1 if none.
  int64_t token_id(const std::string& token) const;

 private:
  struct PreTokenizer {
    std::unique_ptr<RegexSplitter> splitter;  // null: ByteLevel without regex (no split)
    SplitKeeps keeps = SplitKeeps::kMatchesAndGaps;
  };
  struct Merge {
    uint32_t rank, merged;
  };

  BpeTokenizer() = default;
  // A stretch between added tokens: normalized (with a normalizer), the added tokens found in the
  // normalized text cut out, the rest encoded by encode_ordinary.
  void encode_normalized(std::string_view text, std::vector<uint32_t>* out) const;
  void encode_ordinary(std::string_view text, std::vector<uint32_t>* out) const;
  void encode_piece(std::string_view piece, std::vector<uint32_t>* out) const;
  void merge_symbols(std::vector<uint32_t>* symbols) const;

  std::string name_;
  uint32_t vocab_size_ = 0, eod_id_ = 0;
  std::optional<uint32_t> bos_id_;
  uint64_t instance_ = 0;  // tells the per-thread caches of two tokenizers apart
  bool ignore_merges_ = false;
  std::unordered_map<std::string, uint32_t> vocab_;      // byte-level string → id
  std::unordered_map<uint64_t, Merge> merges_;           // (left << 32 | right) → rank, result
  static constexpr uint32_t kNoSymbol = UINT32_MAX;       // a byte valid UTF-8 never has, missing from the vocabulary
  static constexpr const char* kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD, what such a byte becomes
  std::array<uint32_t, 256> byte_ids_{};                 // the id of each byte's symbol, or kNoSymbol
  std::vector<std::string> id_bytes_;                    // id → the bytes it decodes to
  std::vector<PreTokenizer> pre_tokenizers_;
  std::unordered_map<std::string, uint32_t> added_;      // added token content → id
  std::optional<UnicodeNormalizer> normalizer_;          // the file's normalizer, if any
  AddedTokenIndex raw_added_;         // added tokens found in the text as it comes
  AddedTokenIndex normalized_added_;  // those marked "normalized", found in the normalized text
};

}  // namespace dstrain
