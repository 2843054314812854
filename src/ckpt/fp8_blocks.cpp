// Block-scaled FP8 weights to float32 and back (fp8_blocks.h), one block row at a time over the
// tensors' own memory: no padded copies of a weight.
#include "dstrain/ckpt/fp8_blocks.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "dstrain/core/fp8_e4m3.h"
#include "dstrain/ckpt/format.h"
#include "dstrain/core/error.h"

namespace dstrain {
namespace {

constexpr ExitCode kCode = ExitCode::kCheckpoint;

int64_t blocks(int64_t size, int64_t block) { return (size + block - 1) / block; }

void check_shapes(const torch::Tensor& weight, const torch::Tensor& scale_inv, Fp8BlockSize block,
                  const std::string& name) {
  if (weight.dim() != 2)
    throw Error(kCode, "tensor " + name + " has shape " + shape_text(weight.sizes().vec()) +
                           "; block-scaled FP8 weights are 2-D");
  const std::vector<int64_t> expected = fp8_scale_shape(weight.sizes().vec(), block);
  if (scale_inv.sizes().vec() != expected)
    throw Error(kCode, "tensor " + name + "'s scale_inv has shape " + shape_text(scale_inv.sizes().vec()) + "; " +
                           shape_text(weight.sizes().vec()) + " in blocks of " +
                           shape_text({block.rows, block.cols}) + " needs " + shape_text(expected));
}

}  // namespace

std::vector<int64_t> fp8_scale_shape(const std::vector<int64_t>& weight_shape, Fp8BlockSize block) {
  if (weight_shape.size() != 2) return {};
  return {blocks(weight_shape[0], block.rows), blocks(weight_shape[1], block.cols)};
}

std::string fp8_scale_problem(const torch::Tensor& scale_inv) {
  const torch::Tensor scales = scale_inv.to(torch::kFloat32).contiguous();
  const float* s = scales.data_ptr<float>();
  const int64_t cols = scales.dim() == 2 ? scales.size(1) : std::max<int64_t>(scales.numel(), 1);
  for (int64_t i = 0, n = scales.numel(); i < n; ++i) {
    if (std::isfinite(s[i]) && s[i] > 0) continue;
    const std::string where = scales.dim() == 2 ? shape_text({i / cols, i % cols}) : "[" + std::to_string(i) + "]";
    std::ostringstream value;
    value << s[i];
    return "element " + where + " is " + (std::isnan(s[i]) ? "nan" : std::isinf(s[i]) ? "infinite" : value.str()) +
           " (scales must be finite and positive)";
  }
  return "";
}

torch::Tensor fp8_dequantize(const torch::Tensor& codes, const torch::Tensor& scale_inv, Fp8BlockSize block,
                             const std::string& name) {
  check_shapes(codes, scale_inv, block, name);
  const std::string problem = fp8_scale_problem(scale_inv);
  if (!problem.empty()) throw Error(kCode, "tensor " + name + "'s scale_inv: " + problem);
  const torch::Tensor in = codes.contiguous();
  const uint8_t* c = in.data_ptr<uint8_t>();
  for (int64_t i = 0, n = in.numel(); i < n; ++i)
    if (e4m3_is_nan(c[i]))
      throw Error(kCode, "tensor " + name + ": element " + shape_text({i / in.size(1), i % in.size(1)}) +
                             " is E4M3's NaN code");
  torch::Tensor weight = e4m3_decode(in);
  const torch::Tensor scales = scale_inv.to(torch::kFloat32).contiguous();
  const int64_t rows = weight.size(0), cols = weight.size(1), scale_cols = scales.size(1);
  float* w = weight.data_ptr<float>();
  const float* s = scales.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row_scales = s + (r / block.rows) * scale_cols;
    for (int64_t col = 0; col < cols; ++col) w[r * cols + col] *= row_scales[col / block.cols];
  }
  return weight;
}

Fp8Weight fp8_quantize(const torch::Tensor& weight, Fp8BlockSize block, const std::string& name) {
  if (weight.dim() != 2)
    throw Error(kCode, "tensor " + name + " has shape " + shape_text(weight.sizes().vec()) +
                           "; block-scaled FP8 weights are 2-D");
  const torch::Tensor in = weight.to(torch::kFloat32).contiguous();
  const int64_t rows = in.size(0), cols = in.size(1);
  Fp8Weight out;
  out.scale_inv = torch::zeros(fp8_scale_shape(in.sizes().vec(), block), torch::kFloat32);
  out.codes = torch::empty({rows, cols}, torch::kUInt8);
  const float* w = in.data_ptr<float>();
  float* s = out.scale_inv.data_ptr<float>();
  uint8_t* c = out.codes.data_ptr<uint8_t>();
  const int64_t scale_cols = out.scale_inv.size(1);
  // The largest magnitude of each block first (scale_inv holds it meanwhile), then its scale.
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t col = 0; col < cols; ++col) {
      float& largest = s[(r / block.rows) * scale_cols + col / block.cols];
      const float x = std::fabs(w[r * cols + col]);
      if (!std::isfinite(x))
        throw Error(kCode, "tensor " + name + ": element " + shape_text({r, col}) +
                               " is not finite; FP8 weights need finite values");
      largest = std::max(largest, x);
    }
  // A block of zeros gets 1, as DeepSeek's; one so small that its scale would underflow to 0, the
  // smallest positive float, so that every scale stays one an import accepts.
  for (int64_t i = 0, n = out.scale_inv.numel(); i < n; ++i) {
    const float scale = s[i] / kE4M3Max;
    s[i] = scale > 0 ? scale : s[i] > 0 ? std::numeric_limits<float>::denorm_min() : 1.0f;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float* row_scales = s + (r / block.rows) * scale_cols;
    for (int64_t col = 0; col < cols; ++col) c[r * cols + col] = e4m3_code(w[r * cols + col] / row_scales[col / block.cols]);
  }
  return out;
}

}  // namespace dstrain
