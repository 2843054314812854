#include "dstrain/core/error.h"

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
    case ExitCode::kRequeue: return "checkpointed on signal, requeue";
  }
  return "unknown";
}

Error config_error(const std::string& key, const std::string& value, const std::string& expected) {
  return Error(ExitCode::kUsage, key + " = " + (value.empty() ? "\"\"" : value) + ": " + expected);
}

Error data_error(const std::string& message) { return Error(ExitCode::kData, message); }

Error comm_error(const std::string& message) { return Error(ExitCode::kCommunication, message); }

}  // namespace dstrain
