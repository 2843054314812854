// Open MPI moves a nonblocking collective or send on only inside MPI calls, so a gradient bucket
// started early makes no headway while the rank computes its backward pass, which calls no MPI.
// The progress thread calls MPI every few tens of microseconds while one of the operations it
// watches is under way, so that they go on beside the computation, as PyTorch's gloo and NCCL
// backends do on threads of their own. It needs MPI_THREAD_MULTIPLE (MpiSession asks for it);
// where the library gives less, or comm.progress_thread is off, operations move only when their
// owner asks (GradientBuffer polls at every gradient's arrival), as before.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

namespace dstrain::mpi_progress {

// Starts the thread when `enabled` and the MPI library provides MPI_THREAD_MULTIPLE; stops it
// otherwise. From the thread that initialised MPI; stop() before MPI_Finalize.
void configure(bool enabled);
void stop();
bool running();

// One nonblocking operation, kept moving by the thread while it runs. Its request is tested only
// through test(), which the thread's tests never overlap.
class Watched {
 public:
  explicit Watched(MPI_Request request);
  ~Watched();
  Watched(const Watched&) = delete;
  Watched& operator=(const Watched&) = delete;

  // Whether the operation has completed (tests it; throws comm_error if MPI reports a failure).
  bool test();
  // Whether a test (the thread's or test()) has seen it complete; calls no MPI.
  bool seen_complete() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace dstrain::mpi_progress
