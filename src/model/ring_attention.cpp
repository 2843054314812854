// Ring attention (model/context_parallel.h) as one autograd function with its own backward pass,
// so that what it keeps is its queries, what it passed, its output and the log-sum-exp of each
// query's scores: the probabilities of every pair of chunks and every rank's expanded keys and
// values (MLA: 70× the latent) are made again in the backward pass, one ring step at a time.
#include "dstrain/model/context_parallel.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <array>
#include <limits>

namespace dstrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the backward pass needs besides tensors: the expansion, the group and the scale.
struct RingSpec : torch::CustomClassHolder {
  RingAttentionInputs inputs;
  ContextParallelGroup* group = nullptr;
  int64_t* score_elements = nullptr;
};

torch::ScalarType compute_type(const torch::Tensor& query) {
  return query.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

// The chunks a ring step pairs: query chunk a of this rank (0 or 1, n positions each) with key
// chunk b of the rank whose keys it holds, unless b lies wholly in a's future; the diagonal pair
// is causal within itself.
struct ChunkPair {
  int64_t a, b;
  bool causal;
};

std::vector<ChunkPair> pairs_of_step(int rank, int step, int size) {
  const auto mine = context_chunks_of(rank, size);
  const auto theirs = context_chunks_of((rank - step + size) % size, size);  // step s: rank − s's
  const std::array<int64_t, 2> query_chunks = {mine.first, mine.second}, key_chunks = {theirs.first, theirs.second};
  std::vector<ChunkPair> pairs;
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t b = 0; b < 2; ++b)
      if (query_chunks[a] >= key_chunks[b]) pairs.push_back({a, b, query_chunks[a] == key_chunks[b]});
  return pairs;
}

// The query rows of a chunk of n scored at once, so that a block's scores hold at most
// `elements` (the transient memory of a step, whatever the chunk's length).
int64_t query_block_rows(const torch::Tensor& q, int64_t n, int64_t elements) {
  return std::clamp<int64_t>(elements / std::max<int64_t>(1, q.size(0) * q.size(1) * n), 1, n);
}

// One block of queries against one chunk of keys: rows [row, row + rows) of query chunk a with
// key chunk b of the pair.
struct Block {
  const ChunkPair& pair;
  int64_t n, row, rows;
  torch::Tensor queries(const torch::Tensor& per_query) const { return per_query.narrow(2, pair.a * n + row, rows); }
  torch::Tensor keys(const torch::Tensor& per_key) const { return per_key.narrow(2, pair.b * n, n); }
};

template <typename Visit>
void for_each_block(const std::vector<ChunkPair>& pairs, int64_t n, int64_t rows, Visit&& visit) {
  for (const ChunkPair& pair : pairs)
    for (int64_t row = 0; row < n; row += rows) visit(Block{pair, n, row, std::min(rows, n - row)});
}

// q kᵀ · scale for a block, the future masked where the pair is the diagonal one.
torch::Tensor scores_of(const Block& block, const torch::Tensor& q, const torch::Tensor& k, double scale) {
  torch::Tensor scores = torch::matmul(block.queries(q), block.keys(k).transpose(-2, -1)) * scale;
  if (!block.pair.causal) return scores;
  const auto options = torch::dtype(torch::kLong).device(q.device());
  const torch::Tensor query_position = torch::arange(block.row, block.row + block.rows, options).unsqueeze(1);
  const torch::Tensor future = torch::arange(block.n, options).unsqueeze(0) > query_position;
  return scores.masked_fill(future, -std::numeric_limits<double>::infinity());
}

std::pair<torch::Tensor, torch::Tensor> expanded(const RingAttentionInputs& in, const torch::Tensor& passed,
                                                 torch::ScalarType compute) {
  auto [k, v] = in.keys_values(passed);
  return {k.to(compute), v.to(compute)};
}

