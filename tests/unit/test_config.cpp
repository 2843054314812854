#include <gtest/gtest.h>

#include "dstrain/core/config.h"
#include "dstrain/train/train_config.h"
#include "test_util.h"

using namespace dstrain;
using dstrain::test::expect_error;
using dstrain::test::TempDir;

namespace {

class ConfigTest : public ::testing::Test {
 protected:
  ConfigTest() {
    dir.write("corpus.h5", "placeholder: only its existence is checked here");
    dir.write("base.ini",
              "[model]\nhidden_size = 64\nnum_heads = 4\nnum_kv_heads = 2\n"
              "[train]\nsteps = 7\nmicro_batch = 2\n[data]\ntrain = " + dir.path("corpus.h5") + "\n");
  }
  Options parse(std::vector<std::string> args) {
    args.insert(args.begin(), {"--config", dir.path("base.ini")});
    return parse_command_line(table, args).options;
  }
  TrainConfig read(std::vector<std::string> args, int world = 1) {
    Options options = parse(std::move(args));
    return read_train_config(options, world);
  }

  TempDir dir;
  OptionTable table = train_option_table();
};

}  // namespace

TEST_F(ConfigTest, FileOverridesDefaultsAndCommandLineOverridesFile) {
  TrainConfig c = read({"--train.steps", "9", "--log.all_ranks"});
  EXPECT_EQ(c.loop.steps, 9);             // command line over file
  EXPECT_EQ(c.loop.micro_batch, 2);       // file over default
  EXPECT_EQ(c.model.num_kv_heads, 2);
  EXPECT_EQ(c.loop.seq_len, 128);         // default
  EXPECT_TRUE(c.log.all_ranks);           // bare boolean flag
  EXPECT_FALSE(read({"--model.rope_interleave", "false"}).model.rope_interleave);
  EXPECT_TRUE(read({"--model.rope_interleave", "true"}).model.rope_interleave);
}

// Without parallel.virtual_stages a schedule gets the chunks it needs (a V's two, the fewest that
// interleave, one otherwise), recorded in the effective configuration; a number given is kept,
// and checked.
TEST_F(ConfigTest, ChunksPerStageFollowTheScheduleUnlessGiven) {
  for (const auto& [schedule, chunks] : std::vector<std::pair<std::string, int>>{
           {"1f1b", 1}, {"gpipe", 1}, {"zb-h1", 1}, {"interleaved", 2}, {"zbv", 2}, {"dualpipev", 2}}) {
    Options options = parse({"--parallel.pp", "2", "--parallel.schedule", schedule, "--train.grad_accum", "4",
                             "--model.num_layers", "8"});
    EXPECT_EQ(read_train_config(options, 2).pipeline.virtual_stages, chunks) << schedule;
    const std::string recorded = "virtual_stages = " + std::to_string(chunks) + "\n";
    EXPECT_NE(options.to_ini().find(recorded), std::string::npos) << schedule;
  }
  EXPECT_EQ(read({"--parallel.pp", "2", "--parallel.schedule", "interleaved", "--parallel.virtual_stages", "4",
                  "--train.grad_accum", "4", "--model.num_layers", "8"},
                 2)
                .pipeline.virtual_stages,
            4);
  expect_error([&] { read({"--parallel.pp", "2", "--parallel.schedule", "zbv", "--parallel.virtual_stages", "1"}, 2); },
               ExitCode::kUsage, {"parallel.virtual_stages = 1", "two chunks per stage in a V"});
}

TEST_F(ConfigTest, DerivedValuesAreResolvedAndRecorded) {
  Options options = parse({"--train.global_batch", "12", "--train.micro_batch", "3"});
  TrainConfig c = read_train_config(options, 2);
  EXPECT_EQ(c.parallel.dp, 2);
  EXPECT_EQ(c.loop.grad_accum, 2);  // 12 / (3 × 2)
  EXPECT_EQ(c.optim.decay_steps, 7);
  std::string ini = options.to_ini();
  EXPECT_NE(ini.find("[parallel]\ntp = 1\nsequence_parallel = true\ncp = 1\ncp_mla = latent\ndp = 2\n"),
            std::string::npos)
      << ini;
  EXPECT_NE(ini.find("order = tp-cp-ep-dp-pp\n"), std::string::npos) << ini;  // completed
  EXPECT_NE(ini.find("grad_accum = 2\n"), std::string::npos) << ini;

  // The written configuration reads back to the same values.
  dir.write("effective.ini", ini);
  Options again = parse_command_line(table, {"--config", dir.path("effective.ini")}).options;
  EXPECT_EQ(again.to_ini(), ini);
}

