#include "dstrain/data/tokenizer.h"

#include "dstrain/core/error.h"
#include "dstrain/core/files.h"
#include "dstrain/data/bpe_tokenizer.h"

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

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name, const std::string& eod_token) {
  if (name == "byte") {
    if (!eod_token.empty()) throw config_error("--eod-token", eod_token, "nothing with --tokenizer byte (its end-of-document is 256)");
    return std::make_unique<ByteTokenizer>();
  }
  if (files::is_regular_file(name)) return BpeTokenizer::from_file(name, eod_token);
  throw config_error("--tokenizer", name, "byte, or a Hugging Face tokenizer.json file (no such file)");
}

std::string tokenizer_identity(const std::string& name) {
  if (name == "byte") return name;
  if (name.rfind("bpe:", 0) == 0 && name.find(':', 4) != std::string::npos)
    return "bpe:" + name.substr(name.rfind(':') + 1);
  return "";
}

}  // namespace dstrain
