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
  // (a cos - b sin, b cos + a sin) = x * cos + swap_pairs(x) * sin, one multiply-add per element.
  torch::Tensor cos, sin;
  bool interleave = false;
  bool cuda_kernel = true;  // apply_rope may use dstrain's kernel where built (ComputeOptions::cuda_kernels)
};

// YaRN context extension (Peng et al. 2023), as DeepSeek-V2/V3 apply it: pairs that turn fewer
// than beta_slow times over original_max_seq_len are interpolated (frequency / factor), pairs
// that turn more than beta_fast times keep their frequency, a linear ramp between; the tables are
// multiplied by mscale(factor, mscale) / mscale(factor, mscale_all_dim), where
// mscale(s, m) = 0.1 m ln(s) + 1. factor 1: plain RoPE.
struct YarnScaling {
  double factor = 1.0;
  int64_t original_max_seq_len = 4096;
  double beta_fast = 32, beta_slow = 1;
  double mscale = 1, mscale_all_dim = 0;
};

RopeTables make_rope_tables(int64_t max_seq_len, int64_t head_dim, double theta, bool interleave,
                            const YarnScaling& yarn = {});

// x: [batch, heads, seq, head_dim]; positions 0 .. seq-1 (or each row's own, with tables of
// rope_tables_at). On a GPU, with dstrain's kernels
// built and the tables' cuda_kernel, one kernel each way (src/model/cuda/rope.cu) with the tables
// in fp32; elsewhere three LibTorch operations with the tables in x's dtype.
torch::Tensor apply_rope(const torch::Tensor& x, const RopeTables& tables);

// The tables from position `first` on, so that apply_rope rotates positions first, first + 1, ...
// (the new tokens of cached decoding).
RopeTables rope_tables_from(const RopeTables& tables, int64_t first, int64_t count);

// Tables [B, 1, 1, head_dim] that rotate batch row b's one position by positions[b] ([B] long,
// on the tables' device): batched decoding, whose rows sit at positions of their own.
RopeTables rope_tables_at(const RopeTables& tables, const torch::Tensor& positions);

}  // namespace dstrain
