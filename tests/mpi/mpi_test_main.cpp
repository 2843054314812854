// GoogleTest under mpirun: every rank runs every test; only rank 0 prints the report. The exit code
// is the same on every rank: 1 when any rank failed a test; kAllSkipped (ctest's SKIP_RETURN_CODE)
// when no rank failed and none passed one; 0 otherwise.
//
// ctest runs each test on its own (tests/CMakeLists.txt), so that one that cannot run on so many
// ranks, or on this backend, shows in ctest's summary as skipped, not as part of a run that passed.
// Started directly with --mpi-ranks=N (how ctest runs each), the program starts itself again on N
// ranks under mpiexec with the same arguments; started without it (ctest's discovery of the tests,
// --gtest_list_tests) it is one rank. --test-backend=mpi|mpi-cuda|nccl chooses the communicators'
// backend (test_communicator.cpp), as DSTRAIN_TEST_BACKEND does.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

constexpr int kAllSkipped = 77;

// Whether a launcher started this process (Open MPI's, or any PMIx one's).
bool launched_by_mpi() { return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK"); }

// The value of --NAME=VALUE among the arguments, or "".
std::string flag(int argc, char** argv, const std::string& name) {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]).rfind(prefix, 0) == 0) return argv[i] + prefix.size();
  return "";
}

// --mpi-ranks=N outside mpiexec: becomes `mpiexec -np N --oversubscribe <this program> ARGS`, with
// what mpiexec needs to run as root (test machines and containers often do).
void relaunch_on_ranks(int argc, char** argv) {
  const std::string ranks = flag(argc, argv, "mpi-ranks");
  if (ranks.empty() || launched_by_mpi()) return;
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  std::vector<std::string> args = {MPIEXEC, "-np", ranks, "--oversubscribe", "/proc/self/exe"};
  char self[4096];
  const ssize_t length = readlink("/proc/self/exe", self, sizeof self - 1);
  if (length > 0) args.back().assign(self, static_cast<size_t>(length));
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  std::vector<char*> exec_args;
  for (std::string& arg : args) exec_args.push_back(arg.data());
  exec_args.push_back(nullptr);
  execv(MPIEXEC, exec_args.data());
  std::perror("mpi tests: cannot start " MPIEXEC);
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  relaunch_on_ranks(argc, argv);
  const std::string backend = flag(argc, argv, "test-backend");
  if (!backend.empty()) setenv("DSTRAIN_TEST_BACKEND", backend.c_str(), 1);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);  // as dstrain asks (mpi_progress.h)
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  ::testing::UnitTest& tests = *::testing::UnitTest::GetInstance();
  if (rank != 0) delete tests.listeners().Release(tests.listeners().default_result_printer());
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  const int passed = tests.successful_test_count() > 0 ? 1 : 0;
  int any_failed = 0, any_passed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(&passed, &any_passed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  if (any_failed) return 1;
  return any_passed ? 0 : kAllSkipped;
}
