// A checkpoint's model_shape (/trainer): the model keys that fix its tensors' shapes, written and
// compared here together, so that a run can refuse another model's checkpoint by name before it
// reads a tensor.
#pragma once

#include <string>

#include "dstrain/model/model_config.h"

namespace dstrain {

// One "key = value" per line.
std::string model_shape_text(const ModelConfig& model);

// "model.KEY = A there, B here" for the first key of `expected` whose value `stored` does not
// share (A: "?" where `stored` lacks the key); "" when there is none.
std::string model_shape_difference(const std::string& stored, const std::string& expected);

}  // namespace dstrain
