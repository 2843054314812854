#include "dstrain/train/signals.h"

#include <csignal>

namespace dstrain::signals {
namespace {

volatile std::sig_atomic_t g_signal = 0;

extern "C" void note_signal(int number) {
  g_signal = number;
  // A second Ctrl-C ends the process at once, as it would without a handler.
  if (number == SIGINT) std::signal(SIGINT, SIG_DFL);
}

}  // namespace

void install() {
  std::signal(SIGTERM, note_signal);
  std::signal(SIGUSR1, note_signal);
  std::signal(SIGINT, note_signal);
}

bool stop_requested() { return g_signal != 0; }

const char* requested_by() {
  switch (g_signal) {
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGINT: return "SIGINT";
    default: return "";
  }
}

}  // namespace dstrain::signals
