#include <gtest/gtest.h>

#include <fstream>
#include <new>

#include "dstrain/core/error.h"
#include "dstrain/core/torch_api.h"

using namespace dstrain;

namespace {

// What the code under test would have caught from `action`.
template <typename Action>
Error translated(Action&& action) {
  try {
    action();
  } catch (const std::exception& e) {
    return as_error(e);
  }
  ADD_FAILURE() << "nothing was thrown";
  return Error(ExitCode::kSuccess, "");
}

}  // namespace

TEST(Errors, OwnErrorsKeepTheirCodeAndMessage) {
  Error error = translated([] { throw config_error("train.steps", "-1", "must be positive"); });
  EXPECT_EQ(error.code(), ExitCode::kUsage);
  EXPECT_STREQ(error.what(), "train.steps = -1: must be positive");
}

TEST(Errors, LibTorchFailuresAreInternalErrorsWithoutTheirBacktrace) {
  Error error = translated([] { torch::ones({2}).view({3}); });
  EXPECT_EQ(error.code(), ExitCode::kInternal);
  const std::string what = error.what();
  EXPECT_EQ(what.rfind("internal error: ", 0), 0u) << what;
  EXPECT_NE(what.find("shape '[3]' is invalid"), std::string::npos) << what;
  EXPECT_EQ(what.find("frame #"), std::string::npos) << what;
  EXPECT_EQ(translated([] { throw std::logic_error("x"); }).code(), ExitCode::kInternal);
}

TEST(Errors, FailedAllocationsAreOutOfMemoryAndSayWhatToLower) {
  for (const Error& error : {translated([] { throw std::bad_alloc(); }),
                             translated([] { throw c10::OutOfMemoryError({__func__, __FILE__, __LINE__}, "CUDA out of memory."); })}) {
    EXPECT_EQ(error.code(), ExitCode::kOutOfMemory) << error.what();
    EXPECT_NE(std::string(error.what()).find("train.micro_batch"), std::string::npos) << error.what();
  }
  EXPECT_STREQ(exit_code_name(ExitCode::kOutOfMemory), "out of memory");
  std::ifstream overcommit("/proc/sys/vm/overcommit_memory");
  int mode = 0;
  if (overcommit >> mode && mode == 1) GTEST_SKIP() << "vm.overcommit_memory = 1: any host allocation succeeds";
  // A real one: 1 TiB from LibTorch's CPU allocator.
  Error host = translated([] { torch::empty({int64_t{1} << 40}, torch::kUInt8); });
  EXPECT_EQ(host.code(), ExitCode::kOutOfMemory) << host.what();
  EXPECT_EQ(std::string(host.what()).rfind("out of memory (DefaultCPUAllocator: ", 0), 0u) << host.what();
}
