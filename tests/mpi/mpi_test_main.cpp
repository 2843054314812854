// GoogleTest under mpirun: every rank runs every test; only rank 0 prints the report. The exit code
// is the same on every rank: 1 when any rank failed a test; kAllSkipped (ctest's SKIP_RETURN_CODE)
// when no rank failed and none passed one, so that a backend this machine cannot run shows as
// skipped; 0 otherwise. A skip inside a run that also failed or passed tests never hides either:
// ctest reports the run by its failures and passes, and the output lists the skipped tests.
#include <gtest/gtest.h>
#include <mpi.h>

namespace {
constexpr int kAllSkipped = 77;
}

int main(int argc, char** argv) {
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
