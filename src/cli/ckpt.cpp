// dstrain ckpt inspect: what a checkpoint holds; dstrain ckpt verify: whether its data are intact;
// import-hf and export-hf (ckpt_hf.cpp): Hugging Face weights in and out.
#include "ckpt.h"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <variant>

#include "ckpt_hf.h"
#include "dstrain/ckpt/checkpoint_model.h"
#include "dstrain/ckpt/checkpoint_reader.h"
#include "dstrain/core/error.h"

namespace dstrain {
namespace {

const char* kCkptUsage =
    "usage: dstrain ckpt inspect FILE    every /trainer attribute, every tensor with shape and dtype, configuration\n"
    "       dstrain ckpt verify FILE     read every dataset and check it against its checksum\n"
    "       dstrain ckpt import-hf PATH --config FILE.ini --output CKPT.h5    Hugging Face safetensors into a checkpoint\n"
    "       dstrain ckpt export-hf FILE --output DIR [--dtype D] [--max-shard-size SIZE]    a checkpoint's model as safetensors\n"
    "FILE is a checkpoint, or a checkpoint directory (its latest). dstrain ckpt import-hf --help (export-hf --help)\n"
    "say more.\n";

// A value of /trainer in `ckpt inspect`: a text's further lines (model_shape's) aligned under its
// first, `indent` columns in.
std::string value_text(int64_t value, size_t) { return std::to_string(value); }
std::string value_text(uint64_t value, size_t) { return std::to_string(value); }
std::string value_text(double value, size_t) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}
std::string value_text(const std::string& value, size_t indent) {
  std::string text = value.substr(0, value.find_last_not_of('\n') + 1);  // model_shape's ends in one
  for (size_t at = text.find('\n'); at != std::string::npos; at = text.find('\n', at + 1))
    text.insert(at + 1, indent, ' ');
  return text;
}

// Every attribute of /trainer as "name = value", so that one added to the format shows too; the
// configuration (a whole INI file) is left to the end of the output.
void print_state_fields(const CheckpointState& s) {
  std::printf("\n  /trainer:\n");
  for (const StateField& field : checkpoint_state_fields()) {
    if (std::string(field.name) == "config") continue;
    const size_t indent = 4 + std::string(field.name).size() + 3;  // "    name = "
    const std::string value = std::visit([&](auto member) { return value_text(s.*member, indent); }, field.member);
    std::printf("    %s = %s\n", field.name, value.c_str());
  }
}

int inspect(const CheckpointReader& r) {
  const CheckpointState& s = r.state();
  std::printf("%s\n  step %lld, %llu samples (%llu tokens) consumed, %llu optimizer steps\n", r.path().c_str(),
              static_cast<long long>(s.step), static_cast<unsigned long long>(s.consumed_samples),
              static_cast<unsigned long long>(s.tokens), static_cast<unsigned long long>(s.optimizer_steps));
  const ParallelConfig layout = checkpoint_layout(s.config);
  const std::string experts = layout.ep > 1 ? " (experts over ep " + std::to_string(layout.ep) + ")" : "";
  const std::string tensors = layout.tp > 1 ? "tp " + std::to_string(layout.tp) + " x " : "";
  std::printf("  written by %llu ranks: %sdp %llu x pp %llu%s, schedule %s, %llu chunk(s) per stage, layers per "
              "virtual stage %s\n",
              static_cast<unsigned long long>(s.world_size), tensors.c_str(), static_cast<unsigned long long>(s.dp),
              static_cast<unsigned long long>(s.pp), experts.c_str(), s.schedule.c_str(),
              static_cast<unsigned long long>(s.virtual_stages), s.stage_layers.c_str());
  std::printf("  global batch %llu x %llu tokens; corpus %s (fingerprint %s, tokenizer %s)\n",
              static_cast<unsigned long long>(s.global_batch), static_cast<unsigned long long>(s.seq_len),
              s.corpus_path.c_str(), s.corpus_checksum.c_str(),
              s.tokenizer.empty() ? "not recorded" : s.tokenizer.c_str());
  if (s.loss_scale > 0)
    std::printf("  fp16 loss scale %g (%g clean steps, %g skipped)\n", s.loss_scale, s.loss_scale_clean_steps,
                s.skipped_steps);
  print_state_fields(s);
  int64_t total = 0;
  std::printf("\n  %-64s %-10s %-16s %12s\n", "dataset", "dtype", "shape", "bytes");
  for (const CheckpointReader::DatasetInfo& d : r.datasets()) {
    int64_t bytes = static_cast<int64_t>(c10::elementSize(d.dtype));
    for (int64_t n : d.shape) bytes *= n;
    total += bytes;
    std::printf("  %-64s %-10s %-16s %12lld\n", d.name.c_str(), dtype_name(d.dtype), shape_text(d.shape).c_str(),
                static_cast<long long>(bytes));
  }
  std::printf("\n  %zu datasets, %.1f MB\n\nconfiguration:\n%s", r.datasets().size(), static_cast<double>(total) / 1e6,
              s.config.c_str());
  return 0;
}

int verify(const CheckpointReader& r) {
  const std::vector<std::string> bad = r.verify();
  if (bad.empty()) {
    std::printf("%s: all %zu datasets match their checksums\n", r.path().c_str(), r.datasets().size());
    return 0;
  }
  std::string message = std::to_string(bad.size()) + " of " + std::to_string(r.datasets().size()) +
                        " datasets do not match their checksums:";
  for (const std::string& b : bad) message += "\n  " + b;
  throw Error(ExitCode::kCheckpoint, message);
}

}  // namespace

int ckpt_command(const std::vector<std::string>& args) {
  const bool help = std::find(args.begin(), args.end(), "--help") != args.end() ||
                    std::find(args.begin(), args.end(), "-h") != args.end();
  if (help && (args.size() == 1 || args[0] == "inspect" || args[0] == "verify")) {
    std::cout << kCkptUsage;
    return 0;
  }
  if (!args.empty() && args[0] == "import-hf") return import_hf_command({args.begin() + 1, args.end()});
  if (!args.empty() && args[0] == "export-hf") return export_hf_command({args.begin() + 1, args.end()});
  if (args.size() != 2 || (args[0] != "inspect" && args[0] != "verify"))
    throw Error(ExitCode::kUsage,
                std::string("ckpt: expected inspect FILE, verify FILE, import-hf PATH ... or export-hf FILE ...") +
                    (args.size() > 2 ? " (unexpected: " + args[2] + ")" : "") + "\n" + kCkptUsage);
  const CheckpointReader reader(resolve_checkpoint(args[1], "CKPT"));
  return args[0] == "inspect" ? inspect(reader) : verify(reader);
}

}  // namespace dstrain
