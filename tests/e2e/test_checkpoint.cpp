// Checkpoints and restarts with real processes: ranks killed with SIGKILL, a signal as Slurm sends
// it, damaged files, other layouts.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "dstrain/ckpt/checkpoint_reader.h"
#include "dstrain/core/files.h"
#include "e2e_util.h"

using namespace dstrain::e2e;

namespace {

// input/tiny.ini with 4 layers, 8 sequences per step as 8 micro-batches of 1 on one rank; a
// checkpoint every 5 of its 20 steps.
const std::vector<std::string> kRun = {"--train.device", "cpu",          "--model.num_layers", "4",
                                       "--train.micro_batch", "1",       "--train.global_batch", "8",
                                       "--ckpt.interval", "5",           "--log.interval", "1"};

RunOutput train(int ranks, int pp, const std::string& run_dir, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = kRun;
  args.insert(args.end(), {"--parallel.pp", std::to_string(pp)});
  args.insert(args.end(), extra.begin(), extra.end());
  return train_tiny(ranks, run_dir, args);
}

// The uninterrupted 2 × 2 run, once per test process.
const std::string& uninterrupted() {
  static std::string dir = [] {
    std::string d = scratch_dir("ckpt-uninterrupted-" + std::to_string(getpid()));
    RunOutput run = train(4, 2, d);
    EXPECT_EQ(run.exit_code, 0) << run.output;
    return d;
  }();
  return dir;
}

std::string digest(const std::string& run_dir) { return read_json(run_dir + "/summary.json")["param_digest"]; }

std::string checkpoint(const std::string& run_dir, int step) {
  char name[32];
  std::snprintf(name, sizeof name, "/checkpoints/step_%08d.h5", step);
  return run_dir + name;
}

std::string latest_of(const std::string& run_dir) {
  std::ifstream in(run_dir + "/checkpoints/latest");
  std::string name;
  std::getline(in, name);
  return name;
}

// Every record of `b` equals the record of `a` for the same step (all its numbers but timings).
void expect_same_records(const std::string& a, const std::string& b, double tolerance) {
  auto ra = read_jsonl(a + "/metrics.jsonl"), rb = read_jsonl(b + "/metrics.jsonl");
  ASSERT_EQ(ra.size(), rb.size());
  for (size_t i = 0; i < ra.size(); ++i) {
    EXPECT_EQ(ra[i]["step"], rb[i]["step"]) << "record " << i;
    for (const char* key : {"loss", "grad_norm", "lr", "eval_loss", "consumed_samples"}) {
      if (!ra[i].contains(key)) continue;
      ASSERT_TRUE(rb[i].contains(key)) << key << " record " << i;
      if (tolerance == 0)
        EXPECT_EQ(ra[i][key], rb[i][key]) << key << " at step " << ra[i]["step"];
      else
        EXPECT_NEAR(ra[i][key].get<double>(), rb[i][key].get<double>(), tolerance) << key << " at step " << ra[i]["step"];
    }
  }
}

}  // namespace

// A rank of a 2 × 2 run dies (SIGKILL) at step 13; the job is started again with the same
// command: it resumes from the latest checkpoint and ends bitwise where the run that never
// stopped ended. The step-10 save completes at a step boundary once every rank has written its
// share, normally at step 11; on a loaded machine its fsync can outlast steps 11 and 12, and
// then step 5 is the latest, which must serve as well.
TEST(Checkpoint, KilledRankResumesBitwise) {
  std::string dir = scratch_dir("ckpt-killed");
  RunOutput killed = train(4, 2, dir, {"--debug.fail_at_step", "13", "--debug.fail_rank", "3"});
  EXPECT_NE(killed.exit_code, 0) << killed.output;
  const std::string latest = latest_of(dir);
  ASSERT_TRUE(latest == "step_00000010.h5" || latest == "step_00000005.h5") << latest << "\n" << killed.output;
  RunOutput resumed = train(4, 2, dir);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming from " + dir + "/checkpoints/" + latest), std::string::npos)
      << resumed.output;
  EXPECT_EQ(digest(dir), digest(uninterrupted()));
  expect_same_records(uninterrupted(), dir, 0.0);  // the steps after the checkpoint logged once, as re-run
}