TEST_F(ConfigTest, UnknownKeysAreRefusedNamingTheKey) {
  dir.write("typo.ini", "[model]\nhiden_size = 64\n");
  expect_error([&] { parse_command_line(table, {"--config", dir.path("typo.ini")}); }, ExitCode::kUsage,
               {"typo.ini", "model.hiden_size"});
  expect_error([&] { parse({"--train.stepz", "3"}); }, ExitCode::kUsage, {"train.stepz"});
  expect_error([&] { parse_command_line(table, {"--config", dir.path("missing.ini")}); },
               ExitCode::kUsage, {"missing.ini"});
  // Words that are no option's value (Boost's parser would hand them over as positional ones).
  expect_error([&] { parse({"--train.steps", "3", "4"}); }, ExitCode::kUsage, {"unexpected argument '4'"});
  expect_error([&] { parse({"run.ini"}); }, ExitCode::kUsage, {"unexpected argument 'run.ini'", "--config run.ini"});
}

TEST_F(ConfigTest, WrongTypesNameKeyValueAndExpectation) {
  expect_error([&] { read({"--train.steps", "ten"}); }, ExitCode::kUsage,
               {"train.steps", "ten", "integer"});
  expect_error([&] { read({"--optim.lr", "fast"}); }, ExitCode::kUsage, {"optim.lr", "fast", "number"});
  expect_error([&] { read({"--log.all_ranks=maybe"}); }, ExitCode::kUsage,
               {"log.all_ranks", "maybe", "true or false"});
  expect_error([&] { read({"--train.micro_batch", "0"}); }, ExitCode::kUsage,
               {"train.micro_batch", "at least 1"});
}

TEST_F(ConfigTest, ImpossibleValuesAreRefused) {
  expect_error([&] { read({"--model.num_heads", "5"}); }, ExitCode::kUsage,
               {"model.num_heads", "5", "must divide model.hidden_size (64)"});
  expect_error([&] { read({"--model.num_kv_heads", "3"}); }, ExitCode::kUsage,
               {"model.num_kv_heads", "must divide model.num_heads"});
  expect_error([&] { read({"--parallel.dp", "3"}, 4); }, ExitCode::kUsage,
               {"parallel.dp", "must equal the number of ranks (4)"});
  expect_error([&] { read({"--train.global_batch", "10"}, 4); }, ExitCode::kUsage,
               {"train.global_batch", "10", "multiple of train.micro_batch × parallel.dp = 2 × 4 = 8"});
  expect_error([&] { read({"--train.global_batch", "8", "--train.grad_accum", "3"}); }, ExitCode::kUsage,
               {"train.grad_accum", "disagrees"});
  expect_error([&] { read({"--data.train", dir.path("nothing.h5")}); }, ExitCode::kUsage,
               {"data.train", "nothing.h5", "no such file"});
  expect_error([&] { read({"--train.seq_len", "8192"}); }, ExitCode::kUsage, {"train.seq_len", "8192"});
  expect_error([&] { read({"--train.seq_len", "2", "--model.num_nextn_predict_layers", "2"}); }, ExitCode::kUsage,
               {"train.seq_len", "model.num_nextn_predict_layers = 2"});
  expect_error([&] { read({"--optim.min_lr", "1", "--optim.lr", "0.1"}); }, ExitCode::kUsage,
               {"optim.min_lr"});
}

TEST_F(ConfigTest, HelpListsEveryOptionWithDefault) {
  std::string help = table.help_text();
  for (const OptionSpec& spec : table.specs()) {
    EXPECT_NE(help.find("--" + spec.key + " "), std::string::npos) << spec.key;
    EXPECT_FALSE(spec.help.empty()) << spec.key;
  }
  EXPECT_NE(help.find("--train.steps N (=100)"), std::string::npos);
}

TEST_F(ConfigTest, ConfigFileProblemsNameTheFile) {
  // A directory is no configuration: it used to read as an empty file, training the defaults.
  expect_error([&] { parse_command_line(table, {"--config", dir.path("")}); }, ExitCode::kUsage,
               {"--config", "a directory"});
  // A key given twice in one file: which was meant?
  dir.write("twice.ini", "[model]\nhidden_size = 64\nhidden_size = 128\n");
  expect_error([&] { parse_command_line(table, {"--config", dir.path("twice.ini")}); }, ExitCode::kUsage,
               {"twice.ini", "model.hidden_size is given twice"});
  // On the command line the last one wins.
  EXPECT_EQ(parse({"--model.hidden_size", "96", "--model.hidden_size", "128"}).get_int("model.hidden_size", 1), 128);
}

TEST_F(ConfigTest, AByteOrderMarkIsSkipped) {
  dir.write("bom.ini", "\xEF\xBB\xBF[model]\nhidden_size = 96\n");
  const Options options = parse_command_line(table, {"--config", dir.path("bom.ini")}).options;
  EXPECT_EQ(options.get_int("model.hidden_size", 1), 96);
}
