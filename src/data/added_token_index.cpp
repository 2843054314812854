#include "dstrain/data/added_token_index.h"

#include <algorithm>
#include <cstring>

namespace dstrain {

AddedTokenIndex::AddedTokenIndex(std::vector<Token> tokens) {
  // Longest first, so that a token that is a prefix of another never wins over it.
  std::stable_sort(tokens.begin(), tokens.end(), [](const Token& a, const Token& b) { return a.first.size() > b.first.size(); });
  for (Token& token : tokens) {
    auto& starting_alike = by_first_byte_[static_cast<unsigned char>(token.first[0])];
    if (starting_alike.empty()) first_bytes_ += token.first[0];
    starting_alike.push_back(std::move(token));
  }
}

const AddedTokenIndex::Token* AddedTokenIndex::find(std::string_view text, size_t from, size_t* at) const {
  for (size_t i = from; i < text.size(); ++i) {
    // On to the next byte that starts an added token (memchr when they all start alike: '<').
    if (first_bytes_.size() == 1) {
      const void* next = std::memchr(text.data() + i, first_bytes_[0], text.size() - i);
      if (!next) return nullptr;
      i = static_cast<size_t>(static_cast<const char*>(next) - text.data());
    } else {
      while (i < text.size() && by_first_byte_[static_cast<unsigned char>(text[i])].empty()) ++i;
      if (i == text.size()) return nullptr;
    }
    for (const Token& token : by_first_byte_[static_cast<unsigned char>(text[i])])
      if (text.compare(i, token.first.size(), token.first) == 0) {
        *at = i;
        return &token;
      }
  }
  return nullptr;
}

}  // namespace dstrain
