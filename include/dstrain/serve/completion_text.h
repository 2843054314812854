// The text of one completion as its tokens arrive: where a stop string ends it, and how much of it
// is settled (streaming shows that much): nothing a stop string could still take back, and no
// half of a UTF-8 character.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace dstrain {

class CompletionText {
 public:
  explicit CompletionText(std::vector<std::string> stop = {});
  // Appends a token's text. True when a stop string now occurs: the text is cut where the first
  // one starts, and nothing more may be appended.
  bool append(const std::string& piece);
  const std::string& text() const { return text_; }
  bool stopped() const { return stopped_; }
  // The length of the text's prefix that no later token can change. The whole text once stopped.
  size_t settled() const;

 private:
  std::vector<std::string> stop_;
  size_t longest_stop_ = 0;
  std::string text_;
  bool stopped_ = false;
};

// The length of `text`'s longest prefix of whole UTF-8 characters (a character cut at the end is
// left out; bytes that are no UTF-8 at all count as characters).
size_t whole_utf8_prefix(const std::string& text);

// Characters (code points) of UTF-8 text: the offsets clients index strings by.
size_t utf8_characters(const std::string& text);

}  // namespace dstrain
