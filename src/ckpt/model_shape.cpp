// The model_shape text of a checkpoint (model_shape.h): written from a model's configuration,
// compared key by key.
#include "dstrain/ckpt/model_shape.h"

#include <sstream>

namespace dstrain {
namespace {

std::string value_of(const std::string& text, const std::string& key) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line))
    if (line.rfind(key + " = ", 0) == 0) return line.substr(key.size() + 3);
  return "?";
}

}  // namespace

std::string model_shape_text(const ModelConfig& m) {
  std::ostringstream out;
  out << "vocab_size = " << m.vocab_size << "\nhidden_size = " << m.hidden_size
      << "\nintermediate_size = " << m.intermediate_size << "\nnum_layers = " << m.num_layers
      << "\nnum_heads = " << m.num_heads << "\nnum_kv_heads = " << m.num_kv_heads << "\n";
  return out.str();
}

std::string model_shape_difference(const std::string& stored, const std::string& expected) {
  std::istringstream lines(expected);
  std::string line;
  while (std::getline(lines, line)) {
    const std::string key = line.substr(0, line.find(" = "));
    if (value_of(stored, key) != value_of(expected, key))
      return "model." + key + " = " + value_of(stored, key) + " there, " + value_of(expected, key) + " here";
  }
  return "";
}

}  // namespace dstrain
