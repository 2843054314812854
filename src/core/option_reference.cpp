#include "dstrain/core/option_reference.h"

#include <sstream>

namespace dstrain {
namespace {

const char* kBegin = "<!-- BEGIN option reference -->";
const char* kEnd = "<!-- END option reference -->";

const char* type_name(OptionKind kind) {
  switch (kind) {
    case OptionKind::kString: return "text";
    case OptionKind::kInt: return "integer";
    case OptionKind::kFloat: return "number";
    case OptionKind::kBool: return "boolean";
  }
  return "";
}

// A table cell: "|" would end it.
std::string cell(const std::string& text) {
  std::string out;
  for (char c : text) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

}  // namespace

std::string option_reference_markdown(const OptionTable& table) {
  std::ostringstream out;
  std::string section;
  for (const OptionSpec& spec : table.specs()) {
    const std::string key_section = spec.key.substr(0, spec.key.find('.'));
    if (key_section != section) {
      section = key_section;
      out << "\n#### [" << section << "]\n\n| key | type | default | meaning |\n|---|---|---|---|\n";
    }
    out << "| `" << spec.key << "` | " << type_name(spec.kind) << " | "
        << (spec.default_value.empty() ? "\"\"" : "`" + cell(spec.default_value) + "`") << " | " << cell(spec.help)
        << " |\n";
  }
  return out.str();
}

std::string option_reference_in(const std::string& page_text) {
  const size_t begin = page_text.find(kBegin), end = page_text.find(kEnd);
  if (begin == std::string::npos || end == std::string::npos || end < begin) return "";
  const size_t first = page_text.find('\n', begin);
  if (first == std::string::npos || first + 1 > end) return "";
  return page_text.substr(first + 1, end - first - 1);
}

}  // namespace dstrain
