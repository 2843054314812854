// Pre-tokenizer patterns classify characters by the Unicode tables of ICU, not by the older ones
// compiled into PCRE2: characters assigned in Unicode 15 split as Hugging Face's tokenizers split
// them. The expectations are the characters' classes in the Unicode 15.0 standard
// (UnicodeData.txt): U+1FAE8 SHAKING FACE and U+1FAF7 LEFTWARDS PUSHING HAND are So, U+31BCB (CJK
// Unified Ideographs Extension H) is Lo, U+0378 is still unassigned.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dstrain/data/regex_splitter.h"
#include "dstrain/data/unicode_properties.h"

using namespace dstrain;

namespace {

const std::string kShakingFace = "\xF0\x9F\xAB\xA8";  // U+1FAE8, So since Unicode 15.0
const std::string kPushingHand = "\xF0\x9F\xAB\xB7";  // U+1FAF7, So since Unicode 15.0
const std::string kExtensionH = "\xF0\xB1\xAF\x8B";   // U+31BCB, Lo since Unicode 15.0
const std::string kUnassigned = "\xCD\xB8";           // U+0378, unassigned

std::vector<std::string> pieces_of(const std::string& pattern, const std::string& text) {
  RegexSplitter splitter(pattern, false, "test");
  std::vector<std::string_view> views;
  splitter.split(text, &views);
  return std::vector<std::string>(views.begin(), views.end());
}

// Whether the pattern's first match is the whole text.
bool matches_whole(const std::string& pattern, const std::string& text) {
  RegexSplitter splitter(pattern, false, "test");
  size_t start = 0, end = 0;
  return splitter.find(text, 0, &start, &end) && start == 0 && end == text.size();
}

// DeepSeek-V3's main Split pattern (its tokenizer.json's third pre-tokenizer).
const char* const kDeepSeekPattern =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
    "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";

}  // namespace

TEST(UnicodeClasses, NewSymbolsAfterASpaceStayOnePieceAsInDeepSeeksTokenizer) {
  // " ?[\p{P}\p{S}]+" takes the space and the symbol together; with Unicode 14's tables the
  // symbol is unassigned and the space went alone.
  EXPECT_EQ(pieces_of(kDeepSeekPattern, "a " + kShakingFace), (std::vector<std::string>{"a", " " + kShakingFace}));
  EXPECT_EQ(pieces_of(kDeepSeekPattern, " " + kPushingHand + kShakingFace),
            (std::vector<std::string>{" " + kPushingHand + kShakingFace}));
  // A letter of Extension H continues a run of letters.
  EXPECT_EQ(pieces_of(kDeepSeekPattern, "a" + kExtensionH + "b " + kExtensionH),
            (std::vector<std::string>{"a" + kExtensionH + "b", " " + kExtensionH}));
}

TEST(UnicodeClasses, EveryFormOfAPropertyEscapeAgrees) {
  EXPECT_TRUE(matches_whole("\\p{L}+", "a" + kExtensionH));
  EXPECT_TRUE(matches_whole("\\p{Lo}", kExtensionH));
  EXPECT_TRUE(matches_whole("[x\\p{L}]+", kExtensionH + "x"));
  EXPECT_TRUE(matches_whole("\\p{So}", kShakingFace));
  EXPECT_TRUE(matches_whole("[^\\s\\p{L}\\p{N}]+", "!" + kShakingFace));  // GPT-2's punctuation class
  EXPECT_FALSE(matches_whole("[^\\s\\p{L}\\p{N}]", kExtensionH));
  EXPECT_FALSE(matches_whole("\\P{L}", kExtensionH));
  EXPECT_FALSE(matches_whole("[\\P{L}]", kExtensionH));  // inside a class: ICU's whole complement
  EXPECT_TRUE(matches_whole("[\\P{L}]", kShakingFace));
  EXPECT_FALSE(matches_whole("\\p{Cn}", kExtensionH));  // classes holding unassigned code points
  EXPECT_TRUE(matches_whole("\\p{Cn}", kUnassigned));
  EXPECT_FALSE(matches_whole("\\p{L}", kUnassigned));
  EXPECT_TRUE(matches_whole("\\p{N}+", "7\xD9\xA3"));  // ASCII and Arabic-Indic digits as before
}

TEST(UnicodeClasses, EscapesAreRewrittenOnlyWhereTheEngineIsOlder) {
  const std::string pattern = "\\p{L}+|[^\\p{N}]|\\p{Foo}";
  // Tables at least as new as ICU's: only \s would change; an unknown name is left to the engine.
  EXPECT_EQ(rewrite_unicode_classes(pattern, "99.0.0"), pattern);
  const std::string old = rewrite_unicode_classes(pattern, "14.0.0");
  EXPECT_EQ(old.rfind("[\\p{L}", 0), 0u) << old;
  EXPECT_NE(old.find("\\x{31350}-\\x{323AF}"), std::string::npos) << "Extension H is missing: " << old;
  EXPECT_NE(old.find("|\\p{Foo}"), std::string::npos) << old;
  EXPECT_FALSE(pcre2_property_class("L", false, false, "99.0.0").has_value());
}
