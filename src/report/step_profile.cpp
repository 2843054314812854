#include "dstrain/report/step_profile.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <unordered_map>
#include <utility>

#include "dstrain/core/profile_scope.h"

namespace dstrain {

namespace {

const char* kOtherPart = "other";
const char* kCommunicationPart = profile_part::kCommunication + std::strlen(kProfilePartPrefix);

bool is_part_label(const std::string& name) { return name.rfind(kProfilePartPrefix, 0) == 0; }

// Each host event's part and self time, from the nesting of the events on each thread.
struct HostAttribution {
  std::vector<std::string> part;                      // by index into the events
  std::vector<double> self_us;                        // by index into the events
  std::unordered_map<uint64_t, std::string> by_operation;  // a host operation's correlation → its part
};

HostAttribution attribute_host_events(const std::vector<ProfiledEvent>& events) {
  HostAttribution a;
  a.part.assign(events.size(), kOtherPart);
  a.self_us.assign(events.size(), 0.0);
  std::vector<size_t> order;
  for (size_t i = 0; i < events.size(); ++i)
    if (!events[i].on_device) order.push_back(i);
  // Outer events first where two start together: the longer contains the shorter.
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    const ProfiledEvent &a_event = events[x], &b_event = events[y];
    return a_event.start_us != b_event.start_us ? a_event.start_us < b_event.start_us
                                                : a_event.duration_us > b_event.duration_us;
  });
  auto end_of = [&](size_t i) { return events[i].start_us + events[i].duration_us; };
  std::unordered_map<uint64_t, std::vector<size_t>> open;  // by thread: the events around the current one
  std::map<std::pair<int64_t, uint64_t>, std::string> forward_part;  // (sequence, thread) → part
  for (size_t i : order) {
    const ProfiledEvent& e = events[i];
    std::vector<size_t>& around = open[e.thread];
    while (!around.empty() && end_of(around.back()) < end_of(i)) around.pop_back();
    std::string part = around.empty() ? kOtherPart : a.part[around.back()];  // the part around it, unless
    if (is_part_label(e.name)) {
      part = e.name.substr(std::strlen(kProfilePartPrefix));
    } else if (e.forward_thread != 0 && e.sequence >= 0) {  // a backward node: its forward operation's part
      const auto forward = forward_part.find({e.sequence, e.forward_thread});
      if (forward != forward_part.end()) part = forward->second;
    } else if (e.sequence >= 0) {
      forward_part.emplace(std::make_pair(e.sequence, e.thread), part);
    }
    a.part[i] = part;
    a.by_operation[e.correlation] = part;
    a.self_us[i] += static_cast<double>(e.duration_us);
    if (!around.empty()) a.self_us[around.back()] -= static_cast<double>(e.duration_us);
    around.push_back(i);
  }
  return a;
}

void add_to(std::map<std::string, ProfileRow>& rows, const std::string& name, double microseconds) {
  ProfileRow& row = rows[name];
  row.name = name;
  row.calls += 1;
  row.microseconds += std::max(0.0, microseconds);  // (a host event overlapping its parent's end)
}

std::vector<ProfileRow> most_first(const std::map<std::string, ProfileRow>& rows) {
  std::vector<ProfileRow> sorted;
  for (const auto& entry : rows) sorted.push_back(entry.second);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const ProfileRow& a, const ProfileRow& b) { return a.microseconds > b.microseconds; });
  return sorted;
}

}  // namespace

StepProfile tabulate_step_profile(const std::vector<ProfiledEvent>& events, int64_t steps) {
  StepProfile profile;
  profile.steps = steps;
  profile.device_time = std::any_of(events.begin(), events.end(), [](const ProfiledEvent& e) { return e.on_device; });
  const HostAttribution host = attribute_host_events(events);
  std::map<std::string, ProfileRow> kernels, parts;
  for (size_t i = 0; i < events.size(); ++i) {
    const ProfiledEvent& e = events[i];
    if (e.on_device != profile.device_time) continue;
    double microseconds = static_cast<double>(e.duration_us);
    std::string part = host.part[i];
    if (e.on_device) {
      const auto launcher = host.by_operation.find(e.launched_by);
      part = e.name.rfind("nccl", 0) == 0 ? kCommunicationPart
             : launcher != host.by_operation.end() ? launcher->second
                                                   : kOtherPart;
    } else {
      microseconds = host.self_us[i];
    }
    add_to(kernels, e.name, microseconds);
    add_to(parts, part, microseconds);
  }
  profile.kernels = most_first(kernels);
  profile.parts = most_first(parts);
  for (const ProfileRow& row : profile.parts) profile.total_microseconds += row.microseconds;
  return profile;
}

std::string step_profile_markdown(const StepProfile& profile, size_t kernel_rows) {
  const double steps = static_cast<double>(std::max<int64_t>(1, profile.steps));
  const double total = std::max(profile.total_microseconds, 1e-9);
  const std::string time = profile.device_time ? "GPU time" : "host self time";
  std::string text = "Profile of " + std::to_string(profile.steps) + " steps: " + time + ", " +
                     std::to_string(profile.total_microseconds / steps / 1e3) + " ms a step\n\n";
  char line[512];
  text += "| part | ms a step | share |\n|---|---:|---:|\n";
  for (const ProfileRow& row : profile.parts) {
    std::snprintf(line, sizeof line, "| %s | %.3f | %.1f%% |\n", row.name.c_str(), row.microseconds / steps / 1e3,
                  100 * row.microseconds / total);
    text += line;
  }
  text += "\n| " + std::string(profile.device_time ? "kernel" : "operation") +
          " | calls a step | ms a step | share |\n|---|---:|---:|---:|\n";
  for (size_t i = 0; i < std::min(kernel_rows, profile.kernels.size()); ++i) {
    const ProfileRow& row = profile.kernels[i];
    std::string name = row.name.size() > 120 ? row.name.substr(0, 117) + "..." : row.name;
    std::replace(name.begin(), name.end(), '|', '/');
    std::snprintf(line, sizeof line, "| %s | %.1f | %.3f | %.1f%% |\n", name.c_str(),
                  static_cast<double>(row.calls) / steps, row.microseconds / steps / 1e3,
                  100 * row.microseconds / total);
    text += line;
  }
  return text;
}

nlohmann::json chrome_trace(const std::vector<ProfiledEvent>& events, int rank) {
  const int host_process = 2 * rank, device_process = 2 * rank + 1;
  nlohmann::json trace = nlohmann::json::array();
  trace.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", host_process},
                   {"args", {{"name", "rank " + std::to_string(rank) + " host"}}}});
  trace.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", device_process},
                   {"args", {{"name", "rank " + std::to_string(rank) + " device"}}}});
  for (const ProfiledEvent& e : events)
    trace.push_back({{"name", e.name},
                     {"ph", "X"},
                     {"ts", e.start_us},
                     {"dur", e.duration_us},
                     {"pid", e.on_device ? device_process : host_process},
                     {"tid", e.thread}});
  return {{"traceEvents", trace}, {"displayTimeUnit", "ms"}};
}

}  // namespace dstrain
