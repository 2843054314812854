// dstrain: the command-line entry point. Each subcommand parses its options and hands over to
// its module; errors become one message and a documented exit code (docs/troubleshooting.md, "Exit codes").
#include <boost/program_options.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "bench.h"
#include "ckpt.h"
#include "command_line_check.h"
#include "model_info.h"
#include "eval.h"
#include "generate.h"
#include "plot.h"
#include "serve.h"
#include "data.h"
#include "pipeline.h"
#include "dstrain/core/config.h"
#include "dstrain/core/error.h"
#include "dstrain/core/h5.h"
#include "dstrain/core/log.h"
#include "dstrain/core/log_writer.h"
#include "dstrain/core/option_reference.h"
#include "dstrain/data/prep.h"
#include "dstrain/parallel/mpi_check.h"
#include "dstrain/parallel/parallel_context.h"
#include "dstrain/train/train_config.h"
#include "dstrain/train/signals.h"
#include "dstrain/report/system_report.h"
#include "dstrain/core/blas.h"
#include "dstrain/parallel/deadline.h"
#include "dstrain/train/trainer.h"

namespace po = boost::program_options;
using namespace dstrain;

namespace {

const char* kUsage =
    "usage: dstrain <command> [options]\n"
    "\n"
    "commands:\n"
    "  train   train a model: mpirun -np N dstrain train --config input/demo.ini [--section.key value ...]\n"
    "  prep    tokenize text or JSONL files into a corpus: dstrain prep --input FILE... --output corpus.h5\n"
    "  data    import llm.c or Megatron corpora, inspect any corpus: dstrain data import|inspect ...\n"
    "  bench   measure: dstrain bench step|comm|memory|io [--config FILE] [--section.key value ...]\n"
    "  pipeline  simulate a schedule: dstrain pipeline simulate --pp P --microbatches M [--schedule S]\n"
    "  ckpt    inspect or verify a checkpoint, Hugging Face weights in and out: dstrain ckpt inspect|verify|import-hf|export-hf\n"
    "  model   what a configuration costs: dstrain model info --config FILE [--ranks N] [--json]\n"
    "  eval    loss and perplexity of a checkpoint: [mpirun -np N] dstrain eval --ckpt CKPT --data CORPUS\n"
    "  generate  continue a text with a checkpoint's model: dstrain generate --ckpt CKPT --prompt TEXT\n"
    "  serve   a checkpoint behind an OpenAI-compatible HTTP endpoint: dstrain serve --ckpt CKPT [--port 8000]\n"
    "  plot    PNG charts of runs (overlaid): dstrain plot RUN_DIR... [--output DIR]\n"
    "\n"
    "  dstrain <command> --help    the options of a command\n"
    "  dstrain --version\n";

// A job script learns that training ran to its end from this file, not from srun's exit status
// alone: Slurm's srun reports 0 for a step whose tasks failed to launch (a PMIx failure, say).
void record_exit_for_job_script(int world_rank, int code) {
  const char* path = std::getenv("DSTRAIN_EXIT_FILE");
  if (world_rank != 0 || path == nullptr || path[0] == '\0') return;
  std::ofstream out(path, std::ios::trunc);
  out << code << "\n";
  if (!out.flush()) log::warning("could not write the exit code to DSTRAIN_EXIT_FILE = ", path);
}

int train_command(int argc, char** argv, const std::vector<std::string>& args) {
  OptionTable table = train_option_table();
  if (std::find(args.begin(), args.end(), "--help-markdown") != args.end()) {
    std::cout << option_reference_markdown(table);  // docs/configuration.md's option reference
    return 0;
  }
  ParsedCommandLine parsed;
  const CommandLineCheck check([&] { parsed = parse_command_line(table, args); });
  if (parsed.help_requested) {
    std::cout << "usage: [mpirun -np N] dstrain train [--config FILE.ini] [--section.key value ...]\n\n"
                 "Every key can be set in the INI file (under [section]) or on the command line,\n"
                 "which wins. Booleans: --key, --key true, --key=false.\n"
              << table.help_text();
    return 0;
  }
  MpiSession mpi(&argc, &argv, startup_timeout_s(check.failed() ? "" : parsed.options.raw("comm.timeout_s")));
  check.agree(mpi.world_rank());
  log::configure(mpi.world_rank(), mpi.world_size(), false);
  if (mpi.world_rank() == 0) {
    log::info(system_report());
    if (blas::loaded().reference)
      log::warning("the CPU computes on the reference BLAS (", blas::loaded().path, "), about 10 times slower than "
                   "OpenBLAS: scripts/install-deps.sh installs and selects OpenBLAS (libopenblas0-pthread)");
  }
  const TrainResult result = run_training(parsed.options);
  if (!result.run_files.empty()) log::info(result.run_files);
  const int code = static_cast<int>(result.requeue ? ExitCode::kRequeue : ExitCode::kSuccess);
  record_exit_for_job_script(mpi.world_rank(), code);
  return code;
}

int bench_command(int argc, char** argv, const std::vector<std::string>& args) {
  const std::vector<std::string> kinds = {"step", "comm", "memory", "io"};
  if (args.empty() || std::find(kinds.begin(), kinds.end(), args[0]) == kinds.end()) {
    if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
      std::cout << "usage: [mpirun -np N] dstrain bench step|comm|memory|io [--config FILE] [--section.key value ...]\n"
                   "  step    training steps of the configured model on random tokens: tokens/s, MFU, peak memory\n"
                   "  comm    all-reduce, reduce-scatter, all-gather bus bandwidth over message sizes\n"
                   "  memory  host, device and host<->device copy bandwidth\n"
                   "  io      read bandwidth of the corpus data.train\n"
                << bench::option_table().help_text();
      return 0;
    }
    throw Error(ExitCode::kUsage, "bench: say what to measure: step, comm, memory or io (see dstrain bench --help)");
  }
  OptionTable table = bench::option_table();
  ParsedCommandLine parsed;
  const CommandLineCheck check(
      [&] { parsed = parse_command_line(table, std::vector<std::string>(args.begin() + 1, args.end())); });
  if (parsed.help_requested) return bench_command(argc, argv, {"--help"});
  MpiSession mpi(&argc, &argv);
  check.agree(mpi.world_rank());
  log::configure(mpi.world_rank(), mpi.world_size(), false);
  const std::string& kind = args[0];
  nlohmann::json result = kind == "step"   ? bench::step(parsed.options)
                          : kind == "comm" ? bench::comm(parsed.options)
                          : kind == "memory" ? bench::memory(parsed.options)
                                             : bench::io(parsed.options);
  const std::string json_path = parsed.options.get_string("bench.json");
  if (!json_path.empty() && mpi.world_rank() == 0) {
    std::ofstream out(json_path, std::ios::trunc);
    out << result.dump(2) << "\n";
    if (!out) throw config_error("bench.json", json_path, "cannot write this file");
  }
  return 0;
}

