// The tokenized corpus: one HDF5 file (docs/data.md, "Corpus format").
//
//   /tokens        1-D, uint16 when the vocabulary fits in 16 bits, else uint32; documents one
//                  after the other, each ending with the end-of-document token
//   /doc_offsets   1-D uint64, n_documents + 1 entries: where each document starts; the last is
//                  the number of tokens
//   attributes on /: format = "dstrain-corpus", format_version, vocab_size, eod_id, tokenizer
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dstrain/core/h5.h"

namespace dstrain {

constexpr uint64_t kCorpusFormatVersion = 1;

struct CorpusInfo {
  std::string path;
  uint64_t n_tokens = 0;
  uint64_t n_documents = 0;
  uint64_t vocab_size = 0;
  uint64_t eod_id = 0;
  std::string tokenizer;
};

// Streams documents into a new corpus file. The file appears under its name only when close()
// succeeds (written as NAME.tmp, then renamed), so an interrupted prep never leaves a corpus
// that looks complete, and never damages an older one of the same name.
class CorpusWriter {
 public:
  CorpusWriter(const std::string& path, uint64_t vocab_size, uint64_t eod_id,
               const std::string& tokenizer);
  ~CorpusWriter();  // without close(): removes the temporary file

  // Appends the tokens and an end-of-document token.
  void add_document(const std::vector<uint32_t>& tokens);
  // The same in parts, for documents that arrive in pieces or are copied from another corpus:
  // append_tokens() adds to the current document, end_document() closes it (adding nothing:
  // the caller has appended its end-of-document token).
  void append_tokens(const uint32_t* tokens, size_t count);
  void end_document();
  CorpusInfo close();

  uint64_t n_tokens() const { return n_tokens_ + pending_.size(); }
  uint64_t n_documents() const { return offsets_.size() - 1; }

 private:
  void flush();
  void write_pending();                 // the buffered tokens, at the end of /tokens
  void write_offsets_and_attributes();  // what close() adds after the tokens

  std::string path_, tmp_path_;
  CorpusInfo info_;
  h5::Handle file_, tokens_;
  hid_t token_type_;
  std::vector<uint32_t> pending_;
  std::vector<uint64_t> offsets_{0};
  uint64_t n_tokens_ = 0;  // already written to the file
  bool closed_ = false;
};

// What identifies a corpus's contents cheaply (sizes, vocabulary, tokenizer, first and last
// tokens), as 16 hex digits: a checkpoint records it, and a resumed run must train on the same.
std::string corpus_fingerprint(const class CorpusReader& corpus);

// Read access by token range, safe to use from the prefetch thread.
class CorpusReader {
 public:
  // Throws Error(kData) naming the file when it is not a readable dstrain corpus.
  explicit CorpusReader(const std::string& path);

  const CorpusInfo& info() const { return info_; }
  // Tokens [offset, offset + count) as uint32 (hyperslab read).
  void read(uint64_t offset, uint64_t count, uint32_t* out) const;
  std::vector<uint64_t> read_doc_offsets() const;

 private:
  CorpusInfo info_;
  h5::Handle file_, tokens_;
};

}  // namespace dstrain
