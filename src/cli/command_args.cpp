#include "command_args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "dstrain/ckpt/checkpoint_model.h"
#include "dstrain/ckpt/checkpoint_reader.h"
#include "dstrain/core/error.h"

namespace dstrain {

CommandArgs split_command_args(const std::vector<std::string>& args, const std::set<std::string>& own,
                               const std::string& command) {
  CommandArgs out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      out.help = true;
      continue;
    }
    if (arg.rfind("--", 0) == 0) {
      const size_t equals = arg.find('=');
      const std::string name = arg.substr(2, equals == std::string::npos ? std::string::npos : equals - 2);
      if (own.count(name)) {
        if (equals != std::string::npos) {
          out.own[name] = arg.substr(equals + 1);
        } else if (i + 1 < args.size()) {
          out.own[name] = args[++i];
        } else {
          throw Error(ExitCode::kUsage, command + ": --" + name + " needs a value (see dstrain " + command + " --help)");
        }
        continue;
      }
    }
    out.overrides.push_back(arg);
  }
  return out;
}

double number_option(const CommandArgs& args, const std::string& name, double fallback, double min_value,
                     double max_value, bool integer) {
  auto it = args.own.find(name);
  if (it == args.own.end()) return fallback;
  const std::string& text = it->second;
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  const bool ok = !text.empty() && *end == '\0' && errno == 0 && std::isfinite(value) &&
                  (!integer || value == std::floor(value)) && value >= min_value && value <= max_value;
  if (!ok) {
    std::ostringstream expected;
    expected << "expected " << (integer ? "an integer" : "a number") << " between " << min_value << " and "
             << max_value;
    throw config_error("--" + name, text, expected.str());
  }
  return value;
}

Options checkpoint_options(const OptionTable& table, const std::string& checkpoint,
                           const std::vector<std::string>& overrides) {
  const CheckpointReader reader(checkpoint);
  std::vector<std::string> args = checkpoint_config_arguments(reader.state().config);
  args.insert(args.end(), overrides.begin(), overrides.end());
  ParsedCommandLine parsed = parse_command_line(table, args);
  return parsed.options;
}

}  // namespace dstrain
