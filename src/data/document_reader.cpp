#include "dstrain/data/document_reader.h"

#include <nlohmann/json.hpp>

#include "dstrain/core/error.h"
#include "dstrain/core/files.h"

namespace dstrain {
namespace {

bool is_ascii_alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

// Whether text[0, end) ends with a White_Space character (what the pre-tokenizers' \s matches).
bool ends_with_white_space(const std::string& text, size_t end) {
  if (end == 0) return false;
  const auto byte = [&](size_t back) { return end >= back ? static_cast<unsigned char>(text[end - back]) : 0; };
  const unsigned char last = byte(1);
  if (last == ' ' || (last >= '\t' && last <= '\r')) return true;
  if (byte(2) == 0xC2) return last == 0x85 || last == 0xA0;                    // U+0085, U+00A0
  if (byte(3) == 0xE1) return byte(2) == 0x9A && last == 0x80;                 // U+1680
  if (byte(3) == 0xE2 && byte(2) == 0x80)                                      // U+2000-200A, 2028, 2029, 202F
    return last <= 0x8A || last == 0xA8 || last == 0xA9 || last == 0xAF;
  if (byte(3) == 0xE2) return byte(2) == 0x81 && last == 0x9F;                 // U+205F
  return byte(3) == 0xE3 && byte(2) == 0x80 && last == 0x80;                   // U+3000
}

// Where to cut `text` (its length when the cut is at its end), at most `limit` bytes in: after
// the last "\n" that follows no other white space and precedes an ASCII letter or digit, where
// GPT-2's and DeepSeek's pre-tokenizers end a piece whatever follows. (After a longer run of
// white space GPT-2's keeps the run's last character for the next piece: "\n\n" before a word
// is two pieces, at the end of a segment one.) 0 when there is none.
size_t safe_cut(const std::string& text, size_t limit) {
  for (size_t i = std::min(limit, text.size() - 1); i-- > 0;)
    if (text[i] == '\n' && is_ascii_alnum(text[i + 1]) && !ends_with_white_space(text, i)) return i + 1;
  return 0;
}

// The last place before `limit` that does not split a UTF-8 character (after a line break when
// there is one).
size_t fallback_cut(const std::string& text, size_t limit) {
  size_t newline = text.rfind('\n', limit - 1);
  if (newline != std::string::npos && newline > 0) return newline + 1;
  size_t cut = limit;
  while (cut > 1 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return cut;
}

}  // namespace

bool is_jsonl_path(const std::string& path) {
  std::string ext = files::extension(path);
  return ext == ".jsonl" || ext == ".json" || ext == ".ndjson";
}

DocumentReader::DocumentReader(const std::string& path, size_t segment_bytes, bool cut_anywhere)
    : path_(path), file_(path, std::ios::binary), segment_bytes_(std::max<size_t>(segment_bytes, 64)),
      jsonl_(is_jsonl_path(path)), cut_anywhere_(cut_anywhere) {
  if (!file_) throw data_error(path + ": cannot open for reading");
}

bool DocumentReader::next(TextSegment* segment) {
  bool got = jsonl_ ? next_jsonl(segment) : next_text(segment);
  if (file_.bad()) throw data_error(path_ + ": read error");
  return got;
}

bool DocumentReader::next_jsonl(TextSegment* segment) {
  std::string line;
  while (std::getline(file_, line)) {
    ++line_number_;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::string where = path_ + ":" + std::to_string(line_number_);
    nlohmann::json record;
    try {
      record = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      // The position, not the library's wording ("[json.exception.parse_error.101] ...").
      throw data_error(where + ": invalid JSON at column " + std::to_string(e.byte) +
                       " (expected one object per line, with a string field \"text\")");
    }
    if (!record.is_object() || !record.contains("text") || !record["text"].is_string())
      throw data_error(where + ": expected an object with a string field \"text\"");
    std::string text = record["text"].get<std::string>();
    if (text.empty()) continue;
    ++documents_;
    *segment = TextSegment{std::move(text), true, std::move(where)};
    return true;
  }
  return false;
}

bool DocumentReader::next_text(TextSegment* segment) {
  // Fill up to 4 segments' worth, so that a safe cut has room to be found.
  const size_t window = 4 * segment_bytes_;
  // Read in blocks of 64 KB, so that a small file costs a small buffer.
  char block[1 << 16];
  while (!at_end_ && carry_.size() < window) {
    file_.read(block, static_cast<std::streamsize>(std::min(sizeof(block), window - carry_.size())));
    carry_.append(block, static_cast<size_t>(file_.gcount()));
    if (file_.eof()) at_end_ = true;
    if (file_.bad()) return false;
  }
  if (carry_.empty()) {
    if (in_document_) {  // a document that ended exactly at a cut: close it with no more text
      in_document_ = false;
      *segment = TextSegment{"", true, path_};
      return true;
    }
    return false;
  }
  if (!in_document_) ++documents_;
  in_document_ = true;
  if (at_end_ && carry_.size() <= segment_bytes_) {
    *segment = TextSegment{carry_, true, path_};  // a copy of the exact size; carry_ keeps its buffer
    carry_.clear();
    in_document_ = false;
    return true;
  }
  size_t cut = cut_anywhere_ ? segment_bytes_ : safe_cut(carry_, segment_bytes_);
  if (cut == 0) cut = safe_cut(carry_, carry_.size());
  if (cut == 0) {
    cut = fallback_cut(carry_, std::min(carry_.size(), window));
    ++unsafe_cuts_;
  }
  *segment = TextSegment{carry_.substr(0, cut), false, path_};
  carry_.erase(0, cut);
  if (at_end_ && carry_.empty()) segment->ends_document = true, in_document_ = false;
  return true;
}

}  // namespace dstrain
