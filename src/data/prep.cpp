#include "dstrain/data/prep.h"

#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "dstrain/core/error.h"
#include "dstrain/core/files.h"
#include "dstrain/core/h5.h"
#include "dstrain/core/log.h"
#include "dstrain/core/random.h"
#include "dstrain/data/document_reader.h"
#include "dstrain/data/tokenizer.h"

namespace dstrain {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t file_size(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// CPU time of this process so far (every thread, user and system), in microseconds.
uint64_t cpu_microseconds() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  auto micros = [](const timeval& t) { return static_cast<uint64_t>(t.tv_sec) * 1000000 + static_cast<uint64_t>(t.tv_usec); };
  return micros(usage.ru_utime) + micros(usage.ru_stime);
}

std::string part_path(const std::string& output, int rank) { return output + ".part-" + std::to_string(rank); }

// Rank r takes the files [first[r], first[r + 1]): contiguous, so that the parts joined in rank
// order are the inputs in order, and about equal in bytes.
std::vector<size_t> assign_files(const std::vector<std::string>& inputs, int world) {
  std::vector<uint64_t> sizes;
  uint64_t total = 0;
  for (const std::string& input : inputs) total += sizes.emplace_back(file_size(input));
  std::vector<size_t> first(world + 1, inputs.size());
  first[0] = 0;
  uint64_t running = 0;
  size_t file = 0;
  for (int r = 1; r < world; ++r) {
    const double target = static_cast<double>(total) * r / world;
    while (file < inputs.size() && static_cast<double>(running + sizes[file] / 2) < target) running += sizes[file++];
    first[r] = std::max(file, first[r - 1]);
  }
  return first;
}

// One batch of document segments on its way through the tokenizing threads.
struct Batch {
  std::vector<TextSegment> segments;
  std::vector<std::vector<uint32_t>> tokens;
};

struct FileCounts {
  std::string path;
  uint64_t documents = 0, unsafe_cuts = 0;
};

// Tokenizes a batch's segments, freeing each text once encoded.
void tokenize_batch(const Tokenizer& tokenizer, Batch* batch) {
  batch->tokens.resize(batch->segments.size());
  for (size_t i = 0; i < batch->segments.size(); ++i) {
    try {
      batch->tokens[i] = tokenizer.encode(batch->segments[i].text);
    } catch (const Error& e) {  // the text's fault: say which
      throw Error(e.code(), batch->segments[i].where + ": " + e.what());
    }
    std::string().swap(batch->segments[i].text);  // the text is no longer needed
  }
}

// Appends a batch's tokens to `writer`: each document after the tokenizer's beginning token (if it
// has one) and before the end-of-document token. `document_starts`: whether the next segment
// begins a document (a document may go on into the next batch).
void write_batch(const Batch& batch, std::optional<uint32_t> bos, uint32_t eod, bool* document_starts,
                 CorpusWriter* writer) {
  for (size_t i = 0; i < batch.segments.size(); ++i) {
    if (bos && *document_starts) writer->append_tokens(&*bos, 1);
    writer->append_tokens(batch.tokens[i].data(), batch.tokens[i].size());
    *document_starts = batch.segments[i].ends_document;
    if (batch.segments[i].ends_document) {
      writer->append_tokens(&eod, 1);
      writer->end_document();
    }
  }
}

// The batches on their way from the reading thread through the tokenizing threads to the writing
// one, and what those threads share. Batches are numbered in reading order; the first failure
// stops every thread.
struct TokenizingPipeline {
  TokenizingPipeline(const Tokenizer& tokenizer, size_t max_in_flight)
      : tokenizer(tokenizer), max_in_flight(max_in_flight) {}

  const Tokenizer& tokenizer;
  const size_t max_in_flight;
  std::mutex mutex;
  std::condition_variable changed;
  std::map<uint64_t, std::unique_ptr<Batch>> to_encode, encoded;
  uint64_t in_flight = 0, read_batches = 0, input_bytes = 0;
  bool reading_done = false, stopping = false;
  std::exception_ptr failure;

  void fail(std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!failure) failure = error;
    stopping = true;
    changed.notify_all();
  }

