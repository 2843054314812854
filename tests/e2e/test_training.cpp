// dstrain train end to end, on real mpirun ranks, checked through the files it writes.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>

#include "dstrain/core/files.h"
#include "e2e_util.h"

using namespace dstrain::e2e;

namespace {

// A run of input/tiny.ini on the CPU (where runs are bitwise reproducible, also on a machine
// with GPUs); extra arguments override.
RunOutput train(int ranks, const std::string& run_dir, std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"--train.device", "cpu"});
  return train_tiny(ranks, run_dir, extra);
}

void expect_same_losses(const std::string& a, const std::string& b, double tolerance) {
  auto ra = train_records(a), rb = train_records(b);
  ASSERT_EQ(ra.size(), 20u);
  ASSERT_EQ(rb.size(), ra.size());
  for (size_t i = 0; i < ra.size(); ++i) {
    EXPECT_EQ(ra[i]["step"], rb[i]["step"]);
    EXPECT_NEAR(ra[i]["loss"].get<double>(), rb[i]["loss"].get<double>(), tolerance) << "step " << i + 1;
    EXPECT_NEAR(ra[i]["grad_norm"].get<double>(), rb[i]["grad_norm"].get<double>(), 10 * tolerance)
        << "step " << i + 1;
  }
  auto ea = eval_records(a), eb = eval_records(b);
  ASSERT_EQ(ea.size(), 2u);  // steps 10 and 20
  ASSERT_EQ(eb.size(), 2u);
  for (size_t i = 0; i < ea.size(); ++i)
    EXPECT_NEAR(ea[i]["eval_loss"].get<double>(), eb[i]["eval_loss"].get<double>(), tolerance);
  // Not vacuous: the model learns.
  EXPECT_LT(ra.back()["loss"].get<double>(), ra.front()["loss"].get<double>() - 0.5);
}

}  // namespace

// Same seed and global batch: 2-rank data parallelism gives the loss of 1 rank at every step.
TEST(Training, DataParallelMatchesOneRank) {
  std::string one = scratch_dir("dp1"), two = scratch_dir("dp2");
  RunOutput a = train(1, one, {"--train.micro_batch", "2", "--train.grad_accum", "2"});
  ASSERT_EQ(a.exit_code, 0) << a.output;
  RunOutput b = train(2, two, {"--train.micro_batch", "2", "--train.grad_accum", "1"});
  ASSERT_EQ(b.exit_code, 0) << b.output;
  expect_same_losses(one, two, 1e-5);
  // Two ranks report their gradient average's time: the exposed part is a part of it; one rank
  // has nothing to report.
  for (const nlohmann::json& record : train_records(two)) {
    ASSERT_TRUE(record.contains("dp_comm_s")) << record.dump();
    EXPECT_GT(record["dp_comm_s"].get<double>(), 0.0);
    EXPECT_GE(record["dp_comm_exposed_s"].get<double>(), 0.0);
    EXPECT_LE(record["dp_comm_exposed_s"].get<double>(), record["dp_comm_s"].get<double>() + 1e-3);
  }
  EXPECT_FALSE(train_records(one).front().contains("dp_comm_s"));
  EXPECT_NE(b.output.find("ms exposed"), std::string::npos);
}

TEST(Training, DataParallelWithGradientAccumulationMatchesOneRank) {
  std::string one = scratch_dir("dp1-ga4"), two = scratch_dir("dp2-ga2");
  RunOutput a = train(1, one, {"--train.micro_batch", "1", "--train.global_batch", "4"});
  ASSERT_EQ(a.exit_code, 0) << a.output;
  RunOutput b = train(2, two, {"--train.micro_batch", "1", "--train.global_batch", "4"});
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(read_json(one + "/summary.json")["layout"]["dp"], 1);
  EXPECT_EQ(read_json(two + "/summary.json")["layout"]["dp"], 2);
  expect_same_losses(one, two, 1e-5);
}

