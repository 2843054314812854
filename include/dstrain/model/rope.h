// Rotary position embedding in the two layouts DeepSeek checkpoints use.
//   half-split  (rotate-half): the pair of dimension i is (i, i + d/2), as in HF Llama-format
//               DeepSeek-LLM checkpoints;
//   interleaved: the pair of dimension i is (2i, 2i + 1), as in DeepSeek-V2/V3 checkpoints.
// Frequency of pair i: theta^(-2i/d); position p rotates the pair by the angle p × frequency.
#pragma once

#include "dstrain/core/torch_api.h"

namespace dstrain {

struct RopeTables {
  // [max_seq_len, head_dim], each pair's angle in both its slots. The sine carries the rotation's
  // sign: -sin in the pair's first slot, +sin in its second, so that a pair (a, b) becomes
  // (a cos - b sin, b cos + a sin) = x * cos + swap_pairs(x) * sin, in three kernels.
  torch::Tensor cos, sin;
  bool interleave = false;
};

RopeTables make_rope_tables(int64_t max_seq_len, int64_t head_dim, double theta, bool interleave);

// x: [batch, heads, seq, head_dim]; positions 0 .. seq-1.
torch::Tensor apply_rope(const torch::Tensor& x, const RopeTables& tables);

}  // namespace dstrain