int prep_command(int argc, char** argv, const std::vector<std::string>& args) {
  PrepOptions options;
  // Read signed: Boost takes "-1" for an unsigned's largest value.
  int64_t threads = 0, memory_limit_mb = 1024, seed = 0;
  // Wide lines: Boost wraps by bytes, and would cut the UTF-8 of DeepSeek's token names in two.
  po::options_description description("dstrain prep options", /*line_length=*/200, /*min_description_length=*/100);
  description.add_options()
      ("help,h", "this help")
      ("input", po::value<std::vector<std::string>>(&options.inputs)->multitoken(),
       "text files (one document each) or JSONL files (.jsonl: one document per line, field \"text\")")
      ("output", po::value<std::string>(&options.output), "corpus file to write (HDF5)")
      ("valid-fraction", po::value<double>(&options.valid_fraction)->default_value(0.0),
       "fraction of documents for the validation split (every 1/F-th document), 0 to 0.5")
      ("valid-output", po::value<std::string>(&options.valid_output),
       "validation corpus file (default: OUTPUT with .valid before the extension)")
      ("tokenizer", po::value<std::string>(&options.tokenizer)->default_value("byte"),
       "byte (one token per byte, end-of-document 256), or a Hugging Face tokenizer.json (byte-level BPE)")
      ("eod-token", po::value<std::string>(&options.eod_token),
       "the tokenizer.json token that ends each document (default: <|endoftext|>, <｜end▁of▁sentence｜>, </s> or <eos>)")
      ("threads", po::value<int64_t>(&threads)->default_value(0),
       "tokenizing threads per process (0: one per core)")
      ("shuffle", po::bool_switch(&options.shuffle), "shuffle the documents of each split")
      ("seed", po::value<int64_t>(&seed)->default_value(0), "seed of --shuffle")
      ("memory-limit", po::value<int64_t>(&memory_limit_mb)->default_value(1024),
       "MB of text and tokens in flight per process (inputs of any size stream through it)");
  po::variables_map given;
  const CommandLineCheck check([&] {
    parse_command_options(args, description, &given, "prep");
    if (threads < 0 || threads > 1024)
      throw config_error("--threads", std::to_string(threads), "0 (one per core) to 1024");
    options.threads = static_cast<unsigned>(threads);
    if (memory_limit_mb < 16 || memory_limit_mb > (int64_t{1} << 40))
      throw config_error("--memory-limit", std::to_string(memory_limit_mb), "16 to 2^40 (MB)");
    options.memory_limit_mb = static_cast<uint64_t>(memory_limit_mb);
    if (seed < 0) throw config_error("--seed", std::to_string(seed), "0 or more");
    options.seed = static_cast<uint64_t>(seed);
  });
  if (!check.failed() && given.count("help")) {
    std::cout << "usage: [mpirun -np N] dstrain prep --input FILE... --output corpus.h5 [--tokenizer tokenizer.json]\n"
                 "       [--valid-fraction F] [--shuffle] [--threads T] [--memory-limit MB]\n\n"
                 "With N processes each tokenizes a block of the input files; the result is the same.\n\n"
              << description;
    return 0;
  }
  MpiSession mpi(&argc, &argv);
  check.agree(mpi.world_rank());
  log::configure(mpi.world_rank(), mpi.world_size(), false);
  options.rank = mpi.world_rank();
  options.world = mpi.world_size();
  options.sum_over_ranks = [](uint64_t* values, int count) {
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values, count, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD));
  };
  PrepSummary summary = run_prep(options);
  if (mpi.world_rank() != 0) return 0;
  const double mb = static_cast<double>(summary.input_bytes) / 1e6;
  std::printf("wrote %s: %llu documents, %llu tokens (tokenizer %s, vocabulary %llu)\n",
              summary.train.path.c_str(), static_cast<unsigned long long>(summary.train.n_documents),
              static_cast<unsigned long long>(summary.train.n_tokens), summary.train.tokenizer.c_str(),
              static_cast<unsigned long long>(summary.train.vocab_size));
  if (summary.valid.n_documents > 0)
    std::printf("wrote %s: %llu documents, %llu tokens\n", summary.valid.path.c_str(),
                static_cast<unsigned long long>(summary.valid.n_documents),
                static_cast<unsigned long long>(summary.valid.n_tokens));
  const unsigned workers = summary.threads * static_cast<unsigned>(summary.ranks);
  const double rate = summary.tokenize_seconds > 0 ? mb / summary.tokenize_seconds : 0.0;
  const double per_cpu_second = summary.tokenize_cpu_seconds > 0 ? mb / summary.tokenize_cpu_seconds : 0.0;
  std::printf("%.2f MB of text in %.2f s: tokenized at %.1f MB/s (%u threads x %d processes, %.1f MB/s per thread; "
              "%.1f MB per CPU-second), %.2f s in all\n",
              mb, summary.tokenize_seconds, rate, summary.threads, summary.ranks, rate / workers, per_cpu_second,
              summary.seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // First of all: a warning signal that arrives while MPI starts is noted, not fatal.
  signals::install();
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::cout << kUsage;
    if (!args.empty()) std::cout << "\noptions of dstrain train:\n" << train_option_table().help_text();
    return args.empty() ? static_cast<int>(ExitCode::kUsage) : 0;
  }
  if (args[0] == "--version") {
    std::cout << "dstrain " << DSTRAIN_VERSION << "\n";
    return 0;
  }
  const std::string command = args[0];
  std::vector<std::string> rest(args.begin() + 1, args.end());
  try {
    if (command == "train") return train_command(argc, argv, rest);
    if (command == "prep") return prep_command(argc, argv, rest);
    if (command == "bench") return bench_command(argc, argv, rest);
    if (command == "pipeline") return pipeline_command(rest);
    if (command == "ckpt") return ckpt_command(rest);
    if (command == "model") return model_command(rest);
    if (command == "eval") return eval_command(argc, argv, rest);
    if (command == "generate") return generate_command(rest);
    if (command == "serve") return serve_command(rest);
    if (command == "plot") return plot_command(rest);
    if (command == "data") return data_command(rest);
    throw Error(ExitCode::kUsage,
                "unknown command '" + command + "' (commands: train, prep, data, bench, pipeline, ckpt, model, eval, generate, serve, plot; see dstrain --help)");
  } catch (const std::exception& e) {
    const Error error = as_error(e);
    if (error.what()[0] != '\0') log::error(error.what());  // empty: another rank has reported it
    if (h5::holds_unclosable_file()) {
      // HDF5's clean-up at exit would crash on the file it could not close: leave without it.
      log::drain(log::kDrainStallSeconds);
      std::fflush(nullptr);
      std::_Exit(static_cast<int>(error.code()));
    }
    finalize_mpi();  // after the message (MpiSession leaves it to here on an error)
    return static_cast<int>(error.code());
  }
}
