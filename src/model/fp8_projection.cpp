#include "dstrain/model/fp8_projection.h"

#include <torch/csrc/autograd/custom_function.h>

#include <numeric>
#include <stdexcept>
#include <string>

#include "dstrain/model/expert_rows.h"
#include "dstrain/model/fp8_products.h"

namespace dstrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the autograd functions take besides tensors. `deferred_weight`: the parameter whose
// gradient the W action computes (undefined when the backward pass computes it at once); not a
// tensor argument, which would give autograd an edge to its accumulator.
struct Fp8Call {
  Fp8Products products;
  torch::Tensor deferred_weight;
  std::vector<int64_t> rows_per_expert;  // grouped only
};

void save_call(AutogradContext* ctx, const Fp8Call& call) {
  ctx->saved_data["recipe"] = static_cast<int64_t>(call.products.recipe);
  ctx->saved_data["weights"] = reinterpret_cast<int64_t>(call.products.weights);
  ctx->saved_data["kernel"] = reinterpret_cast<int64_t>(call.products.kernel);
  if (call.deferred_weight.defined()) {
    ctx->saved_data["deferred_weight"] = call.deferred_weight;
    ctx->saved_data["deferral"] = reinterpret_cast<int64_t>(call.products.deferral);
  }
}

// The input as the forward product uses it and the backward pass keeps it: the copy shared with
// the projections beside this one where there is a share.
Fp8Tensor kept_input(const Fp8Products& products, const torch::Tensor& input, int64_t part, const torch::Tensor& rows,
                     Fp8Tile tile) {
  return products.inputs ? products.inputs->quantized(input, part, rows, tile) : fp8_quantize(rows, tile);
}

Fp8Tiling saved_tiling(AutogradContext* ctx) {
  return fp8_tiling(static_cast<Fp8Recipe>(ctx->saved_data["recipe"].toInt()));
}
Fp8WeightCache& saved_cache(AutogradContext* ctx) {
  return *reinterpret_cast<Fp8WeightCache*>(ctx->saved_data["weights"].toInt());
}
Fp8Matmul* saved_kernel(AutogradContext* ctx) {
  return reinterpret_cast<Fp8Matmul*>(ctx->saved_data["kernel"].toInt());
}

// The weight's gradient: left to the W action when deferred (undefined returned), else computed.
torch::Tensor weight_gradient(AutogradContext* ctx, std::function<torch::Tensor()> gradient) {
  const auto deferred = ctx->saved_data.find("deferred_weight");
  if (deferred != ctx->saved_data.end()) {
    auto* deferral = reinterpret_cast<WeightGradientDeferral*>(ctx->saved_data["deferral"].toInt());
    deferral->defer(deferred->second.toTensor(), std::move(gradient));
    return {};
  }
  return ctx->needs_input_grad(1) ? gradient() : torch::Tensor();
}

class Fp8Projection : public torch::autograd::Function<Fp8Projection> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const Fp8Call& call) {
    const Fp8Tiling tiling = fp8_tiling(call.products.recipe);
    const Fp8Tensor kept = kept_input(call.products, x, -1, x.reshape({-1, weight.size(1)}), tiling.input);
    const Fp8Tensor w = call.products.weights->quantized(weight, tiling.weight);
    ctx->save_for_backward({weight});
    ctx->saved_data["x_codes"] = kept.codes;
    ctx->saved_data["x_scales"] = kept.scales;
    ctx->saved_data["x_shape"] = x.sizes().vec();
    ctx->saved_data["x_dtype"] = x.scalar_type();
    save_call(ctx, call);
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = weight.size(0);
    return fp8_output(kept, w, call.products.kernel).to(x.scalar_type()).view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const torch::Tensor weight = ctx->get_saved_variables()[0];
    const Fp8Tiling tiling = saved_tiling(ctx);
    const torch::Tensor dy = grad_outputs[0].reshape({-1, weight.size(0)});
    const Fp8Tensor kept{ctx->saved_data["x_codes"].toTensor(), ctx->saved_data["x_scales"].toTensor(), tiling.input};
    Fp8Matmul* kernel = saved_kernel(ctx);
    torch::Tensor dx;
    if (ctx->needs_input_grad(0))
      dx = fp8_input_gradient(dy, saved_cache(ctx).quantized(weight, tiling.weight_for_input_grad), tiling.output_grad,
                              kernel)
               .to(ctx->saved_data["x_dtype"].toScalarType())
               .view(ctx->saved_data["x_shape"].toIntVector());
    const torch::ScalarType dtype = weight.scalar_type();
    torch::Tensor dw = weight_gradient(ctx, [dy, kept, tiling, dtype, kernel] {
      return fp8_weight_gradient(dy, kept, tiling, kernel).to(dtype);
    });
    return {dx, dw, torch::Tensor()};
  }
};

