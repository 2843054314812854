// The causal attention of the model's layers: compat::causal_attention on [batch, heads, seq,
// head_dim] queries, keys and values, with the given softmax scale.
//
// Under selective recomputation, where attention is unfused (LibTorch < 2.1, which keeps the
// softmax probabilities: heads × seq² a layer, the largest activation it has), the probabilities
// are not kept: they are given back once multiplied with the values and computed again from the
// kept queries and keys just before that product's backward pass needs them, so that nothing
// seq² is kept, as with fused attention. Only the scores and the softmax rerun, not the product
// with the values. Fused attention keeps no probabilities and runs as it is.
#pragma once

#include "dstrain/core/torch_api.h"

#include "dstrain/model/recompute.h"

namespace dstrain {

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double scale,
                               SelectiveRecompute selective = {});

}  // namespace dstrain
