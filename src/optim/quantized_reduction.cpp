#include "dstrain/optim/quantized_reduction.h"

#include <vector>

#include "dstrain/core/error.h"

namespace dstrain {

torch::Tensor quantized_reduce_scatter(Communicator& group, const torch::Tensor& region, BlockFormat format,
                                       torch::Tensor residual, int64_t* bytes_sent) {
  const int64_t dp = group.size(), chunk = region.numel() / dp;
  if (chunk * dp != region.numel() || chunk % kQuantizationBlock != 0)
    throw Error(ExitCode::kInternal, "quantized reduction: the bucket is not dp whole chunks of blocks");
  const torch::Tensor sending = residual.defined() ? region + residual : region.contiguous();
  const QuantizedBlocks mine = quantize_blocks(sending, format);
  if (residual.defined()) residual.copy_(sending - dequantize_blocks(mine, format));

  // Row r of each goes to rank r; row q of what arrives is rank q's copy of this rank's chunk.
  const int64_t blocks = chunk / kQuantizationBlock;
  torch::Tensor codes = torch::empty({dp, chunk}, mine.codes.options());
  torch::Tensor scales = torch::empty({dp, blocks}, mine.scales.options());
  const std::vector<int64_t> one_row(static_cast<size_t>(dp), 1);
  group.all_to_all(codes, mine.codes.view({dp, chunk}), one_row, one_row);
  group.all_to_all(scales, mine.scales.view({dp, blocks}), one_row, one_row);
  *bytes_sent += (dp - 1) * (chunk + blocks * static_cast<int64_t>(sizeof(float)));

  torch::Tensor sum = torch::zeros({chunk}, region.options());
  for (int64_t q = 0; q < dp; ++q) sum.add_(dequantize_blocks({codes[q], scales[q]}, format));
  return sum.div_(static_cast<double>(dp));
}

void all_gather_bf16(Communicator& group, torch::Tensor& region, const torch::Tensor& chunk, int64_t* bytes_sent) {
  const torch::Tensor mine = chunk.to(torch::kBFloat16);
  torch::Tensor all = torch::empty({region.numel()}, mine.options());
  group.all_gather(all, mine);
  region.copy_(all);
  *bytes_sent += (group.size() - 1) * chunk.numel() * 2;
}

}  // namespace dstrain
