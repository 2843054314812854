// The byte-level BPE tokenizer: encodings worked out by hand on small tokenizer.json files of
// GPT-2's and DeepSeek's shapes, round trips of arbitrary bytes, and clear errors. Parity with
// an independent implementation on real text is tests/parity/bpe_parity.sh.
#include <gtest/gtest.h>

#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include <random>
#include <set>

#include "dstrain/data/bpe_tokenizer.h"
#include "dstrain/data/byte_level.h"
#include "dstrain/data/regex_splitter.h"
#include "test_util.h"

using namespace dstrain;
using dstrain::test::expect_error;
using dstrain::test::TempDir;
using nlohmann::json;

namespace {

// A byte-level vocabulary where byte b has id b, plus one token per merge, ids from 256 on.
json small_tokenizer(const std::vector<std::pair<std::string, std::string>>& merges, json pre_tokenizer) {
  json vocab = json::object();
  const auto& chars = byte_level::byte_to_chars();
  for (int b = 0; b < 256; ++b) vocab[chars[b]] = b;
  json merge_list = json::array();
  int next = 256;
  for (const auto& [left, right] : merges) {
    if (!vocab.contains(left + right)) vocab[left + right] = next++;
    merge_list.push_back(left + " " + right);
  }
  return json{{"version", "1.0"},
              {"added_tokens", json::array({json{{"id", next}, {"content", "<|endoftext|>"}, {"special", true}},
                                            json{{"id", next + 1}, {"content", "<|end|>"}, {"special", true}},
                                            json{{"id", next + 2}, {"content", "<|end|>x"}, {"special", true}}})},
              {"normalizer", nullptr},
              {"pre_tokenizer", pre_tokenizer},
              {"decoder", json{{"type", "ByteLevel"}}},
              {"model", json{{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}}};
}

json gpt2_pre_tokenizer() { return json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}; }

// DeepSeek-V3's pre-tokenizer as its tokenizer.json writes it.
json deepseek_pre_tokenizer() {
  auto split = [](const std::string& regex) {
    return json{{"type", "Split"}, {"pattern", json{{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}};
  };
  return json{{"type", "Sequence"},
              {"pretokenizers",
               json::array({split("\\p{N}{1,3}"), split("[一-龥\u3040-ゟ゠-ヿ]+"),
                            split("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"),
                            json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
}

std::unique_ptr<BpeTokenizer> load(const json& tokenizer) { return BpeTokenizer::from_json(tokenizer.dump(), "test.json"); }

std::vector<std::string> pieces_of(const RegexSplitter& splitter, const std::string& text) {
  std::vector<std::string_view> views;
  splitter.split(text, &views);
  return std::vector<std::string>(views.begin(), views.end());
}

std::string random_bytes(std::mt19937& rng, size_t n) {
  std::string text(n, '\0');
  for (char& c : text) c = static_cast<char>(rng() & 0xFF);
  return text;
}

}  // namespace

TEST(ByteLevel, EveryByteHasItsOwnCharacterAndComesBack) {
  const auto& chars = byte_level::byte_to_chars();
  EXPECT_EQ(chars[' '], "\xC4\xA0");   // U+0120 'Ġ', as in GPT-2's vocabulary
  EXPECT_EQ(chars['\n'], "\xC4\x8A");  // U+010A 'Ċ'
  EXPECT_EQ(chars['a'], "a");
  EXPECT_EQ(std::set<std::string>(chars.begin(), chars.end()).size(), 256u);
  std::string all, bytes;
  for (int b = 0; b < 256; ++b) all += chars[b];
  ASSERT_TRUE(byte_level::chars_to_bytes(all, &bytes));
  ASSERT_EQ(bytes.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(static_cast<unsigned char>(bytes[b]), b);
  EXPECT_FALSE(byte_level::chars_to_bytes("\xE4\xB8\x80", &bytes));  // U+4E00 is not in the alphabet
}

TEST(RegexSplitter, Gpt2PatternSplitsAsGpt2Does) {
  RegexSplitter gpt2(kGpt2Pattern, false, "test");
  EXPECT_EQ(pieces_of(gpt2, "Hello world's  42x!!\n\n  end"),
            (std::vector<std::string>{"Hello", " world", "'s", " ", " 42", "x", "!!", "\n\n ", " end"}));
  // U+0085 is white space for Unicode (and Oniguruma, Rust's regex, Python's re), not for PCRE2's
  // \s: the rewritten pattern must treat it as white space.
  EXPECT_EQ(pieces_of(gpt2, "a \xC2\x85" "b"), (std::vector<std::string>{"a", " ", "\xC2\x85", "b"}));
  // Invalid UTF-8 matches nothing and stays between the matches; nothing is lost.
  EXPECT_EQ(pieces_of(gpt2, "ab\xFF\xFE" "cd"), (std::vector<std::string>{"ab", "\xFF\xFE", "cd"}));
}

// Empty matches split as in Hugging Face (Oniguruma's iteration): each is a split point that adds
// no piece, except where the previous match ended.
TEST(RegexSplitter, EmptyMatchesAreSplitPoints) {
  RegexSplitter capitals("(?=[A-Z])", false, "test");
  EXPECT_EQ(pieces_of(capitals, "helloWorldFOO"), (std::vector<std::string>{"hello", "World", "F", "O", "O"}));
  EXPECT_EQ(pieces_of(capitals, "Hello"), (std::vector<std::string>{"Hello"}));
  RegexSplitter boundaries("\\b", false, "test");
  EXPECT_EQ(pieces_of(boundaries, "ab, cd"), (std::vector<std::string>{"ab", ", ", "cd"}));
  // "x*" matches "xx" and then, at its end, an empty match that is passed over; the next empty
  // match (before "b") splits.
  RegexSplitter stars("x*", false, "test");
  EXPECT_EQ(pieces_of(stars, "axxbc"), (std::vector<std::string>{"a", "xx", "b", "c"}));
  std::vector<std::string_view> gaps;
  capitals.split("aBc", &gaps, SplitKeeps::kGaps);
  EXPECT_EQ(std::vector<std::string>(gaps.begin(), gaps.end()), (std::vector<std::string>{"a", "Bc"}));
}

TEST(RegexSplitter, ReorderedGpt2PatternFindsTheSamePieces) {
  // ("|(?!)" adds an alternative that never matches: it keeps the ASCII fast path out of this.)
  RegexSplitter original(std::string(kGpt2Pattern) + "|(?!)", false, "test"),
      fast(std::string(kGpt2PatternFast) + "|(?!)", false, "test");
  std::mt19937 rng(7);
  const std::vector<std::string> parts = {"a", "Zé", "日本", "7", "٣", " ", "  ", "\n", "\t", "'s", "'ll", "'", "!?",
                                          "\xC2\x85", "\xC2\xA0", "\xE3\x80\x80", "\xF0\x9F\x98\x80", "\xCC\x81", "\xFF"};
  for (int round = 0; round < 2000; ++round) {
    std::string text;
    for (int i = 0, n = 1 + rng() % 12; i < n; ++i) text += parts[rng() % parts.size()];
    ASSERT_EQ(pieces_of(original, text), pieces_of(fast, text)) << text;
  }
}

// The ASCII fast path of GPT-2's pattern against PCRE2 alone (the same pattern with a different
// spelling, which turns the fast path off), on text mostly ASCII with everything else mixed in.
TEST(RegexSplitter, Gpt2AsciiFastPathAgreesWithTheRegex) {
  RegexSplitter fast(kGpt2Pattern, false, "test"), regex_only(std::string(kGpt2Pattern) + "|(?!)", false, "test");
  std::mt19937 rng(5);
  const std::vector<std::string> parts = {"a", "Zz", "q", "7", "12", " ", " ", "  ", "\n", "\n\n", "\t", "\r\n", "\x0b",
                                          "\x0c", "\x1c", "'", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'r",
                                          "!", "?!", ".", "-", "\"", "é", "日", "\xC2\x85", "\xC2\xA0", "\xE3\x80\x80",
                                          "\xC2\xB2", "\xCC\x81", "\xFF", "\x80", "\xF0\x9F\x98\x80", std::string("x\0y", 3)};
  for (int round = 0; round < 20000; ++round) {
    std::string text;
    for (int i = 0, n = 1 + rng() % 16; i < n; ++i) text += parts[rng() % parts.size()];
    ASSERT_EQ(pieces_of(fast, text), pieces_of(regex_only, text)) << text;
  }
}

TEST(BpeTokenizer, KnownEncodingsOfAGpt2ShapedTokenizer) {
  auto tokenizer = load(small_tokenizer({{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}, {"o", "r"},
                                         {"Ġw", "or"}},
                                        gpt2_pre_tokenizer()));
  // hello: h e l l o → he l l o → he ll o → hell o → hello; " world": Ġw o r l d → Ġw or l d → Ġwor l d
  const uint32_t hello = 259, wor = 262;
  EXPECT_EQ(tokenizer->encode("hello world"), (std::vector<uint32_t>{hello, wor, 'l', 'd'}));
  // Equal ranks: leftmost first ("l l" then the leftover l).
  EXPECT_EQ(tokenizer->encode("lll"), (std::vector<uint32_t>{257, 'l'}));
  // Merges never cross pre-tokens: "o" and "r" sit in different pieces here.
  EXPECT_EQ(tokenizer->encode("o r"), (std::vector<uint32_t>{'o', ' ', 'r'}));
  // Added tokens are cut out first, the longest at a position winning.
  const uint32_t endoftext = 263, end = 264, end_x = 265;
  EXPECT_EQ(tokenizer->encode("he<|endoftext|><|end|>x<|end|>"), (std::vector<uint32_t>{256, endoftext, end_x, end}));
  EXPECT_EQ(tokenizer->eod_id(), endoftext);
  EXPECT_EQ(tokenizer->vocab_size(), 266u);
  EXPECT_EQ(tokenizer->decode({hello, wor, 'l', 'd', endoftext}), "hello world<|endoftext|>");
  EXPECT_EQ(tokenizer->name().rfind("bpe:test.json:", 0), 0u);
}

TEST(BpeTokenizer, DeepSeekShapedPreTokenizerSplitsDigitsAndScripts) {
  auto tokenizer = load(small_tokenizer({{"1", "2"}, {"12", "3"}, {"3", "4"}, {"a", "b"}, {"Ġ", "a"}}, deepseek_pre_tokenizer()));
  // \p{N}{1,3}: "12345" is "123" and "45": "3 4" would merge if the pieces were one.
  EXPECT_EQ(tokenizer->encode("12345"), (std::vector<uint32_t>{257, '4', '5'}));
  EXPECT_EQ(tokenizer->encode("1234"), (std::vector<uint32_t>{257, '4'}));
  // A CJK run is a piece of its own: "ab" after it still merges, " a" (Ġa) too.
  std::vector<uint32_t> ids = tokenizer->encode("日本ab a");
  ASSERT_EQ(ids.size(), 6u + 2u);  // 6 bytes of 日本, then "ab" and " a"
  EXPECT_EQ(ids[6], 259u);
  EXPECT_EQ(ids[7], 260u);
  EXPECT_EQ(tokenizer->decode(ids), "日本ab a");
}

TEST(BpeTokenizer, AnyBytesRoundTrip) {
  std::mt19937 rng(11);
  for (const json& pre : {gpt2_pre_tokenizer(), deepseek_pre_tokenizer()}) {
    const auto& chars = byte_level::byte_to_chars();
    auto tokenizer = load(small_tokenizer({{"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {chars[0xC3], chars[0xA9]}}, pre));
    for (int round = 0; round < 300; ++round) {
      std::string text = random_bytes(rng, rng() % 200);
      ASSERT_EQ(tokenizer->decode(tokenizer->encode(text)), text);
    }
    std::string text = "the caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC 123456 \xF0\x9F\x98\x80 \xC0\xAF \xED\xA0\x80 \r\n\t end  ";
    EXPECT_EQ(tokenizer->decode(tokenizer->encode(text)), text);
  }
}

TEST(BpeTokenizer, ReadsTokenizerJsonFilesWithEitherMergeFormat) {
  TempDir dir;
  json tokenizer = small_tokenizer({{"h", "e"}}, gpt2_pre_tokenizer());
  dir.write("strings.json", tokenizer.dump());
  tokenizer["model"]["merges"] = json::array({json::array({"h", "e"})});  // newer files: pairs
  dir.write("pairs.json", tokenizer.dump());
  for (const char* name : {"strings.json", "pairs.json"})
    EXPECT_EQ(BpeTokenizer::from_file(dir.path(name))->encode("hex"), (std::vector<uint32_t>{256, 'x'})) << name;
  EXPECT_EQ(BpeTokenizer::from_file(dir.path("pairs.json"), "<|end|>")->eod_id(), 258u);
}

TEST(BpeTokenizer, UnusableFilesNameTheFieldAndWhatWasExpected) {
  json good = small_tokenizer({{"h", "e"}}, gpt2_pre_tokenizer());
  json bad = good;
  bad["model"]["vocab"].erase("a");
  SCOPED_TRACE("case 1");
  expect_error([&] { load(bad); }, ExitCode::kUsage, {"test.json", "model.vocab", "byte 97"});
  bad = good;
  bad["model"]["merges"].push_back("x zz");
  SCOPED_TRACE("case 2");
  expect_error([&] { load(bad); }, ExitCode::kUsage, {"test.json", "model.merges[1]", "missing from model.vocab"});
  bad = good;
  bad["pre_tokenizer"] = json{{"type", "Whitespace"}};
  SCOPED_TRACE("case 3");
  expect_error([&] { load(bad); }, ExitCode::kUsage, {"pre_tokenizer.type", "Whitespace", "ByteLevel, Split or Sequence"});
  bad = good;
  bad["pre_tokenizer"] = json{{"type", "Split"}, {"pattern", json{{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  SCOPED_TRACE("case 4");
  expect_error([&] { load(bad); }, ExitCode::kUsage, {"pre_tokenizer", "(unclosed", "does not compile"});
  bad = good;
  bad["model"]["type"] = "WordPiece";
  SCOPED_TRACE("case 5");
  expect_error([&] { load(bad); }, ExitCode::kUsage, {"model.type", "WordPiece", "BPE"});
  bad = good;
  bad["normalizer"] = json{{"type", "Lowercase"}};
  SCOPED_TRACE("case 6");
  expect_error([&] { load(bad); }, ExitCode::kUsage, {"normalizer", "Lowercase", "NFC"});
  bad = good;
  bad["added_tokens"] = json::array();
  SCOPED_TRACE("case 7");
  expect_error([&] { load(bad); }, ExitCode::kUsage, {"--eod-token", "<|endoftext|>"});
  SCOPED_TRACE("case 8");
  expect_error([&] { BpeTokenizer::from_json(good.dump(), "test.json", "<nope>"); }, ExitCode::kUsage,
               {"--eod-token", "<nope>"});
  SCOPED_TRACE("case 9");
  expect_error([&] { BpeTokenizer::from_json("{\"model\": ", "broken.json"); }, ExitCode::kUsage,
               {"broken.json", "not valid JSON"});
  // Fields of the wrong kind: named, with what was expected and what was found, never in the
  // JSON library's words ("cannot use at() with array", "key 'content' not found").
  const std::vector<std::pair<std::function<void(json&)>, std::vector<std::string>>> misshapen = {
      {[](json& j) { j["model"]["merges"] = json::array({json::array({1, 2})}); },
       {"model.merges[0][0]: expected a string, found the number 1"}},
      {[](json& j) { j["model"]["merges"] = "h e"; }, {"model.merges: expected an array, found the string \"h e\""}},
      {[](json& j) { j["added_tokens"] = json::array({json::array({"<s>", 1})}); },
       {"added_tokens[0]: expected an object with \"content\", found an array of 2"}},
      {[](json& j) { j["added_tokens"] = json::array({json{{"id", 5}}}); }, {"added_tokens[0].content: missing"}},
      {[](json& j) { j["model"]["vocab"] = json::array(); }, {"model.vocab: expected an object of token: id"}},
      {[](json& j) { j["model"] = json::array(); }, {"test.json: model: expected an object, found an array of 0"}},
      {[](json& j) { j.erase("model"); }, {"test.json: model: missing"}},
      {[](json& j) { j["model"]["merges"] = json::array({json::array({"h"})}); },
       {"model.merges[0]: expected \"LEFT RIGHT\" or [\"LEFT\", \"RIGHT\"]"}},
      {[](json& j) { j["pre_tokenizer"] = json{{"type", 7}}; }, {"pre_tokenizer.type: expected a string, found the number 7"}},
      {[](json& j) { j["added_tokens"][0]["special"] = "yes"; }, {"added_tokens[0].special: expected true or false"}},
  };
  for (size_t i = 0; i < misshapen.size(); ++i) {
    SCOPED_TRACE("misshapen case " + std::to_string(i));
    bad = good;
    misshapen[i].first(bad);
    try {
      load(bad);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_EQ(e.code(), ExitCode::kUsage) << message;
      EXPECT_EQ(message.find("json.exception"), std::string::npos) << message;
      for (const std::string& part : misshapen[i].second) EXPECT_NE(message.find(part), std::string::npos) << message;
    }
  }
  try {
    BpeTokenizer::from_json("{\"model\": ", "broken.json");
    ADD_FAILURE() << "broken JSON was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("json.exception"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("at byte 11: unexpected end of input"), std::string::npos) << e.what();
  }
  SCOPED_TRACE("case 10");
  expect_error([&] { BpeTokenizer::from_file("/nonexistent/tokenizer.json"); }, ExitCode::kUsage,
               {"--tokenizer", "/nonexistent/tokenizer.json"});
}

// Two tokens with one id would decode alike and make the ids ambiguous.
TEST(BpeTokenizer, TwoTokensWithOneIdAreRefused) {
  json bad = small_tokenizer({{"h", "e"}}, gpt2_pre_tokenizer());
  bad["model"]["vocab"]["duplicate"] = bad["model"]["vocab"]["a"];
  expect_error([&] { load(bad); }, ExitCode::kUsage,
               {"test.json", "model.vocab", "both have id " + std::to_string(bad["model"]["vocab"]["a"].get<int>())});
}

// Shapes of real files that Hugging Face's tokenizers loads, encoded as it encodes them.
TEST(BpeTokenizer, ReadsTheShapesOfDeepSeeksAndOtherPublishedFiles) {
  const auto& chars = byte_level::byte_to_chars();
  // DeepSeek-LLM's: no vocabulary entry for the bytes valid UTF-8 never has (C0, C1, F5-FF); their
  // characters are ordinary added tokens instead, which match those characters in the text.
  json llm = small_tokenizer({{"h", "e"}}, gpt2_pre_tokenizer());
  uint32_t next_id = 300;
  std::map<int, uint32_t> added_id;
  for (int b : {0xC0, 0xC1, 0xF5, 0xFC, 0xFF}) {
    llm["model"]["vocab"].erase(chars[b]);
    added_id[b] = next_id;
    llm["added_tokens"].push_back(json{{"id", next_id++}, {"content", chars[b]}, {"special", false}});
  }
  auto deepseek_llm = load(llm);
  EXPECT_EQ(deepseek_llm->encode("\xC3\xBC"), (std::vector<uint32_t>{added_id[0xFC]}));  // "ü", U+00FC
  // The byte itself (invalid UTF-8) reads as U+FFFD, whose bytes the vocabulary has.
  EXPECT_EQ(deepseek_llm->encode("a\xFC"), (std::vector<uint32_t>{'a', 0xEF, 0xBF, 0xBD}));
  EXPECT_EQ(deepseek_llm->encode("\xFF"), (std::vector<uint32_t>{0xEF, 0xBF, 0xBD}));
  EXPECT_EQ(deepseek_llm->decode(deepseek_llm->encode("he\xC3\xBC")), "he\xC3\xBC");
  llm["model"]["vocab"].erase(chars[0x80]);  // a byte valid UTF-8 has: still required
  expect_error([&] { load(llm); }, ExitCode::kUsage, {"model.vocab", "byte 128"});

  // Special tokens written into model.vocab (outside the byte-level alphabet); an added token with
  // the same content keeps the vocabulary's id whatever id it is given.
  json specials = small_tokenizer({{"h", "e"}}, gpt2_pre_tokenizer());
  const std::string bos = "<\uFF5Cbegin\u2581of\u2581sentence\uFF5C>";
  specials["model"]["vocab"][bos] = 400;
  specials["added_tokens"].push_back(json{{"id", 999}, {"content", bos}, {"special", true}});
  auto with_specials = load(specials);
  EXPECT_EQ(with_specials->encode(bos + "he"), (std::vector<uint32_t>{400, 256}));
  EXPECT_EQ(with_specials->decode({400, 256}), bos + "he");
  EXPECT_EQ(with_specials->vocab_size(), 401u);

  // The post-processor's leading special token starts documents and prompts; none without a template.
  EXPECT_FALSE(with_specials->bos_id().has_value());
  json templated = specials;
  json single = json::array({json{{"SpecialToken", json{{"id", bos}, {"type_id", 0}}}},
                             json{{"Sequence", json{{"id", "A"}, {"type_id", 0}}}}});
  templated["post_processor"] = json{{"type", "TemplateProcessing"}, {"single", single}};
  EXPECT_EQ(load(templated)->bos_id(), std::optional<uint32_t>(400));
  templated["post_processor"] = json{{"type", "Sequence"},
                                     {"processors", json::array({json{{"type", "ByteLevel"}},
                                                                 json{{"type", "TemplateProcessing"}, {"single", single}}})}};
  EXPECT_EQ(load(templated)->bos_id(), std::optional<uint32_t>(400));
  templated["post_processor"] = json{{"type", "TemplateProcessing"}, {"single", single}};
  templated["post_processor"]["single"][0]["SpecialToken"]["id"] = "<nope>";
  expect_error([&] { load(templated); }, ExitCode::kUsage, {"post_processor", "'<nope>', which is no token"});

  // Split with a literal pattern.
  json literal = small_tokenizer({{"a", "b"}}, json{{"type", "Split"}, {"pattern", json{{"String", "."}}},
                                                    {"behavior", "Removed"}, {"invert", false}});
  EXPECT_EQ(load(literal)->encode("ab.xab"), (std::vector<uint32_t>{256, 'x', 256}));

  // Split with invert: "Removed" then drops the gaps and keeps the matches (GPT-4o's file as
  // shipped); a gap of invalid UTF-8 is kept, not lost; "Isolated" is unchanged by it.
  auto split_of = [](const std::string& regex, const std::string& behavior, bool invert) {
    return json{{"type", "Sequence"},
                {"pretokenizers", json::array({json{{"type", "Split"}, {"pattern", json{{"Regex", regex}}},
                                                    {"behavior", behavior}, {"invert", invert}},
                                               json{{"type", "ByteLevel"}, {"add_prefix_space", false},
                                                    {"use_regex", false}}})}};
  };
  auto inverted = load(small_tokenizer({{"a", "b"}}, split_of(" ?[a-z]+|[0-9]", "Removed", true)));
  EXPECT_EQ(inverted->encode("ab cd!9"), (std::vector<uint32_t>{256, ' ', 'c', 'd', '9'}));
  EXPECT_EQ(inverted->encode("ab\xFF" "9"), (std::vector<uint32_t>{256, 0xFF, '9'}));
  auto removed = load(small_tokenizer({{"a", "b"}}, split_of(" ?[a-z]+|[0-9]", "Removed", false)));
  EXPECT_EQ(removed->encode("ab cd!9"), (std::vector<uint32_t>{'!'}));
  for (bool invert : {false, true})
    EXPECT_EQ(load(small_tokenizer({{"a", "b"}}, split_of("b", "Isolated", invert)))->encode("abab"),
              (std::vector<uint32_t>{'a', 'b', 'a', 'b'}));
  const std::string o200k =
      "[^\r\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"
      "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\r\n/]*|"
      "\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
  auto gpt4o = load(small_tokenizer({{"Ġ", "w"}}, split_of(o200k, "Removed", true)));
  const std::string text = "Hello World's 12345!!\n\n  \xE6\x97\xA5\xFF end";
  EXPECT_EQ(gpt4o->decode(gpt4o->encode(text)), text);  // the matches cover all valid text
  // " w" is one piece (a letter run with its leading space), so its merge applies.
  const std::vector<uint32_t> ids = gpt4o->encode(" w1234");
  EXPECT_EQ(ids, (std::vector<uint32_t>{256, '1', '2', '3', '4'}));

  // A Split after ByteLevel would see byte-level characters: refused, not mis-split.
  json late = small_tokenizer({{"a", "b"}}, json{{"type", "Sequence"},
                                                 {"pretokenizers", json::array({gpt2_pre_tokenizer(),
                                                                                literal["pre_tokenizer"]})}});
  expect_error([&] { load(late); }, ExitCode::kUsage, {"pre_tokenizer.pretokenizers[1]", "a Split after ByteLevel"});

  // Many added tokens (DeepSeek-V3 has about 800).
  json many = small_tokenizer({{"h", "e"}}, gpt2_pre_tokenizer());
  for (int i = 0; i < 5000; ++i)
    many["added_tokens"].push_back(json{{"id", 1000 + i}, {"content", "<|place" + std::to_string(i) + "|>"}});
  EXPECT_EQ(load(many)->encode("he<|place4999|><|place49|>x<|endoftext|>"),
            (std::vector<uint32_t>{256, 5999, 1049, 'x', 257}));

  // A pair listed twice takes its last rank, as in Hugging Face's merge map: "e l" (rank 1) before
  // "l l" (ranks 0 and 2).
  json twice = small_tokenizer({{"l", "l"}, {"e", "l"}}, gpt2_pre_tokenizer());
  twice["model"]["merges"].push_back("l l");
  EXPECT_EQ(load(twice)->encode("ell"), (std::vector<uint32_t>{257, 'l'}));

  // Ids that would index tables wrongly are refused, naming the entry.
  for (const json& id : {json(-1), json(4294967295u), json(1.5)}) {
    json bad = small_tokenizer({{"h", "e"}}, gpt2_pre_tokenizer());
    bad["model"]["vocab"]["a"] = id;
    expect_error([&] { load(bad); }, ExitCode::kUsage, {"model.vocab 'a'", "is not an integer from 0 to 16777215"});
  }
}

// A normalizer as Qwen's files have it (NFC, alone or in a Sequence): text is normalized before
// it is split, so a decomposed "é" is the precomposed one's tokens. The expectations are
// Unicode's: U+0065 U+0301 composes to U+00E9 (C3 A9); NFKC also maps U+FB01 (the "fi"
// ligature) to "f" "i"; an invalid byte between them stops composition.
TEST(BpeTokenizer, NormalizesTextAsTheFileAsks) {
  const auto& chars = byte_level::byte_to_chars();
  const std::string decomposed = "e\xCC\x81", composed = "\xC3\xA9";
  json qwen = small_tokenizer({{chars[0xC3], chars[0xA9]}}, gpt2_pre_tokenizer());
  for (const json& normalizer : {json{{"type", "NFC"}},
                                 json{{"type", "Sequence"}, {"normalizers", json::array({json{{"type", "NFC"}}})}}}) {
    qwen["normalizer"] = normalizer;
    auto tokenizer = load(qwen);
    EXPECT_EQ(tokenizer->encode("caf" + decomposed), (std::vector<uint32_t>{'c', 'a', 'f', 256}));
    EXPECT_EQ(tokenizer->encode("caf" + composed), (std::vector<uint32_t>{'c', 'a', 'f', 256}));
    EXPECT_EQ(tokenizer->decode(tokenizer->encode(decomposed + " x")), composed + " x");
    EXPECT_EQ(tokenizer->encode("e\xFF\xCC\x81"), (std::vector<uint32_t>{'e', 0xFF, 0xCC, 0x81}));
    EXPECT_EQ(tokenizer->encode("\xEF\xAC\x81"), (std::vector<uint32_t>{0xEF, 0xAC, 0x81}));  // NFC keeps ligatures
  }
  qwen["normalizer"] = json{{"type", "NFKC"}};
  EXPECT_EQ(load(qwen)->encode("\xEF\xAC\x81"), (std::vector<uint32_t>{'f', 'i'}));
  qwen["normalizer"] = json{{"type", "NFD"}};
  EXPECT_EQ(load(qwen)->encode(composed), (std::vector<uint32_t>{'e', 0xCC, 0x81}));

  // Added tokens: one marked "normalized" is found in the normalized text (its content normalized
  // too); one that is not is found only in the text as written.
  qwen["normalizer"] = json{{"type", "NFC"}};
  qwen["added_tokens"].push_back(json{{"id", 500}, {"content", "<" + decomposed + ">"}, {"normalized", true}});
  qwen["added_tokens"].push_back(json{{"id", 501}, {"content", "[" + decomposed + "]"}, {"normalized", false}});
  auto tokenizer = load(qwen);
  EXPECT_EQ(tokenizer->encode("<" + composed + ">"), (std::vector<uint32_t>{500}));
  EXPECT_EQ(tokenizer->encode("<" + decomposed + ">"), (std::vector<uint32_t>{500}));
  EXPECT_EQ(tokenizer->encode("[" + decomposed + "]"), (std::vector<uint32_t>{501}));
  EXPECT_EQ(tokenizer->encode("[" + composed + "]"), (std::vector<uint32_t>{'[', 256, ']'}));
}

// A recorded name's identity: byte, or a tokenizer.json's content hash whatever its file name;
// none for the names imported corpora give their source.
TEST(TokenizerIdentity, ByteAndTheJsonHashFixTheIdsOtherNamesDoNot) {
  EXPECT_EQ(tokenizer_identity("byte"), "byte");
  EXPECT_EQ(tokenizer_identity("bpe:tokenizer.json:0123456789abcdef"), "bpe:0123456789abcdef");
  EXPECT_EQ(tokenizer_identity("bpe:gpt2.json:0123456789abcdef"), tokenizer_identity("bpe:a:b:0123456789abcdef"));
  EXPECT_NE(tokenizer_identity("bpe:tokenizer.json:0123456789abcdef"), tokenizer_identity("bpe:tokenizer.json:fedcba9876543210"));
  for (const char* unknown : {"llm.c", "megatron", "", "bpe:"}) EXPECT_EQ(tokenizer_identity(unknown), "") << unknown;
}
