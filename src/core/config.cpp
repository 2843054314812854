#include "dstrain/core/config.h"

#include <boost/program_options.hpp>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

#include "dstrain/core/error.h"
#include "dstrain/core/files.h"

namespace po = boost::program_options;

namespace dstrain {
namespace {

const char* kind_placeholder(OptionKind kind) {
  switch (kind) {
    case OptionKind::kString: return "TEXT";
    case OptionKind::kInt: return "N";
    case OptionKind::kFloat: return "X";
    case OptionKind::kBool: return "BOOL";
  }
  return "";
}

bool parse_bool_literal(const std::string& text, bool* value) {
  static const std::set<std::string> truthy = {"true", "1", "yes", "on"};
  static const std::set<std::string> falsy = {"false", "0", "no", "off"};
  if (truthy.count(text)) { *value = true; return true; }
  if (falsy.count(text)) { *value = false; return true; }
  return false;
}

std::string section_of(const std::string& key) { return key.substr(0, key.find('.')); }

po::options_description make_description(const OptionTable& table) {
  po::options_description description;
  description.add_options()("help,h", "")("config", po::value<std::string>(), "");
  for (const OptionSpec& spec : table.specs()) {
    auto* value = po::value<std::string>();
    // A bare `--log.all_ranks` means true; `--log.all_ranks false` is joined in by the caller.
    if (spec.kind == OptionKind::kBool) value->implicit_value("true");
    description.add_options()(spec.key.c_str(), value, spec.help.c_str());
  }
  return description;
}

// Boost does not let an option with an implicit value take its value from the next token;
// join `--flag false` into `--flag=false` so that booleans read like every other option.
std::vector<std::string> join_bool_values(const OptionTable& table,
                                          const std::vector<std::string>& args) {
  std::vector<std::string> joined;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    bool literal = false;
    if (arg.rfind("--", 0) == 0 && arg.find('=') == std::string::npos && i + 1 < args.size()) {
      const OptionSpec* spec = table.find(arg.substr(2));
      if (spec && spec->kind == OptionKind::kBool && parse_bool_literal(args[i + 1], &literal)) {
        joined.push_back(arg + "=" + args[i + 1]);
        ++i;
        continue;
      }
    }
    joined.push_back(arg);
  }
  return joined;
}

}  // namespace

void OptionTable::add(const std::string& key, OptionKind kind, const std::string& default_value,
                      const std::string& help) {
  if (key.find('.') == std::string::npos || find(key))
    throw Error(ExitCode::kInternal, "option table: bad or duplicate key " + key);
  specs_.push_back({key, kind, default_value, help});
}

const OptionSpec* OptionTable::find(const std::string& key) const {
  for (const OptionSpec& spec : specs_)
    if (spec.key == key) return &spec;
  return nullptr;
}

std::string OptionTable::help_text() const {
  std::ostringstream out;
  std::string section;
  for (const OptionSpec& spec : specs_) {
    if (section_of(spec.key) != section) {
      section = section_of(spec.key);
      out << "\n[" << section << "]\n";
    }
    std::string left = "  --" + spec.key + " " + kind_placeholder(spec.kind) + " (=" +
                       (spec.default_value.empty() ? "\"\"" : spec.default_value) + ")";
    out << std::left << std::setw(44) << left;
    if (left.size() >= 44) out << "\n" << std::string(44, ' ');
    out << spec.help << "\n";
  }
  return out.str();
}

const std::string& Options::raw(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) throw Error(ExitCode::kInternal, "option not declared: " + key);
  return it->second;
}

int64_t Options::get_int(const std::string& key, int64_t min_value, int64_t max_value) const {
  const std::string& text = raw(key);
  char* end = nullptr;
  errno = 0;
  long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE)
    throw config_error(key, text, "expected an integer");
  if (value < min_value || value > max_value) {
    std::string range = max_value == INT64_MAX
                            ? "at least " + std::to_string(min_value)
                            : "between " + std::to_string(min_value) + " and " + std::to_string(max_value);
    throw config_error(key, text, "expected an integer " + range);
  }
  return value;
}

double Options::get_float(const std::string& key, double min_value, double max_value) const {
  const std::string& text = raw(key);
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(value))
    throw config_error(key, text, "expected a number");
  if (value < min_value || value > max_value) {
    std::ostringstream range;
    range << "expected a number between " << min_value << " and " << max_value;
    throw config_error(key, text, range.str());
  }
  return value;
}

bool Options::get_bool(const std::string& key) const {
  bool value = false;
  if (!parse_bool_literal(raw(key), &value))
    throw config_error(key, raw(key), "expected true or false");
  return value;
}

size_t Options::index_of_choice(const std::string& key, const std::vector<std::string>& choices) const {
  const std::string& text = raw(key);
  for (size_t i = 0; i < choices.size(); ++i)
    if (text == choices[i]) return i;
  std::string allowed;
  for (const std::string& choice : choices) allowed += (allowed.empty() ? "" : ", ") + choice;
  throw config_error(key, text, "expected one of: " + allowed);
}

