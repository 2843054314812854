// Numbers pinned by an earlier build: tests/regression/pinned_results.json holds the runs (ranks,
// configuration, options) and what a reference executable computed for each: every step's losses,
// gradient norm and learning rate, the expert balance, the evaluations and the final parameters'
// digest. This build must compute the same bits. A change that must change no number (a refactor)
// is held to the numbers of the commit before it.
//
// To record the results of another executable (say, the commit before a change):
//   DSTRAIN_RECORD_PINNED_WITH=/path/to/dstrain build/tests/dstrain_e2e_tests --gtest_filter='Pinned*'
// rewrites the file's results (the runs stay as they are) and skips the check.
//
// Bits are only comparable between machines that compute alike: the file names the LibTorch version
// and the kernels (LibTorch's for the CPU, the BLAS's) it was recorded with, and elsewhere the test
// says so and skips.
#include <ATen/Version.h>
#include <gtest/gtest.h>
#include <torch/version.h>

#include <cstdlib>
#include <fstream>

#include "dstrain/core/blas.h"
#include "e2e_util.h"

using namespace dstrain::e2e;
using nlohmann::json;

namespace {

const std::string kPinnedFile = std::string(DSTRAIN_SOURCE_DIR) + "/tests/regression/pinned_results.json";

// The fields of a training or evaluation record that the model's numbers decide (not the clock's).
const char* const kPinnedFields[] = {"loss", "mtp_loss", "balance_loss", "grad_norm", "lr", "consumed_samples",
                                     "expert_load_max_over_mean", "ep_load_max_over_mean", "ep_ranks_per_token",
                                     "eval_loss"};

// LibTorch's line "CPU capability usage: AVX2" of its build configuration.
std::string cpu_kernels() {
  const std::string config = at::show_config(), label = "CPU capability usage: ";
  const size_t at = config.find(label);
  if (at == std::string::npos) return "unknown";
  const size_t start = at + label.size();
  return config.substr(start, config.find('\n', start) - start);
}

// What decides the bits besides the code: LibTorch, its CPU kernels and the BLAS with the kernels
// it chose for this CPU.
json this_machine() {
  return {{"libtorch", TORCH_VERSION}, {"cpu_kernels", cpu_kernels()}, {"blas", dstrain::blas::loaded().name}};
}

// One pinned run with `executable`, in a fresh directory; its results as the file keeps them.
json run_pinned(const std::string& executable, const json& run) {
  const std::string dir = scratch_dir("pinned-" + run["name"].get<std::string>());
  std::vector<std::string> args = {"train", "--config", std::string(DSTRAIN_SOURCE_DIR) + "/" + run["config"].get<std::string>(),
                                   "--run.dir", dir, "--data.train", test_corpus().train, "--data.valid",
                                   test_corpus().valid, "--train.device", "cpu", "--train.threads", "1"};
  for (const json& option : run["options"]) args.push_back(option.get<std::string>());
  const RunOutput output = run_executable(executable, run["ranks"].get<int>(), args);
  EXPECT_EQ(output.exit_code, 0) << run["name"] << ":\n" << output.output;
  json records = json::array();
  for (const json& record : read_jsonl(dir + "/metrics.jsonl")) {
    json pinned = {{"step", record["step"]}};
    for (const char* field : kPinnedFields)
      if (record.contains(field)) pinned[field] = record[field];
    records.push_back(pinned);
  }
  return {{"records", records}, {"param_digest", read_json(dir + "/summary.json")["param_digest"]}};
}

// The file's text: a line for each record, so that a change of numbers reads as a change of lines.
std::string pinned_text(const json& pinned) {
  std::string text = "{\n";
  for (const auto& [key, value] : pinned.items())
    if (key != "runs") text += " " + json(key).dump() + ": " + value.dump() + ",\n";
  text += " \"runs\": [\n";
  for (size_t r = 0; r < pinned["runs"].size(); ++r) {
    const json& run = pinned["runs"][r];
    text += "  {";
    for (const char* key : {"name", "ranks", "config", "options"}) text += json(key).dump() + ": " + run[key].dump() + ", ";
    text += "\"results\": {\"param_digest\": " + run["results"]["param_digest"].dump() + ", \"records\": [\n";
    const json& records = run["results"]["records"];
    for (size_t i = 0; i < records.size(); ++i)
      text += "    " + records[i].dump() + (i + 1 < records.size() ? ",\n" : "\n");
    text += std::string("  ]}}") + (r + 1 < pinned["runs"].size() ? ",\n" : "\n");
  }
  return text + " ]\n}\n";
}

}  // namespace

TEST(PinnedResults, EveryRunComputesTheRecordedBits) {
  json pinned = read_json(kPinnedFile);
  ASSERT_FALSE(pinned["runs"].empty());
  if (const char* reference = std::getenv("DSTRAIN_RECORD_PINNED_WITH")) {
    for (json& run : pinned["runs"]) run["results"] = run_pinned(reference, run);
    pinned["recorded_on"] = this_machine();
    std::ofstream(kPinnedFile) << pinned_text(pinned);
    GTEST_SKIP() << "recorded the results of " << reference << " into " << kPinnedFile << ", checked nothing";
  }
  if (pinned["recorded_on"] != this_machine())
    GTEST_SKIP() << "the pinned bits were computed with " << pinned["recorded_on"].dump() << " and this machine has "
                 << this_machine().dump() << ": other kernels round otherwise";
  for (const json& run : pinned["runs"]) {
    const json mine = run_pinned(DSTRAIN_EXE, run), recorded = run["results"];
    const std::string name = run["name"];
    EXPECT_EQ(mine["param_digest"], recorded["param_digest"]) << name << ": the final parameters differ";
    ASSERT_EQ(mine["records"].size(), recorded["records"].size()) << name;
    for (size_t i = 0; i < recorded["records"].size(); ++i)
      EXPECT_EQ(mine["records"][i], recorded["records"][i]) << name << ", record " << i;
  }
}
