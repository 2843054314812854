// The added tokens of a tokenizer (special tokens and the like), found in text before anything
// else splits it: leftmost first, and the longest at a position (Hugging Face's leftmost-longest
// match), by the first byte so that text without any is passed over quickly.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dstrain {

class AddedTokenIndex {
 public:
  using Token = std::pair<std::string, uint32_t>;  // content, id

  AddedTokenIndex() = default;
  explicit AddedTokenIndex(std::vector<Token> tokens);

  bool empty() const { return first_bytes_.empty(); }

  // The first added token in `text` at or after `from`: where it starts and which it is; nullptr
  // when there is none.
  const Token* find(std::string_view text, size_t from, size_t* at) const;

  // Calls on_token(id) for each added token of `text` and on_gap(stretch) for each non-empty
  // stretch between them, in order.
  template <typename OnToken, typename OnGap>
  void split(std::string_view text, OnToken on_token, OnGap on_gap) const {
    size_t gap = 0, at = 0;
    while (const Token* token = find(text, gap, &at)) {
      if (at > gap) on_gap(text.substr(gap, at - gap));
      on_token(token->second);
      gap = at + token->first.size();
    }
    if (text.size() > gap) on_gap(text.substr(gap));
  }

 private:
  std::array<std::vector<Token>, 256> by_first_byte_;  // longest first
  std::string first_bytes_;                            // the distinct first bytes
};

}  // namespace dstrain
