// The completion text of dstrain serve: stop strings cut it, streaming shows only what no later
// token can change, and UTF-8 characters are never split.
#include <gtest/gtest.h>

#include "dstrain/serve/completion_text.h"

using namespace dstrain;

TEST(CompletionText, AStopStringCutsTheTextWhereItStartsEvenAcrossPieces) {
  CompletionText text({"lazy", "dog"});
  EXPECT_FALSE(text.append("over the l"));
  EXPECT_EQ(text.settled(), std::string("over the ").size());  // "l" may start "lazy"
  EXPECT_FALSE(text.append("a"));
  EXPECT_EQ(text.settled(), std::string("over the ").size());
  EXPECT_TRUE(text.append("zy dog"));
  EXPECT_TRUE(text.stopped());
  EXPECT_EQ(text.text(), "over the ");
  EXPECT_EQ(text.settled(), text.text().size());
  EXPECT_TRUE(text.append("more"));  // nothing is taken once stopped
  EXPECT_EQ(text.text(), "over the ");
}

TEST(CompletionText, TheEarliestStopStringWinsAndAFalseStartIsReleased) {
  CompletionText text({"b c", "c"});
  EXPECT_FALSE(text.append("a b"));
  EXPECT_EQ(text.settled(), 2u);  // "b" may start "b c"
  EXPECT_FALSE(text.append("x"));
  EXPECT_EQ(text.settled(), 4u);  // "a bx": no stop string can start in it any more
  EXPECT_TRUE(text.append(" b c"));
  EXPECT_EQ(text.text(), "a bx ");
}

TEST(CompletionText, WithoutStopStringsEverythingButAHalfCharacterIsSettled) {
  CompletionText text;
  EXPECT_FALSE(text.append("caf\xC3"));  // é cut after its first byte
  EXPECT_EQ(text.settled(), 3u);
  EXPECT_FALSE(text.append("\xA9 \xE2\x82"));  // é completed; € cut after two of its three bytes
  EXPECT_EQ(text.settled(), 6u);
  EXPECT_FALSE(text.append("\xAC"));
  EXPECT_EQ(text.settled(), text.text().size());
}

TEST(CompletionText, Utf8HelpersCountCharactersAndKeepBytesThatStartNone) {
  EXPECT_EQ(whole_utf8_prefix(""), 0u);
  EXPECT_EQ(whole_utf8_prefix("\xF0\x9F\x98"), 0u);  // 3 of an emoji's 4 bytes
  EXPECT_EQ(whole_utf8_prefix("a\xF0\x9F\x98\x80"), 5u);
  EXPECT_EQ(whole_utf8_prefix("a\xFF"), 2u);  // no UTF-8 at all: a byte of its own, nothing to wait for
  EXPECT_EQ(utf8_characters("caf\xC3\xA9 \xE2\x82\xAC"), 6u);
}
