#include "inference_model.h"

#include <filesystem>

#include "dstrain/ckpt/checkpoint_model.h"
#include "dstrain/ckpt/checkpoint_reader.h"
#include "dstrain/core/accelerator.h"
#include "dstrain/core/error.h"
#include "dstrain/train/stage_builder.h"
#include "dstrain/train/train_config.h"

namespace dstrain {
namespace {

// The tokenizer `given` by --tokenizer (empty: none) for a model whose corpus's tokenizer the
// checkpoint names `recorded` (empty: not recorded). Anything but byte must be given, since the
// checkpoint keeps a name, not the file; where the name fixes the token ids (byte, a
// tokenizer.json's hash) another tokenizer is refused.
std::unique_ptr<Tokenizer> tokenizer_of_model(const std::string& given, const std::string& recorded) {
  if (given.empty() && !recorded.empty() && recorded != "byte")
    throw config_error("--tokenizer", "", "the model was trained on tokens of " + recorded + ": give that tokenizer.json");
  std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(given.empty() ? "byte" : given);
  const std::string trained_on = tokenizer_identity(recorded);
  if (!trained_on.empty() && tokenizer_identity(tokenizer->name()) != trained_on)
    throw config_error("--tokenizer", given, "the model was trained on tokens of " + recorded + ", not of " +
                                                 tokenizer->name());
  return tokenizer;
}

// The command runs the whole model on one process: of the training configuration only the model's
// settings mean anything to it. (A layout such as --parallel.ep would otherwise pass in silence.)
void refuse_settings_beyond_the_model(const std::vector<std::string>& overrides, const std::string& command) {
  for (const std::string& arg : overrides) {
    if (arg.rfind("--", 0) != 0) continue;
    const std::string key = arg.substr(2, arg.find('=') == std::string::npos ? std::string::npos : arg.find('=') - 2);
    if (key.find('.') != std::string::npos && key.rfind("model.", 0) != 0)
      throw Error(ExitCode::kUsage, command + ": --" + key + " is not a setting of " + command +
                                        ", which runs the whole model on one process: besides its own options it "
                                        "takes --model.* settings only (see dstrain " + command + " --help)");
  }
}

// --device: auto when not given.
DeviceRequest device_option(const CommandArgs& parsed) {
  if (!parsed.own.count("device")) return DeviceRequest::kAuto;
  const std::string& name = parsed.own.at("device");
  for (const auto& [text, request] : device_request_names())
    if (text == name) return request;
  throw config_error("--device", name, "expected cpu, cuda or auto");
}

// The run a checkpoint belongs to: RUN/checkpoints/step_N.h5 → RUN; else the file's own name.
std::string run_name_of(const std::string& checkpoint) {
  const std::filesystem::path path = std::filesystem::absolute(checkpoint);
  const std::filesystem::path folder = path.parent_path();
  if (folder.filename() == "checkpoints" && !folder.parent_path().filename().empty())
    return folder.parent_path().filename().string();
  return path.stem().string();
}

}  // namespace

InferenceModel load_inference_model(const CommandArgs& parsed, const std::string& command) {
  refuse_settings_beyond_the_model(parsed.overrides, command);
  const DeviceRequest requested = device_option(parsed);
  if (requested == DeviceRequest::kCuda && accel::device_count() == 0)
    throw config_error("--device", "cuda", "no GPU here (or a LibTorch without CUDA)");
  InferenceModel loaded;
  loaded.device = computes_on_gpu(requested) ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  loaded.checkpoint = resolve_checkpoint(parsed.own.at("ckpt"), "--ckpt");
  loaded.run_name = run_name_of(loaded.checkpoint);
  const CheckpointReader reader(loaded.checkpoint);
  loaded.step = reader.state().step;
  loaded.tokenizer =
      tokenizer_of_model(parsed.own.count("tokenizer") ? parsed.own.at("tokenizer") : "", reader.state().tokenizer);
  OptionTable table = train_option_table();
  Options options = checkpoint_options(table, loaded.checkpoint, parsed.overrides);
  const ModelConfig model_config = read_model_config(options);
  if (model_config.vocab_size < static_cast<int64_t>(loaded.tokenizer->vocab_size()))
    throw config_error("--tokenizer", loaded.tokenizer->name(),
                       "its vocabulary (" + std::to_string(loaded.tokenizer->vocab_size()) +
                           ") is larger than the model's (" + std::to_string(model_config.vocab_size) + ")");
  // dstrain's kernels and the grouped products where they apply; nothing recomputed (no graph).
  loaded.model = CausalLM(model_config, LayerSlice::whole(model_config), compute_options(LoopConfig{}));
  load_model_parameters(reader, sorted_parameters(*loaded.model));
  loaded.model->to(loaded.device);
  return loaded;
}

}  // namespace dstrain
