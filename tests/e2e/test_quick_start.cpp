// README.md's quick start, run as it is written and in its order, so that the page cannot drift
// from the program. The demo is shortened 50 times (its steps and intervals) and runs in a copy of
// the checkout's scripts and inputs in a scratch directory, so that nothing is written into the
// source tree; everything else is the README's text.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <regex>

#include "dstrain/core/files.h"
#include "e2e_util.h"

using namespace dstrain::e2e;

namespace {

std::vector<std::string> quick_start_commands() {
  std::ifstream in(std::string(DSTRAIN_SOURCE_DIR) + "/README.md");
  std::vector<std::string> commands;
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    if (line.find("<!-- BEGIN quick start commands -->") != std::string::npos) inside = true;
    else if (line.find("<!-- END quick start commands -->") != std::string::npos) inside = false;
    else if (inside && !line.empty()) commands.push_back(line.substr(line.find_first_not_of(' ')));
  }
  return commands;
}

// The README's command as this test runs it: this build's dstrain, the scratch run directory,
// and the demo 50 times shorter (input/demo.ini's 600 steps, or the command's own, / 50).
std::string shortened(std::string command, const std::string& dstrain, const std::string& run_dir) {
  command = std::regex_replace(command, std::regex("build/dstrain"), dstrain);
  command = std::regex_replace(command, std::regex("runs/demo"), run_dir);
  if (command.rfind("scripts/demo.sh", 0) != 0) return command;
  std::smatch steps;
  int64_t total = 600;
  if (std::regex_search(command, steps, std::regex("--train\\.steps (\\d+)"))) {
    total = std::stoll(steps[1]);
    command = std::regex_replace(command, std::regex("--train\\.steps \\d+"), "");
  }
  return command + " --train.steps " + std::to_string(total / 50) + " --run.dir " + run_dir +
         " --train.eval_interval 6 --ckpt.interval 6 --log.interval 6 --optim.warmup_steps 2";
}

// A checkout's scripts and inputs, copied into `dir`: where the README's commands run.
std::string copy_of_checkout(const std::string& dir) {
  const RunOutput copied =
      run_shell("cp -r '" + std::string(DSTRAIN_SOURCE_DIR) + "/scripts' '" + std::string(DSTRAIN_SOURCE_DIR) +
                "/input' '" + dir + "'");
  EXPECT_EQ(copied.exit_code, 0) << copied.output;
  return dir;
}

// DSTRAIN: the demo runs this build's executable and builds nothing (a test must not rebuild the
// tree under the other tests' feet).
RunOutput run_in(const std::string& checkout, const std::string& command, const std::string& dstrain) {
  return run_shell("cd '" + checkout + "' && DSTRAIN='" + dstrain + "' " + command);
}

}  // namespace

TEST(QuickStart, ReadmeCommandsRunInOrderOnTheDemosOutput) {
  const std::vector<std::string> commands = quick_start_commands();
  ASSERT_EQ(commands.size(), 5u) << "README.md's quick start commands changed: update this test's checks";
  const std::string dstrain = DSTRAIN_EXE;
  const std::string checkout = copy_of_checkout(scratch_dir("quick-start"));
  const std::string run_dir = checkout + "/runs/demo";
  // A corpus left by another dstrain, or made from other texts: the demo makes its own again.
  std::string why;
  ASSERT_TRUE(dstrain::files::make_directories(checkout + "/data", &why)) << why;
  for (const char* stale : {"/data/demo.h5", "/data/demo.valid.h5"}) std::ofstream(checkout + stale) << "stale";
  std::vector<RunOutput> outputs;
  for (const std::string& command : commands) {
    const std::string runnable = shortened(command, dstrain, run_dir);
    outputs.push_back(run_in(checkout, runnable, dstrain));
    ASSERT_EQ(outputs.back().exit_code, 0) << runnable << "\n" << outputs.back().output;
  }
  // The demo trained, saved, evaluated, generated, plotted and said what comes next.
  const std::string& demo = outputs[0].output;
  for (const char* part : {"done: 12 steps", "== the last checkpoint on the validation text ==", "perplexity",
                           "== what the model writes after", "wrote ", "Open:", "Next:"})
    EXPECT_NE(demo.find(part), std::string::npos) << part << "\n" << demo;
  EXPECT_TRUE(dstrain::files::exists(run_dir + "/checkpoints/step_00000012.h5"));
  // eval, generate (greedy: the prompt, then its continuation) and plot on what it left.
  EXPECT_NE(outputs[1].output.find("step_00000012.h5 (step 12)"), std::string::npos) << outputs[1].output;
  EXPECT_EQ(outputs[2].output.rfind("The licensee", 0), 0u) << outputs[2].output;
  for (const char* plot : {"/loss.png", "/lr.png", "/throughput.png"})
    EXPECT_TRUE(dstrain::files::exists(run_dir + plot)) << plot;
  // The second demo continues the first run from its checkpoint.
  EXPECT_NE(outputs[4].output.find("resuming from"), std::string::npos) << outputs[4].output;
  EXPECT_TRUE(dstrain::files::exists(run_dir + "/checkpoints/step_00000024.h5"));
}