  // The reading thread: the documents of `inputs` in batches of about `batch_bytes`.
  void read(const std::vector<std::string>& inputs, size_t batch_bytes, std::vector<FileCounts>* counts) {
    try {
      auto batch = std::make_unique<Batch>();
      size_t bytes = 0;
      auto hand_over = [&] {
        std::unique_lock<std::mutex> lock(mutex);
        changed.wait(lock, [&] { return stopping || in_flight < max_in_flight; });
        if (stopping) return false;
        ++in_flight;
        to_encode.emplace(read_batches++, std::move(batch));
        changed.notify_all();
        batch = std::make_unique<Batch>();
        bytes = 0;
        return true;
      };
      for (const std::string& input : inputs) {
        DocumentReader documents(input, batch_bytes, tokenizer.encodes_bytewise());
        TextSegment segment;
        while (documents.next(&segment)) {
          bytes += segment.text.size();
          input_bytes += segment.text.size();
          batch->segments.push_back(std::move(segment));
          if (bytes >= batch_bytes && !hand_over()) return;
        }
        counts->push_back(FileCounts{input, documents.documents(), documents.unsafe_cuts()});
      }
      if (!batch->segments.empty() && !hand_over()) return;
      std::lock_guard<std::mutex> lock(mutex);
      reading_done = true;
      changed.notify_all();
    } catch (...) {
      fail(std::current_exception());
    }
  }

  // A tokenizing thread: encodes the batches read, lowest number first.
  void encode() {
    try {
      for (;;) {
        std::unique_ptr<Batch> batch;
        uint64_t sequence;
        {
          std::unique_lock<std::mutex> lock(mutex);
          changed.wait(lock, [&] { return stopping || !to_encode.empty() || reading_done; });
          if (stopping || to_encode.empty()) return;
          sequence = to_encode.begin()->first;
          batch = std::move(to_encode.begin()->second);
          to_encode.erase(to_encode.begin());
        }
        tokenize_batch(tokenizer, batch.get());
        std::lock_guard<std::mutex> lock(mutex);
        encoded.emplace(sequence, std::move(batch));
        changed.notify_all();
      }
    } catch (...) {
      fail(std::current_exception());
    }
  }

  // The writing thread: writes the encoded batches in order, as they come.
  void write(CorpusWriter* writer) {
    const uint32_t eod = tokenizer.eod_id();
    const std::optional<uint32_t> bos = tokenizer.bos_id();
    bool document_starts = true;
    try {
      for (uint64_t next = 0;; ++next) {
        std::unique_ptr<Batch> batch;
        {
          std::unique_lock<std::mutex> lock(mutex);
          changed.wait(lock, [&] { return stopping || encoded.count(next) || (reading_done && next == read_batches); });
          if (stopping || !encoded.count(next)) break;
          batch = std::move(encoded[next]);
          encoded.erase(next);
        }
        write_batch(*batch, bos, eod, &document_starts, writer);
        batch.reset();
        std::lock_guard<std::mutex> lock(mutex);
        --in_flight;
        changed.notify_all();
      }
    } catch (...) {
      fail(std::current_exception());
    }
  }
};

// Reads `inputs` with one thread, tokenizes with `threads` others and writes the batches in
// order into `writer` (this thread). At most `max_in_flight` batches exist at any time.
uint64_t tokenize_files(const std::vector<std::string>& inputs, const Tokenizer& tokenizer, CorpusWriter* writer,
                        unsigned threads, size_t batch_bytes, std::vector<FileCounts>* counts) {
  const size_t max_in_flight = 2 * threads + 2;
  TokenizingPipeline pipeline(tokenizer, max_in_flight);
  std::thread reader([&] { pipeline.read(inputs, batch_bytes, counts); });
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t) workers.emplace_back([&] { pipeline.encode(); });
  pipeline.write(writer);
  reader.join();
  for (std::thread& worker : workers) worker.join();
  if (pipeline.failure) std::rethrow_exception(pipeline.failure);
  return pipeline.input_bytes;
}

struct DocRef {
  uint32_t part;
  uint64_t begin, end;
};

// Copies documents from the parts into `writer` in the order of `docs`. In input order it reads
// ahead in large blocks; shuffled it reads each document alone.
void copy_documents(const std::vector<std::unique_ptr<CorpusReader>>& parts, const std::vector<DocRef>& docs,
                    bool read_ahead, CorpusWriter* writer) {
  constexpr uint64_t kBlock = 1 << 20;
  std::vector<uint32_t> buffer;
  uint32_t buffer_part = 0;
  uint64_t buffer_begin = 0, buffer_end = 0;
  for (const DocRef& doc : docs) {
    for (uint64_t at = doc.begin; at < doc.end;) {
      if (!(doc.part == buffer_part && at >= buffer_begin && at < buffer_end)) {
        uint64_t size = parts[doc.part]->info().n_tokens;
        uint64_t count = std::min(size - at, read_ahead ? kBlock : std::min(kBlock, doc.end - at));
        buffer.resize(count);
        parts[doc.part]->read(at, count, buffer.data());
        buffer_part = doc.part;
        buffer_begin = at;
        buffer_end = at + count;
      }
      uint64_t count = std::min(doc.end, buffer_end) - at;
      writer->append_tokens(buffer.data() + (at - buffer_begin), count);
      at += count;
    }
    writer->end_document();
  }
}