// Attention so far, in place: `out` normalised over the keys seen and `lse` the log of their
// softmax denominator (−∞ before any), a block's part merged in by the log-sum-exp rule.
void merge_into(const Block& block, torch::Tensor& out, torch::Tensor& lse, const torch::Tensor& block_out,
                const torch::Tensor& block_lse) {
  torch::Tensor seen_out = block.queries(out), seen_lse = block.queries(lse);
  const torch::Tensor joint = torch::logaddexp(seen_lse, block_lse);
  seen_out.mul_((seen_lse - joint).exp().unsqueeze(-1)).add_(block_out * (block_lse - joint).exp().unsqueeze(-1));
  seen_lse.copy_(joint);
}

// The gradients a ring step's pairs give the queries (added to dq) and the keys and values it
// holds (returned), from the output's gradient dout, the log-sum-exp of every query's scores and
// delta = rowsum(dout · out) (flash attention's backward pass).
struct StepGradients {
  torch::Tensor dk, dv;
};

StepGradients attention_backward(const std::vector<ChunkPair>& pairs, const torch::Tensor& q, const torch::Tensor& k,
                                 const torch::Tensor& v, const torch::Tensor& dout, const torch::Tensor& lse,
                                 const torch::Tensor& delta, const RingAttentionInputs& in, torch::Tensor& dq) {
  const int64_t n = q.size(2) / 2;
  StepGradients g{torch::zeros_like(k), torch::zeros_like(v)};
  for_each_block(pairs, n, query_block_rows(q, n, in.score_block_elements), [&](const Block& block) {
    const torch::Tensor dout_block = block.queries(dout);
    const torch::Tensor probabilities = (scores_of(block, q, k, in.scale) - block.queries(lse).unsqueeze(-1)).exp();
    block.keys(g.dv).add_(torch::matmul(probabilities.transpose(-2, -1), dout_block));
    const torch::Tensor dprob = torch::matmul(dout_block, block.keys(v).transpose(-2, -1));
    const torch::Tensor dscores = probabilities * (dprob - block.queries(delta).unsqueeze(-1)) * in.scale;
    block.queries(dq).add_(torch::matmul(dscores, block.keys(k)));
    block.keys(g.dk).add_(torch::matmul(dscores.transpose(-2, -1), block.queries(q)));
  });
  return g;
}

