// What one rank's optimizer updates of one parameter: the whole of it, or under ZeRO-1 the
// elements [offset, offset + numel) of the flattened parameter that fall in this rank's shard.
#pragma once

#include "dstrain/core/torch_api.h"

#include <c10/util/accumulate.h>

#include <string>
#include <vector>

namespace dstrain {

struct ParameterShard {
  std::string name;                 // the parameter's global name
  torch::Tensor values;             // the parameter itself, or a 1-D view of its elements in the shard
  torch::Tensor grad;               // the matching fp32 gradient (a view of the gradient buffer)
  std::vector<int64_t> full_shape;  // of the whole parameter
  int64_t offset = 0;               // of values' first element in the flattened parameter

  bool whole() const { return offset == 0 && values.numel() == c10::multiply_integers(full_shape); }
};

}  // namespace dstrain
