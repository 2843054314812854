// Running the real dstrain executable (under mpirun) and reading back what it wrote.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace dstrain::e2e {

struct RunOutput {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// `ranks` = 0 runs dstrain directly (no launcher); otherwise under mpirun -np ranks.
RunOutput run_dstrain(int ranks, const std::vector<std::string>& args);
// The same with another dstrain executable (a reference build's, say).
RunOutput run_executable(const std::string& executable, int ranks, const std::vector<std::string>& args);
// A shell command line, its standard output and error together.
RunOutput run_shell(const std::string& command);

// A scratch directory `name` in this test process's own directory under the temp directory,
// emptied first; all of it is removed after the process's last test unless one failed.
std::string scratch_dir(const std::string& name);

// The test corpus: Debian's license texts (base-files), prepared once per test process.
struct TestCorpus {
  std::string train, valid;
};
const TestCorpus& test_corpus();

// `dstrain train` of input/tiny.ini on the test corpus into `run_dir`; `extra` overrides.
RunOutput train_tiny(int ranks, const std::string& run_dir, const std::vector<std::string>& extra);
// The same with input/tiny-v3.ini (MLA, MoE, MTP): micro-batch 1, global batch 8, the final model
// saved; `extra` overrides.
RunOutput train_tiny_v3(int ranks, const std::string& run_dir, const std::vector<std::string>& extra);

// The byte at the middle of a dataset's data in an HDF5 file, flipped in place.
void flip_a_byte(const std::string& file, const std::string& dataset);

// A whole file's bytes (empty, with a test failure, when it cannot be read).
std::string read_text(const std::string& path);
std::vector<nlohmann::json> read_jsonl(const std::string& path);
nlohmann::json read_json(const std::string& path);

// Training records (those with "loss") and evaluation records (with "eval_loss") of a run dir.
std::vector<nlohmann::json> train_records(const std::string& run_dir);
std::vector<nlohmann::json> eval_records(const std::string& run_dir);

// Another layout's run against `reference`'s: `steps` training records in `dir`, each one's `keys`
// within `tolerance` of the reference's record of the same step.
void expect_same_losses(const std::string& dir, const std::string& reference, size_t steps,
                        const std::vector<std::string>& keys, double tolerance = 1e-5);
// The final models (final_model.h5) of two runs: the same names, every value within 1e-5.
void expect_same_parameters(const std::string& dir, const std::string& reference);
// A run directory's checkpoint of `step`.
std::string checkpoint_file(const std::string& run_dir, int step);

// A training run of some model: `ranks` (0: no launcher), its run directory, options.
using Trainer = RunOutput (*)(int ranks, const std::string& run_dir, std::vector<std::string> extra);
struct RankLayout {
  int ranks;
  std::vector<std::string> options;
};
// `train`'s run on one rank, once per test process for each `name` (its scratch directory's).
const std::string& one_rank_run(Trainer train, const std::string& name);
// Each layout's run of `train` against one_rank_run(train, name), `steps` records each:
// expect_same_losses over `keys` and expect_same_parameters. The run directories, in order.
std::vector<std::string> expect_layouts_match_one_rank(Trainer train, const std::string& name, size_t steps,
                                                       const std::vector<std::string>& keys,
                                                       const std::vector<RankLayout>& layouts);

}  // namespace dstrain::e2e
