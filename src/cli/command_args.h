// The command lines of `dstrain eval` and `dstrain generate`: a few options of the command's own
// (`--ckpt FILE`, `--prompt TEXT`, ...) mixed with `--section.key value` overrides of the
// checkpoint's training configuration.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "dstrain/core/config.h"

namespace dstrain {

struct CommandArgs {
  std::map<std::string, std::string> own;  // "ckpt" → "runs/x/checkpoints"
  std::vector<std::string> overrides;      // the rest, for parse_command_line
  bool help = false;
};

// `own`: option names without the dashes. Throws Error(kUsage) naming the option when one of the
// command's own lacks its value.
CommandArgs split_command_args(const std::vector<std::string>& args, const std::set<std::string>& own,
                               const std::string& command);

// The number `--name` gives, checked to lie in [min_value, max_value] (and to be whole when
// `integer`); `fallback` when not given. Throws Error(kUsage) naming the option and its value.
double number_option(const CommandArgs& args, const std::string& name, double fallback, double min_value,
                     double max_value, bool integer);

// The training configuration stored in the checkpoint file `checkpoint`, overridden by
// `overrides` (later wins), as values of `table` (train_option_table(), which must outlive them).
// Throws Error(kCheckpoint) for a missing or damaged checkpoint, Error(kUsage) for bad overrides.
Options checkpoint_options(const OptionTable& table, const std::string& checkpoint,
                           const std::vector<std::string>& overrides);

}  // namespace dstrain
