// Dispatch of `dstrain data import` by format, and `dstrain data inspect` for every corpus kind.
#include "dstrain/data/import.h"

#include <hdf5.h>

#include <algorithm>
#include <sstream>

#include "dstrain/core/error.h"
#include "dstrain/core/files.h"
#include "import_llmc.h"
#include "import_megatron.h"

namespace dstrain {
namespace {

std::string inspect_dstrain(const std::string& path, uint64_t show_tokens) {
  CorpusReader corpus(path);
  const CorpusInfo& info = corpus.info();
  std::vector<uint64_t> offsets = corpus.read_doc_offsets();
  uint64_t shortest = UINT64_MAX, longest = 0;
  for (size_t d = 0; d + 1 < offsets.size(); ++d) {
    shortest = std::min(shortest, offsets[d + 1] - offsets[d]);
    longest = std::max(longest, offsets[d + 1] - offsets[d]);
  }
  std::ostringstream out;
  out << path << ": dstrain corpus (format version " << kCorpusFormatVersion << ")\n"
      << "  tokenizer " << info.tokenizer << ", vocabulary " << info.vocab_size << ", end-of-document " << info.eod_id << "\n"
      << "  " << info.n_tokens << " tokens (" << (info.vocab_size <= 65536 ? "uint16" : "uint32") << "), "
      << info.n_documents << " documents";
  if (info.n_documents > 0)
    out << " of " << shortest << " to " << longest << " tokens (mean "
        << static_cast<double>(info.n_tokens) / static_cast<double>(info.n_documents) << ")";
  out << "\n  fingerprint " << corpus_fingerprint(corpus) << "\n";
  const uint64_t n = std::min(show_tokens, info.n_tokens);
  if (n > 0) {
    std::vector<uint32_t> tokens(n);
    corpus.read(0, n, tokens.data());
    out << "  first tokens:";
    for (uint32_t t : tokens) out << " " << t;
    out << "\n";
  }
  return out.str();
}

std::string inspect_llmc(const std::string& path) {
  llmc::ShardHeader h = llmc::read_header(path);
  std::ostringstream out;
  out << path << ": llm.c token shard, version " << h.version << " (" << (h.token_bytes == 2 ? "uint16" : "uint32")
      << " tokens), " << h.n_tokens << " tokens\n"
      << "  import: dstrain data import --format llmc --input " << path << " --output CORPUS.h5\n";
  return out.str();
}

std::string inspect_megatron(const std::string& path) {
  megatron::Index index = megatron::read_index(megatron::prefix_of(path));
  uint64_t tokens = 0;
  for (int32_t length : index.sequence_lengths) tokens += static_cast<uint64_t>(length);
  std::ostringstream out;
  out << index.prefix << ".idx/.bin: Megatron indexed dataset, " << (index.is_signed ? "int" : "uint")
      << index.token_bytes * 8 << " tokens: " << tokens << " tokens, " << index.sequence_lengths.size()
      << " sequences, " << index.document_starts.size() - 1 << " documents\n"
      << "  import: dstrain data import --format megatron --input " << index.prefix
      << " --output CORPUS.h5 --eod-id ID --vocab-size N\n";
  return out.str();
}

}  // namespace

ImportFormat import_format_named(const std::string& name) {
  if (name == "llmc") return ImportFormat::kLlmc;
  if (name == "megatron") return ImportFormat::kMegatron;
  throw config_error("--format", name, "llmc (llm.c .bin shards) or megatron (Megatron-LM .idx/.bin)");
}

CorpusInfo import_corpus(const ImportOptions& options) {
  if (options.inputs.empty()) throw config_error("--input", "", "give at least one file to import");
  if (options.output.empty()) throw config_error("--output", "", "give the corpus file to write");
  std::vector<std::string> made;  // the output's directories this import made: removed again if it fails
  std::string why;
  if (!files::make_parent_directories(options.output, &why, &made))
    throw config_error("--output", options.output, "cannot create its directory (" + why + ")");
  try {
    return options.format == ImportFormat::kLlmc ? llmc::import_shards(options) : megatron::import_datasets(options);
  } catch (...) {
    files::remove_empty_directories(made);
    throw;
  }
}

std::string verify_corpus(const std::string& path) {
  const CorpusReader corpus(path);  // checks the attributes and the document offsets
  const CorpusInfo& info = corpus.info();
  const std::vector<uint64_t> offsets = corpus.read_doc_offsets();
  constexpr uint64_t kChunk = uint64_t{1} << 20;  // tokens read at once
  std::vector<uint32_t> tokens(static_cast<size_t>(std::min(kChunk, info.n_tokens)));
  for (uint64_t start = 0; start < info.n_tokens; start += kChunk) {
    const uint64_t n = std::min(kChunk, info.n_tokens - start);
    corpus.read(start, n, tokens.data());
    const auto bad = std::find_if(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(n),
                                  [&](uint32_t t) { return t >= info.vocab_size; });
    if (bad == tokens.begin() + static_cast<std::ptrdiff_t>(n)) continue;
    const uint64_t position = start + static_cast<uint64_t>(bad - tokens.begin());
    const uint64_t document = static_cast<uint64_t>(
        std::upper_bound(offsets.begin(), offsets.end(), position) - offsets.begin() - 1);
    throw data_error(path + ": token " + std::to_string(*bad) + " at position " + std::to_string(position) +
                     " (document " + std::to_string(document) + ") is not below the vocabulary size " +
                     std::to_string(info.vocab_size));
  }
  return path + ": " + std::to_string(info.n_tokens) + " tokens in " + std::to_string(info.n_documents) +
         " documents, every token below the vocabulary size " + std::to_string(info.vocab_size) +
         ", the document offsets in order\n";
}

std::string inspect_corpus(const std::string& path, uint64_t show_tokens) {
  if (files::is_regular_file(path)) {
    if (h5::is_hdf5_file(path)) return inspect_dstrain(path, show_tokens);
    if (llmc::looks_like_shard(path)) return inspect_llmc(path);
  }
  if (megatron::looks_like_index(path)) return inspect_megatron(path);
  if (!files::exists(path) && !files::exists(megatron::prefix_of(path) + ".idx"))
    throw data_error(path + ": no such file");
  throw data_error(path + ": not a corpus dstrain knows (a dstrain HDF5 corpus, an llm.c .bin shard, or a "
                          "Megatron .idx/.bin dataset)");
}

}  // namespace dstrain
