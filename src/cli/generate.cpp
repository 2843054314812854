#include "generate.h"

#include <chrono>
#include <cstdio>
#include <iostream>

#include "command_args.h"
#include "dstrain/core/error.h"
#include "dstrain/data/tokenizer.h"
#include "dstrain/model/generation.h"
#include "inference_model.h"

namespace dstrain {
namespace {

const char* kGenerateUsage =
    "usage: dstrain generate --ckpt CKPT --prompt TEXT [options] [--model.key value ...]\n"
    "\n"
    "Continues TEXT with the model of checkpoint CKPT (a file, or a checkpoint directory: its latest),\n"
    "written by any layout. Prints the prompt and its continuation; a summary goes to standard error.\n"
    "\n"
    "  --ckpt CKPT             checkpoint file or directory\n"
    "  --prompt TEXT           the text to continue\n"
    "  --max-new-tokens N      tokens to generate at most (128); generation also stops at the end-of-document\n"
    "                          token and at model.max_seq_len\n"
    "  --temperature T         divides the logits (1.0); 0: greedy decoding, deterministic\n"
    "  --top-k K               sample among the K most likely tokens (0: all)\n"
    "  --top-p P               sample among the fewest most likely tokens whose probability reaches P (1.0: all)\n"
    "  --seed S                seed of the sampling (0)\n"
    "  --device D              cpu, cuda (GPU 0) or auto (cuda when there is a GPU; the default)\n"
    "  --tokenizer NAME        the tokenizer of the model's corpus: byte (the default), or its tokenizer.json\n"
    "                          (the checkpoint records which; generate refuses another)\n";

}  // namespace

int generate_command(const std::vector<std::string>& args) {
  const CommandArgs parsed =
      split_command_args(args,
                         {"ckpt", "prompt", "max-new-tokens", "temperature", "top-k", "top-p", "seed", "device",
                          "tokenizer"},
                         "generate");
  if (parsed.help) {
    std::cout << kGenerateUsage;
    return 0;
  }
  for (const char* required : {"ckpt", "prompt"})
    if (!parsed.own.count(required))
      throw Error(ExitCode::kUsage, std::string("generate: give --") + required + " (see dstrain generate --help)");
  SamplingOptions sampling;
  sampling.max_new_tokens = static_cast<int64_t>(number_option(parsed, "max-new-tokens", 128, 1, 1e9, true));
  sampling.temperature = number_option(parsed, "temperature", 1.0, 0, 1e6, false);
  sampling.top_k = static_cast<int64_t>(number_option(parsed, "top-k", 0, 0, 1e9, true));
  sampling.top_p = number_option(parsed, "top-p", 1.0, 1e-9, 1.0, false);
  sampling.seed = static_cast<uint64_t>(number_option(parsed, "seed", 0, 0, 9e15, true));
  const InferenceModel loaded = load_inference_model(parsed, "generate");
  const Tokenizer* tokenizer = loaded.tokenizer.get();
  const ModelConfig& model_config = loaded.model->config();
  const std::string& checkpoint = loaded.checkpoint;
  const torch::Device device = loaded.device;
  sampling.stop_token = tokenizer->eod_id();
  const CachedDecoder decoder(loaded.model);

  // The prompt starts as the tokenizer starts every document (DeepSeek's beginning token).
  std::vector<int64_t> prompt;
  if (const std::optional<uint32_t> bos = tokenizer->bos_id()) prompt.push_back(*bos);
  for (uint32_t id : tokenizer->encode(parsed.own.at("prompt"))) prompt.push_back(id);
  if (prompt.empty() || static_cast<int64_t>(prompt.size()) >= model_config.max_seq_len)
    throw config_error("--prompt", "(" + std::to_string(prompt.size()) + " tokens)",
                       "expected 1 to model.max_seq_len - 1 = " + std::to_string(model_config.max_seq_len - 1) +
                           " tokens");
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int64_t> tokens = generate(decoder, prompt, sampling);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<uint32_t> text_ids;
  for (int64_t id : tokens)
    if (id != sampling.stop_token) text_ids.push_back(static_cast<uint32_t>(id));
  std::cout << parsed.own.at("prompt") << tokenizer->decode(text_ids) << std::endl;
  const bool ended = !tokens.empty() && tokens.back() == sampling.stop_token;
  const bool at_limit = !ended && static_cast<int64_t>(tokens.size()) < sampling.max_new_tokens;
  const std::string why_stopped =
      ended ? ", ended at the end-of-document token"
      : at_limit ? ", stopped at model.max_seq_len = " + std::to_string(model_config.max_seq_len) + " positions"
                 : "";
  std::fprintf(stderr, "generated %zu tokens in %.2f s (%.1f tokens/s) on %s from %s (step %lld)%s\n", tokens.size(),
               seconds, seconds > 0 ? static_cast<double>(tokens.size()) / seconds : 0.0, device.str().c_str(),
               checkpoint.c_str(), static_cast<long long>(loaded.step), why_stopped.c_str());
  return 0;
}

}  // namespace dstrain
