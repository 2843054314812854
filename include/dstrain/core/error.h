// Errors that reach the user, each with the process exit code it maps to. The codes are a stable
// contract (README, "Exit codes"): job scripts decide from them whether to requeue.
#pragma once

#include <stdexcept>
#include <string>

namespace dstrain {

enum class ExitCode : int {
  kSuccess = 0,
  kInternal = 1,       // a bug or an unexpected library failure
  kUsage = 2,          // bad command line or configuration
  kData = 3,           // unreadable or invalid corpus / input text
  kCheckpoint = 4,     // unreadable, corrupt or incompatible checkpoint
  kCommunication = 5,  // MPI/NCCL failure or timeout
  kNumerical = 6,      // training stopped on a non-finite loss or gradient
  kRequeue = 75,       // checkpointed on a signal: resubmit me (EX_TEMPFAIL)
};

const char* exit_code_name(ExitCode code);

// An error meant for a person: the message names the file, key or option and what was expected.
class Error : public std::runtime_error {
 public:
  Error(ExitCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ExitCode code() const { return code_; }

 private:
  ExitCode code_;
};

// "train.micro_batch = 3: must divide ..." — the shape every configuration error takes.
Error config_error(const std::string& key, const std::string& value, const std::string& expected);
Error data_error(const std::string& message);
Error comm_error(const std::string& message);

}  // namespace dstrain