TEST(Training, SameConfigAndSeedIsBitwiseReproducible) {
  std::string first = scratch_dir("repro1"), second = scratch_dir("repro2"), other = scratch_dir("seed2");
  ASSERT_EQ(train(2, first, {}).exit_code, 0);
  ASSERT_EQ(train(2, second, {}).exit_code, 0);
  auto a = read_jsonl(first + "/metrics.jsonl"), b = read_jsonl(second + "/metrics.jsonl");
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), 22u);  // 20 steps + 2 evaluations
  for (size_t i = 0; i < a.size(); ++i)
    for (const char* key : {"step", "loss", "lr", "grad_norm", "eval_loss", "consumed_samples"})
      EXPECT_EQ(a[i].value(key, nlohmann::json()), b[i].value(key, nlohmann::json())) << key << " record " << i;
  std::string digest = read_json(first + "/summary.json")["param_digest"];
  EXPECT_EQ(digest.size(), 16u);
  EXPECT_EQ(digest, read_json(second + "/summary.json")["param_digest"].get<std::string>());

  ASSERT_EQ(train(2, other, {"--run.seed", "99"}).exit_code, 0);
  EXPECT_NE(digest, read_json(other + "/summary.json")["param_digest"].get<std::string>());
}

// The gradient average started during the backward pass, moved by the MPI progress thread, gives
// the bits of the one made after it without the thread: for data parallelism, and for dp 2 × pp 2
// with ZeRO-1 (reduce-scatter of the gradients, all-gather of the updated parameters). Small
// buckets, so that many are under way at once.
TEST(Training, OverlappedReductionsOnTheProgressThreadChangeNoBit) {
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{}, std::vector<std::string>{"--parallel.pp", "2", "--optim.zero", "1"}}) {
    const int ranks = layout.empty() ? 2 : 4;
    std::string overlapped = scratch_dir("overlap-thread"), plain = scratch_dir("overlap-none");
    auto settings = [&](const char* overlap) {
      std::vector<std::string> args = {"--comm.bucket_mb", "0.005", "--comm.overlap", overlap,
                                       "--comm.progress_thread", overlap};
      args.insert(args.end(), layout.begin(), layout.end());
      return args;
    };
    RunOutput a = train(ranks, overlapped, settings("true")), b = train(ranks, plain, settings("false"));
    ASSERT_EQ(a.exit_code, 0) << a.output;
    ASSERT_EQ(b.exit_code, 0) << b.output;
    auto x = train_records(overlapped), y = train_records(plain);
    ASSERT_EQ(x.size(), y.size());
    for (size_t i = 0; i < x.size(); ++i)
      for (const char* key : {"loss", "grad_norm"})
        EXPECT_EQ(x[i][key], y[i][key]) << key << " at step " << x[i]["step"] << " on " << ranks << " ranks";
    EXPECT_EQ(read_json(overlapped + "/summary.json")["param_digest"], read_json(plain + "/summary.json")["param_digest"])
        << ranks << " ranks";
  }
}

