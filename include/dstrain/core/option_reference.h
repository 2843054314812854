// The option reference of docs/configuration.md, generated from an option table so that the manual
// and the program cannot drift apart: a test compares the page's copy with this text.
#pragma once

#include <string>

#include "dstrain/core/config.h"

namespace dstrain {

// One Markdown table per section ("#### [train]", then | key | type | default | meaning |).
std::string option_reference_markdown(const OptionTable& table);

// A page's lines between "<!-- BEGIN option reference -->" and "<!-- END option reference -->"
// (the markers themselves left out); "" when the markers are missing.
std::string option_reference_in(const std::string& page_text);

}  // namespace dstrain
