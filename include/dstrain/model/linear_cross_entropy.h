// The language-model loss: the mean cross-entropy of the LM head's logits (hidden @ weightᵀ)
// against the target tokens, computed without keeping what the usual log_softmax + nll_loss
// graph keeps.
//
// The logits are [tokens, vocabulary] (16k × 102k at a micro-batch of 8 × 2048: 3.4 GB in bf16).
// That graph keeps an fp32 log-softmax of them for the backward pass, which makes an fp32
// gradient of the same size and a third pass to bring it back to the logits' dtype: about 36
// bytes of memory traffic per logit and up to 13 GB of memory per micro-batch. Here the
// log-softmax is taken in row chunks (fp32, one chunk alive at a time); each chunk gives its
// losses, and its softmax minus the one-hot targets, the logits' gradient up to a scalar, is
// written over the logits as soon as it is known. The backward pass applies the scalar (the
// incoming gradient over the token count) to the two [tokens, hidden] and [vocabulary, hidden]
// products instead of to the logits: about 20 bytes per logit, and no memory beyond the logits.
// On a GPU with dstrain's kernels built (and `cuda_kernel`), one kernel does a row's softmax in one
// pass without fp32 copies (src/model/cuda/softmax_cross_entropy.cu): 4 to 6 bytes per logit.
//
// The loss and the softmax are computed in fp32 whatever the dtype of hidden and weight; the
// gradient of the target logit, softmax − 1, is taken from the fp32 log-probability, so it loses
// nothing to the rounding of a probability near one. fp16 keeps the log_softmax + nll_loss
// graph: written unscaled, fp16 would lose the probabilities below its range (6e-8), of which a
// large vocabulary has many, while that graph scales them by the loss scale first.
#pragma once

#include "dstrain/core/torch_api.h"

namespace dstrain {

// Elements of logits whose fp32 log-softmax is alive at once, when chunk_rows is 0: 16 MB (twice
// that from bf16 logits, which LibTorch converts to fp32 before its log-softmax; only fp16 has a
// converting kernel). Small beside the logits, which it meets at the forward pass's peak with
// every logits' gradient kept before it (a multi-token prediction module's head comes second);
// large enough that a chunk's launches cost nothing beside its work.
constexpr int64_t kLossChunkElements = int64_t{1} << 22;

// hidden [..., H] and weight [V, H] of one dtype; targets [...] (int64) with hidden's leading
// shape. Returns the mean over the targets as a 0-dim fp32 tensor, differentiable (first order)
// with respect to hidden and weight. `chunk_rows`: rows per log-softmax chunk; 0 takes as many
// as fit in 16 MB of fp32 (the GPU kernel takes all rows at once).
torch::Tensor linear_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                   const torch::Tensor& targets, int64_t chunk_rows = 0, bool cuda_kernel = true);

}  // namespace dstrain
