// dstrain data import: corpora of llm.c and Megatron-LM into dstrain corpora; dstrain data
// inspect: what a corpus file of any of these kinds holds.
#include "data.h"

#include <boost/program_options.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>

#include "dstrain/core/config.h"
#include "dstrain/core/error.h"
#include "dstrain/data/import.h"

namespace po = boost::program_options;

namespace dstrain {
namespace {

const char* kDataUsage =
    "usage: dstrain data inspect FILE [--tokens N]   what a corpus holds: dstrain (.h5), llm.c (.bin), Megatron (.idx/.bin)\n"
    "       dstrain data verify FILE                  read every token of a dstrain corpus: below its vocabulary?\n"
    "       dstrain data import --format llmc|megatron --input FILE... --output corpus.h5\n"
    "                           [--eod-id ID] [--vocab-size N] [--tokenizer-name NAME]\n";

int import_command(const std::vector<std::string>& args) {
  ImportOptions options;
  std::string format;
  po::options_description description("dstrain data import options");
  description.add_options()
      ("help,h", "this help")
      ("format", po::value<std::string>(&format), "llmc (llm.c .bin token shards) or megatron (PREFIX.idx + PREFIX.bin)")
      ("input", po::value<std::vector<std::string>>(&options.inputs)->multitoken(),
       "llm.c shards, in order (read as one stream), or Megatron prefixes")
      ("output", po::value<std::string>(&options.output), "corpus file to write (HDF5)")
      ("eod-id", po::value<int64_t>(&options.eod_id)->default_value(-1),
       "the end-of-document token (llm.c version 1 default: GPT-2's 50256)")
      ("vocab-size", po::value<int64_t>(&options.vocab_size)->default_value(-1),
       "vocabulary size (llm.c version 1 default: GPT-2's 50257)")
      ("tokenizer-name", po::value<std::string>(&options.tokenizer_name), "tokenizer name recorded in the corpus");
  po::variables_map given;
  parse_command_options(args, description, &given, "data import");
  if (given.count("help")) {
    std::cout << kDataUsage << "\n" << description;
    return 0;
  }
  options.format = import_format_named(format);
  CorpusInfo info = import_corpus(options);
  std::printf("wrote %s: %llu documents, %llu tokens (vocabulary %llu, end-of-document %llu)\n", info.path.c_str(),
              static_cast<unsigned long long>(info.n_documents), static_cast<unsigned long long>(info.n_tokens),
              static_cast<unsigned long long>(info.vocab_size), static_cast<unsigned long long>(info.eod_id));
  return 0;
}

}  // namespace

int data_command(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << kDataUsage;
    return args.empty() ? static_cast<int>(ExitCode::kUsage) : 0;
  }
  if (args[0] == "import") return import_command(std::vector<std::string>(args.begin() + 1, args.end()));
  if (args[0] == "inspect") {
    if (std::find(args.begin(), args.end(), "--help") != args.end() || std::find(args.begin(), args.end(), "-h") != args.end()) {
      std::cout << kDataUsage;
      return 0;
    }
    uint64_t tokens = 16;
    std::string path;
    for (size_t i = 1; i < args.size(); ++i) {
      if (args[i] == "--tokens" && i + 1 < args.size()) {
        try {
          tokens = std::stoull(args[++i]);
        } catch (const std::exception&) {
          throw config_error("--tokens", args[i], "a number of tokens to show");
        }
      } else if (path.empty() && args[i].rfind("--", 0) != 0) {
        path = args[i];
      } else {
        throw Error(ExitCode::kUsage, "data inspect: unexpected argument '" + args[i] + "'\n" + kDataUsage);
      }
    }
    if (path.empty()) throw Error(ExitCode::kUsage, std::string("data inspect: give a corpus file\n") + kDataUsage);
    std::cout << inspect_corpus(path, tokens);
    return 0;
  }
  if (args[0] == "verify") {
    if (args.size() == 2 && args[1] != "--help" && args[1] != "-h") {
      std::cout << verify_corpus(args[1]);
      return 0;
    }
    if (args.size() == 2) {
      std::cout << kDataUsage;
      return 0;
    }
    throw Error(ExitCode::kUsage, std::string("data verify: give one corpus file\n") + kDataUsage);
  }
  throw Error(ExitCode::kUsage, "data: unknown subcommand '" + args[0] + "'\n" + kDataUsage);
}

}  // namespace dstrain
