#include "dstrain/data/tokenizer.h"

#include "dstrain/core/error.h"

namespace dstrain {

std::vector<uint32_t> ByteTokenizer::encode(const std::string& text) const {
  std::vector<uint32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<uint32_t>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (uint32_t id : ids)
    if (id < 256) text.push_back(static_cast<char>(id));  // special tokens have no bytes
  return text;
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name) {
  if (name == "byte") return std::make_unique<ByteTokenizer>();
  throw config_error("--tokenizer", name, "expected byte (the only tokenizer built in so far)");
}

}  // namespace dstrain