class RingAttention : public torch::autograd::Function<RingAttention> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& query, const torch::Tensor& passed,
                               at::TensorList /*expansion_parameters: differentiated through keys_values*/,
                               const c10::intrusive_ptr<RingSpec>& spec) {
    ContextParallelGroup& group = *spec->group;
    const int size = group.size(), rank = group.rank();
    const auto compute = compute_type(query);
    const torch::Tensor q = query.to(compute);
    const int64_t n = q.size(2) / 2, rows = query_block_rows(q, n, spec->inputs.score_block_elements);
    torch::Tensor out, lse;  // made at the first step, when the values' width is known
    torch::Tensor held = passed.contiguous();
    for (int step = 0; step < size; ++step) {
      // The next rank's keys travel while this step's are attended to.
      auto next = step + 1 < size ? group.start_pass({held}) : nullptr;
      const auto [k, v] = expanded(spec->inputs, held, compute);
      if (step == 0) {
        out = torch::zeros({q.size(0), q.size(1), q.size(2), v.size(-1)}, q.options());
        lse = torch::full({q.size(0), q.size(1), q.size(2)}, -std::numeric_limits<double>::infinity(), q.options());
      }
      for_each_block(pairs_of_step(rank, step, size), n, rows, [&](const Block& block) {
        const torch::Tensor scores = scores_of(block, q, k, spec->inputs.scale);
        const torch::Tensor block_lse = scores.logsumexp(-1);
        merge_into(block, out, lse, torch::matmul((scores - block_lse.unsqueeze(-1)).exp(), block.keys(v)), block_lse);
        if (spec->score_elements) *spec->score_elements += q.size(0) * q.size(1) * block.rows * n;
      });
      if (next) held = next->wait()[0];
    }
    out = out.to(query.scalar_type());
    ctx->save_for_backward({query, passed, out, lse});
    ctx->saved_data["spec"] = c10::IValue::make_capsule(c10::intrusive_ptr<torch::CustomClassHolder>(spec));
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &query = saved[0], &passed = saved[1], &out = saved[2], &lse = saved[3];
    const auto spec = c10::static_intrusive_pointer_cast<RingSpec>(ctx->saved_data["spec"].toCapsule());
    const RingAttentionInputs& in = spec->inputs;
    ContextParallelGroup& group = *spec->group;
    const int size = group.size(), rank = group.rank();
    const auto compute = compute_type(query);
    const torch::Tensor q = query.to(compute), dout = grads[0].to(compute);
    const torch::Tensor delta = (dout * out.to(compute)).sum(-1);
    torch::Tensor dq = torch::zeros_like(q);
    std::vector<torch::Tensor> dparameters(in.expansion_parameters.size());
    // Step s holds what rank − s passed, and receives the gradient of it that ranks − s … − 1 have
    // gathered; it adds its own share and sends the sum on with the next step's pass.
    torch::Tensor held = passed.contiguous(), gathered;
    for (int step = 0; step < size; ++step) {
      std::vector<torch::Tensor> outgoing;
      if (step + 1 < size) outgoing.push_back(held);
      if (step > 0) outgoing.push_back(gathered);
      auto next = outgoing.empty() ? nullptr : group.start_pass(outgoing);
      torch::Tensor share = share_of_step(spec, held, q, dout, lse, delta, rank, step, dq, dparameters);
      if (next) {
        std::vector<torch::Tensor> arrived = next->wait();
        if (step > 0) share.add_(arrived.back());
        if (step + 1 < size) held = arrived.front();
      }
      gathered = share;
    }
    torch::Tensor dpassed = gathered;  // with one rank, its own
    if (size > 1) dpassed = group.start_pass({gathered})->wait()[0];
    variable_list result = {dq.to(query.scalar_type()), dpassed.to(passed.scalar_type())};
    for (torch::Tensor& d : dparameters) result.push_back(d);
    result.emplace_back();  // the spec
    return result;
  }

 private:
  // This rank's share of the gradient of `held` (what rank − step passed), in the compute dtype;
  // its shares of the expansion parameters' gradients are added to `dparameters`.
  static torch::Tensor share_of_step(const c10::intrusive_ptr<RingSpec>& spec, const torch::Tensor& held,
                                     const torch::Tensor& q, const torch::Tensor& dout, const torch::Tensor& lse,
                                     const torch::Tensor& delta, int rank, int step, torch::Tensor& dq,
                                     std::vector<torch::Tensor>& dparameters) {
    const RingAttentionInputs& in = spec->inputs;
    const auto compute = q.scalar_type();
    const torch::Tensor leaf = held.detach().requires_grad_(true);
    torch::AutoGradMode differentiable(true);  // the expansion again, to differentiate it
    auto [k, v] = in.keys_values(leaf);
    const StepGradients g = attention_backward(pairs_of_step(rank, step, spec->group->size()), q, k.to(compute),
                                               v.to(compute), dout, lse, delta, in, dq);
    variable_list inputs = {leaf};
    inputs.insert(inputs.end(), in.expansion_parameters.begin(), in.expansion_parameters.end());
    const variable_list d =
        torch::autograd::grad({k, v}, inputs, {g.dk.to(k.scalar_type()), g.dv.to(v.scalar_type())},
                              /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t i = 0; i < dparameters.size(); ++i) {
      if (!d[i + 1].defined()) continue;
      dparameters[i] = dparameters[i].defined() ? dparameters[i] + d[i + 1] : d[i + 1];
    }
    return d[0].defined() ? d[0].to(compute) : torch::zeros(held.sizes(), held.options().dtype(compute));
  }
};

}  // namespace

torch::Tensor ring_attention(const RingAttentionInputs& inputs, ContextParallelGroup& group, int64_t* score_elements) {
  auto spec = c10::make_intrusive<RingSpec>();
  spec->inputs = inputs;
  spec->inputs.query = spec->inputs.passed = torch::Tensor();  // held by the function as its inputs
  spec->group = &group;
  spec->score_elements = score_elements;
  return RingAttention::apply(inputs.query, inputs.passed, at::TensorList(inputs.expansion_parameters), spec);
}

}  // namespace dstrain
