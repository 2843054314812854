#include "dstrain/data/unicode_properties.h"

#include <unicode/uchar.h>
#include <unicode/uset.h>
#include <unicode/uversion.h>

#include <cstdio>
#include <memory>

namespace dstrain {
namespace {

using Set = std::unique_ptr<USet, decltype(&uset_close)>;

// The set of a UnicodeSet pattern such as "[\p{L}]"; null when ICU does not know it.
Set icu_set(const std::string& pattern) {
  const std::u16string text(pattern.begin(), pattern.end());
  UErrorCode status = U_ZERO_ERROR;
  USet* set = uset_openPattern(reinterpret_cast<const UChar*>(text.data()), static_cast<int32_t>(text.size()), &status);
  if (U_FAILURE(status)) {
    if (set) uset_close(set);
    return Set(nullptr, uset_close);
  }
  return Set(set, uset_close);
}

// "14.0.0" → {14, 0}; {0, 0} when it does not parse (then ICU decides every character).
std::pair<int, int> major_minor(const std::string& version) {
  int major = 0, minor = 0;
  if (std::sscanf(version.c_str(), "%d.%d", &major, &minor) < 1) return {0, 0};
  return {major, minor};
}

std::pair<int, int> icu_unicode_version() {
  UVersionInfo version;
  u_getUnicodeVersion(version);
  return {version[0], version[1]};
}

// The inside of a PCRE2 character class that holds exactly `set`'s code points (surrogates,
// which PCRE2 refuses in UTF mode, left out).
std::string class_items(const USet* set) {
  std::string out;
  char item[32];
  for (int32_t i = 0; i < uset_getItemCount(set); ++i) {
    UChar32 start = 0, end = 0;
    UErrorCode status = U_ZERO_ERROR;
    if (uset_getItem(set, i, &start, &end, nullptr, 0, &status) != 0) continue;  // a string, not a range
    for (auto [from, to] : {std::pair<UChar32, UChar32>{start, std::min<UChar32>(end, 0xD7FF)},
                            std::pair<UChar32, UChar32>{std::max<UChar32>(start, 0xE000), end}}) {
      if (from > to) continue;
      if (from == to) std::snprintf(item, sizeof(item), "\\x{%X}", static_cast<unsigned>(from));
      else std::snprintf(item, sizeof(item), "\\x{%X}-\\x{%X}", static_cast<unsigned>(from), static_cast<unsigned>(to));
      out += item;
    }
  }
  return out;
}

}  // namespace

std::optional<std::string> pcre2_property_class(const std::string& name, bool negated, bool in_class,
                                                const std::string& engine_unicode_version) {
  const auto [major, minor] = major_minor(engine_unicode_version);
  if (icu_unicode_version() <= std::make_pair(major, minor)) return std::nullopt;
  const Set property = icu_set("[\\p{" + name + "}]");
  if (!property) return std::nullopt;
  // The characters assigned since the engine's version: to the engine they are unassigned (Cn).
  const Set unassigned = icu_set("[\\p{Cn}]");
  const Set known_to_engine = icu_set("[\\p{Age=" + std::to_string(major) + "." + std::to_string(minor) + "}]");
  if (!unassigned || !known_to_engine) return std::nullopt;
  Set added(uset_cloneAsThawed(unassigned.get()), uset_close);
  uset_complement(added.get());
  uset_removeAll(added.get(), known_to_engine.get());

  if (!uset_containsSome(property.get(), unassigned.get())) {
    // A class of assigned characters (letters, digits, symbols, ...): the engine's escape plus
    // the characters ICU adds to it. Outside a class, `\P{X}` is the negated union.
    Set gained(uset_cloneAsThawed(property.get()), uset_close);
    uset_retainAll(gained.get(), added.get());
    if (uset_isEmpty(gained.get())) return std::nullopt;
    const std::string items = class_items(gained.get());
    if (!negated) return in_class ? "\\p{" + name + "}" + items : "[\\p{" + name + "}" + items + "]";
    if (!in_class) return "[^\\p{" + name + "}" + items + "]";
  }
  // A class that holds unassigned code points (Cn, C, Any), or `\P{X}` inside a class: the
  // engine's escape would keep the added characters, so ICU's whole set is written out.
  Set whole(uset_cloneAsThawed(property.get()), uset_close);
  if (negated) uset_complement(whole.get());
  if (uset_isEmpty(whole.get())) return in_class ? std::string() : std::string("(?!)");
  return in_class ? class_items(whole.get()) : "[" + class_items(whole.get()) + "]";
}

std::string unicode_tables_description() {
  const auto [major, minor] = icu_unicode_version();
  return std::string("ICU ") + U_ICU_VERSION + ", Unicode " + std::to_string(major) + "." + std::to_string(minor);
}

}  // namespace dstrain