// Each expert's a[e] · b[e]ᵀ into its rows of `out`: with `grouped` (the forward pass's
// Fp8Matmul::groups) one grouped kernel where it takes the operands, else a product an expert
// (b[e] is there for every expert with `grouped`, for those with rows without).
void expert_products(torch::Tensor& out, const std::vector<Fp8Tensor>& a, const std::vector<Fp8Tensor>& b,
                     const std::vector<int64_t>& counts, Fp8Matmul* kernel, bool grouped) {
  const torch::Tensor together = grouped ? kernel->grouped(a, b) : torch::Tensor();
  if (together.defined()) {
    out.copy_(together);
    return;
  }
  for_each_expert_with_rows(counts, [&](int64_t e, int64_t start, int64_t n) {
    out.narrow(0, start, n).copy_(fp8_product(a[static_cast<size_t>(e)], b[static_cast<size_t>(e)], kernel));
  });
}

// Each expert's weight quantized in `tile` (transposed: for the input gradient): every expert's
// for the grouped kernel, else those with rows.
std::vector<Fp8Tensor> expert_weights(Fp8WeightCache& cache, const torch::Tensor& weights,
                                      const std::vector<int64_t>& counts, bool grouped, Fp8Tile tile, bool transposed) {
  std::vector<Fp8Tensor> result(counts.size());
  for (size_t e = 0; e < counts.size(); ++e)
    if (grouped || counts[e] > 0) {
      const Fp8Tensor w = cache.quantized(weights, static_cast<int64_t>(e), tile);
      result[e] = transposed ? fp8_transposed(w) : w;
    }
  return result;
}

