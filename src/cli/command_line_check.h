// A multi-rank command reads its command line before MPI starts (part of it says how MPI starts:
// comm.timeout_s bounds the start). Every rank reads the same line, and each would print the same
// mistake. So the failure is kept, MPI starts all the same, and the ranks agree on it
// (agreed_phase): the lowest rank that failed prints it, once, as any other start-up failure.
#pragma once

#include <exception>
#include <optional>

#include "dstrain/core/error.h"
#include "dstrain/parallel/agreed_phase.h"

namespace dstrain {

class CommandLineCheck {
 public:
  // Runs `read`, keeping what it throws.
  template <typename Read>
  explicit CommandLineCheck(Read&& read) {
    try {
      read();
    } catch (const std::exception& e) {
      failure_ = as_error(e);
    }
  }
  bool failed() const { return failure_.has_value(); }
  // Once MPI runs, on every rank: throws the failure on the rank that reports it, an Error without
  // a message (printed by another rank) on the others, and nothing when every rank read its line.
  void agree(int world_rank) const {
    agreed_phase(world_rank, [&] {
      if (failure_) throw *failure_;
    });
  }

 private:
  std::optional<Error> failure_;
};

}  // namespace dstrain
