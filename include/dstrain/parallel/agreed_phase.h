// A phase of a start-up in which any rank may fail on its own (reading a file that only some
// ranks see, say): afterwards every rank knows whether all succeeded, so that none waits in a
// collective for a rank that has given up, and only the lowest failing rank reports (one
// message, not one per rank). The start-up of every multi-rank command goes through it. A phase
// that contains collectives must fail on all ranks alike, or not at all.
#pragma once

#include <exception>
#include <optional>

#include "dstrain/core/error.h"
#include "dstrain/parallel/parallel_context.h"

namespace dstrain {

template <typename Phase>
void agreed_phase(int world_rank, Phase&& phase) {
  std::optional<Error> failure;
  try {
    phase();
  } catch (const std::exception& e) {
    failure = as_error(e);
  }
  const FailureAgreement agreement =
      agree_on_failure(failure ? static_cast<int>(failure->code()) : 0, failure && failure->what()[0] != '\0');
  if (agreement.exit_code == 0) return;
  if (agreement.reporter == world_rank) throw *failure;
  throw Error(static_cast<ExitCode>(agreement.exit_code), "");  // reported by another rank
}

}  // namespace dstrain
