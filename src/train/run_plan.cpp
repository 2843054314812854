#include "dstrain/train/run_plan.h"

#include <cstdio>

#include "dstrain/core/device_peak.h"
#include "dstrain/core/log.h"
#include "dstrain/model/flops.h"
#include "dstrain/report/metrics.h"

namespace dstrain {
namespace {

// What each corpus of a mixture gives the run: its share of the samples, and how often that
// goes through it.
void log_mixture(const TrainConfig& c, const Mixture& data) {
  const double run_samples = static_cast<double>(c.loop.steps) * static_cast<double>(c.loop.global_batch);
  for (size_t i = 0; i < data.corpora.size(); ++i) {
    const CorpusInfo& info = data.corpora[i]->info();
    const double samples = static_cast<double>(samples_in_corpus(info.n_tokens, c.loop.seq_len));
    char text[96];
    std::snprintf(text, sizeof text, "%.1f%% of the samples, %.2f epochs of its ", 100 * data.weights[i],
                  data.weights[i] * run_samples / samples);
    log::info("  ", info.path, ": ", text, with_commas(samples));
  }
}

}  // namespace

RunPlan run_plan(const TrainConfig& c, const ParallelContext& parallel, const DevicePlacement& placement) {
  const DevicePeak peak = device_peak(placement.name, c.loop.precision, c.loop.peak_tflops);
  return {training_flops_per_token(c.model, c.loop.seq_len), peak.tflops * 1e12 * parallel.grid().world(),
          peak.described};
}

void log_run_plan(const TrainConfig& c, const RunPlan& plan, const ParallelContext& parallel,
                  const DevicePlacement& placement, const RankStage& stage, const AdamW& optimizer, bool sharded,
                  const Mixture& train_data) {
  char flops[32];
  std::snprintf(flops, sizeof flops, "%.3g", plan.flops_per_token);
  log::info("model: ", with_commas(static_cast<double>(count_parameters(c.model).total)), " parameters, ", flops,
            " FLOP per token (training); ", name_of(precision_names(), c.loop.precision), " on ",
            placement.device.str(), " (", placement.name, "), comm ",
            name_of(backend_names(), parallel.group(Group::kDpCp).backend()));
  log::info("MFU peak: ", plan.peak_described);
  const int pp = parallel.group(Group::kPp).size(), chunks_per_stage = c.pipeline.virtual_stages;
  if (pp * chunks_per_stage > 1) {
    std::string text = "pipeline: " + std::to_string(pp) + " stages × " + std::to_string(chunks_per_stage) +
                       " chunk(s), schedule " + schedule_name(c.pipeline.schedule) + ", layers per virtual stage";
    for (const LayerSlice& slice : stage.slices) text += " " + std::to_string(slice.last - slice.first);
    log::info(text);
  }
  const int ep = parallel.group(Group::kEp).size();
  if (ep > 1) {
    log::info("experts: the ", c.model.n_routed_experts, " routed experts of each MoE layer split over ", ep,
              " expert-parallel ranks, ", c.model.n_routed_experts / ep, " each; their gradients averaged over ",
              parallel.group(Group::kEdp).size(), " rank(s) holding the same");
  }
  char state[128];
  std::snprintf(state, sizeof state, "optimizer state: %.1f MiB on rank 0%s", optimizer.state_bytes() / 1048576.0,
                sharded ? ", sharded over the data-parallel ranks (ZeRO-1)" : "");
  log::info(state);
  log::info("training ", c.loop.steps, " steps: global batch ", c.loop.global_batch, " × ", c.loop.seq_len,
            " tokens (micro_batch ", c.loop.micro_batch, " × grad_accum ", c.loop.grad_accum, " × dp ",
            parallel.group(Group::kDp).size(), "), ", with_commas(static_cast<double>(train_data.n_tokens())),
            " tokens in ", c.data.train);
  if (c.loop.rampup.on())
    log::info("batch ramp-up: the global batch starts at ", c.loop.rampup.start, " sequences and grows by ",
              c.loop.rampup.increment, " over the first ", with_commas(static_cast<double>(c.loop.rampup.samples)),
              " samples to ", c.loop.global_batch, " (train.batch_rampup)");
  if (train_data.corpora.size() > 1) log_mixture(c, train_data);
}

}  // namespace dstrain
