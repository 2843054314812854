#include "dstrain/data/regex_splitter.h"

#include <cctype>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <unicode/utf8.h>

#include <memory>

#include "dstrain/core/error.h"
#include "dstrain/data/unicode_properties.h"
#include "gpt2_scanner.h"

namespace dstrain {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The same matches, found faster: alternatives that can start at the same character keep their
// order (contractions before punctuation; the optional-space ones before the white-space runs),
// and the two that match most pieces, letters and digits, are tried first.
const char* const kGpt2PatternFast =
    R"( ?\p{L}+| ?\p{N}+|'s|'t|'re|'ve|'m|'ll|'d| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

// Unicode's White_Space property (PropList.txt), as the inside of a character class.
const char* const kWhiteSpace = R"(\t-\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// Per-thread match state, shared by every pattern: one ovector pair is all split() reads, and a
// JIT stack larger than the default 32 KB keeps long runs of one class from running out of it.
struct ThreadMatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  ThreadMatchState() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~ThreadMatchState() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(data);
  }
};

ThreadMatchState& thread_state() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

std::string engine_unicode_version() {
  char version[24] = "";
  if (pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, version) < 0) return "";
  return version;
}

std::string rewrite_unicode_classes(const std::string& pattern, const std::string& engine_version) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      char next = pattern[i + 1];
      ++i;
      if (next == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (next == 'S') {
        if (in_class)
          throw Error(ExitCode::kUsage, "regular expression '" + pattern +
                                            "': \\S inside a character class is not supported");
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else if ((next == 'p' || next == 'P') && i + 1 < pattern.size() && pattern[i + 1] == '{' &&
                 pattern.find('}', i) != std::string::npos) {
        const size_t close = pattern.find('}', i);
        const std::string name = pattern.substr(i + 2, close - i - 2);
        const std::optional<std::string> by_icu = pcre2_property_class(name, next == 'P', in_class, engine_version);
        out += by_icu ? *by_icu : pattern.substr(i - 1, close - i + 2);
        i = close;
      } else {
        out += c;
        out += next;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // "[]...]" and "[^]...]": a ']' right after the opening is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

namespace {

// `text` with every ASCII character but letters and digits escaped: a pattern that matches it
// literally.
std::string regex_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

RegexSplitter::RegexSplitter(const std::string& pattern, bool literal, const std::string& where) {
  // A literal is escaped rather than compiled with PCRE2_LITERAL, which PCRE2 refuses with UCP.
  const std::string source = literal ? regex_escape(pattern) : rewrite_unicode_classes(pattern, engine_unicode_version());
  // UTF + UCP: \p{..}, \d, \w and case folding by Unicode properties. MULTILINE: ^ and $ at line
  // ends, as in Oniguruma's Ruby syntax that Hugging Face's tokenizers compile patterns with.
  uint32_t flags = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_MULTILINE;
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(), flags,
                                   &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    throw Error(ExitCode::kUsage, where + ": regular expression '" + pattern + "' does not compile at offset " +
                                      std::to_string(offset) + ": " + reinterpret_cast<char*>(message));
  }
  code_ = code;
  where_ = where;
  ascii_gpt2_ = !literal && (pattern == kGpt2Pattern || pattern == kGpt2PatternFast);
  // Without JIT (some platforms) the interpreter gives the same matches, only slower.
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

RegexSplitter::~RegexSplitter() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

bool RegexSplitter::find(std::string_view text, size_t from, size_t* start, size_t* end) const {
  auto* code = static_cast<pcre2_code*>(code_);
  ThreadMatchState& state = thread_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // NOTEMPTY_ATSTART: an empty match at `from`, where the previous match ended, is passed over as
  // Oniguruma's iteration passes it over; an empty match further on is a split point.
  int rc = jit_ ? pcre2_jit_match(code, subject, text.size(), from, PCRE2_NOTEMPTY_ATSTART, state.data, state.context)
                : pcre2_match(code, subject, text.size(), from, PCRE2_NOTEMPTY_ATSTART, state.data, state.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(rc, message, sizeof(message));
    throw Error(ExitCode::kData, where_ + ": its regular expression gave up on this text at byte " +
                                     std::to_string(from) + " (" + reinterpret_cast<char*>(message) +
                                     "; a very long run of spaces or symbols?)");
  }
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data);
  *start = ovector[0];
  *end = ovector[1];
  return true;
}

namespace {

bool valid_utf8(std::string_view text) {
  for (int32_t i = 0, n = static_cast<int32_t>(text.size()); i < n;) {
    UChar32 c = 0;
    U8_NEXT(text.data(), i, n, c);
    if (c < 0) return false;
  }
  return true;
}

}  // namespace

void RegexSplitter::split(std::string_view text, std::vector<std::string_view>* pieces, SplitKeeps keeps) const {
  const bool keep_matches = keeps != SplitKeeps::kGaps;
  auto gap = [&](std::string_view piece) {
    if (keeps != SplitKeeps::kMatches || !valid_utf8(piece)) pieces->push_back(piece);
  };
  size_t emitted = 0, start = 0, end = 0;
  while (emitted < text.size()) {
    if (ascii_gpt2_) {
      const size_t ascii_end = gpt2::ascii_match_end(text, emitted);
      if (ascii_end > emitted) {
        if (keep_matches) pieces->push_back(text.substr(emitted, ascii_end - emitted));
        emitted = ascii_end;
        continue;
      }
    }
    if (!find(text, emitted, &start, &end)) break;
    if (start > emitted) gap(text.substr(emitted, start - emitted));
    if (keep_matches && end > start) pieces->push_back(text.substr(start, end - start));
    emitted = end;
  }
  if (emitted < text.size()) gap(text.substr(emitted));
}

}  // namespace dstrain
