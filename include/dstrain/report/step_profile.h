// What a profile of training steps says (`dstrain bench step --bench.profile`, debug.profile):
// where the time went, by kernel and by part of the model, from the events LibTorch's profiler
// recorded, and those events as a Chrome trace (chrome://tracing, Perfetto).
//
// Time is the device's when there are device events (GPU kernels, copies): what the GPU spent,
// each kernel attributed to the operation that launched it. Without them (the CPU) it is each
// operation's self time: its duration less that of the operations inside it on its thread.
// A part is the innermost ProfileScope (core/profile_scope.h) around an operation on its thread;
// a backward node takes the part of the forward operation with its sequence number, and the
// operations inside it follow. NCCL's kernels are communication whatever launched them; what no
// part covers is "other".
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace dstrain {

struct ProfiledEvent {
  std::string name;
  bool on_device = false;        // a GPU kernel, copy or set, on the device's own clock
  uint64_t thread = 0;           // the host thread (device events: the stream)
  uint64_t start_us = 0, duration_us = 0;
  uint64_t correlation = 0;      // a host operation's id
  uint64_t launched_by = 0;      // a device event's launching operation (its correlation); 0: none
  int64_t sequence = -1;         // the autograd sequence number; -1: none
  uint64_t forward_thread = 0;   // a backward node's forward thread; 0: not a backward node
};

struct ProfileRow {
  std::string name;
  int64_t calls = 0;
  double microseconds = 0;
};

struct StepProfile {
  bool device_time = false;        // the device's time, else the host's self time
  int64_t steps = 0;               // how many steps the events cover
  double total_microseconds = 0;   // over all rows, all steps
  std::vector<ProfileRow> kernels; // by kernel or operation name, most time first
  std::vector<ProfileRow> parts;   // by part of the model, most time first
};

StepProfile tabulate_step_profile(const std::vector<ProfiledEvent>& events, int64_t steps);

// Markdown: the parts, then the `kernel_rows` kernels that took the most time, each with its
// time a step, its share and its calls.
std::string step_profile_markdown(const StepProfile& profile, size_t kernel_rows);

// The Chrome trace format's object: one complete ("X") event each, the host's threads and the
// device's streams as its threads.
nlohmann::json chrome_trace(const std::vector<ProfiledEvent>& events, int rank);

}  // namespace dstrain