class Fp8GroupedProjection : public torch::autograd::Function<Fp8GroupedProjection> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& rows, const torch::Tensor& weights,
                               const Fp8Call& asked) {
    const bool grouped = asked.products.kernel && asked.products.kernel->groups(rows);
    Fp8Call call = asked;
    call.products.recipe = experts_recipe(asked.products.recipe, grouped);
    const Fp8Tiling tiling = fp8_tiling(call.products.recipe);
    const std::vector<int64_t>& counts = call.rows_per_expert;
    std::vector<Fp8Tensor> kept(counts.size());  // each expert's input as kept; none for one without rows
    for_each_expert_with_rows(counts, [&](int64_t e, int64_t start, int64_t n) {
      kept[static_cast<size_t>(e)] = kept_input(call.products, rows, e, rows.narrow(0, start, n), tiling.input);
    });
    torch::Tensor out = torch::empty({rows.size(0), weights.size(1)}, rows.options());  // every row an expert's
    expert_products(out, kept,
                    expert_weights(*call.products.weights, weights, counts, grouped, tiling.weight, false), counts,
                    call.products.kernel, grouped);
    std::vector<torch::Tensor> codes, scales;
    for (const Fp8Tensor& k : kept) {
      codes.push_back(k.codes);
      scales.push_back(k.scales);
    }
    ctx->save_for_backward({weights});
    ctx->saved_data["x_codes"] = codes;
    ctx->saved_data["x_scales"] = scales;
    ctx->saved_data["x_dtype"] = rows.scalar_type();
    ctx->saved_data["counts"] = counts;
    ctx->saved_data["grouped"] = grouped;
    save_call(ctx, call);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const torch::Tensor weights = ctx->get_saved_variables()[0];
    const Fp8Tiling tiling = saved_tiling(ctx);
    const torch::Tensor dy = grad_outputs[0];
    const std::vector<int64_t> counts = ctx->saved_data["counts"].toIntVector();
    const std::vector<torch::Tensor> codes = ctx->saved_data["x_codes"].toTensorVector();
    const std::vector<torch::Tensor> scales = ctx->saved_data["x_scales"].toTensorVector();
    Fp8Matmul* kernel = saved_kernel(ctx);
    torch::Tensor dx;
    if (ctx->needs_input_grad(0)) {
      std::vector<Fp8Tensor> output_grads(counts.size());
      for_each_expert_with_rows(counts, [&](int64_t e, int64_t start, int64_t n) {
        output_grads[static_cast<size_t>(e)] = fp8_quantize(dy.narrow(0, start, n), tiling.output_grad);
      });
      dx = torch::empty({dy.size(0), weights.size(2)}, dy.options().dtype(ctx->saved_data["x_dtype"].toScalarType()));
      const bool grouped = ctx->saved_data["grouped"].toBool();
      expert_products(dx, output_grads,
                      expert_weights(saved_cache(ctx), weights, counts, grouped, tiling.weight_for_input_grad, true),
                      counts, kernel, grouped);
    }
    const std::vector<int64_t> shape = weights.sizes().vec();
    const torch::TensorOptions options = weights.options();
    torch::Tensor dw = weight_gradient(ctx, [dy, codes, scales, counts, tiling, shape, options, kernel] {
      torch::Tensor result = torch::zeros(shape, options);  // zero for an expert without rows
      for_each_expert_with_rows(counts, [&](int64_t e, int64_t start, int64_t n) {
        const Fp8Tensor kept{codes[static_cast<size_t>(e)], scales[static_cast<size_t>(e)], tiling.input};
        result.select(0, e).copy_(fp8_weight_gradient(dy.narrow(0, start, n), kept, tiling, kernel));
      });
      return result;
    });
    return {dx, dw, torch::Tensor()};
  }
};

bool defers(const torch::Tensor& x, const torch::Tensor& weight, const Fp8Products& products) {
  // (Only where x carries a graph: otherwise the backward pass, and the weight's gradient with it,
  // would never run.)
  return products.deferral && products.deferral->deferring() && torch::GradMode::is_enabled() &&
         weight.requires_grad() && x.requires_grad();
}

}  // namespace

torch::Tensor fp8_projection(const torch::Tensor& x, const torch::Tensor& weight, const Fp8Products& products) {
  if (defers(x, weight, products)) return Fp8Projection::apply(x, weight.detach(), Fp8Call{products, weight, {}});
  return Fp8Projection::apply(x, weight, Fp8Call{products, torch::Tensor(), {}});
}

torch::Tensor fp8_grouped_projection(const torch::Tensor& rows, const torch::Tensor& weights,
                                     const std::vector<int64_t>& rows_per_expert, const Fp8Products& products) {
  const int64_t total = std::accumulate(rows_per_expert.begin(), rows_per_expert.end(), int64_t{0});
  if (weights.dim() != 3 || static_cast<int64_t>(rows_per_expert.size()) != weights.size(0) ||
      total != rows.size(0) || rows.size(1) != weights.size(2))
    throw std::invalid_argument("fp8_grouped_projection: " + std::to_string(rows.size(0)) +
                                " rows for counts summing to " + std::to_string(total) + ", over weights of " +
                                std::to_string(weights.dim()) + " dimensions for " +
                                std::to_string(rows_per_expert.size()) + " experts");
  if (defers(rows, weights, products))
    return Fp8GroupedProjection::apply(rows, weights.detach(), Fp8Call{products, weights, rows_per_expert});
  return Fp8GroupedProjection::apply(rows, weights, Fp8Call{products, torch::Tensor(), rows_per_expert});
}

}  // namespace dstrain
