// The data-parallel average of a gradient bucket with 8-bit values on the wire, as DeepSpeed's
// ZeRO++ quantized gradients do it: the bucket's dp equal chunks are quantized in blocks
// (block_quantization.h) and each goes to the rank that owns it, in one all-to-all; the owner
// dequantizes the dp copies of its chunk and sums them in fp32, in rank order, then divides by
// dp. That is about a quarter of an fp32 reduce-scatter's bytes. Unless the buffer is sharded
// (ZeRO-1 keeps just its chunk), the averaged chunks are then all-gathered in bf16.
#pragma once

#include "dstrain/core/torch_api.h"

#include <cstdint>

#include "dstrain/parallel/communicator.h"
#include "dstrain/optim/block_quantization.h"

namespace dstrain {

// `region`: fp32, 1-D, dp chunks each a multiple of kQuantizationBlock long. `residual`:
// undefined, or this rank's error feedback for the region (of the same shape): added to the
// region before quantizing, and replaced by what quantizing lost. Returns this rank's chunk of
// the average (fp32); adds the bytes this rank sent to *bytes_sent.
torch::Tensor quantized_reduce_scatter(Communicator& group, const torch::Tensor& region, BlockFormat format,
                                       torch::Tensor residual, int64_t* bytes_sent);

// Every rank's `chunk` into `region` (rank r's at r × chunk), sent as bf16; this rank's own chunk
// is rounded alike, so that every rank holds the same values.
void all_gather_bf16(Communicator& group, torch::Tensor& region, const torch::Tensor& chunk, int64_t* bytes_sent);

}  // namespace dstrain
