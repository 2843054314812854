// Streams the documents of one input file of `dstrain prep` with bounded memory: a plain text
// file is one document, a JSONL file (.jsonl/.json/.ndjson) one document per line in its "text"
// field.
//
// A document longer than `segment_bytes` (a text file larger than memory) comes in segments.
// Segments end after a line break that follows no other white space and precedes an ASCII
// letter or digit: the GPT-2 and DeepSeek pre-tokenizers always end a piece there, so encoding
// the segments one by one gives the tokens of encoding the whole document. Where no such place
// exists within 4 × segment_bytes the cut falls on the last line break or UTF-8 character
// boundary instead, and the reader says so. With `cut_anywhere` (a tokenizer that encodes byte
// by byte) every segment is segment_bytes long.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace dstrain {

struct TextSegment {
  std::string text;
  bool ends_document = true;
  std::string where;  // "file" or "file:line", for messages
};

class DocumentReader {
 public:
  // Throws Error(kData) naming the file when it cannot be opened.
  DocumentReader(const std::string& path, size_t segment_bytes, bool cut_anywhere = false);

  // The next segment; false at the end of the file. Empty documents are skipped. Throws
  // Error(kData) naming file and line for invalid JSON or a record without a string "text".
  bool next(TextSegment* segment);
  // How many documents began so far, and bytes read.
  uint64_t documents() const { return documents_; }
  // Cuts that could not fall on a safe place (see above).
  uint64_t unsafe_cuts() const { return unsafe_cuts_; }

 private:
  bool next_jsonl(TextSegment* segment);
  bool next_text(TextSegment* segment);

  std::string path_;
  std::ifstream file_;
  size_t segment_bytes_;
  bool jsonl_, cut_anywhere_;
  uint64_t line_number_ = 0, documents_ = 0, unsafe_cuts_ = 0;
  std::string carry_;          // text read past the last cut
  bool in_document_ = false;   // a text document has begun
  bool at_end_ = false;
};

bool is_jsonl_path(const std::string& path);

}  // namespace dstrain
