// A full disk, for real: a file system of 80 KB (a tmpfs the test mounts; the test is skipped
// where it cannot mount one) that a training run fills with its checkpoint or its final model.
// The run must say what happened, exit with the checkpoint code, and leave no partial file
// behind; it used to die in HDF5's clean-up (a segmentation fault, and no message at all).
#include <gtest/gtest.h>

#include <sys/mount.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "dstrain/core/files.h"
#include "e2e_util.h"

using namespace dstrain::e2e;

namespace {

// A tmpfs of `kilobytes` mounted over a scratch directory while it lives.
class TinyFileSystem {
 public:
  explicit TinyFileSystem(const std::string& dir, int kilobytes, unsigned long flags = 0) : dir_(dir) {
    const std::string options = "size=" + std::to_string(kilobytes) + "k";
    mounted_ = ::mount("tmpfs", dir.c_str(), "tmpfs", flags, options.c_str()) == 0;
    if (!mounted_) why_ = std::strerror(errno);
  }
  ~TinyFileSystem() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& why() const { return why_; }

 private:
  std::string dir_, why_;
  bool mounted_ = false;
};

void expect_clean_failure(const RunOutput& run, const std::string& file) {
  EXPECT_EQ(run.exit_code, 4) << run.output;  // the checkpoint code, not a crash (139)
  EXPECT_NE(run.output.find("error: "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find(file), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("Segmentation fault"), std::string::npos) << run.output;
}

}  // namespace

TEST(FullDisk, ACheckpointThatDoesNotFitEndsTheRunCleanly) {
  const std::string dir = scratch_dir("full-disk-checkpoint");
  TinyFileSystem disk(dir, 80);
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (" << disk.why() << "); needs root";
  const RunOutput run = train_tiny(0, dir + "/run", {"--ckpt.interval", "2", "--train.steps", "6"});
  expect_clean_failure(run, "step_00000002.h5.tmp");
  EXPECT_NE(run.output.find("No space left on device"), std::string::npos) << run.output;
  EXPECT_FALSE(dstrain::files::exists(dir + "/run/checkpoints/step_00000002.h5.tmp")) << "the partial file stayed";
}

TEST(FullDisk, AFinalModelThatDoesNotFitEndsTheRunCleanly) {
  const std::string dir = scratch_dir("full-disk-final");
  TinyFileSystem disk(dir, 80);
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (" << disk.why() << "); needs root";
  const RunOutput run = train_tiny(0, dir + "/run", {"--ckpt.save_final", "true", "--train.steps", "4"});
  expect_clean_failure(run, "final_model.h5.tmp");
  EXPECT_FALSE(dstrain::files::exists(dir + "/run/final_model.h5.tmp")) << "the partial file stayed";
}

// `dstrain prep` onto a full disk: the data error names the file and says the disk is full (HDF5's
// message alone said only "can't write data"), and no corpus, whole or partial, stays.
TEST(FullDisk, APrepThatDoesNotFitSaysTheDiskIsFull) {
  const std::string dir = scratch_dir("full-disk-prep");
  TinyFileSystem disk(dir, 80);
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (" << disk.why() << "); needs root";
  std::vector<std::string> args = {"prep", "--output", dir + "/corpus.h5", "--valid-fraction", "0", "--input"};
  for (const char* name : {"GPL-2", "GPL-3", "LGPL-2.1", "Apache-2.0"})  // ~110k tokens of 2 bytes
    args.push_back(std::string("/usr/share/common-licenses/") + name);
  const RunOutput run = run_dstrain(0, args);
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_NE(run.output.find(dir + "/corpus.h5"), std::string::npos) << run.output;  // the file it was writing
  EXPECT_NE(run.output.find("No space left on device: the file system of " + dir), std::string::npos) << run.output;
  for (const std::string& name : dstrain::files::directory_entries(dir))
    EXPECT_TRUE(name == "." || name == "..") << "a file stayed: " << name;
}

// A checkpoint directory on a read-only file system: refused at the start (exit 2), not at the
// first save, after an interval of steps that would then be lost.
TEST(FullDisk, AReadOnlyCheckpointDirectoryIsRefusedBeforeAnyStep) {
  const std::string dir = scratch_dir("read-only-checkpoints");
  TinyFileSystem disk(dir, 80, MS_RDONLY);
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (" << disk.why() << "); needs root";
  const RunOutput run = train_tiny(0, scratch_dir("read-only-checkpoints-run"),
                                   {"--ckpt.dir", dir, "--ckpt.interval", "2", "--train.steps", "4"});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("ckpt.dir = " + dir + ": cannot write in this directory (Read-only file system)"),
            std::string::npos)
      << run.output;
  EXPECT_EQ(run.output.find("step 1/4"), std::string::npos) << run.output;
}

