#include "eval.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>

#include "command_args.h"
#include "command_line_check.h"
#include "dstrain/ckpt/checkpoint_reader.h"
#include "dstrain/core/error.h"
#include "dstrain/core/files.h"
#include "dstrain/core/log.h"
#include "dstrain/parallel/mpi_communicator.h"
#include "dstrain/parallel/parallel_context.h"
#include "dstrain/parallel/agreed_phase.h"
#include "dstrain/train/checkpoint_evaluation.h"
#include "dstrain/train/train_config.h"

namespace dstrain {
namespace {

const char* kEvalUsage =
    "usage: [mpirun -np N] dstrain eval --ckpt CKPT --data CORPUS [--batches B] [--json FILE] [--section.key value ...]\n"
    "\n"
    "The mean next-token loss and the perplexity of checkpoint CKPT (a file, or a checkpoint directory:\n"
    "its latest) on the corpus CORPUS (made by dstrain prep), over its first B global batches in order\n"
    "(default 0: all it holds), as the training loop evaluates data.valid. The model and the batch come\n"
    "from the checkpoint's configuration; any layout works (--parallel.pp, --parallel.dp, ...), and\n"
    "--train.micro_batch, --train.device, --train.precision override it.\n"
    "\n"
    "  --ckpt CKPT      checkpoint file or directory\n"
    "  --data CORPUS    corpus to evaluate on\n"
    "  --batches B      global batches (train.global_batch sequences each) to evaluate; 0: all\n"
    "  --json FILE      also write the result as JSON (rank 0)\n";

}  // namespace

int eval_command(int argc, char** argv, const std::vector<std::string>& args) {
  CommandArgs parsed;
  std::string corpus;
  int64_t batches = 0;
  const CommandLineCheck check([&] {
    parsed = split_command_args(args, {"ckpt", "data", "batches", "json"}, "eval");
    if (parsed.help) return;
    for (const char* required : {"ckpt", "data"})
      if (!parsed.own.count(required))
        throw Error(ExitCode::kUsage, std::string("eval: give --") + required + " (see dstrain eval --help)");
    corpus = parsed.own.at("data");
    if (!files::is_regular_file(corpus))
      throw config_error("--data", corpus, "no such file (make a corpus with `dstrain prep`)");
    batches = static_cast<int64_t>(number_option(parsed, "batches", 0, 0, 1e15, true));
    if (const auto json = parsed.own.find("json"); json != parsed.own.end()) {  // before the evaluation, not after
      std::string why;
      if (files::is_directory(json->second) || !files::make_parent_directories(json->second, &why))
        throw config_error("--json", json->second, why.empty() ? "a directory" : "cannot create its directory (" + why + ")");
    }
  });
  if (!check.failed() && parsed.help) {
    std::cout << kEvalUsage;
    return 0;
  }

  MpiSession mpi(&argc, &argv);
  check.agree(mpi.world_rank());
  log::configure(mpi.world_rank(), mpi.world_size(), false);
  OptionTable table = train_option_table();
  std::string checkpoint;
  Options options;
  // Which file a checkpoint directory's `latest` names, decided by rank 0 alone: a run saving
  // meanwhile could otherwise show ranks different checkpoints.
  agreed_phase(mpi.world_rank(), [&] {
    if (mpi.world_rank() == 0) checkpoint = resolve_checkpoint(parsed.own.at("ckpt"), "--ckpt");
  });
  checkpoint = MpiCommunicator(MPI_COMM_WORLD).broadcast_string(checkpoint, 0);
  agreed_phase(mpi.world_rank(), [&] {  // every rank reads the checkpoint; one reports its faults
    std::vector<std::string> overrides = {"--data.train=" + corpus, "--data.valid=" + corpus};
    overrides.insert(overrides.end(), parsed.overrides.begin(), parsed.overrides.end());
    options = checkpoint_options(table, checkpoint, overrides);
  });
  const CheckpointEvaluation result = evaluate_checkpoint(options, checkpoint, corpus, batches);
  if (mpi.world_rank() != 0) return 0;
  char line[512];
  std::snprintf(line, sizeof line,
                "eval of %s (step %lld) on %s: loss %.6f | perplexity %.4f | %lld global batches, %lld tokens | %.1f s",
                result.checkpoint.c_str(), static_cast<long long>(result.step), result.corpus.c_str(), result.loss,
                result.perplexity, static_cast<long long>(result.batches), static_cast<long long>(result.tokens),
                result.seconds);
  log::info(line);
  const auto json_path = parsed.own.find("json");
  if (json_path != parsed.own.end()) {
    const nlohmann::json record = {{"checkpoint", result.checkpoint}, {"step", result.step},
                                   {"corpus", result.corpus},         {"loss", result.loss},
                                   {"perplexity", result.perplexity}, {"batches", result.batches},
                                   {"sequences", result.sequences},   {"tokens", result.tokens},
                                   {"seconds", result.seconds}};
    std::ofstream out(json_path->second, std::ios::trunc);
    out << record.dump(2) << "\n";
    if (!out) throw config_error("--json", json_path->second, "cannot write this file");
  }
  return 0;
}

}  // namespace dstrain
