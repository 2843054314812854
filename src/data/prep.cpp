#include "dstrain/data/prep.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <sstream>

#include "dstrain/core/error.h"
#include "dstrain/core/files.h"
#include "dstrain/core/log.h"
#include "dstrain/data/tokenizer.h"

namespace dstrain {
namespace {

bool is_jsonl(const std::string& path) {
  std::string ext = files::extension(path);
  return ext == ".jsonl" || ext == ".json" || ext == ".ndjson";
}

// Every k-th document goes to the validation split: deterministic, streaming, and spread over
// the whole input rather than taken from its end.
class Splitter {
 public:
  explicit Splitter(double fraction)
      : period_(fraction > 0 ? static_cast<uint64_t>(std::llround(1.0 / fraction)) : 0) {}
  bool to_valid() { return period_ > 0 && (index_++ % period_) == period_ - 1; }

 private:
  uint64_t period_;
  uint64_t index_ = 0;
};

}  // namespace

std::string default_valid_path(const std::string& output) {
  const std::string dir = files::parent(output);
  return (dir.empty() ? "" : dir == "/" ? "/" : dir + "/") + files::stem(output) + ".valid" + files::extension(output);
}

PrepSummary run_prep(const PrepOptions& options) {
  if (options.inputs.empty()) throw config_error("--input", "", "give at least one text or JSONL file");
  if (options.output.empty()) throw config_error("--output", "", "give the corpus file to write");
  if (!(options.valid_fraction >= 0.0 && options.valid_fraction <= 0.5))
    throw config_error("--valid-fraction", std::to_string(options.valid_fraction),
                       "expected a number between 0 and 0.5");
  for (const std::string& input : options.inputs)
    if (!files::is_regular_file(input)) throw data_error(input + ": no such input file");

  auto started = std::chrono::steady_clock::now();
  std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(options.tokenizer);
  bool split = options.valid_fraction > 0.0;
  std::string valid_path = options.valid_output.empty() ? default_valid_path(options.output)
                                                        : options.valid_output;
  CorpusWriter train(options.output, tokenizer->vocab_size(), tokenizer->eod_id(), tokenizer->name());
  std::unique_ptr<CorpusWriter> valid;
  if (split)
    valid = std::make_unique<CorpusWriter>(valid_path, tokenizer->vocab_size(), tokenizer->eod_id(),
                                           tokenizer->name());
  Splitter splitter(options.valid_fraction);
  PrepSummary summary;

  auto add = [&](const std::string& text) {
    if (text.empty()) return;
    CorpusWriter& target = split && splitter.to_valid() ? *valid : train;
    target.add_document(tokenizer->encode(text));
    summary.input_bytes += text.size();
  };

  for (const std::string& input : options.inputs) {
    std::ifstream file(input, std::ios::binary);
    if (!file) throw data_error(input + ": cannot open for reading");
    uint64_t docs_before = train.n_documents() + (valid ? valid->n_documents() : 0);
    if (is_jsonl(input)) {
      std::string line;
      for (uint64_t line_number = 1; std::getline(file, line); ++line_number) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        std::string where = input + ":" + std::to_string(line_number);
        nlohmann::json record;
        try {
          record = nlohmann::json::parse(line);
        } catch (const nlohmann::json::parse_error& e) {
          throw data_error(where + ": invalid JSON (" + std::string(e.what()) + ")");
        }
        if (!record.is_object() || !record.contains("text") || !record["text"].is_string())
          throw data_error(where + ": expected an object with a string field \"text\"");
        add(record["text"].get<std::string>());
      }
    } else {
      std::ostringstream text;
      text << file.rdbuf();
      add(text.str());
    }
    if (file.bad()) throw data_error(input + ": read error");
    uint64_t docs = train.n_documents() + (valid ? valid->n_documents() : 0) - docs_before;
    log::info("  ", input, ": ", docs, " documents");
  }

  if (train.n_documents() == 0)
    throw data_error("the corpus would be empty: the inputs hold no non-empty document");
  if (split && valid->n_documents() == 0)
    throw data_error("the validation split would be empty: " + std::to_string(train.n_documents()) +
                     " documents with --valid-fraction " + std::to_string(options.valid_fraction) +
                     " (give a larger fraction or more documents)");
  summary.train = train.close();
  if (split) summary.valid = valid->close();
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return summary;
}

}  // namespace dstrain
