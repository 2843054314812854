// The Unicode property classes of tokenizer patterns (\p{L}, \p{N}, \p{S}, ...) by ICU's tables,
// not by the regex engine's.
//
// PCRE2 compiles its Unicode tables in: Debian 12's knows Unicode 14, so a character assigned
// since (U+1FAE8 🫨 is a symbol, U+31BCB a letter, both Unicode 15) is unassigned to it and
// falls out of \p{S} and \p{L}. Hugging Face's tokenizers know it, and split the text elsewhere.
// ICU follows the distribution's Unicode more closely; for a pattern, each property escape is
// rewritten so that the characters the engine does not know take their class from ICU, while
// the engine's own fast lookup still decides every character it knows.
#pragma once

#include <optional>
#include <string>

namespace dstrain {

// What stands for `\p{name}` (`\P{name}` when `negated`) in a PCRE2 pattern, written outside a
// character class or inside one (`in_class`), given the Unicode version of the engine's tables
// ("14.0.0"). nullopt: the escape already means what ICU says (ICU's tables are no newer, the
// property gained no character since, or ICU does not know the name: the engine then decides).
std::optional<std::string> pcre2_property_class(const std::string& name, bool negated, bool in_class,
                                                const std::string& engine_unicode_version);

// "ICU 72.1, Unicode 15.0": the tables that decide, for messages and the documentation.
std::string unicode_tables_description();

}  // namespace dstrain
