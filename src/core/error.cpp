#include "dstrain/core/error.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <new>

namespace dstrain {

const char* exit_code_name(ExitCode code) {
  switch (code) {
    case ExitCode::kSuccess: return "success";
    case ExitCode::kInternal: return "internal error";
    case ExitCode::kUsage: return "usage or configuration error";
    case ExitCode::kData: return "data error";
    case ExitCode::kCheckpoint: return "checkpoint error";
    case ExitCode::kCommunication: return "communication failure";
    case ExitCode::kNumerical: return "non-finite loss or gradient";
    case ExitCode::kOutOfMemory: return "out of memory";
    case ExitCode::kRequeue: return "checkpointed on signal, requeue";
  }
  return "unknown";
}

Error config_error(const std::string& key, const std::string& value, const std::string& expected) {
  return Error(ExitCode::kUsage, key + " = " + (value.empty() ? "\"\"" : value) + ": " + expected);
}

Error data_error(const std::string& message) { return Error(ExitCode::kData, message); }

Error comm_error(const std::string& message) { return Error(ExitCode::kCommunication, message); }

Error as_error(const std::exception& e) {
  if (const auto* error = dynamic_cast<const Error*>(&e)) return *error;
  const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
  std::string what = torch_error ? torch_error->what_without_backtrace() : e.what();
  // The CUDA allocator throws OutOfMemoryError; the CPU allocator a plain c10::Error saying so
  // ("can't allocate memory" in LibTorch 1.13, "not enough memory" in 2.x) after the location
  // of the check that failed.
  const size_t host = std::min(what.find("DefaultCPUAllocator: can't allocate memory"),
                               what.find("DefaultCPUAllocator: not enough memory"));
  const bool out_of_memory =
      dynamic_cast<const std::bad_alloc*>(&e) || dynamic_cast<const c10::OutOfMemoryError*>(&e) || host != std::string::npos;
  if (!out_of_memory) return Error(ExitCode::kInternal, "internal error: " + what);
  if (host != std::string::npos) what.erase(0, host);
  if (const size_t end = what.find('\n'); end != std::string::npos) what.resize(end);
  return Error(ExitCode::kOutOfMemory,
               "out of memory (" + what +
                   "): this configuration does not fit; lower train.micro_batch (raising train.grad_accum keeps the "
                   "batch), spread the layers over more pipeline stages (parallel.pp), or shard the optimizer state "
                   "(optim.zero = 1)");
}

}  // namespace dstrain
