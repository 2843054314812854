// Configuration: INI files with sections, every key overridable on the command line as
// `--section.key value`. Each module declares its own keys (with default and meaning) into one
// OptionTable and reads them back, typed and checked, from the parsed Options; core knows the
// mechanism, not the keys.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace boost::program_options {
class options_description;
class variables_map;
}  // namespace boost::program_options

namespace dstrain {

enum class OptionKind { kString, kInt, kFloat, kBool };

// The values of an enum by the names options, logs and files give them: each module's reader
// parses an option once into its enum through such a table, and writes the name back from it.
template <typename Enum>
using EnumNames = std::vector<std::pair<std::string, Enum>>;

// The name `names` gives `value` ("?" for a value it lacks).
template <typename Enum>
const std::string& name_of(const EnumNames<Enum>& names, Enum value) {
  static const std::string unknown = "?";
  for (const auto& [name, named] : names)
    if (named == value) return name;
  return unknown;
}

struct OptionSpec {
  std::string key;            // "train.steps"
  OptionKind kind;
  std::string default_value;  // as it would be written in an INI file
  std::string help;
};

class OptionTable {
 public:
  void add(const std::string& key, OptionKind kind, const std::string& default_value,
           const std::string& help);
  const std::vector<OptionSpec>& specs() const { return specs_; }
  const OptionSpec* find(const std::string& key) const;
  // "  --train.steps N (=100)   meaning", grouped by section: what --help prints.
  std::string help_text() const;

 private:
  std::vector<OptionSpec> specs_;
};

// Parsed values, all still text; the typed getters check and name the key on error.
class Options {
 public:
  Options() = default;
  Options(const OptionTable* table, std::map<std::string, std::string> values)
      : table_(table), values_(std::move(values)) {}

  const std::string& raw(const std::string& key) const;
  std::string get_string(const std::string& key) const { return raw(key); }
  int64_t get_int(const std::string& key, int64_t min_value, int64_t max_value = INT64_MAX) const;
  double get_float(const std::string& key, double min_value, double max_value) const;
  bool get_bool(const std::string& key) const;
  // One of `names`' values; any other text is Error(kUsage) listing the names.
  template <typename Enum>
  Enum get_enum(const std::string& key, const EnumNames<Enum>& names) const {
    std::vector<std::string> choices;
    for (const auto& named : names) choices.push_back(named.first);
    return names[index_of_choice(key, choices)].second;
  }

  // Derived values (a resolved parallel.dp, say) so that config.ini records what actually ran.
  void set(const std::string& key, const std::string& value);
  // Every key, grouped by section, in the table's order: a file `--config` can read back.
  std::string to_ini() const;

 private:
  size_t index_of_choice(const std::string& key, const std::vector<std::string>& choices) const;

  const OptionTable* table_ = nullptr;
  std::map<std::string, std::string> values_;
};

// Command line (highest precedence) over the INI file named by `--config` over the defaults.
// Throws Error(kUsage) naming the file or option for unknown keys, missing values and the like.
// `--help` is reported through `help_requested` instead of an error.
struct ParsedCommandLine {
  Options options;
  bool help_requested = false;
  std::string config_file;  // empty when none was given
};
ParsedCommandLine parse_command_line(const OptionTable& table, const std::vector<std::string>& args);

// The integers of a comma-separated list such as "9,8,8,7" into *values; false when an item is
// empty, not an integer, or out of range (the caller names the option).
bool parse_integer_list(const std::string& text, std::vector<int64_t>* values);

// The options of a command with options of its own (prep, data import, pipeline simulate) into
// `given`. Names are exact, without Boost's default guessing of abbreviations: `--threads` is not
// `--thread` (an INI file takes no abbreviations either). An argument that is no option's value
// is refused (Boost would drop it). Errors are usage errors naming `command`.
void parse_command_options(const std::vector<std::string>& args,
                           const boost::program_options::options_description& description,
                           boost::program_options::variables_map* given, const std::string& command);

}  // namespace dstrain