void shuffle_documents(std::vector<DocRef>* docs, uint64_t seed, uint64_t stream) {
  SplitMix64 rng(mix_seed(seed, stream));
  for (size_t i = docs->size(); i > 1; --i) std::swap((*docs)[i - 1], (*docs)[rng.below(i)]);
}

// Every k-th document goes to the validation split: deterministic, streaming, and spread over
// the whole input rather than taken from its end.
uint64_t split_period(double fraction) {
  return fraction > 0 ? static_cast<uint64_t>(std::llround(1.0 / fraction)) : 0;
}

// The lowest rank joins the parts into the outputs.
void join_parts(const PrepOptions& options, const Tokenizer& tokenizer, const std::string& valid_path,
                PrepSummary* summary) {
  std::vector<std::unique_ptr<CorpusReader>> parts;
  std::vector<DocRef> train_docs, valid_docs;
  const uint64_t period = split_period(options.valid_fraction);
  uint64_t index = 0;
  for (int r = 0; r < options.world; ++r) {
    parts.push_back(std::make_unique<CorpusReader>(part_path(options.output, r)));
    std::vector<uint64_t> offsets = parts.back()->read_doc_offsets();
    for (size_t d = 0; d + 1 < offsets.size(); ++d, ++index) {
      DocRef doc{static_cast<uint32_t>(r), offsets[d], offsets[d + 1]};
      (period > 0 && index % period == period - 1 ? valid_docs : train_docs).push_back(doc);
    }
  }
  if (train_docs.empty()) throw data_error("the corpus would be empty: the inputs hold no non-empty document");
  char fraction[32];
  std::snprintf(fraction, sizeof fraction, "%g", options.valid_fraction);
  if (period > 0 && valid_docs.empty())
    throw data_error("the validation split would be empty: " + std::to_string(train_docs.size()) +
                     " document(s) with --valid-fraction " + fraction + " (give " +
                     (options.valid_fraction < 0.5 && train_docs.size() >= 2 ? "a larger fraction or " : "") +
                     "more documents, or --valid-fraction 0 for none)");
  if (options.shuffle) {
    shuffle_documents(&train_docs, options.seed, 0);
    shuffle_documents(&valid_docs, options.seed, 1);
  }
  CorpusWriter train(options.output, tokenizer.vocab_size(), tokenizer.eod_id(), tokenizer.name());
  copy_documents(parts, train_docs, !options.shuffle, &train);
  std::unique_ptr<CorpusWriter> valid;
  if (period > 0) {
    valid = std::make_unique<CorpusWriter>(valid_path, tokenizer.vocab_size(), tokenizer.eod_id(), tokenizer.name());
    copy_documents(parts, valid_docs, !options.shuffle, valid.get());
  }
  summary->train = train.close();
  if (valid) summary->valid = valid->close();
}

// Where the validation split goes: --valid-output, or beside --output.
std::string valid_output_path(const PrepOptions& options) {
  return options.valid_output.empty() ? default_valid_path(options.output) : options.valid_output;
}

void check_options(const PrepOptions& options) {
  if (options.inputs.empty()) throw config_error("--input", "", "give at least one text or JSONL file");
  if (options.output.empty()) throw config_error("--output", "", "give the corpus file to write");
  if (!(options.valid_fraction >= 0.0 && options.valid_fraction <= 0.5))
    throw config_error("--valid-fraction", std::to_string(options.valid_fraction),
                       "expected a number between 0 and 0.5");
  if (options.memory_limit_mb < 16)
    throw config_error("--memory-limit", std::to_string(options.memory_limit_mb), "at least 16 (MB)");
  const std::string valid_path = valid_output_path(options);
  for (const std::string& input : options.inputs) {
    if (files::is_directory(input)) throw data_error(input + ": a directory; give the files in it (" + input + "/*)");
    if (!files::is_regular_file(input)) throw data_error(input + ": no such input file");
    if (h5::is_hdf5_file(input)) throw data_error(input + ": an HDF5 file (a corpus?), not text or JSONL to tokenize");
    // Writing an input would destroy the text.
    if (files::same_file(input, options.output))
      throw config_error("--output", options.output, "is also an input file");
    if (options.valid_fraction > 0 && files::same_file(input, valid_path))
      throw options.valid_output.empty()
          ? config_error("--output", options.output, "its validation split would go to " + valid_path +
                                                         ", an input file (give --valid-output)")
          : config_error("--valid-output", valid_path, "is also an input file");
  }
}

// The directories of the corpus files, as far as they are missing (every rank writes its part
// there); those made are appended to `made`.
void make_output_directories(const PrepOptions& options, const std::string& valid_path, std::vector<std::string>* made) {
  std::vector<std::pair<std::string, std::string>> outputs = {{"--output", options.output}};
  if (options.valid_fraction > 0)
    outputs.emplace_back(options.valid_output.empty() ? "--output" : "--valid-output", valid_path);
  for (const auto& [option, path] : outputs) {
    std::string why;
    if (!files::make_parent_directories(path, &why, made))
      throw config_error(option, path, "cannot create its directory (" + why + ")");
  }
}