TEST(Training, RunDirectoryHoldsEffectiveConfigMetricsAndSummary) {
  std::string dir = scratch_dir("rundir");
  RunOutput run = train(2, dir + "/nested/run", {"--log.interval", "5"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("effective configuration"), std::string::npos);
  EXPECT_NE(run.output.find("metrics: " + dir + "/nested/run/metrics.jsonl"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("step 20/20 | loss"), std::string::npos) << run.output;
  auto records = train_records(dir + "/nested/run");
  ASSERT_EQ(records.size(), 4u);  // steps 5, 10, 15, 20
  for (const char* key : {"step", "loss", "lr", "grad_norm", "tokens_per_s", "step_time_s"})
    EXPECT_TRUE(records[0].contains(key)) << key;
  EXPECT_EQ(records[0]["consumed_samples"], 5 * 4);  // 5 steps × micro_batch 2 × dp 2

  // config.ini records the resolved layout and reads back as a configuration.
  const std::string text = read_text(dir + "/nested/run/config.ini");
  EXPECT_NE(text.find("[parallel]\ntp = 1\nsequence_parallel = true\ncp = 1\ncp_mla = latent\ndp = 2\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\norder = tp-cp-ep-dp-pp\n"), std::string::npos) << text;
  std::string again = scratch_dir("rundir-again");
  RunOutput rerun = run_dstrain(2, {"train", "--config", dir + "/nested/run/config.ini", "--run.dir", again});
  ASSERT_EQ(rerun.exit_code, 0) << rerun.output;
  EXPECT_EQ(read_json(again + "/summary.json")["param_digest"],
            read_json(dir + "/nested/run/summary.json")["param_digest"]);

  // A run from step 0 in a directory with another run's logs says that it replaces them.
  RunOutput replacing = train(1, again, {"--train.steps", "2"});
  ASSERT_EQ(replacing.exit_code, 0) << replacing.output;
  EXPECT_NE(replacing.output.find("run.dir = " + again + " holds the logs of an earlier run, and this one starts at "
                                  "step 0: it replaces their config.ini, metrics.jsonl and summary.json"),
            std::string::npos) << replacing.output;
  EXPECT_EQ(train_records(again).back()["step"], 2);
}

// Evaluation follows train.eval_interval whether or not a log line falls on the same step.
TEST(Training, EvaluationIntervalIsIndependentOfTheLogInterval) {
  std::string dir = scratch_dir("eval-interval");
  RunOutput run = train(1, dir, {"--log.interval", "3", "--train.eval_interval", "5"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::vector<int64_t> logged, evaluated;
  for (const auto& r : train_records(dir)) logged.push_back(r["step"].get<int64_t>());
  for (const auto& r : eval_records(dir)) evaluated.push_back(r["step"].get<int64_t>());
  EXPECT_EQ(logged, (std::vector<int64_t>{3, 6, 9, 12, 15, 18, 20}));
  EXPECT_EQ(evaluated, (std::vector<int64_t>{5, 10, 15, 20}));
  EXPECT_NE(run.output.find("eval at step 5 | loss"), std::string::npos) << run.output;
}

// A log line's loss is the mean over the steps since the previous one (those skipped for
// non-finite gradients left out); its gradient norm and learning rate are its step's.
TEST(Training, LoggedLossIsTheMeanOverTheLogInterval) {
  const std::string each = scratch_dir("log-each"), third = scratch_dir("log-third");
  ASSERT_EQ(train(1, each, {"--log.interval", "1"}).exit_code, 0);
  ASSERT_EQ(train(1, third, {"--log.interval", "3"}).exit_code, 0);
  const auto steps = train_records(each), means = train_records(third);
  ASSERT_EQ(steps.size(), 20u);
  ASSERT_EQ(means.size(), 7u);  // steps 3, 6, ..., 18 and 20
  for (const auto& record : means) {
    const int64_t step = record["step"].get<int64_t>(), first = step == 20 ? 19 : step - 2;
    double sum = 0;
    for (int64_t s = first; s <= step; ++s) sum += steps[static_cast<size_t>(s - 1)]["loss"].get<double>();
    EXPECT_NEAR(record["loss"].get<double>(), sum / static_cast<double>(step - first + 1), 1e-9) << "step " << step;
    EXPECT_EQ(record["grad_norm"], steps[static_cast<size_t>(step - 1)]["grad_norm"]) << "step " << step;
    EXPECT_EQ(record["lr"], steps[static_cast<size_t>(step - 1)]["lr"]) << "step " << step;
  }

  const std::vector<std::string> skip_step_2 = {"--train.steps", "3", "--optim.nonfinite", "skip",
                                                "--debug.fail_at_step", "2", "--debug.fail_mode", "nan"};
  auto with = [&](std::vector<std::string> args, const std::string& interval) {
    args.insert(args.end(), {"--log.interval", interval});
    return args;
  };
  const std::string skipped_each = scratch_dir("log-skip-each"), skipped_third = scratch_dir("log-skip-third");
  ASSERT_EQ(train(1, skipped_each, with(skip_step_2, "1")).exit_code, 0);
  ASSERT_EQ(train(1, skipped_third, with(skip_step_2, "3")).exit_code, 0);
  const auto a = train_records(skipped_each), b = train_records(skipped_third);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_NEAR(b[0]["loss"].get<double>(), (a[0]["loss"].get<double>() + a[2]["loss"].get<double>()) / 2, 1e-9);
}

TEST(Training, ConfigurationErrorsExitWithCode2AndNameTheKey) {
  std::string dir = scratch_dir("errors");
  std::ofstream(dir + "/a-file") << "not a directory\n";
  struct Case {
    int ranks;
    std::vector<std::string> args;
    std::string expected;
  };
  std::vector<Case> cases = {
      {2,
       {"--parallel.dp", "3"},
       "parallel.dp = 3: tp × cp × dp × pp = 1 × 1 × 3 × 1 = 3 must equal the number of ranks (2)"},
      {2, {"--model.num_heads", "3"}, "model.num_heads = 3: must divide model.hidden_size (32)"},
      {2, {"--train.global_batch", "6"}, "train.global_batch = 6: must be a multiple of"},
      // (once accepted: the run then ended at its second step on a non-finite loss, exit code 6)
      {0, {"--optim.eps", "0"}, "optim.eps = 0: must be above 0"},
      {0, {"--data.train", dir + "/missing.h5"}, "data.train = " + dir + "/missing.h5: no such file"},
      {0, {"--data.valid", "a.h5:1,b.h5:1"}, "data.valid = a.h5:1,b.h5:1: one corpus: evaluation takes no mixture"},
      {0, {"--model.hidden_sise", "32"}, "model.hidden_sise"},
      // A prefix of one option (train.steps) is not that option: the same key in a file is refused too.
      {0, {"--train.step", "5"}, "unrecognised option '--train.step'"},
      // Read by every rank before MPI starts, reported by one.
      {2, {"--train.stpes", "5"}, "unrecognised option '--train.stpes'"},
      // The checkpoint directory is run.dir's unless ckpt.dir says otherwise: the message names run.dir.
      {0,
       {"--run.dir", dir + "/a-file/run"},
       "run.dir = " + dir + "/a-file/run: cannot create " + dir + "/a-file/run/checkpoints"},
      {0, {"--train.steps", "many"}, "train.steps = many: expected an integer"},
      {0, {"--train.seq_len", "100"}, "train.seq_len = 100: longer than model.max_seq_len = 64"},
      // An INI file without --config would otherwise be ignored, and the defaults trained.
      {0, {"input/demo.ini"}, "unexpected argument 'input/demo.ini': a configuration file is given as --config"},
      {0, {"--model.vocab_size", "100"}, "model.vocab_size = 100: smaller than the vocabulary"},
  };
  for (const Case& c : cases) {
    RunOutput run = train(c.ranks, dir + "/run", c.args);
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_NE(run.output.find(c.expected), std::string::npos) << "expected \"" << c.expected << "\" in:\n" << run.output;
    // One message, not one per rank (dstrain's own lines: an MPI library may log "error:" too).
    EXPECT_EQ(run.output.find("] error:"), run.output.rfind("] error:")) << run.output;
    EXPECT_EQ(run.output.find(c.expected), run.output.rfind(c.expected)) << run.output;
    EXPECT_EQ(run.output.find("Traceback"), std::string::npos);
    // Some of these fail after the checkpoint directory was made: a failed start removes it again.
    EXPECT_FALSE(dstrain::files::exists(dir + "/run")) << c.expected;
  }
  RunOutput usage = run_dstrain(0, {"trian"});
  EXPECT_EQ(usage.exit_code, 2);
  EXPECT_NE(usage.output.find("unknown command 'trian'"), std::string::npos) << usage.output;
  // A command without its subcommand: a usage error naming the subcommands, whichever the
  // command; the usage asked for is an answer.
  for (const auto& [command, subcommand] : std::vector<std::pair<std::string, std::string>>{
           {"model", "info"}, {"pipeline", "simulate"}, {"ckpt", "verify"}, {"data", "inspect"}, {"bench", "step"}}) {
    RunOutput bare = run_dstrain(0, {command});
    EXPECT_EQ(bare.exit_code, 2) << command << ":\n" << bare.output;
    EXPECT_NE(bare.output.find(subcommand), std::string::npos) << command << ":\n" << bare.output;
  }
  for (const std::vector<std::string>& help :
       {std::vector<std::string>{"model", "info", "--help"}, std::vector<std::string>{"model", "-h"},
        std::vector<std::string>{"pipeline", "simulate", "--help"}, std::vector<std::string>{"pipeline", "-h"}}) {
    RunOutput asked = run_dstrain(0, help);
    EXPECT_EQ(asked.exit_code, 0) << help[0] << ":\n" << asked.output;
  }
}

// A model whose parameters, gradients and optimizer state cannot fit is the configuration's fault,
// not a bug: stopped before anything is allocated (Linux would grant the memory and kill the
// process later, without a word), exit code 7, one message with the figures and what to change,
// and the run's earlier checkpoints untouched. (A failed allocation itself: test_error.cpp.)
TEST(Training, AModelTooLargeForMemoryStopsBeforeAllocatingWithCode7) {
  std::string dir = scratch_dir("out-of-memory");
  ASSERT_EQ(train(2, dir, {"--train.steps", "4", "--ckpt.interval", "4"}).exit_code, 0);
  const std::vector<std::string> before = dstrain::files::directory_entries(dir + "/checkpoints");
  ASSERT_FALSE(before.empty());
  // A 2^31-token vocabulary: a 256 GiB embedding table, more than any test machine has.
  RunOutput run = train(2, dir, {"--train.steps", "8", "--ckpt.resume", "none", "--model.vocab_size", "2147483647"});
  EXPECT_EQ(run.exit_code, 7) << run.output;
  EXPECT_NE(run.output.find("out of memory before the start"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("for the 2 ranks that share this host's available memory, which has"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("parallel.pp"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("internal error"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("] error:"), run.output.rfind("] error:")) << run.output;
  EXPECT_EQ(run.output.find("frame #"), std::string::npos) << run.output;  // no C++ backtrace
  EXPECT_EQ(dstrain::files::directory_entries(dir + "/checkpoints"), before);
}

// A rank stopped (SIGSTOP) before MPI starts: MPI_Init on the others waits for it, which has no
// timeout of its own; comm.timeout_s bounds it, and the job ends with exit code 5 naming the phase.
TEST(Training, ARankStoppedAtStartUpEndsTheJobWithinTheTimeout) {
  const std::string dir = scratch_dir("stopped-at-start");
  // The launcher starts each rank through a shell; rank 1's stops itself before it becomes dstrain.
  std::string command = "timeout 120 " + std::string(MPIEXEC) +
                        " -np 2 --oversubscribe bash -c 'if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then kill -STOP $$; fi; "
                        "exec \"$0\" \"$@\"' " + DSTRAIN_EXE + " train --config " + DSTRAIN_SOURCE_DIR +
                        "/input/tiny.ini --run.dir " + dir + " --data.train " + test_corpus().train +
                        " --train.device cpu --comm.timeout_s 3";
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  const auto start = std::chrono::steady_clock::now();
  const RunOutput run = run_shell(command);
  const std::string& output = run.output;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(run.exit_code, 5) << output;  // (124 would be timeout(1)'s: a hang)
  EXPECT_LT(seconds, 60.0) << output;
  EXPECT_NE(output.find("MPI start-up (MPI_Init waits for every rank) did not finish within comm.timeout_s = 3 s "
                        "(rank 0"),
            std::string::npos)
      << output;
}


// The start-up report names the BLAS library the CPU computes with, and warns when it is the
// reference one (a fresh Debian's default, about ten times slower than OpenBLAS). The reference
// library is loaded here by pointing the loader at Debian's netlib directories.
TEST(Training, StartUpNamesTheBlasAndWarnsOfTheReferenceOne) {
  const std::string netlib = "/usr/lib/x86_64-linux-gnu/blas", lapack = "/usr/lib/x86_64-linux-gnu/lapack";
  if (!dstrain::files::exists(netlib + "/libblas.so.3") || !dstrain::files::exists(lapack + "/liblapack.so.3"))
    GTEST_SKIP() << "Debian's reference BLAS (libblas3, liblapack3) is not installed here";
  const std::vector<std::string> args = {"train", "--config", std::string(DSTRAIN_SOURCE_DIR) + "/input/tiny.ini",
                                         "--run.dir", scratch_dir("blas"), "--train.steps", "-1"};
  RunOutput usual = run_dstrain(0, args);
  EXPECT_EQ(usual.exit_code, 2) << usual.output;  // (the report comes before the configuration's check)
  EXPECT_NE(usual.output.find(", BLAS "), std::string::npos) << usual.output;
  const char* before = std::getenv("LD_LIBRARY_PATH");
  const std::string saved = before ? before : "";
  setenv("LD_LIBRARY_PATH", (netlib + ":" + lapack).c_str(), 1);
  RunOutput reference = run_dstrain(0, args);
  if (before)
    setenv("LD_LIBRARY_PATH", saved.c_str(), 1);
  else
    unsetenv("LD_LIBRARY_PATH");
  EXPECT_NE(reference.output.find("BLAS reference BLAS (netlib)"), std::string::npos) << reference.output;
  EXPECT_NE(reference.output.find("warning: the CPU computes on the reference BLAS"), std::string::npos)
      << reference.output;
  EXPECT_EQ(usual.output.find("warning: the CPU computes on the reference BLAS") == std::string::npos,
            usual.output.find("reference BLAS (netlib)") == std::string::npos);
}
