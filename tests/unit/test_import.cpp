// Imports of llm.c shards and Megatron indexed datasets: files written here from the formats'
// specifications read back as the same documents of the same tokens; damaged files give errors
// that name the file and the field.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>

#include "dstrain/data/corpus.h"
#include "dstrain/data/import.h"
#include "test_util.h"

using namespace dstrain;
using dstrain::test::expect_error;
using dstrain::test::TempDir;

namespace {

using Docs = std::vector<std::vector<uint32_t>>;

Docs random_docs(uint32_t seed, int n, uint32_t vocab, uint32_t avoid) {
  std::mt19937 rng(seed);
  Docs docs(n);
  for (auto& doc : docs) {
    doc.resize(1 + rng() % 300);
    for (uint32_t& t : doc) do t = rng() % vocab; while (t == avoid);
  }
  return docs;
}

// llm.c's writer (dev/data/data_common.py write_datafile): header, then every document preceded
// by the end-of-text token.
void write_llmc(const std::string& path, const std::vector<uint32_t>& stream, int version) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = version;
  header[2] = static_cast<int32_t>(stream.size());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 1024);
  for (uint32_t t : stream) {
    if (version == 1) {
      uint16_t v = static_cast<uint16_t>(t);
      out.write(reinterpret_cast<const char*>(&v), 2);
    } else {
      out.write(reinterpret_cast<const char*>(&t), 4);
    }
  }
}

Docs read_docs(const std::string& path, uint32_t eod) {
  CorpusReader reader(path);
  EXPECT_EQ(reader.info().eod_id, eod);
  std::vector<uint64_t> offsets = reader.read_doc_offsets();
  std::vector<uint32_t> tokens(reader.info().n_tokens);
  reader.read(0, tokens.size(), tokens.data());
  Docs docs;
  for (size_t d = 0; d + 1 < offsets.size(); ++d) {
    EXPECT_EQ(tokens[offsets[d + 1] - 1], eod) << "document " << d << " ends with the end-of-document token";
    docs.emplace_back(tokens.begin() + offsets[d], tokens.begin() + offsets[d + 1] - 1);
  }
  return docs;
}

// Megatron's MMIDIDX writer (megatron/core/datasets/indexed_dataset.py, _IndexWriter): each
// document is one or more sequences.
void write_megatron(const std::string& prefix, const Docs& docs, uint8_t dtype_code, size_t token_bytes,
                    int sequences_per_doc) {
  std::ofstream bin(prefix + ".bin", std::ios::binary);
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers, doc_starts{0};
  int64_t at = 0;
  for (const auto& doc : docs) {
    size_t per = (doc.size() + sequences_per_doc - 1) / sequences_per_doc;
    for (size_t start = 0; start < doc.size(); start += per) {
      size_t n = std::min(per, doc.size() - start);
      for (size_t i = 0; i < n; ++i) {
        uint64_t v = doc[start + i];
        bin.write(reinterpret_cast<const char*>(&v), static_cast<std::streamsize>(token_bytes));  // little-endian
      }
      lengths.push_back(static_cast<int32_t>(n));
      pointers.push_back(at);
      at += static_cast<int64_t>(n * token_bytes);
    }
    doc_starts.push_back(static_cast<int64_t>(lengths.size()));
  }
  std::ofstream idx(prefix + ".idx", std::ios::binary);
  idx.write("MMIDIDX\0\0", 9);
  uint64_t version = 1, n_seq = lengths.size(), n_doc = doc_starts.size();
  idx.write(reinterpret_cast<const char*>(&version), 8);
  idx.write(reinterpret_cast<const char*>(&dtype_code), 1);
  idx.write(reinterpret_cast<const char*>(&n_seq), 8);
  idx.write(reinterpret_cast<const char*>(&n_doc), 8);
  idx.write(reinterpret_cast<const char*>(lengths.data()), static_cast<std::streamsize>(lengths.size() * 4));
  idx.write(reinterpret_cast<const char*>(pointers.data()), static_cast<std::streamsize>(pointers.size() * 8));
  idx.write(reinterpret_cast<const char*>(doc_starts.data()), static_cast<std::streamsize>(doc_starts.size() * 8));
}

void truncate_file(const std::string& path, long bytes_less) {
  std::ifstream in(path, std::ios::binary);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(content.data(), static_cast<std::streamsize>(content.size() - bytes_less));
}

}  // namespace

TEST(Import, LlmcShardsReadBackAsTheirDocuments) {
  TempDir dir;
  const uint32_t eot = 50256;
  Docs docs = random_docs(1, 40, 50257, eot);
  std::vector<uint32_t> stream;
  for (const auto& doc : docs) {
    stream.push_back(eot);
    stream.insert(stream.end(), doc.begin(), doc.end());
  }
  // Two shards that cut a document in the middle, as llm.c's writer does.
  const size_t cut = stream.size() / 2 + 3;
  write_llmc(dir.path("s0.bin"), std::vector<uint32_t>(stream.begin(), stream.begin() + cut), 1);
  write_llmc(dir.path("s1.bin"), std::vector<uint32_t>(stream.begin() + cut, stream.end()), 1);
  ImportOptions options;
  options.format = ImportFormat::kLlmc;
  options.inputs = {dir.path("s0.bin"), dir.path("s1.bin")};
  options.output = dir.path("c.h5");
  CorpusInfo info = import_corpus(options);
  EXPECT_EQ(info.n_documents, docs.size());
  EXPECT_EQ(info.vocab_size, 50257u);
  EXPECT_EQ(read_docs(dir.path("c.h5"), eot), docs);
  EXPECT_NE(inspect_corpus(dir.path("s0.bin"), 0).find("llm.c token shard, version 1"), std::string::npos);

  // Version 2 (uint32), a larger vocabulary, another delimiter.
  Docs big = random_docs(2, 10, 130000, 128000);
  stream.clear();
  for (const auto& doc : big) {
    stream.push_back(128000);
    stream.insert(stream.end(), doc.begin(), doc.end());
  }
  write_llmc(dir.path("v2.bin"), stream, 2);
  options.inputs = {dir.path("v2.bin")};
  expect_error([&] { import_corpus(options); }, ExitCode::kUsage, {"--eod-id", "version 2"});
  options.eod_id = 128000;
  options.vocab_size = 130000;
  import_corpus(options);
  EXPECT_EQ(read_docs(dir.path("c.h5"), 128000), big);
}