PrepSummary prep(const PrepOptions& options, std::vector<std::string>* made_directories) {
  const bool several = options.world > 1 && options.sum_over_ranks;
  const auto started = Clock::now();
  std::unique_ptr<Tokenizer> tokenizer;
  try {
    check_options(options);
    tokenizer = make_tokenizer(options.tokenizer, options.eod_token);
    make_output_directories(options, valid_output_path(options), made_directories);
  } catch (const Error& e) {
    // Every rank finds the same: the lowest says it.
    throw Error(e.code(), options.rank == 0 ? e.what() : "");
  }
  PrepSummary summary;
  summary.threads = options.threads > 0 ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  summary.ranks = several ? options.world : 1;
  const int world = summary.ranks, rank = several ? options.rank : 0;
  const std::string valid_path = valid_output_path(options);
  // In flight: up to 2 × threads + 2 batches, each its text and then up to 4 bytes of token per
  // byte of text (the byte tokenizer's worst case), and the reader's window of 4 batches.
  const size_t batch_bytes = std::clamp<uint64_t>(options.memory_limit_mb * 1000000 / (5 * (2 * summary.threads + 2) + 4),
                                                  64 * 1024, 4 * 1000000);  // small enough to spread over the threads

  // Each rank: its files → its part. (Throughput counts from here: loading the tokenizer is not
  // tokenizing.)
  const auto tokenizing = Clock::now();
  const uint64_t cpu_before = cpu_microseconds();
  PrepOptions mine = options;
  mine.world = world;
  std::vector<size_t> first = assign_files(options.inputs, world);
  std::vector<std::string> my_inputs(options.inputs.begin() + first[rank], options.inputs.begin() + first[rank + 1]);
  std::exception_ptr failure;
  uint64_t sums[3] = {0, 0, 0};  // failed ranks, input bytes, CPU microseconds
  try {
    CorpusWriter part(part_path(options.output, rank), tokenizer->vocab_size(), tokenizer->eod_id(), tokenizer->name());
    std::vector<FileCounts> counts;
    sums[1] = tokenize_files(my_inputs, *tokenizer, &part, summary.threads, batch_bytes, &counts);
    part.close();
    for (const FileCounts& file : counts) {
      log::info("  ", file.path, ": ", file.documents, " documents");
      if (file.unsafe_cuts > 0)
        log::warning(file.path, ": a document with no line break followed by a letter or digit within ",
                     4 * batch_bytes / 1000000.0, " MB was cut elsewhere ", file.unsafe_cuts,
                     " times: tokens there may differ from encoding it whole (raise --memory-limit)");
    }
  } catch (...) {
    failure = std::current_exception();
    sums[0] = 1;
  }
  sums[2] = cpu_microseconds() - cpu_before;
  if (several) options.sum_over_ranks(sums, 3);
  summary.input_bytes = sums[1];
  summary.tokenize_cpu_seconds = static_cast<double>(sums[2]) / 1e6;
  summary.tokenize_seconds = std::chrono::duration<double>(Clock::now() - tokenizing).count();
  auto remove_parts = [&] {
    for (int r = 0; r < world; ++r) std::remove(part_path(options.output, r).c_str());
  };
  if (failure) {
    std::remove(part_path(options.output, rank).c_str());
    std::rethrow_exception(failure);
  }
  if (sums[0] > 0) {
    std::remove(part_path(options.output, rank).c_str());
    throw Error(ExitCode::kData, "");  // the rank that failed has said why
  }

  uint64_t join_failed[1] = {0};
  if (rank == 0) {
    try {
      join_parts(mine, *tokenizer, valid_path, &summary);
    } catch (...) {
      failure = std::current_exception();
      join_failed[0] = 1;
    }
    remove_parts();
  }
  if (several) options.sum_over_ranks(join_failed, 1);
  if (failure) std::rethrow_exception(failure);
  if (join_failed[0] > 0) throw Error(ExitCode::kData, "");
  summary.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  return summary;
}

}  // namespace

std::string default_valid_path(const std::string& output) {
  const std::string dir = files::parent(output);
  return (dir.empty() ? "" : dir == "/" ? "/" : dir + "/") + files::stem(output) + ".valid" + files::extension(output);
}

PrepSummary run_prep(const PrepOptions& options) {
  std::vector<std::string> made;  // the outputs' directories this prep made: removed again if it fails
  try {
    return prep(options, &made);
  } catch (...) {
    files::remove_empty_directories(made);
    throw;
  }
}

}  // namespace dstrain
