// What a person sees at the start and while training runs: the hardware and software report, the
// live progress line on a terminal, and plain lines only when the output is a file.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <regex>

#include "e2e_util.h"

using namespace dstrain::e2e;

namespace {

std::string command_output(const std::string& command) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  std::string output;
  char buffer[4096];
  size_t n;
  while (pipe && (n = fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, n);
  if (pipe) pclose(pipe);
  return output;
}

std::vector<std::string> train_args(const std::string& dir) {
  return {"train", "--config", std::string(DSTRAIN_SOURCE_DIR) + "/input/tiny.ini", "--run.dir", dir,
          "--data.train", test_corpus().train, "--train.device", "cpu", "--train.steps", "30",
          "--log.interval", "10"};
}

}  // namespace

TEST(Progress, TerminalGetsALiveLineAndFilesGetPlainLines) {
  const std::string dir = scratch_dir("progress");
  // A terminal: script(1) runs dstrain on a pseudo-terminal and passes on what it wrote.
  std::string command = std::string(DSTRAIN_EXE);
  for (const std::string& arg : train_args(dir)) command += " '" + arg + "'";
  const std::string on_terminal = command_output("TERM=xterm script -qefc \"" + command + "\" /dev/null");
  EXPECT_NE(on_terminal.find("\r\033[K"), std::string::npos) << on_terminal;
  EXPECT_TRUE(std::regex_search(on_terminal, std::regex(R"(\[#+-*\] +\d+/30 \| [\d,]+ tok/s \| ETA )"))) << on_terminal;
  EXPECT_NE(on_terminal.find("30/30"), std::string::npos) << on_terminal;
  // A file (as under Slurm): no control characters, a plain line every log.interval steps.
  RunOutput to_file = run_dstrain(0, train_args(dir));
  ASSERT_EQ(to_file.exit_code, 0) << to_file.output;
  EXPECT_EQ(to_file.output.find('\r'), std::string::npos) << to_file.output;
  EXPECT_EQ(to_file.output.find('\033'), std::string::npos) << to_file.output;
  for (const char* step : {"step 10/30", "step 20/30", "step 30/30"})
    EXPECT_NE(to_file.output.find(step), std::string::npos) << step << "\n" << to_file.output;
}

TEST(Progress, UnderMpirunTheLaunchersOutputDecides) {
  // Open MPI gives its ranks a pseudo-terminal even when mpirun writes to a pipe or a file.
  const std::string dir = scratch_dir("progress-mpirun");
  RunOutput to_pipe = run_dstrain(2, train_args(dir));
  ASSERT_EQ(to_pipe.exit_code, 0) << to_pipe.output;
  EXPECT_EQ(to_pipe.output.find('\033'), std::string::npos) << to_pipe.output;
  EXPECT_NE(to_pipe.output.find("step 30/30"), std::string::npos) << to_pipe.output;
  std::string command = std::string(MPIEXEC) + " -np 2 --oversubscribe " + DSTRAIN_EXE;
  for (const std::string& arg : train_args(dir)) command += " '" + arg + "'";
  const std::string on_terminal = command_output("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TERM=xterm "
                                                 "script -qefc \"" + command + "\" /dev/null");
  EXPECT_TRUE(std::regex_search(on_terminal, std::regex(R"(\[#+-*\] +\d+/30 \| [\d,]+ tok/s \| ETA )"))) << on_terminal;
}

TEST(Progress, StartupReportsHardwareAndLibraryVersions) {
  RunOutput run = run_dstrain(2, train_args(scratch_dir("report")));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  // Against what other tools say about this machine and these libraries.
  const std::string cores = command_output("grep -c ^processor /proc/cpuinfo");
  EXPECT_NE(run.output.find(", " + cores.substr(0, cores.find('\n')) + " cores, "), std::string::npos) << run.output;
  const std::string model = command_output("grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | cut -c2-");
  if (!model.empty()) EXPECT_NE(run.output.find(model.substr(0, model.find('\n'))), std::string::npos) << run.output;
  const std::string h5dump = command_output("h5dump --version");  // "h5dump: Version 1.10.8"
  std::smatch hdf5;
  ASSERT_TRUE(std::regex_search(h5dump, hdf5, std::regex(R"(Version ([0-9.]+))"))) << h5dump;
  EXPECT_NE(run.output.find("HDF5 " + hdf5[1].str()), std::string::npos) << run.output;
  const std::string ompi = command_output(std::string(MPIEXEC) + " --version");  // "mpirun (Open MPI) 4.1.4"
  std::smatch mpi;
  if (std::regex_search(ompi, mpi, std::regex(R"(Open MPI\) ([0-9.]+))")))
    EXPECT_NE(run.output.find("MPI Open MPI v" + mpi[1].str()), std::string::npos) << run.output;
  EXPECT_TRUE(std::regex_search(run.output, std::regex(R"(LibTorch \d+\.\d+)"))) << run.output;
  EXPECT_TRUE(std::regex_search(run.output, std::regex(R"(GiB memory)"))) << run.output;
  EXPECT_NE(run.output.find("NCCL "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("CUDA "), std::string::npos) << run.output;
  // Once, by rank 0.
  EXPECT_EQ(run.output.find("host "), run.output.rfind("host ")) << run.output;
}
