// dstrain generate from models trained to memorise a short text, on several layouts, and from a
// DeepSeek-V3-shaped model (MLA and MoE) against greedy decoding by full forward passes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "dstrain/ckpt/checkpoint_model.h"
#include "dstrain/ckpt/checkpoint_reader.h"
#include "dstrain/core/config.h"
#include "dstrain/data/byte_level.h"
#include "dstrain/data/tokenizer.h"
#include "dstrain/model/transformer.h"
#include "dstrain/train/train_config.h"
#include "e2e_util.h"

using namespace dstrain::e2e;

namespace {

const std::string kText = "the quick brown fox jumps over the lazy dog; ";

// A corpus of one document: kText over and over.
const std::string& memorise_corpus() {
  static const std::string corpus = [] {
    const std::string dir = scratch_dir("generate-corpus-" + std::to_string(getpid()));
    std::ofstream text(dir + "/fox.txt");
    for (int i = 0; i < 300; ++i) text << kText;
    text.close();
    RunOutput prep = run_dstrain(0, {"prep", "--input", dir + "/fox.txt", "--output", dir + "/fox.h5"});
    EXPECT_EQ(prep.exit_code, 0) << prep.output;
    return dir + "/fox.h5";
  }();
  return corpus;
}

std::string train_memoriser(int ranks, const std::string& name, std::vector<std::string> layout) {
  const std::string dir = scratch_dir(name);
  std::vector<std::string> args = {"train", "--config", std::string(DSTRAIN_SOURCE_DIR) + "/input/tiny.ini",
                                   "--run.dir", dir, "--data.train", memorise_corpus(), "--train.device", "cpu",
                                   "--train.steps", "150", "--train.global_batch", "4", "--train.micro_batch", "1",
                                   "--train.seq_len", "64",  // every position generation will use
                                   "--optim.lr", "1e-2", "--optim.min_lr", "1e-3", "--log.interval", "50",
                                   "--ckpt.interval", "150"};
  args.insert(args.end(), layout.begin(), layout.end());
  RunOutput run = run_dstrain(ranks, args);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  return dir + "/checkpoints";
}

RunOutput generate(const std::string& ckpt, std::vector<std::string> extra) {
  std::vector<std::string> args = {"generate", "--ckpt", ckpt, "--prompt", "the quick", "--device", "cpu",
                                   "--max-new-tokens", "40"};
  args.insert(args.end(), extra.begin(), extra.end());
  return run_dstrain(0, args);
}

// Byte-level BPE: the 256 bytes, two merges and an end-of-document token (258 < tiny's 264).
nlohmann::json small_bpe_tokenizer() {
  nlohmann::json vocab = nlohmann::json::object();
  const auto& chars = dstrain::byte_level::byte_to_chars();
  for (int b = 0; b < 256; ++b) vocab[chars[b]] = b;
  vocab["th"] = 256;
  vocab["the"] = 257;
  return {{"added_tokens", {{{"id", 258}, {"content", "<|endoftext|>"}, {"special", true}}}},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"t h", "th e"}}}}};
}

// Standard output's text: the prompt and its continuation (the summary goes to standard error,
// which run_dstrain mixes in after it).
std::string generated_text(const RunOutput& run) { return run.output.substr(0, run.output.find("\ngenerated ")); }

}  // namespace

TEST(Generate, GreedyReproducesTheMemorisedTextFromAnyLayout) {
  // The prompt and 40 tokens: the sentence from its start, and its start again.
  const std::string expected = (kText + kText).substr(0, std::string("the quick").size() + 40);
  const std::string one = train_memoriser(1, "generate-dp1", {});
  RunOutput a = generate(one, {"--temperature", "0"});
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::string text = generated_text(a);
  EXPECT_EQ(text, expected) << a.output;
  // Deterministic.
  RunOutput again = generate(one, {"--temperature", "0"});
  EXPECT_EQ(generated_text(again), text);
  // Checkpoints of other layouts: the same model within float tolerance, the same text.
  for (auto [ranks, layout] : std::vector<std::pair<int, std::vector<std::string>>>{
           {2, {"--parallel.pp", "2"}}, {2, {"--parallel.dp", "2"}}}) {
    const std::string ckpt = train_memoriser(ranks, "generate-" + layout[0].substr(11) + "2", layout);
    RunOutput b = generate(ckpt, {"--temperature", "0"});
    ASSERT_EQ(b.exit_code, 0) << b.output;
    EXPECT_EQ(generated_text(b), expected) << layout[0] << ": " << b.output;
  }
}

