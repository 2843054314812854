// Splits text at the matches of a Unicode regular expression (PCRE2, JIT-compiled), the way a
// Hugging Face "Split" pre-tokenizer with behavior "Isolated" does: every match is a piece, and
// so is every stretch of text between matches. An empty match (a lookahead such as (?=[A-Z]))
// is a split point that adds no piece.
//
// The patterns of tokenizer.json files are written for Oniguruma (Hugging Face) and Rust's
// fancy-regex (tiktoken), where \s is Unicode White_Space. PCRE2's \s lacks U+0085, so \s and \S
// are rewritten to the explicit White_Space set before compiling, and property classes get the
// characters PCRE2's tables are too old to know from ICU's (unicode_properties.h). Bytes that
// are not valid UTF-8 never match (PCRE2_MATCH_INVALID_UTF) and so end up in the pieces between
// matches: any byte string splits, and the pieces always concatenate back to the text. GPT-2's pattern is matched
// by hand where the text is ASCII (gpt2_scanner.h), by PCRE2 elsewhere.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace dstrain {

// Which pieces split() keeps. Hugging Face's Split: behavior "Isolated" keeps the matches and
// the gaps between them; "Removed" drops the matches; "Removed" with `invert: true` drops the
// gaps (GPT-4o's file: the pieces are the pattern's matches, as tiktoken's findall gives them).
enum class SplitKeeps { kMatchesAndGaps, kGaps, kMatches };

class RegexSplitter {
 public:
  // `literal`: the pattern is a plain string (tokenizer.json's {"String": ...}).
  // Throws Error(kUsage) naming `where` and PCRE2's message when the pattern does not compile.
  RegexSplitter(const std::string& pattern, bool literal, const std::string& where);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Appends the pieces of `text` that `keeps` names (matches and the gaps between them, in order,
  // none empty). A gap that is not valid UTF-8 is never dropped: text that Hugging Face would
  // have received as U+FFFD, which every pattern that drops gaps matches, is not lost.
  // Thread-safe: per-thread match data.
  void split(std::string_view text, std::vector<std::string_view>* pieces,
             SplitKeeps keeps = SplitKeeps::kMatchesAndGaps) const;
  // The first match at or after `from`, [*start, *end), other than an empty one at `from` itself
  // (where the previous match ended); false when there is none.
  bool find(std::string_view text, size_t from, size_t* start, size_t* end) const;

 private:
  void* code_ = nullptr;  // pcre2_code_8*
  std::string where_;     // the tokenizer file and field, for messages
  bool jit_ = false;
  bool ascii_gpt2_ = false;  // GPT-2's pattern: ASCII stretches matched by gpt2_scanner.h
};

// The pattern PCRE2 compiles: `\s`/`\S` → the White_Space set, and `\p{..}`/`\P{..}` → the class
// ICU's tables give where the engine's (of Unicode `engine_version`) are older, outside and
// inside character classes (exposed for tests).
std::string rewrite_unicode_classes(const std::string& pattern, const std::string& engine_version);
// The Unicode version of PCRE2's tables ("14.0.0").
std::string engine_unicode_version();

// GPT-2's pre-tokenizer pattern (also tiktoken's r50k/p50k and Hugging Face's ByteLevel with
// use_regex = true).
extern const char* const kGpt2Pattern;
// kGpt2Pattern reordered to match the same pieces with fewer attempts (what ByteLevel uses).
extern const char* const kGpt2PatternFast;

}  // namespace dstrain