// SIGKILL while the step-10 checkpoint is being written: `latest` still names step 5, which
// verifies and resumes.
TEST(Checkpoint, KillDuringAWriteLeavesThePreviousCheckpoint) {
  std::string dir = scratch_dir("ckpt-kill-in-save");
  RunOutput killed = train(4, 2, dir, {"--debug.fail_at_step", "10", "--debug.fail_rank", "1",
                                       "--debug.fail_mode", "kill_in_save"});
  EXPECT_NE(killed.exit_code, 0) << killed.output;
  EXPECT_EQ(latest_of(dir), "step_00000005.h5");
  EXPECT_FALSE(dstrain::files::exists(checkpoint(dir, 10)));
  RunOutput verify = run_dstrain(0, {"ckpt", "verify", dir + "/checkpoints"});
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
  EXPECT_NE(verify.output.find("all 118 datasets match"), std::string::npos) << verify.output;
  RunOutput resumed = train(4, 2, dir);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(digest(dir), digest(uninterrupted()));
  EXPECT_FALSE(dstrain::files::exists(checkpoint(dir, 10) + ".tmp"));  // cleaned up by a later save
}

// The 2 × 2 checkpoint of step 10, resumed as DP 4 × PP 1 and as DP 1 × PP 4.
TEST(Checkpoint, ResumesOnOtherLayouts) {
  const std::string source = checkpoint(uninterrupted(), 10);
  for (int pp : {1, 4}) {
    std::string dir = scratch_dir("ckpt-relayout-pp" + std::to_string(pp));
    RunOutput run = train(4, pp, dir, {"--ckpt.resume", source});
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find("continuing on this layout"), std::string::npos) << run.output;
    auto mine = train_records(dir), reference = train_records(uninterrupted());
    ASSERT_EQ(mine.size(), 10u);  // steps 11-20
    for (size_t i = 0; i < mine.size(); ++i) {
      EXPECT_EQ(mine[i]["step"], reference[i + 10]["step"]);
      EXPECT_NEAR(mine[i]["loss"].get<double>(), reference[i + 10]["loss"].get<double>(), 1e-5) << "pp " << pp;
    }
  }
}

// SIGTERM (Slurm's warning) reaches one rank at step 7: every rank stops after the step, a
// checkpoint is written, the job exits with 75; the resubmitted job continues exactly.
TEST(Checkpoint, SigtermCheckpointsRequeuesAndResumesExactly) {
  std::string dir = scratch_dir("ckpt-sigterm");
  RunOutput stopped = train(4, 2, dir, {"--debug.fail_at_step", "7", "--debug.fail_rank", "2",
                                        "--debug.fail_mode", "sigterm"});
  EXPECT_EQ(stopped.exit_code, 75) << stopped.output;
  EXPECT_NE(stopped.output.find("resubmit the job to continue"), std::string::npos) << stopped.output;
  EXPECT_EQ(latest_of(dir), "step_00000007.h5");
  RunOutput resumed = train(4, 2, dir);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(digest(dir), digest(uninterrupted()));
  expect_same_records(uninterrupted(), dir, 0.0);
}

// Ctrl-C in an interactive run (one process, no mpirun): the same graceful stop.
TEST(Checkpoint, SigintStopsWithACheckpoint) {
  std::string dir = scratch_dir("ckpt-sigint");
  RunOutput stopped = train(0, 1, dir, {"--debug.fail_at_step", "4", "--debug.fail_mode", "sigint"});
  EXPECT_EQ(stopped.exit_code, 75) << stopped.output;
  EXPECT_NE(stopped.output.find("stopped by SIGINT after step 4: checkpoint written"), std::string::npos)
      << stopped.output;
  EXPECT_EQ(latest_of(dir), "step_00000004.h5");
}