TEST(Generate, SamplingIsSeededAndBadOptionsAreClearErrors) {
  const std::string ckpt = train_memoriser(1, "generate-sampling", {"--train.steps", "20", "--ckpt.interval", "20"});
  RunOutput a = generate(ckpt, {"--temperature", "1.5", "--top-k", "50", "--top-p", "0.95", "--seed", "3"});
  RunOutput b = generate(ckpt, {"--temperature", "1.5", "--top-k", "50", "--top-p", "0.95", "--seed", "3"});
  RunOutput c = generate(ckpt, {"--temperature", "1.5", "--top-k", "50", "--top-p", "0.95", "--seed", "4"});
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(generated_text(a), generated_text(b));
  EXPECT_NE(generated_text(a), generated_text(c));

  // The model's positions end the text before --max-new-tokens does, and the summary says so.
  RunOutput long_text = run_dstrain(0, {"generate", "--ckpt", ckpt, "--prompt", "the quick", "--device", "cpu",
                                        "--max-new-tokens", "100"});
  ASSERT_EQ(long_text.exit_code, 0) << long_text.output;
  // 64 positions: the 9 of the prompt and 55 new tokens fed back, and the last one, never fed back.
  EXPECT_NE(long_text.output.find("generated 56 tokens"), std::string::npos) << long_text.output;
  EXPECT_NE(long_text.output.find("stopped at model.max_seq_len = 64 positions"), std::string::npos) << long_text.output;

  RunOutput bad_p = generate(ckpt, {"--top-p", "1.5"});
  EXPECT_EQ(bad_p.exit_code, 2) << bad_p.output;
  EXPECT_NE(bad_p.output.find("--top-p = 1.5"), std::string::npos) << bad_p.output;
  RunOutput long_prompt = run_dstrain(0, {"generate", "--ckpt", ckpt, "--prompt", std::string(100, 'x')});
  EXPECT_EQ(long_prompt.exit_code, 2) << long_prompt.output;
  EXPECT_NE(long_prompt.output.find("--prompt"), std::string::npos) << long_prompt.output;
  RunOutput no_ckpt = run_dstrain(0, {"generate", "--ckpt", "/nonexistent", "--prompt", "x"});
  EXPECT_EQ(no_ckpt.exit_code, 4) << no_ckpt.output;
  // A layout means nothing to one process running the whole model: refused, not ignored.
  RunOutput layout = generate(ckpt, {"--parallel.ep", "3"});
  EXPECT_EQ(layout.exit_code, 2) << layout.output;
  EXPECT_NE(layout.output.find("--parallel.ep is not a setting of generate"), std::string::npos) << layout.output;
}

// A model trained on a BPE corpus: generate needs that tokenizer.json (the checkpoint records its
// name and hash) and refuses another, and eval refuses a corpus of another tokenizer.
TEST(Generate, TheTokenizerMustBeTheOneTheModelWasTrainedOn) {
  const std::string dir = scratch_dir("generate-bpe");
  const nlohmann::json tokenizer = small_bpe_tokenizer();
  std::ofstream(dir + "/tok.json") << tokenizer.dump();
  std::ofstream text(dir + "/fox.txt");
  for (int i = 0; i < 100; ++i) text << kText;
  text.close();
  RunOutput prep = run_dstrain(0, {"prep", "--input", dir + "/fox.txt", "--output", dir + "/fox.h5", "--tokenizer",
                                   dir + "/tok.json"});
  ASSERT_EQ(prep.exit_code, 0) << prep.output;
  RunOutput train = run_dstrain(0, {"train", "--config", std::string(DSTRAIN_SOURCE_DIR) + "/input/tiny.ini",
                                    "--run.dir", dir + "/run", "--data.train", dir + "/fox.h5", "--train.device",
                                    "cpu", "--train.steps", "2", "--ckpt.interval", "2"});
  ASSERT_EQ(train.exit_code, 0) << train.output;
  const std::string ckpt = dir + "/run/checkpoints";

  RunOutput without = generate(ckpt, {});
  EXPECT_EQ(without.exit_code, 2) << without.output;
  EXPECT_NE(without.output.find("--tokenizer = \"\": the model was trained on tokens of bpe:tok.json:"),
            std::string::npos) << without.output;
  RunOutput bytes = generate(ckpt, {"--tokenizer", "byte"});
  EXPECT_EQ(bytes.exit_code, 2) << bytes.output;
  EXPECT_NE(bytes.output.find(", not of byte"), std::string::npos) << bytes.output;
  RunOutput with = generate(ckpt, {"--tokenizer", dir + "/tok.json"});
  EXPECT_EQ(with.exit_code, 0) << with.output;
  EXPECT_EQ(generated_text(with).rfind("the quick", 0), 0u) << with.output;
  // The same tokenizer.json under another name is the same tokenizer (its content's hash).
  std::ofstream(dir + "/renamed.json") << tokenizer.dump();
  RunOutput renamed = generate(ckpt, {"--tokenizer", dir + "/renamed.json"});
  EXPECT_EQ(renamed.exit_code, 0) << renamed.output;

  RunOutput eval = run_dstrain(0, {"eval", "--ckpt", ckpt, "--data", memorise_corpus()});
  EXPECT_EQ(eval.exit_code, 3) << eval.output;
  EXPECT_NE(eval.output.find(memorise_corpus() + ": tokenized with byte, the model was trained on bpe:tok.json:"),
            std::string::npos) << eval.output;
}