// The same with several ranks, where every rank writes its share of one file through MPI-IO: the
// error, exit code 4, and no partial file, for data and pipeline parallelism, ZeRO-1 and the final
// model. Where the disk fills while HDF5 creates the file collectively, the ranks can hang inside
// HDF5; they then end after the communication timeout, with the same code, the file removed.
class FullDiskRanks : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(FullDiskRanks, AWriteThatDoesNotFitEndsEveryRankCleanly) {
  // A directory per layout: ctest runs them side by side.
  std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::replace(name.begin(), name.end(), '/', '-');
  const std::string dir = scratch_dir("full-disk-ranks-" + name);
  TinyFileSystem disk(dir, 80);
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (" << disk.why() << "); needs root";
  std::vector<std::string> args = {"--train.steps", "6", "--comm.timeout_s", "10"};
  args.insert(args.end(), GetParam().begin(), GetParam().end());
  const bool final_model = GetParam().back() == "--ckpt.save_final";
  if (final_model) args.push_back("true");
  test_corpus();  // made before the clock starts: the bound is the run's
  const auto started = std::chrono::steady_clock::now();
  const RunOutput run = train_tiny(2, dir + "/run", args);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  expect_clean_failure(run, final_model ? "final_model.h5.tmp" : "step_00000002.h5.tmp");
  // Bounded by comm.timeout_s, with room for a start-up and steps beside the rest of the suite:
  // a hang inside HDF5 would last until ctest's own timeout.
  EXPECT_LT(seconds, 10 + 60) << "beyond comm.timeout_s:\n" << run.output;
  for (const std::string& name : dstrain::files::directory_entries(dir + "/run/checkpoints"))
    EXPECT_TRUE(name == "." || name == "..") << "a partial file stayed: " << name;
  EXPECT_FALSE(dstrain::files::exists(dir + "/run/final_model.h5.tmp")) << "the partial file stayed";
}

INSTANTIATE_TEST_SUITE_P(Layouts, FullDiskRanks,
                         ::testing::Values(std::vector<std::string>{"--ckpt.interval", "2"},
                                           std::vector<std::string>{"--ckpt.interval", "2", "--parallel.pp", "2"},
                                           std::vector<std::string>{"--ckpt.interval", "2", "--optim.zero", "1"},
                                           std::vector<std::string>{"--ckpt.interval", "0", "--ckpt.save_final"}));

// import-hf onto a full disk: its error, exit code 4, no partial output (it used to print its
// error and then crash in HDF5's clean-up at exit).
TEST(FullDisk, AnImportThatDoesNotFitEndsCleanly) {
  const std::string dir = scratch_dir("full-disk-import");
  const RunOutput trained = train_tiny(0, dir + "/run", {"--ckpt.save_final", "true", "--train.steps", "2"});
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const RunOutput exported =
      run_dstrain(0, {"ckpt", "export-hf", dir + "/run/final_model.h5", "--output", dir + "/hf"});
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  std::string why;
  ASSERT_TRUE(dstrain::files::make_directories(dir + "/full", &why)) << why;
  TinyFileSystem disk(dir + "/full", 80);
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (" << disk.why() << "); needs root";
  const RunOutput run = run_dstrain(0, {"ckpt", "import-hf", dir + "/hf", "--output", dir + "/full/imported.h5"});
  expect_clean_failure(run, "imported.h5");
  EXPECT_NE(run.output.find("No space left on device"), std::string::npos) << run.output;
  for (const std::string& name : dstrain::files::directory_entries(dir + "/full"))
    EXPECT_TRUE(name == "." || name == "..") << "a partial file stayed: " << name;
}
