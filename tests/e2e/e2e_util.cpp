#include "e2e_util.h"

#include "dstrain/ckpt/parameter_file.h"
#include "dstrain/core/files.h"
#include "dstrain/core/h5.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

namespace dstrain::e2e {

namespace {

std::string quote(const std::string& arg) {
  std::string quoted = "'";
  for (char c : arg) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

}  // namespace

RunOutput run_dstrain(int ranks, const std::vector<std::string>& args) { return run_executable(DSTRAIN_EXE, ranks, args); }

RunOutput run_executable(const std::string& executable, int ranks, const std::vector<std::string>& args) {
  // Test machines and containers often run as root, which mpirun refuses without these.
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  std::string command;
  if (ranks > 0) command = std::string(MPIEXEC) + " -np " + std::to_string(ranks) + " --oversubscribe ";
  command += quote(executable);
  for (const std::string& arg : args) command += " " + quote(arg);
  return run_shell(command);
}

RunOutput run_shell(const std::string& command_line) {
  const std::string command = command_line + " 2>&1";
  RunOutput result;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) result.output.append(buffer, n);
  int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

namespace {

// Where this test process writes: a directory of its own under the temp directory (so that two
// suites on one machine never meet), made on first use and removed after the last test; kept,
// and named, when a test failed.
class ScratchRoot : public ::testing::Environment {
 public:
  const std::string& path() {
    if (path_.empty()) {
      std::string name = files::temp_directory() + "/dstrain-e2e-XXXXXX";
      if (!mkdtemp(name.data())) ADD_FAILURE() << "cannot make a directory like " << name;
      path_ = name;
    }
    return path_;
  }
  void TearDown() override {
    if (path_.empty()) return;
    if (::testing::UnitTest::GetInstance()->Passed()) files::remove_tree(path_);
    else std::fprintf(stderr, "the failed tests' files are kept in %s\n", path_.c_str());
  }

 private:
  std::string path_;
};

ScratchRoot* const scratch_root = [] {
  auto* root = new ScratchRoot;  // GoogleTest owns it
  ::testing::AddGlobalTestEnvironment(root);
  return root;
}();

}  // namespace

std::string scratch_dir(const std::string& name) {
  const std::string dir = scratch_root->path() + "/" + name;
  files::remove_tree(dir);
  std::string why;
  if (!files::make_directories(dir, &why)) ADD_FAILURE() << why;
  return dir;
}

const TestCorpus& test_corpus() {
  static TestCorpus corpus = [] {
    std::string dir = scratch_dir("corpus");
    TestCorpus c{dir + "/licenses.h5", dir + "/licenses.valid.h5"};
    std::vector<std::string> args = {"prep", "--output", c.train, "--valid-fraction", "0.25", "--input"};
    for (const char* name : {"GPL-2", "GPL-3", "LGPL-2.1", "Apache-2.0", "MPL-2.0", "Artistic", "GFDL-1.3", "BSD"})
      args.push_back(std::string("/usr/share/common-licenses/") + name);
    RunOutput prep = run_dstrain(0, args);
    if (prep.exit_code != 0) ADD_FAILURE() << "dstrain prep failed:\n" << prep.output;
    return c;
  }();
  return corpus;
}

RunOutput train_tiny_v3(int ranks, const std::string& run_dir, const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"train", "--config", std::string(DSTRAIN_SOURCE_DIR) + "/input/tiny-v3.ini",
                                   "--run.dir", run_dir, "--data.train", test_corpus().train, "--data.valid",
                                   test_corpus().valid, "--train.micro_batch", "1", "--train.global_batch", "8",
                                   "--ckpt.save_final", "true"};
  args.insert(args.end(), extra.begin(), extra.end());
  return run_dstrain(ranks, args);
}

RunOutput train_tiny(int ranks, const std::string& run_dir, const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"train", "--config", std::string(DSTRAIN_SOURCE_DIR) + "/input/tiny.ini",
                                   "--run.dir", run_dir, "--data.train", test_corpus().train,
                                   "--data.valid", test_corpus().valid};
  args.insert(args.end(), extra.begin(), extra.end());
  return run_dstrain(ranks, args);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::vector<nlohmann::json> records;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) records.push_back(nlohmann::json::parse(line));
  return records;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