// A tokenizer whose post-processor starts each document with a beginning token (as DeepSeek's
// starts it with <｜begin▁of▁sentence｜>): prep puts the token before every document, and
// generate before the prompt. A model that memorised documents of one sentence then writes that
// sentence from an empty prompt, and stops at the end-of-document token.
TEST(Generate, PromptsStartWithTheTokenizersBeginningToken) {
  const std::string dir = scratch_dir("generate-bos");
  nlohmann::json tokenizer = small_bpe_tokenizer();
  tokenizer["added_tokens"].push_back({{"id", 259}, {"content", "<s>"}, {"special", true}});
  tokenizer["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}}};
  std::ofstream(dir + "/tok.json") << tokenizer.dump();
  std::ofstream documents(dir + "/fox.jsonl");
  for (int i = 0; i < 200; ++i) documents << nlohmann::json{{"text", kText}}.dump() << "\n";
  documents.close();
  RunOutput prep = run_dstrain(0, {"prep", "--input", dir + "/fox.jsonl", "--output", dir + "/fox.h5", "--tokenizer",
                                   dir + "/tok.json"});
  ASSERT_EQ(prep.exit_code, 0) << prep.output;
  RunOutput train = run_dstrain(
      0, {"train", "--config", std::string(DSTRAIN_SOURCE_DIR) + "/input/tiny.ini", "--run.dir", dir + "/run",
          "--data.train", dir + "/fox.h5", "--train.device", "cpu", "--train.steps", "150", "--train.global_batch", "4",
          "--train.micro_batch", "1", "--train.seq_len", "64", "--optim.lr", "1e-2", "--optim.min_lr", "1e-3",
          "--log.interval", "50", "--ckpt.interval", "150"});
  ASSERT_EQ(train.exit_code, 0) << train.output;
  const std::string ckpt = dir + "/run/checkpoints";

  auto greedy = [&](const std::string& prompt) {
    return run_dstrain(0, {"generate", "--ckpt", ckpt, "--tokenizer", dir + "/tok.json", "--prompt", prompt,
                           "--device", "cpu", "--max-new-tokens", "60", "--temperature", "0"});
  };
  for (const std::string prompt : {"", "the quick"}) {
    RunOutput run = greedy(prompt);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_EQ(generated_text(run), kText) << "prompt \"" << prompt << "\": " << run.output;
    EXPECT_NE(run.output.find("ended at the end-of-document token"), std::string::npos) << run.output;
  }
}

// input/tiny-v3.ini (MLA with query compression, MoE with sigmoid group-limited routing and the
// balancing bias, a dense first layer) trained a few steps: greedy `dstrain generate` gives the
// same text twice, and the text of a greedy loop that runs the whole sequence through the
// checkpoint's model (eval mode, no cache) for every new token.
TEST(Generate, LatentAttentionMoEGreedyMatchesFullForwardDecoding) {
  const std::string ini = std::string(DSTRAIN_SOURCE_DIR) + "/input/tiny-v3.ini";
  const std::string dir = scratch_dir("generate-v3");
  RunOutput run = run_dstrain(1, {"train", "--config", ini, "--run.dir", dir, "--data.train", memorise_corpus(),
                                  "--train.device", "cpu", "--train.steps", "12", "--train.global_batch", "2",
                                  "--train.micro_batch", "1", "--train.seq_len", "64", "--ckpt.interval", "12",
                                  "--log.interval", "12"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::string ckpt = dir + "/checkpoints";
  RunOutput a = generate(ckpt, {"--temperature", "0"});
  ASSERT_EQ(a.exit_code, 0) << a.output;
  RunOutput again = generate(ckpt, {"--temperature", "0"});
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(generated_text(again), generated_text(a));

  // The same checkpoint through the model's full forward pass, one new token at a time.
  const dstrain::OptionTable table = dstrain::train_option_table();
  const dstrain::ModelConfig config =
      dstrain::read_model_config(dstrain::parse_command_line(table, {"--config", ini}).options);
  dstrain::CausalLM model(config, dstrain::LayerSlice::whole(config));
  dstrain::load_model_parameters(dstrain::CheckpointReader(ckpt + "/step_00000012.h5"),
                                 dstrain::sorted_parameters(*model));
  model->eval();
  const dstrain::ByteTokenizer bytes;
  std::vector<int64_t> ids;
  for (uint32_t id : bytes.encode("the quick")) ids.push_back(id);
  std::vector<uint32_t> continuation;
  torch::NoGradGuard no_grad;
  for (int i = 0; i < 40 && static_cast<int64_t>(ids.size()) < config.max_seq_len; ++i) {
    const int64_t token = model->forward(torch::tensor(ids, torch::kLong).unsqueeze(0))[0][-1].argmax().item<int64_t>();
    continuation.push_back(static_cast<uint32_t>(token));
    if (token == bytes.eod_id()) break;
    ids.push_back(token);
  }
  EXPECT_EQ(generated_text(a), "the quick" + bytes.decode(continuation)) << a.output;
}
