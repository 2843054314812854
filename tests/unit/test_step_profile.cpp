// The step profile's tables from events made up here, whose attribution is worked out by hand:
// self times from the nesting, parts from the scopes, backward nodes through their sequence
// numbers, device kernels through the operation that launched them, NCCL's as communication.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dstrain/report/step_profile.h"

using namespace dstrain;

namespace {

ProfiledEvent host(const std::string& name, uint64_t thread, uint64_t start, uint64_t duration, uint64_t correlation,
                   int64_t sequence = -1, uint64_t forward_thread = 0) {
  ProfiledEvent e;
  e.name = name;
  e.thread = thread;
  e.start_us = start;
  e.duration_us = duration;
  e.correlation = correlation;
  e.sequence = sequence;
  e.forward_thread = forward_thread;
  return e;
}

ProfiledEvent kernel(const std::string& name, uint64_t start, uint64_t duration, uint64_t launched_by) {
  ProfiledEvent e = host(name, 7, start, duration, 0);
  e.on_device = true;
  e.launched_by = launched_by;
  return e;
}

// Thread 1 runs the forward pass: a product inside the attention's scope, a relu outside any;
// thread 2 the backward pass: the product's backward node (its wrapper and the node), with a
// product inside it.
std::vector<ProfiledEvent> host_events() {
  return {host("dstrain::attention", 1, 0, 100, 1),
          host("aten::mm", 1, 10, 50, 2, /*sequence=*/5),
          host("aten::resolve_conj", 1, 10, 2, 3),
          host("aten::relu", 1, 100, 20, 4, /*sequence=*/6),
          host("autograd::engine::evaluate_function: MmBackward0", 2, 200, 80, 5, 5, /*forward_thread=*/1),
          host("MmBackward0", 2, 201, 78, 6, 5, 1),
          host("aten::mm", 2, 210, 40, 7)};
}

double part_time(const StepProfile& profile, const std::string& name) {
  for (const ProfileRow& row : profile.parts)
    if (row.name == name) return row.microseconds;
  return -1;
}

}  // namespace

TEST(StepProfile, HostSelfTimeGoesToTheScopeAroundItAndBackwardNodesToTheirForwardOperations) {
  const StepProfile profile = tabulate_step_profile(host_events(), 2);
  EXPECT_FALSE(profile.device_time);
  // attention: its scope's own 50, the product's 48 and resolve_conj's 2 forward; the backward
  // node's 2 + 38 and the product inside it 40. other: the relu's 20.
  EXPECT_DOUBLE_EQ(part_time(profile, "attention"), 180);
  EXPECT_DOUBLE_EQ(part_time(profile, "other"), 20);
  EXPECT_EQ(profile.parts.size(), 2u);
  EXPECT_DOUBLE_EQ(profile.total_microseconds, 200);
  ASSERT_FALSE(profile.kernels.empty());
  EXPECT_EQ(profile.kernels[0].name, "aten::mm");  // 48 + 40, the most
  EXPECT_EQ(profile.kernels[0].calls, 2);
  EXPECT_DOUBLE_EQ(profile.kernels[0].microseconds, 88);
}

TEST(StepProfile, DeviceKernelsTakeThePartOfTheOperationThatLaunchedThem) {
  std::vector<ProfiledEvent> events = host_events();
  events.push_back(kernel("gemm_forward", 20, 30, /*launched_by=*/2));      // the forward product
  events.push_back(kernel("gemm_backward", 220, 25, /*launched_by=*/7));    // the product in the backward node
  events.push_back(kernel("ncclDevKernel_AllReduce", 300, 7, /*launched_by=*/4));  // launched by the relu
  events.push_back(kernel("elementwise", 130, 5, /*launched_by=*/99));      // by nothing recorded
  const StepProfile profile = tabulate_step_profile(events, 1);
  EXPECT_TRUE(profile.device_time);
  EXPECT_DOUBLE_EQ(part_time(profile, "attention"), 55);
  EXPECT_DOUBLE_EQ(part_time(profile, "communication"), 7);
  EXPECT_DOUBLE_EQ(part_time(profile, "other"), 5);
  EXPECT_DOUBLE_EQ(profile.total_microseconds, 67);
  EXPECT_EQ(profile.kernels.size(), 4u);  // device events only
  EXPECT_EQ(profile.kernels[0].name, "gemm_forward");
}

TEST(StepProfile, TheTableGivesEachPartsTimeAStepAndItsShare) {
  const std::string table = step_profile_markdown(tabulate_step_profile(host_events(), 2), 1);
  EXPECT_NE(table.find("host self time, 0.100000 ms a step"), std::string::npos) << table;
  EXPECT_NE(table.find("| attention | 0.090 | 90.0% |"), std::string::npos) << table;
  EXPECT_NE(table.find("| other | 0.010 | 10.0% |"), std::string::npos) << table;
  EXPECT_NE(table.find("| aten::mm | 1.0 | 0.044 | 44.0% |"), std::string::npos) << table;
  EXPECT_EQ(table.find("relu"), std::string::npos) << table;  // one kernel row asked for
}

TEST(StepProfile, TheChromeTraceHasAnEventForEachAndNamesTheProcesses) {
  std::vector<ProfiledEvent> events = host_events();
  events.push_back(kernel("gemm_forward", 20, 30, 2));
  const nlohmann::json trace = chrome_trace(events, 3);
  const nlohmann::json& list = trace["traceEvents"];
  ASSERT_EQ(list.size(), events.size() + 2);
  EXPECT_EQ(list[0]["args"]["name"], "rank 3 host");
  EXPECT_EQ(list[1]["args"]["name"], "rank 3 device");
  EXPECT_EQ(list[2]["name"], "dstrain::attention");
  EXPECT_EQ(list[2]["ph"], "X");
  EXPECT_EQ(list[2]["pid"], 6);
  EXPECT_EQ(list.back()["pid"], 7);
  EXPECT_EQ(list.back()["dur"], 30);
}