std::vector<nlohmann::json> train_records(const std::string& run_dir) {
  std::vector<nlohmann::json> out;
  for (auto& r : read_jsonl(run_dir + "/metrics.jsonl"))
    if (r.contains("loss")) out.push_back(r);
  return out;
}

std::vector<nlohmann::json> eval_records(const std::string& run_dir) {
  std::vector<nlohmann::json> out;
  for (auto& r : read_jsonl(run_dir + "/metrics.jsonl"))
    if (r.contains("eval_loss")) out.push_back(r);
  return out;
}

// The byte at the middle of a dataset's data, flipped in place.
void flip_a_byte(const std::string& file, const std::string& dataset) {
  haddr_t offset = 0;
  hsize_t size = 0;
  {
    std::lock_guard<std::recursive_mutex> lock(dstrain::h5::h5_mutex());
    hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
    ASSERT_GE(d, 0);
    offset = H5Dget_offset(d);
    size = H5Dget_storage_size(d);
    ASSERT_GE(H5Dclose(d), 0);
    ASSERT_GE(H5Fclose(f), 0);
  }
  std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(static_cast<std::streamoff>(offset + size / 2));
  char byte = 0;
  io.get(byte);
  io.seekp(static_cast<std::streamoff>(offset + size / 2));
  io.put(static_cast<char>(byte ^ 0x10));
}

void expect_same_losses(const std::string& dir, const std::string& reference, size_t steps,
                        const std::vector<std::string>& keys, double tolerance) {
  const std::vector<nlohmann::json> mine = train_records(dir), theirs = train_records(reference);
  ASSERT_EQ(mine.size(), steps) << dir;
  std::map<int64_t, nlohmann::json> by_step;
  for (const auto& record : theirs) by_step[record["step"].get<int64_t>()] = record;
  for (const auto& record : mine) {
    const int64_t step = record["step"].get<int64_t>();
    ASSERT_TRUE(by_step.count(step)) << "step " << step;
    for (const std::string& key : keys)
      EXPECT_NEAR(record[key].get<double>(), by_step[step][key].get<double>(), tolerance) << key << " at step " << step;
  }
}

void expect_same_parameters(const std::string& dir, const std::string& reference) {
  const NamedTensors a = read_parameter_file(dir + "/final_model.h5");
  const NamedTensors b = read_parameter_file(reference + "/final_model.h5");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].first, b[i].first);
    ASSERT_EQ(a[i].second.sizes(), b[i].second.sizes()) << a[i].first;
    EXPECT_LT((a[i].second - b[i].second).abs().max().item<float>(), 1e-5) << a[i].first;
  }
}

std::string checkpoint_file(const std::string& run_dir, int step) {
  char name[32];
  std::snprintf(name, sizeof name, "/checkpoints/step_%08d.h5", step);
  return run_dir + name;
}

const std::string& one_rank_run(Trainer train, const std::string& name) {
  static std::map<std::string, std::string> dirs;
  const auto found = dirs.find(name);
  if (found != dirs.end()) return found->second;
  const std::string dir = scratch_dir(name);
  const RunOutput run = train(1, dir, {});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  return dirs[name] = dir;
}

std::vector<std::string> expect_layouts_match_one_rank(Trainer train, const std::string& name, size_t steps,
                                                       const std::vector<std::string>& keys,
                                                       const std::vector<RankLayout>& layouts) {
  const std::string& reference = one_rank_run(train, name + "-one-rank");
  std::vector<std::string> dirs;
  for (const RankLayout& layout : layouts) {
    std::string dir_name = name;
    for (const std::string& option : layout.options) dir_name += "-" + option.substr(option.rfind('.') + 1);
    const std::string dir = scratch_dir(dir_name);
    dirs.push_back(dir);
    SCOPED_TRACE(dir);
    const RunOutput run = train(layout.ranks, dir, layout.options);
    EXPECT_EQ(run.exit_code, 0) << run.output;
    if (run.exit_code != 0) continue;
    expect_same_losses(dir, reference, steps, keys);
    expect_same_parameters(dir, reference);
  }
  return dirs;
}

}  // namespace dstrain::e2e