// Damage and mismatches: each a clear error with the checkpoint exit code, naming what is wrong.
TEST(Checkpoint, DamagedOrForeignCheckpointsAreClearErrors) {
  std::string dir = scratch_dir("ckpt-damaged");
  ASSERT_EQ(train(1, 1, dir, {"--train.steps", "5"}).exit_code, 0);
  const std::string good = checkpoint(dir, 5);

  auto copy_of_good = [&](const std::string& name) {
    const std::string copy = dir + "/" + name;
    std::ofstream(copy, std::ios::binary | std::ios::trunc) << read_text(good);
    return copy;
  };
  std::string flipped = copy_of_good("flipped.h5");
  flip_a_byte(flipped, "/optim/model.layers.1.mlp.up_proj.weight/exp_avg");
  RunOutput verify = run_dstrain(0, {"ckpt", "verify", flipped});
  EXPECT_EQ(verify.exit_code, 4) << verify.output;
  EXPECT_NE(verify.output.find("/optim/model.layers.1.mlp.up_proj.weight/exp_avg: the data do not match the checksum"),
            std::string::npos) << verify.output;
  RunOutput resume = train(1, 1, scratch_dir("ckpt-from-flipped"), {"--ckpt.resume", flipped});
  EXPECT_EQ(resume.exit_code, 4) << resume.output;
  EXPECT_NE(resume.output.find("exp_avg: the data do not match the checksum"), std::string::npos) << resume.output;

  // Checkpoints without `latest` (a crash between a run's first checkpoint and its `latest`, or
  // files copied in): ckpt.resume = auto resumes from the newest, which the run leaves as it was.
  const std::string orphaned = scratch_dir("ckpt-without-latest");
  std::string why;
  ASSERT_TRUE(dstrain::files::make_directories(orphaned + "/checkpoints", &why)) << why;
  std::ofstream(checkpoint(orphaned, 5), std::ios::binary) << read_text(good);
  std::ofstream(checkpoint(orphaned, 3), std::ios::binary) << "an older one, never read";
  RunOutput adopted = train(1, 1, orphaned, {"--train.steps", "6"});
  EXPECT_EQ(adopted.exit_code, 0) << adopted.output;
  EXPECT_NE(adopted.output.find("holds checkpoints but no `latest`: resuming from the newest, step_00000005.h5"),
            std::string::npos) << adopted.output;
  EXPECT_NE(adopted.output.find("resuming from " + checkpoint(orphaned, 5)), std::string::npos) << adopted.output;
  EXPECT_EQ(read_json(orphaned + "/summary.json")["start_step"], 5);
  EXPECT_EQ(latest_of(orphaned), "step_00000006.h5");
  EXPECT_EQ(read_text(checkpoint(orphaned, 5)), read_text(good));

  // The trainer's attributes have a checksum too: a step changed from 5 to 3 would resume the
  // data order two steps back.
  const std::string edited = copy_of_good("edited.h5");
  {
    dstrain::h5::Handle file(H5Fopen(edited.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    ASSERT_GE(file.get(), 0);
    dstrain::h5::Handle trainer(H5Gopen2(file.get(), "trainer", H5P_DEFAULT), H5Gclose);
    ASSERT_GE(trainer.get(), 0);
    ASSERT_GE(H5Adelete(trainer.get(), "step"), 0);
    dstrain::h5::write_attribute_u64(trainer.get(), "step", 3, dstrain::ExitCode::kInternal);
  }
  for (const std::vector<std::string>& command : {std::vector<std::string>{"ckpt", "verify", edited},
                                                  {"train", "--config", std::string(DSTRAIN_SOURCE_DIR) + "/input/tiny.ini",
                                                   "--data.train", test_corpus().train, "--run.dir",
                                                   scratch_dir("ckpt-from-edited"), "--ckpt.resume", edited}}) {
    RunOutput run = run_dstrain(0, command);
    EXPECT_EQ(run.exit_code, 4) << run.output;
    EXPECT_NE(run.output.find(edited + ": /trainer: its attributes (step, samples consumed, configuration, ...) do "
                              "not match their checksum"),
              std::string::npos) << run.output;
  }

  std::string truncated = dir + "/truncated.h5";
  {
    const std::string bytes = read_text(good);
    std::ofstream(truncated, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  }
  RunOutput cut = run_dstrain(0, {"ckpt", "inspect", truncated});
  EXPECT_EQ(cut.exit_code, 4) << cut.output;
  EXPECT_NE(cut.output.find(truncated + ": not a readable HDF5 file (truncated or damaged?)"), std::string::npos)
      << cut.output;

  std::string dangling = scratch_dir("ckpt-dangling");
  ASSERT_TRUE(dstrain::files::make_directories(dangling + "/checkpoints", nullptr) || true);
  std::ofstream(dangling + "/checkpoints/latest") << "step_00000099.h5\n";
  RunOutput missing = train(1, 1, dangling);
  EXPECT_EQ(missing.exit_code, 4) << missing.output;
  EXPECT_NE(missing.output.find("latest names step_00000099.h5, which does not exist"), std::string::npos)
      << missing.output;
  std::ofstream(dangling + "/checkpoints/latest", std::ios::binary | std::ios::trunc) << std::string("\0\xff junk\n", 8);
  RunOutput garbled = train(1, 1, dangling);
  EXPECT_EQ(garbled.exit_code, 4) << garbled.output;
  EXPECT_NE(garbled.output.find("latest: does not name a checkpoint file (step_NNNNNNNN.h5): damaged?"),
            std::string::npos) << garbled.output;

  RunOutput other = train(1, 1, scratch_dir("ckpt-other-model"), {"--ckpt.resume", good, "--model.hidden_size", "64"});
  EXPECT_EQ(other.exit_code, 4) << other.output;
  EXPECT_NE(other.output.find("a checkpoint of another model: model.hidden_size = 32 there, 64 here"),
            std::string::npos) << other.output;

  RunOutput corpus = train(1, 1, scratch_dir("ckpt-other-corpus"),
                           {"--ckpt.resume", good, "--data.train", test_corpus().valid});
  EXPECT_EQ(corpus.exit_code, 4) << corpus.output;
  EXPECT_NE(corpus.output.find("not the corpus " + good + " trained on"), std::string::npos) << corpus.output;

  // Another global batch continues from the checkpoint's data position (a batch-size ramp-up's
  // next stage; tests/e2e/test_batch_rampup.cpp checks the numbers).
  RunOutput batch = train(1, 1, scratch_dir("ckpt-other-batch"), {"--ckpt.resume", good, "--train.global_batch", "4"});
  EXPECT_EQ(batch.exit_code, 0) << batch.output;
  EXPECT_NE(batch.output.find("train.global_batch = 4 where " + good + " was trained with 8: the run continues from "
                              "its data position"),
            std::string::npos) << batch.output;
  RunOutput seed = train(1, 1, scratch_dir("ckpt-other-seed"), {"--ckpt.resume", good, "--run.seed", "7"});
  EXPECT_EQ(seed.exit_code, 2) << seed.output;
  EXPECT_NE(seed.output.find("run.seed = 7: " + good + " was trained with seed 1234; resume with --run.seed 1234"),
            std::string::npos) << seed.output;

  // A longer run moves the end of the decay (optim.decay_steps follows train.steps): allowed, and said.
  const std::string longer_dir = scratch_dir("ckpt-longer");
  RunOutput longer = train(1, 1, longer_dir, {"--ckpt.resume", good, "--train.steps", "6"});
  EXPECT_EQ(longer.exit_code, 0) << longer.output;
  EXPECT_NE(longer.output.find("the learning-rate schedule differs from the one " + good +
                               " was trained with (optim.decay_steps = 5 there, 6 here)"),
            std::string::npos) << longer.output;
  // Its end says which steps this process ran, and its summary where it started.
  EXPECT_NE(longer.output.find("done: step 6 (resumed after step 5) in "), std::string::npos) << longer.output;
  EXPECT_EQ(read_json(longer_dir + "/summary.json")["start_step"], 5);
}

// A rank that stops answering: the others give up after comm.timeout_s, name first the rank that
// no longer answers (even those whose own wait was for a rank that waits for it), then which of
// their operations waited for whom, and end the job with the communication exit code.
TEST(Checkpoint, AHungRankEndsTheJobWithACommunicationError) {
  std::string dir = scratch_dir("ckpt-hang");
  RunOutput run = train(4, 2, dir, {"--debug.fail_at_step", "4", "--debug.fail_rank", "1", "--debug.fail_mode", "hang",
                                    "--comm.timeout_s", "10"});  // (it bounds the ranks' start-up too)
  EXPECT_EQ(run.exit_code, 5) << run.output;
  EXPECT_NE(run.output.find("did not finish within comm.timeout_s = 10 s"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("world rank 1"), std::string::npos) << run.output;  // the peer waited for
  // Every timed-out rank's message starts with the silent one, rank 1, and names no other as silent.
  size_t messages = 0;
  for (size_t at = run.output.find("error: "); at != std::string::npos; at = run.output.find("error: ", at + 1)) {
    const std::string line = run.output.substr(at, run.output.find('\n', at) - at);
    if (line.find("did not finish within") == std::string::npos) continue;
    ++messages;
    EXPECT_EQ(line.rfind("error: world rank 1 (host ", 0), 0u) << line;
    EXPECT_NE(line.find(") did not answer within 2 s: stopped, hung outside communication, or dead"), std::string::npos)
        << line;
  }
  EXPECT_GE(messages, 1u) << run.output;
}

// A step whose gradients are not finite never reaches a checkpoint: the run stops first, and a
// save of an earlier step still being written completes.
TEST(Checkpoint, NonFiniteStepsNeverReachACheckpoint) {
  std::string dir = scratch_dir("ckpt-nonfinite");
  RunOutput run = train(2, 1, dir, {"--debug.fail_at_step", "7", "--debug.fail_rank", "1", "--debug.fail_mode", "nan",
                                    "--log.interval", "10"});
  EXPECT_EQ(run.exit_code, 6) << run.output;
  EXPECT_NE(run.output.find("steps 6-10: the gradient norm was not finite in 1 step(s)"), std::string::npos)
      << run.output;
  EXPECT_EQ(latest_of(dir), "step_00000005.h5");  // the last good one, intact
  EXPECT_FALSE(dstrain::files::exists(checkpoint(dir, 10)));

  // Stopped at step 6, before any step boundary after the step-5 save began: that save, of a
  // finite step, is still in flight, and completes before the ranks exit.
  std::string in_flight = scratch_dir("ckpt-nonfinite-in-flight");
  RunOutput stopped = train(2, 1, in_flight, {"--debug.fail_at_step", "6", "--debug.fail_rank", "1",
                                              "--debug.fail_mode", "nan"});
  EXPECT_EQ(stopped.exit_code, 6) << stopped.output;
  EXPECT_NE(stopped.output.find("step 6: the gradient norm was not finite in 1 step(s)"), std::string::npos) << stopped.output;
  // Both ranks stop there; rank 0 alone says so.
  size_t said = 0;
  for (size_t at = stopped.output.find("error: step 6:"); at != std::string::npos; at = stopped.output.find("error: step 6:", at + 1))
    ++said;
  EXPECT_EQ(said, 1u) << stopped.output;
  EXPECT_EQ(latest_of(in_flight), "step_00000005.h5") << stopped.output;
  RunOutput verify = run_dstrain(0, {"ckpt", "verify", checkpoint(in_flight, 5)});
  EXPECT_EQ(verify.exit_code, 0) << verify.output;

  // optim.nonfinite = skip: the step changes nothing, and the run goes on.
  std::string skipping = scratch_dir("ckpt-nonfinite-skip");
  RunOutput skipped = train(2, 1, skipping, {"--debug.fail_at_step", "7", "--debug.fail_rank", "1",
                                             "--debug.fail_mode", "nan", "--log.interval", "10",
                                             "--optim.nonfinite", "skip"});
  EXPECT_EQ(skipped.exit_code, 0) << skipped.output;
  EXPECT_NE(skipped.output.find("steps 6-10: 1 step(s) with a non-finite gradient norm skipped"), std::string::npos)
      << skipped.output;
  EXPECT_EQ(latest_of(skipping), "step_00000020.h5");
}

// Retention: the newest keep_last, plus every keep_every-th for good; h5dump and ckpt inspect read
// the files.
TEST(Checkpoint, RetentionAndH5dump) {
  std::string dir = scratch_dir("ckpt-retention");
  ASSERT_EQ(train(2, 1, dir, {"--ckpt.keep_last", "2", "--ckpt.keep_every", "10"}).exit_code, 0);
  EXPECT_FALSE(dstrain::files::exists(checkpoint(dir, 5)));
  EXPECT_TRUE(dstrain::files::exists(checkpoint(dir, 10)));  // a multiple of keep_every
  EXPECT_TRUE(dstrain::files::exists(checkpoint(dir, 15)));
  EXPECT_TRUE(dstrain::files::exists(checkpoint(dir, 20)));
  EXPECT_EQ(latest_of(dir), "step_00000020.h5");

  // The same job once more (a requeue after the end), or with fewer steps: nothing to do, and
  // nothing in the run directory changes (config.ini still describes the run that trained).
  const std::string summary = read_json(dir + "/summary.json").dump(), config = read_text(dir + "/config.ini");
  auto sorted_entries = [&] {
    std::vector<std::string> names = dstrain::files::directory_entries(dir);
    std::sort(names.begin(), names.end());
    return names;
  };
  const std::vector<std::string> entries = sorted_entries();
  for (const char* steps : {"20", "10"}) {
    RunOutput again = train(2, 1, dir, {"--ckpt.keep_last", "2", "--ckpt.keep_every", "10", "--train.steps", steps});
    EXPECT_EQ(again.exit_code, 0) << again.output;
    EXPECT_NE(again.output.find("nothing to do"), std::string::npos) << again.output;
    // (train.steps 10 moves the end of the decay, but no step follows to take another schedule.)
    EXPECT_EQ(again.output.find("learning-rate schedule differs"), std::string::npos) << again.output;
    EXPECT_EQ(read_json(dir + "/summary.json").dump(), summary);
    EXPECT_EQ(read_text(dir + "/config.ini"), config) << "train.steps " << steps;
    EXPECT_EQ(sorted_entries(), entries) << "train.steps " << steps;
    EXPECT_EQ(train_records(dir).size(), 20u);
  }

  FILE* pipe = popen(("h5dump -n " + checkpoint(dir, 20) + " 2>&1").c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string listing;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) listing.append(buffer, n);
  EXPECT_EQ(pclose(pipe), 0) << listing;
  for (const char* name : {"dataset    /model/lm_head.weight", "dataset    /optim/model.norm.weight/exp_avg_sq",
                           "dataset    /trainer/rng_cpu"})
    EXPECT_NE(listing.find(name), std::string::npos) << name << " in:\n" << listing;

  // dstrain's own listing: the summary, then every /trainer attribute as "name = value"
  // (model_shape's further lines aligned under its first), the configuration last.
  RunOutput inspect = run_dstrain(0, {"ckpt", "inspect", checkpoint(dir, 20)});
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  const std::string& out = inspect.output;
  const std::string model_shape_continued = "\n" + std::string(18, ' ') + "hidden_size = ";
  for (const std::string& part : std::vector<std::string>{
           checkpoint(dir, 20) + "\n  step 20, ", "\n  written by 2 ranks: dp 2 x pp 1, ",
           "\n  /trainer:\n    step = 20\n", "\n    world_size = 2\n    dp = 2\n    pp = 1\n",
           "\n    model_shape = vocab_size = ", model_shape_continued})
    EXPECT_NE(out.find(part), std::string::npos) << part << " in:\n" << out;
  EXPECT_EQ(out.find("    config = "), std::string::npos) << out;
  EXPECT_LT(out.find("\n  /trainer:\n"), out.find("\nconfiguration:\n")) << out;
}

// bf16 parameters are saved as bf16 (h5dump reads them as numbers) beside their fp32 master
// weights, from which a resumed run continues bitwise.
TEST(Checkpoint, Bf16RunsResumeFromTheirMasterWeights) {
  const std::vector<std::string> bf16 = {"--train.precision", "bf16", "--train.steps", "10"};
  std::string whole = scratch_dir("ckpt-bf16-whole"), broken = scratch_dir("ckpt-bf16-broken");
  ASSERT_EQ(train(2, 1, whole, bf16).exit_code, 0);
  std::vector<std::string> killed = bf16;
  killed.insert(killed.end(), {"--debug.fail_at_step", "7", "--debug.fail_rank", "0"});
  EXPECT_NE(train(2, 1, broken, killed).exit_code, 0);
  RunOutput resumed = train(2, 1, broken, bf16);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(digest(broken), digest(whole));

  dstrain::CheckpointReader reader(checkpoint(whole, 10));
  ASSERT_NE(reader.find("model/lm_head.weight"), nullptr);
  EXPECT_EQ(reader.find("model/lm_head.weight")->dtype, torch::kBFloat16);
  ASSERT_NE(reader.find("optim/lm_head.weight/master"), nullptr);
  EXPECT_EQ(reader.find("optim/lm_head.weight/master")->dtype, torch::kFloat32);
  torch::Tensor master = reader.read("optim/lm_head.weight/master"), param = reader.read("model/lm_head.weight");
  EXPECT_TRUE(torch::equal(param, master.to(torch::kBFloat16)));  // the parameter is its rounded master
  // HDF5 itself reads the 16-bit type as numbers (what h5dump and h5py show).
  std::lock_guard<std::recursive_mutex> lock(dstrain::h5::h5_mutex());
  hid_t f = H5Fopen(checkpoint(whole, 10).c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, "/model/lm_head.weight", H5P_DEFAULT);
  torch::Tensor as_float = torch::empty(param.sizes(), torch::kFloat32);
  EXPECT_GE(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, as_float.data_ptr<float>()), 0);
  H5Dclose(d);
  H5Fclose(f);
  EXPECT_TRUE(torch::equal(as_float, param.to(torch::kFloat32)));
}

namespace {

// `mpirun -np 2` training a 25M-parameter model (a step of about 3 s alone, up to 12 s beside the
// rest of the suite) into `dir`, its output into dir/launcher.log; `environment` (NAME=VALUE) is
// set for it and passed on to the ranks. Returns once the run has logged its second step.
pid_t launch_until_second_step(const std::string& dir, const std::vector<std::string>& environment) {
  std::vector<std::string> args = {std::string(MPIEXEC), "-np", "2", "--oversubscribe"};
  for (const std::string& setting : environment) args.insert(args.end(), {"-x", setting.substr(0, setting.find('='))});
  args.insert(args.end(), {DSTRAIN_EXE, "train", "--config", std::string(DSTRAIN_SOURCE_DIR) + "/input/tiny.ini",
                           "--run.dir", dir, "--data.train", test_corpus().train, "--train.device", "cpu",
                           "--model.hidden_size", "512", "--model.num_layers", "8", "--model.num_heads", "8",
                           "--model.intermediate_size", "1408", "--model.max_seq_len", "256", "--train.seq_len", "256",
                           "--train.micro_batch", "8", "--train.global_batch", "16", "--train.steps", "1000",
                           "--log.interval", "1", "--train.eval_interval", "0"});
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  const pid_t launcher = fork();
  if (launcher == 0) {
    for (const std::string& setting : environment) putenv(const_cast<char*>(setting.c_str()));
    const std::string log = dir + "/launcher.log";
    freopen(log.c_str(), "w", stdout);
    dup2(fileno(stdout), STDERR_FILENO);
    std::vector<char*> argv;
    for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  auto logged_steps = [&] {
    std::ifstream metrics(dir + "/metrics.jsonl");
    std::string line;
    int lines = 0;
    while (std::getline(metrics, line)) ++lines;
    return lines;
  };
  for (int waited = 0; launcher > 0 && waited < 1800 && logged_steps() < 2; ++waited) usleep(100 * 1000);
  EXPECT_GE(logged_steps(), 2) << read_text(dir + "/launcher.log");
  return launcher;
}

// The checkpoint a stop signal left in `dir`: of the second step or later.
void expect_stopped_with_a_checkpoint(const std::string& dir, const std::string& signal) {
  const std::string output = read_text(dir + "/launcher.log");
  EXPECT_NE(output.find("stopped by " + signal + " after step"), std::string::npos) << output;
  const std::string latest = latest_of(dir);
  ASSERT_FALSE(latest.empty()) << output;
  dstrain::CheckpointReader reader(dir + "/checkpoints/" + latest);
  EXPECT_GE(reader.state().step, 2u);
}

}  // namespace

// SIGTERM to mpirun itself (`kill` of the launcher, a scheduler without Slurm): Open MPI passes it
// on to the ranks only after odls_base_sigkill_timeout and kills them as long after that, 1 s by
// default, too little for a step of this model and its checkpoint (without the setting the ranks
// are killed before they write it). With the setting docs/checkpoints.md gives, the ranks finish their
// step, write the checkpoint and stop. Open MPI sleeps the whole timeout twice whatever the ranks
// do, so 30 s costs the test a minute: room for a step and a save on a loaded machine, not more.
TEST(Checkpoint, SigtermToMpirunLeavesACheckpointWithOpenMpisKillTimeout) {
  const std::string dir = scratch_dir("ckpt-sigterm-mpirun");
  const pid_t launcher = launch_until_second_step(dir, {"OMPI_MCA_odls_base_sigkill_timeout=30"});
  ASSERT_GT(launcher, 0);
  ASSERT_EQ(kill(launcher, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(waitpid(launcher, &status, 0), launcher);
  expect_stopped_with_a_checkpoint(dir, "SIGTERM");
}

// SIGUSR1 to mpirun, docs/checkpoints.md's way to stop an mpirun job: Open MPI forwards it to every rank at
// once, without the kill timeout's delay or its limit; the ranks write the checkpoint and exit with
// 75, which mpirun returns.
TEST(Checkpoint, SigusrToMpirunStopsEveryRankWithACheckpointAndExit75) {
  const std::string dir = scratch_dir("ckpt-sigusr-mpirun");
  const pid_t launcher = launch_until_second_step(dir, {});
  ASSERT_GT(launcher, 0);
  ASSERT_EQ(kill(launcher, SIGUSR1), 0);
  int status = 0;
  ASSERT_EQ(waitpid(launcher, &status, 0), launcher);
  ASSERT_TRUE(WIFEXITED(status)) << read_text(dir + "/launcher.log");
  EXPECT_EQ(WEXITSTATUS(status), 75) << read_text(dir + "/launcher.log");
  expect_stopped_with_a_checkpoint(dir, "SIGUSR1");
}
