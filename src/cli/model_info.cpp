// dstrain model info --config FILE [--ranks N] [--json] [--section.key value ...]: parameters
// (total and activated), training FLOPs per token, and the memory one rank needs for the
// configured layout, from the configuration alone.
#include "model_info.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <numeric>

#include "dstrain/core/error.h"
#include "dstrain/core/torch_compat.h"
#include "dstrain/model/flops.h"
#include "dstrain/train/memory_plan.h"
#include "dstrain/train/train_config.h"

namespace dstrain {
namespace {

const char* kUsage =
    "usage: dstrain model info [--config FILE] [--ranks N] [--json] [--section.key value ...]\n\n"
    "Parameters (total and activated per token), training FLOPs per token, and memory per rank for\n"
    "the configuration's layout on N ranks (default: the fewest it fits, tp x cp x dp x pp, with the\n"
    "fewest dp that parallel.ep fits where dp is not given). Every --parallel.* option of train applies:\n"
    "with tp > 1 each rank holds 1/tp of the split layers, with ep > 1 1/ep of the routed experts, and\n"
    "ZeRO-1 (optim.zero) shards the state.\n";

// GiB for the models this plans for, MiB for the small ones a test or a demo trains.
std::string size_text(double bytes) {
  const double mib = 1024.0 * 1024.0, gib = 1024.0 * mib;
  char text[32];
  std::snprintf(text, sizeof text, bytes < gib ? "%.2f MiB" : "%.2f GiB", bytes / (bytes < gib ? mib : gib));
  return text;
}

// Without --ranks, the fewest ranks the configured layout runs on: tp × cp × dp × pp, where dp is
// left to the number of ranks the fewest data-parallel ranks in which parallel.ep fits (ep must
// divide tp × cp × dp).
int fewest_ranks(const Options& options) {
  auto size = [&](const char* key, int64_t min_value) { return options.get_int(key, min_value, INT32_MAX); };
  const int64_t model_parallel = size("parallel.tp", 1) * size("parallel.cp", 1) * size("parallel.pp", 1);
  const int64_t given_dp = size("parallel.dp", 0), ep = size("parallel.ep", 1);
  const int64_t tp_cp = size("parallel.tp", 1) * size("parallel.cp", 1);
  const int64_t dp = given_dp > 0 ? given_dp : ep / std::gcd(ep, tp_cp);
  const int64_t ranks = model_parallel * dp;
  if (ranks > INT32_MAX)
    throw config_error("parallel.pp", options.raw("parallel.pp"), "more ranks than MPI can number");
  return static_cast<int>(ranks);
}

std::string billions(double n) {
  char text[32];
  std::snprintf(text, sizeof text, n >= 1e9 ? "%.2fB" : "%.2fM", n >= 1e9 ? n / 1e9 : n / 1e6);
  return text;
}

// {"none": ..., "selective": ..., "full": ...}
nlohmann::json by_recompute_name(const std::map<Recompute, double>& bytes) {
  nlohmann::json named;
  for (const auto& [mode, value] : bytes) named[name_of(recompute_names(), mode)] = value;
  return named;
}

nlohmann::json info_json(const TrainConfig& config, int ranks, const MemoryPlan& plan) {
  const ParameterCounts counts = count_parameters(config.model);
  const ParallelConfig& p = config.parallel;
  return {{"total_params", counts.total},
          {"active_params", counts.active},
          {"embedding_params", counts.embedding},
          {"mtp_params", counts.mtp},
          {"flops_per_token", training_flops_per_token(config.model, config.loop.seq_len)},
          {"seq_len", config.loop.seq_len},
          {"layout",
           {{"ranks", ranks},
            {"tp", p.tp},
            {"sequence_parallel", p.sequence_parallel},
            {"cp_mla", p.cp_latent ? "latent" : "heads"},
            {"cp", p.cp},
            {"dp", p.dp},
            {"pp", p.pp},
            {"ep", p.ep},
            {"order", p.order},
            {"virtual_stages", config.pipeline.virtual_stages},
            {"zero", config.optim.zero}}},
          {"precision", name_of(precision_names(), config.loop.precision)},
          {"fp8", name_of(fp8_recipe_names(), config.loop.fp8)},
          {"memory_per_rank",
           {{"parameters", plan.parameters},
            {"gradients", plan.gradients},
            {"optimizer_state", plan.optimizer_state},
            {"fp8_weight_copies", plan.fp8_weight_copies},
            {"activations", plan.activations},
            {"activations_by_recompute", by_recompute_name(plan.activations_by_recompute)},
            {"total", plan.total()}}}};
}

void print_info(const TrainConfig& config, int ranks, const MemoryPlan& plan) {
  const ParameterCounts counts = count_parameters(config.model);
  std::printf("parameters       %s total, %s activated per token (input embedding left out)%s\n",
              billions(static_cast<double>(counts.total)).c_str(), billions(static_cast<double>(counts.active)).c_str(),
              counts.mtp > 0 ? (", + " + billions(static_cast<double>(counts.mtp)) + " in MTP modules").c_str() : "");
  std::printf("training FLOPs   %.4g per token at seq_len %lld (forward + backward, attention included)\n",
              training_flops_per_token(config.model, config.loop.seq_len), static_cast<long long>(config.loop.seq_len));
  const std::string ep = config.parallel.ep > 1 ? ", ep " + std::to_string(config.parallel.ep) : "";
  std::string tp = config.parallel.tp == 1 ? ""
                   : "tp " + std::to_string(config.parallel.tp) +
                         (config.parallel.sequence_parallel ? " (sequence-parallel)" : "") + " x ";
  if (config.parallel.cp > 1) tp += "cp " + std::to_string(config.parallel.cp) + " x ";
  std::printf("layout           %d rank(s): %sdp %d x pp %d%s%s, %s, micro_batch %lld\n", ranks, tp.c_str(),
              config.parallel.dp, config.parallel.pp, ep.c_str(), config.optim.zero == 1 ? ", ZeRO-1" : "",
              name_of(precision_names(), config.loop.precision).c_str(),
              static_cast<long long>(config.loop.micro_batch));
  const std::string fp8_copies =
      config.loop.fp8 == Fp8Recipe::kNone ? "" : ", FP8 weight copies " + size_text(plan.fp8_weight_copies);
  std::printf("memory per rank  parameters %s, gradients %s, optimizer state %s%s,\n",
              size_text(plan.parameters).c_str(), size_text(plan.gradients).c_str(),
              size_text(plan.optimizer_state).c_str(), fp8_copies.c_str());
  const std::string fp8 = config.loop.fp8 == Fp8Recipe::kNone
                              ? ""
                              : "; train.fp8 = " + name_of(fp8_recipe_names(), config.loop.fp8) +
                                    ": the linear maps keep their inputs in FP8";
  std::printf(
      "                 activations %s at a step's peak (estimate for train.recompute = %s;\n"
      "                 none %s, selective %s, full %s%s%s); total %s\n",
      size_text(plan.activations).c_str(), name_of(recompute_names(), config.loop.recompute).c_str(),
      size_text(plan.activations_by_recompute.at(Recompute::kNone)).c_str(),
      size_text(plan.activations_by_recompute.at(Recompute::kSelective)).c_str(),
      size_text(plan.activations_by_recompute.at(Recompute::kFull)).c_str(),
      compat::kHasFusedAttention ? "" : "; this LibTorch's attention keeps its probabilities", fp8.c_str(),
      size_text(plan.total()).c_str());
}

}  // namespace

int model_command(const std::vector<std::string>& args_given) {
  auto is_help = [](const std::string& arg) { return arg == "--help" || arg == "-h"; };
  if (args_given.empty() || args_given[0] != "info" ||
      std::find_if(args_given.begin(), args_given.end(), is_help) != args_given.end()) {
    std::cout << kUsage;
    // Help asked for is an answer; no subcommand, or another, a usage error (as `dstrain` alone).
    return !args_given.empty() && (args_given[0] == "info" || is_help(args_given[0])) ? 0 : 2;
  }
  bool json = false;
  int ranks = 0;  // not given
  std::vector<std::string> args;
  for (size_t i = 1; i < args_given.size(); ++i) {
    if (args_given[i] == "--json") {
      json = true;
    } else if (args_given[i] == "--ranks") {
      if (i + 1 == args_given.size()) throw config_error("--ranks", "", "expected a number of ranks");
      try {
        ranks = std::stoi(args_given[++i]);
      } catch (const std::exception&) {
        throw config_error("--ranks", args_given[i], "expected a number of ranks");
      }
      if (ranks < 1) throw config_error("--ranks", args_given[i], "expected at least 1");
    } else {
      args.push_back(args_given[i]);
    }
  }
  OptionTable table = train_option_table();
  ParsedCommandLine parsed = parse_command_line(table, args);
  if (ranks == 0) ranks = fewest_ranks(parsed.options);
  const TrainConfig config = read_model_and_layout(parsed.options, ranks);
  const MemoryPlan plan = plan_memory(config, fused_operations(config));
  if (json)
    std::cout << info_json(config, ranks, plan).dump(2) << "\n";
  else
    print_info(config, ranks, plan);
  return 0;
}

}  // namespace dstrain