void Options::set(const std::string& key, const std::string& value) {
  raw(key);  // must be a declared key
  values_[key] = value;
}

std::string Options::to_ini() const {
  std::ostringstream out;
  std::string section;
  for (const OptionSpec& spec : table_->specs()) {
    std::string key_section = section_of(spec.key);
    if (key_section != section) {
      out << (section.empty() ? "" : "\n") << "[" << key_section << "]\n";
      section = key_section;
    }
    out << spec.key.substr(key_section.size() + 1) << " = " << raw(spec.key) << "\n";
  }
  return out.str();
}

namespace {

std::string unexpected_argument(const std::string& arg) {
  const bool ini = arg.size() > 4 && arg.compare(arg.size() - 4, 4, ".ini") == 0;
  return "unexpected argument '" + arg + "'" + (ini ? ": a configuration file is given as --config " + arg : "");
}

po::parsed_options parse_exact(const std::vector<std::string>& args, const po::options_description& description) {
  po::parsed_options parsed =
      po::command_line_parser(args)
          .options(description)
          .style(po::command_line_style::default_style & ~po::command_line_style::allow_guessing)
          .run();
  for (const po::option& option : parsed.options)
    if (option.position_key >= 0 || option.string_key.empty())  // nothing would read it
      throw po::error(unexpected_argument(option.original_tokens.empty() ? option.value.at(0)
                                                                          : option.original_tokens[0]));
  return parsed;
}

}  // namespace

void parse_command_options(const std::vector<std::string>& args, const po::options_description& description,
                           po::variables_map* given, const std::string& command) {
  try {
    po::store(parse_exact(args, description), *given);
    po::notify(*given);
  } catch (const po::error& e) {
    throw Error(ExitCode::kUsage, command + ": " + e.what() + " (see dstrain " + command + " --help)");
  }
}

namespace {

// The keys and values of an INI file. A directory, a missing file and a key given twice (which
// of the two was meant?) are errors naming the file; a UTF-8 byte-order mark, which some editors
// write, is skipped.
std::map<std::string, std::string> read_config_file(const std::string& path,
                                                    const po::options_description& description) {
  if (files::is_directory(path)) throw config_error("--config", path, "a directory; give a configuration file (.ini)");
  std::ifstream file(path, std::ios::binary);
  if (!file) throw config_error("--config", path, "cannot open this file for reading");
  std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) text.erase(0, 3);
  std::istringstream lines(text);
  po::variables_map from_file;
  try {
    po::store(po::parse_config_file(lines, description, /*allow_unregistered=*/false), from_file);
  } catch (const po::multiple_occurrences& e) {
    std::string key = e.get_option_name();
    key.erase(0, key.find_first_not_of('-'));
    throw Error(ExitCode::kUsage,
                path + ": " + key + " is given twice; keep one (on the command line the last one wins)");
  } catch (const po::error& e) {
    throw Error(ExitCode::kUsage, path + ": " + e.what() + " (see --help for the keys each section takes)");
  }
  std::map<std::string, std::string> values;
  for (const auto& [key, value] : from_file) values[key] = value.as<std::string>();
  return values;
}

}  // namespace

bool parse_integer_list(const std::string& text, std::vector<int64_t>* values) {
  for (size_t start = 0; start <= text.size();) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    char* end = nullptr;
    errno = 0;
    const long long value = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno == ERANGE) return false;
    values->push_back(value);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return true;
}

ParsedCommandLine parse_command_line(const OptionTable& table, const std::vector<std::string>& args) {
  po::options_description description = make_description(table);
  ParsedCommandLine parsed;
  // The command line is read option by option so that a later `--key value` replaces an
  // earlier one (wrapper scripts append overrides); Boost's store() would refuse the repeat.
  std::map<std::string, std::string> given;
  try {
    const po::parsed_options options = parse_exact(join_bool_values(table, args), description);
    for (const po::option& option : options.options) {
      if (option.string_key == "help") {
        parsed.help_requested = true;
      } else if (option.string_key == "config") {
        parsed.config_file = option.value.at(0);
      } else {
        given[option.string_key] = option.value.empty() ? "true" : option.value.front();  // bare bool
      }
    }
  } catch (const po::error& e) {
    throw Error(ExitCode::kUsage, std::string("command line: ") + e.what() +
                                      " (see --help for the options and their defaults)");
  }
  if (!parsed.config_file.empty())
    for (const auto& [key, value] : read_config_file(parsed.config_file, description))
      if (!given.count(key)) given[key] = value;
  std::map<std::string, std::string> values;
  for (const OptionSpec& spec : table.specs()) {
    auto it = given.find(spec.key);
    values[spec.key] = it != given.end() ? it->second : spec.default_value;
  }
  parsed.options = Options(&table, std::move(values));
  return parsed;
}

}  // namespace dstrain
