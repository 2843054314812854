// The bound on phases that cannot be left by an exception (parallel/deadline.h), in a child process
// that really blocks: it ends with the phase's exit code and message, and removes the partial
// file it was asked to; a phase that finishes in time is left alone.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "dstrain/core/files.h"
#include "dstrain/parallel/deadline.h"
#include "test_util.h"

using namespace dstrain;

namespace {

// Runs `body` in a child process; returns its exit status.
template <typename Body>
int in_child(Body body) {
  const pid_t child = fork();
  if (child == 0) {
    body();
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST(Deadline, AnExpiredPhaseEndsWithItsCodeAndRemovesItsPartialFile) {
  test::TempDir dir;
  const std::string partial = dir.path("step_00000002.h5.tmp");
  std::ofstream(partial) << "half a checkpoint";
  const int code = in_child([&] {
    Deadline deadline("a collective creation", 0.2, "a rank stopped", ExitCode::kCheckpoint);
    deadline.remove_on_expiry(partial);
    std::this_thread::sleep_for(std::chrono::seconds(10));  // blocked, as inside MPI
  });
  EXPECT_EQ(code, static_cast<int>(ExitCode::kCheckpoint));
  EXPECT_FALSE(files::exists(partial));
}

TEST(Deadline, APhaseThatFinishesInTimeKeepsItsFile) {
  test::TempDir dir;
  const std::string kept = dir.path("step_00000002.h5.tmp");
  std::ofstream(kept) << "a checkpoint in the making";
  const int code = in_child([&] {
    Deadline deadline("a collective creation", 5, "a rank stopped", ExitCode::kCheckpoint);
    deadline.remove_on_expiry(kept);
  });
  EXPECT_EQ(code, 0);
  EXPECT_TRUE(files::exists(kept));
}
