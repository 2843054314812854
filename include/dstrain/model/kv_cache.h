// What generation keeps of the positions a model has already read, so that each new token
// attends to them without recomputing them. The attention modules fill and read it
// (forward_cached); its shapes are theirs.
#pragma once

#include "dstrain/core/torch_api.h"

#include <cstdint>
#include <vector>

namespace dstrain {

// One attention layer's cache, room for `capacity` positions (model.max_seq_len), filled up to
// the model's KvCache::length.
struct AttentionCache {
  // Multi-head / grouped-query attention: keys (rotated) and values of the key/value heads,
  // [batch, kv_heads, capacity, head_dim] each.
  torch::Tensor keys, values;
  // Multi-head Latent Attention, as DeepSeek-V2 caches it (§2.1.2): the compressed key/value
  // latent after kv_a_layernorm, [batch, capacity, kv_lora_rank], and the decoupled RoPE key
  // (rotated), shared by the heads, [batch, capacity, qk_rope_head_dim]: kv_lora_rank +
  // qk_rope_head_dim numbers a position, expanded by kv_b_proj when attended to.
  torch::Tensor latent, rope_key;
};

// Every decoder layer's cache, in layer order, and how many positions they hold. `length` is
// the positions of every row alike (forward_cached); batched decoding (forward_decode) keeps its
// rows at positions of their own, which its caller holds.
struct KvCache {
  std::vector<AttentionCache> layers;
  int64_t length = 0;
};

// One step of batched decoding (continuous batching): a new token for each of the first B rows
// of a cache, row b's at position positions[b], so that sequences of any length decode side by
// side. Made once a step (DecoderStackImpl::forward_decode) for every layer.
struct DecodeStep {
  torch::Tensor rows;       // [B] long: 0 .. B - 1, the rows written
  torch::Tensor positions;  // [B] long: where each row's new token goes
  torch::Tensor visible;    // [B, 1, 1, keys] bool: row b sees its keys 0 .. positions[b]
  int64_t keys = 0;         // max(positions) + 1: the cache positions attention reads
};

}  // namespace dstrain
