// Errors that reach the user, each with the process exit code it maps to. The codes are a stable
// contract (docs/troubleshooting.md, "Exit codes"): job scripts decide from them whether to requeue.
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
  kOutOfMemory = 7,    // the configuration does not fit in host or device memory
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

// Any exception as the Error it amounts to: an Error itself; a failed host or device allocation
// an out-of-memory error that says how to need less; anything else an internal error. LibTorch's
// messages lose their C++ backtrace.
Error as_error(const std::exception& e);

}  // namespace dstrain
