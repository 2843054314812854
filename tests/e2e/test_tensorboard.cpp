// TensorBoard event files of real runs, decoded by tests/tools/read_tfevents.py (standard-library
// Python with its own CRC-32C and protobuf decoder) and compared with metrics.jsonl.
#include <gtest/gtest.h>
#include <dirent.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "dstrain/report/tensorboard.h"
#include "e2e_util.h"

using namespace dstrain::e2e;

namespace {

std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> found;
  DIR* d = opendir(dir.c_str());
  if (!d) return found;
  while (dirent* entry = readdir(d))
    if (std::string(entry->d_name).rfind("events.out.tfevents.", 0) == 0) found.push_back(dir + "/" + entry->d_name);
  closedir(d);
  std::sort(found.begin(), found.end());
  return found;
}

// Every event of the files, decoded by the independent reader.
std::vector<nlohmann::json> decode(const std::vector<std::string>& files) {
  std::string command = std::string(PYTHON3) + " " + DSTRAIN_SOURCE_DIR + "/tests/tools/read_tfevents.py";
  for (const std::string& f : files) command += " '" + f + "'";
  command += " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, n);
  EXPECT_EQ(pclose(pipe), 0) << output;
  std::vector<nlohmann::json> events;
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) events.push_back(nlohmann::json::parse(line));
  return events;
}

// Each metrics record is one event at its step, with every number under its tag, as a float.
void expect_events_match_records(const std::vector<nlohmann::json>& events, const std::vector<nlohmann::json>& records) {
  ASSERT_EQ(events.size(), records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    const nlohmann::json& record = records[i];
    const nlohmann::json& event = events[i];
    EXPECT_EQ(event["step"], record["step"]) << "record " << i;
    size_t numbers = 0;
    auto expect_scalar = [&](const std::string& tag, const nlohmann::json& value) {
      ++numbers;
      ASSERT_TRUE(event["scalars"].contains(tag)) << tag << " missing at step " << record["step"];
      EXPECT_EQ(event["scalars"][tag].get<double>(), static_cast<double>(value.get<float>()))
          << tag << " at step " << record["step"];
    };
    for (const auto& [key, value] : record.items()) {
      if (key == "step") continue;
      if (value.is_number()) expect_scalar(dstrain::tensorboard_tag(key), value);
      if (value.is_object())  // per layer
        for (const auto& [layer, number] : value.items())
          expect_scalar(dstrain::tensorboard_tag(key) + "/layer_" + layer, number);
    }
    EXPECT_EQ(event["scalars"].size(), numbers) << "record " << i;
  }
}

}  // namespace

TEST(TensorBoard, EventFileDecodesToTheLoggedValues) {
  const std::string dir = scratch_dir("tensorboard-pp2");
  RunOutput run = train_tiny(2, dir, {"--train.device", "cpu", "--parallel.pp", "2"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::vector<std::string> files = event_files(dir);
  ASSERT_EQ(files.size(), 1u);
  std::vector<nlohmann::json> events = decode(files);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0]["file_version"], "brain.Event:2");
  EXPECT_GT(events[0]["wall_time"].get<double>(), 1.5e9);  // seconds since 1970, not since start
  events.erase(events.begin());
  const std::vector<nlohmann::json> records = read_jsonl(dir + "/metrics.jsonl");
  ASSERT_EQ(records.size(), 22u);  // 20 steps and 2 evaluations
  expect_events_match_records(events, records);
  // What a person looks for is there: the pipeline's idle share and the evaluation.
  EXPECT_TRUE(events[0]["scalars"].contains("perf/pipeline_idle"));
  EXPECT_TRUE(events.back()["scalars"].contains("eval/loss"));
}

TEST(TensorBoard, ResumedRunMarksTheRestartInANewFile) {
  const std::string dir = scratch_dir("tensorboard-resume");
  ASSERT_EQ(train_tiny(1, dir, {"--train.device", "cpu", "--train.steps", "10", "--optim.decay_steps", "20",
                                "--ckpt.interval", "5"}).exit_code, 0);
  RunOutput second = train_tiny(1, dir, {"--train.device", "cpu", "--train.steps", "20", "--optim.decay_steps", "20",
                                         "--ckpt.interval", "5"});
  ASSERT_EQ(second.exit_code, 0) << second.output;
  const std::vector<std::string> files = event_files(dir);
  ASSERT_EQ(files.size(), 2u);
  // The second file: its version, a SessionLog START at step 11, then steps 11 to 20.
  std::vector<nlohmann::json> events = decode({files[1]});
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events[1]["session_log_status"], 1);
  EXPECT_EQ(events[1]["step"], 11);
  events.erase(events.begin(), events.begin() + 2);
  std::vector<nlohmann::json> later;
  for (const nlohmann::json& r : read_jsonl(dir + "/metrics.jsonl"))
    if (r["step"].get<int>() > 10) later.push_back(r);
  expect_events_match_records(events, later);
}

// An MoE model's per-layer expert balance: one scalar per MoE layer.
TEST(TensorBoard, MoeExpertLoadPerLayer) {
  const std::string dir = scratch_dir("tensorboard-moe");
  RunOutput run = run_dstrain(1, {"train", "--config", std::string(DSTRAIN_SOURCE_DIR) + "/input/tiny-v3.ini", "--run.dir",
                                  dir, "--data.train", test_corpus().train, "--train.device", "cpu", "--train.steps", "4"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::vector<nlohmann::json> events = decode(event_files(dir));
  ASSERT_FALSE(events.empty());
  events.erase(events.begin());  // the file_version record
  expect_events_match_records(events, read_jsonl(dir + "/metrics.jsonl"));
  ASSERT_EQ(events.size(), 4u);
  EXPECT_TRUE(events.back()["scalars"].contains("moe/expert_load_max_over_mean/layer_2"));
}