TEST(Import, MegatronDatasetsReadBackAsTheirDocuments) {
  TempDir dir;
  Docs docs = random_docs(3, 30, 32000, 2);
  // Megatron's --append-eod: some documents already end with the end-of-document token.
  for (size_t d = 0; d < docs.size(); d += 3) docs[d].push_back(2);
  write_megatron(dir.path("u16"), docs, 8, 2, 1);
  write_megatron(dir.path("i32"), docs, 4, 4, 3);  // int32, documents of 3 sequences
  ImportOptions options;
  options.format = ImportFormat::kMegatron;
  options.output = dir.path("c.h5");
  options.inputs = {dir.path("u16")};
  expect_error([&] { import_corpus(options); }, ExitCode::kUsage, {"--eod-id", "does not record"});
  options.eod_id = 2;
  options.vocab_size = 32000;
  Docs expected = docs;
  for (auto& doc : expected)
    if (doc.back() == 2) doc.pop_back();  // the end-of-document token is not doubled
  for (const char* input : {"u16", "i32.idx"}) {
    options.inputs = {dir.path(input)};
    CorpusInfo info = import_corpus(options);
    EXPECT_EQ(info.n_documents, docs.size()) << input;
    EXPECT_EQ(read_docs(dir.path("c.h5"), 2), expected) << input;
  }
  options.inputs = {dir.path("u16"), dir.path("i32")};
  import_corpus(options);
  Docs twice = expected;
  twice.insert(twice.end(), expected.begin(), expected.end());
  EXPECT_EQ(read_docs(dir.path("c.h5"), 2), twice);
  std::string report = inspect_corpus(dir.path("i32.bin"), 0);
  EXPECT_NE(report.find("Megatron indexed dataset, int32"), std::string::npos) << report;
  EXPECT_NE(report.find("30 documents"), std::string::npos) << report;
  report = inspect_corpus(dir.path("c.h5"), 4);
  EXPECT_NE(report.find("60 documents"), std::string::npos) << report;
  EXPECT_NE(report.find("vocabulary 32000, end-of-document 2"), std::string::npos) << report;
}

TEST(Import, DamagedInputsNameTheFileAndTheField) {
  TempDir dir;
  ImportOptions options;
  options.format = ImportFormat::kLlmc;
  options.output = dir.path("c.h5");
  write_llmc(dir.path("ok.bin"), {50256, 1, 2, 3}, 1);
  write_llmc(dir.path("short.bin"), {50256, 1, 2, 3}, 1);
  truncate_file(dir.path("short.bin"), 2);
  options.inputs = {dir.path("short.bin")};
  expect_error([&] { import_corpus(options); }, ExitCode::kData, {"short.bin", "announces 4 tokens", "truncated"});
  dir.write("text.bin", std::string(2000, 'x'));
  options.inputs = {dir.path("text.bin")};
  expect_error([&] { import_corpus(options); }, ExitCode::kData, {"text.bin", "header[0]", "20240520"});
  write_llmc(dir.path("v9.bin"), {1}, 9);
  options.inputs = {dir.path("v9.bin")};
  expect_error([&] { import_corpus(options); }, ExitCode::kData, {"v9.bin", "header[1] (version) = 9"});
  options.inputs = {dir.path("ok.bin")};
  options.vocab_size = 100;
  options.eod_id = 3;
  write_llmc(dir.path("big.bin"), {3, 1, 200}, 1);
  options.inputs = {dir.path("big.bin")};
  expect_error([&] { import_corpus(options); }, ExitCode::kData, {"big.bin", "token 200 at position 2", "--vocab-size 100"});

  options.format = ImportFormat::kMegatron;
  options.eod_id = 0;
  options.vocab_size = 1000;
  write_megatron(dir.path("m"), {{1, 2, 3}, {4, 5}}, 8, 2, 1);
  truncate_file(dir.path("m.idx"), 8);
  options.inputs = {dir.path("m")};
  expect_error([&] { import_corpus(options); }, ExitCode::kData, {"m.idx", "truncated or damaged"});
  write_megatron(dir.path("m"), {{1, 2, 3}, {4, 5}}, 8, 2, 1);
  truncate_file(dir.path("m.bin"), 2);
  expect_error([&] { import_corpus(options); }, ExitCode::kData, {"m.idx", "sequence 1", "lies outside", "m.bin"});
  write_megatron(dir.path("f"), {{1, 2}}, 7, 4, 1);  // float32
  options.inputs = {dir.path("f")};
  expect_error([&] { import_corpus(options); }, ExitCode::kData, {"f.idx", "dtype code 7"});
  expect_error([&] { import_format_named("parquet"); }, ExitCode::kUsage, {"--format", "parquet", "llmc"});
  expect_error([&] { inspect_corpus(dir.path("text.bin"), 0); }, ExitCode::kData, {"text.bin", "not a corpus"});
  expect_error([&] { inspect_corpus(dir.path("none.h5"), 0); }, ExitCode::kData, {"none.h5", "no such file"});
  EXPECT_FALSE(std::ifstream(dir.path("c.h5")).good()) << "no corpus from failed imports";
}
