// `dstrain ckpt import-hf` and `dstrain ckpt export-hf`: Hugging Face safetensors weights into a
// checkpoint, and a checkpoint's model out as safetensors with a config.json.
#pragma once

#include <string>
#include <vector>

namespace dstrain {

extern const char* kImportHfUsage;
extern const char* kExportHfUsage;

// `args` after the subcommand's name.
int import_hf_command(const std::vector<std::string>& args);
int export_hf_command(const std::vector<std::string>& args);

}  // namespace dstrain
