// A log that nobody reads: dstrain's standard output and error go into a pipe that the test never
// reads, as when mpirun, once signalled, stops forwarding its ranks' output. Training goes on well
// past what the pipe holds, and SIGTERM still ends the run with a checkpoint (exit 75).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "e2e_util.h"

using namespace dstrain::e2e;

namespace {

int lines_in(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) ++lines;
  return lines;
}

// Polls `done` every 50 ms for up to `seconds` (a bound against a hang, not a speed).
template <typename Done>
bool within(double seconds, Done done) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

}  // namespace

TEST(UnreadLog, NeitherTrainingNorItsStopWaitsForTheReader) {
  const std::string dir = scratch_dir("unread-log");
  const std::vector<std::string> args = {
      DSTRAIN_EXE, "train", "--config", std::string(DSTRAIN_SOURCE_DIR) + "/input/tiny.ini", "--run.dir", dir,
      "--data.train", test_corpus().train, "--train.device", "cpu", "--train.steps", "1000000", "--log.interval", "1",
      "--train.eval_interval", "0", "--ckpt.interval", "0"};
  int pipe_ends[2];
  ASSERT_EQ(pipe(pipe_ends), 0);
  const int pipe_bytes = fcntl(pipe_ends[1], F_SETPIPE_SZ, 4096);  // the smallest: full after a few lines
  ASSERT_GT(pipe_bytes, 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    dup2(pipe_ends[1], STDOUT_FILENO);
    dup2(pipe_ends[1], STDERR_FILENO);
    close(pipe_ends[0]);
    close(pipe_ends[1]);
    std::vector<char*> argv;
    for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(pipe_ends[1]);
  auto held = [&] {
    int bytes = 0;
    return ioctl(pipe_ends[0], FIONREAD, &bytes) == 0 ? bytes : -1;
  };
  const std::string metrics = dir + "/metrics.jsonl";
  int status = 0;
  auto ended = [&] { return waitpid(child, &status, WNOHANG) == child; };

  // 200 steps log a line each to standard output (and to metrics.jsonl): several times what the
  // pipe holds, unread.
  const bool went_on = within(300, [&] { return lines_in(metrics) >= 200; });
  EXPECT_TRUE(went_on) << "training stopped at step " << lines_in(metrics) << " once its output was not read";
  EXPECT_GT(held(), 0) << "someone read the pipe";

  // SIGTERM: the checkpoint and the exit, with the output still unread.
  ASSERT_EQ(kill(child, SIGTERM), 0);
  const bool stopped = within(300, ended);
  if (!stopped) {
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
  }
  close(pipe_ends[0]);
  ASSERT_TRUE(stopped) << "the run did not end after SIGTERM";
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 75);
  std::ifstream latest(dir + "/checkpoints/latest");
  std::string name;
  EXPECT_TRUE(std::getline(latest, name) && name.rfind("step_", 0) == 0) << "no checkpoint after SIGTERM";
}
