#include "dstrain/model/flops.h"

namespace dstrain {
namespace {

struct LayerCounts {
  int64_t total = 0, active_matmul = 0, norms = 0;
};

int64_t attention_matmul_parameters(const ModelConfig& c) {
  const int64_t h = c.hidden_size, heads = c.num_heads;
  if (!c.is_mla()) {
    const int64_t d = c.head_dim();
    return h * heads * d + 2 * h * c.num_kv_heads * d + heads * d * h;  // q, k, v, o
  }
  const int64_t query = c.q_lora_rank > 0 ? h * c.q_lora_rank + c.q_lora_rank * heads * c.qk_head_dim()  // q_a, q_b
                                          : h * heads * c.qk_head_dim();                                // q_proj
  return query + h * (c.kv_lora_rank + c.qk_rope_head_dim)                       // kv_a_proj_with_mqa
         + c.kv_lora_rank * heads * (c.qk_nope_head_dim + c.v_head_dim)           // kv_b_proj
         + heads * c.v_head_dim * h;                                              // o_proj
}

LayerCounts layer_counts(const ModelConfig& c, int64_t layer) {
  const int64_t h = c.hidden_size;
  LayerCounts counts;
  counts.norms = 2 * h + (c.is_mla() ? c.kv_lora_rank + c.q_lora_rank : 0);  // MLA: q_a/kv_a_layernorm
  const int64_t attention = attention_matmul_parameters(c);
  if (!c.is_moe_layer(layer)) {
    const int64_t mlp = 3 * h * c.intermediate_size;
    counts.total = attention + mlp + counts.norms;
    counts.active_matmul = attention + mlp;
    return counts;
  }
  const int64_t expert = 3 * h * c.moe_intermediate_size;
  const int64_t router = c.n_routed_experts * h;
  counts.total = attention + router + expert * (c.n_routed_experts + c.n_shared_experts) + counts.norms;
  counts.active_matmul = attention + router + expert * (c.num_experts_per_tok + c.n_shared_experts);
  return counts;
}

}  // namespace

ParameterCounts count_parameters(const ModelConfig& c) {
  const int64_t h = c.hidden_size;
  ParameterCounts counts;
  counts.embedding = c.vocab_size * h;
  counts.matmul = c.vocab_size * h;           // lm_head
  counts.total = counts.embedding + counts.matmul + h;  // + the final norm
  int64_t layer_norms = 0;
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    const LayerCounts l = layer_counts(c, layer);
    counts.total += l.total;
    counts.matmul += l.active_matmul;
    layer_norms += l.norms;
  }
  counts.active = counts.matmul + layer_norms + h;
  // An MTP module: two norms, a projection of [h; embedding] (2h → h) and a decoder layer (an
  // MoE one where the model's last layer is), and its own final norm.
  const LayerCounts mtp_layer = layer_counts(c, c.num_layers);
  counts.mtp = c.num_nextn_predict_layers * (2 * h + 2 * h * h + mtp_layer.total + h);
  return counts;
}

int64_t layer_parameters(const ModelConfig& c, int64_t layer) { return layer_counts(c, layer).total; }

int64_t layer_routed_expert_parameters(const ModelConfig& c, int64_t layer) {
  return c.is_moe_layer(layer) ? c.n_routed_experts * 3 * c.hidden_size * c.moe_intermediate_size : 0;
}

double layer_training_flops_per_token(const ModelConfig& c, int64_t seq_len, int64_t layer) {
  return 6.0 * static_cast<double>(layer_counts(c, layer).active_matmul) +
         6.0 * static_cast<double>(c.num_heads * (c.qk_head_dim() + c.value_head_dim()) * seq_len);
}

double layer_training_flops_per_token(const ModelConfig& c, int64_t seq_len) {
  double sum = 0;
  for (int64_t layer = 0; layer < c.num_layers; ++layer) sum += layer_training_flops_per_token(c, seq_len, layer);
  return sum / static_cast<double>(c.num_layers);
}

double head_training_flops_per_token(const ModelConfig& c) {
  return 6.0 * static_cast<double>(c.vocab_size * c.hidden_size);
}

double mtp_training_flops_per_token(const ModelConfig& c, int64_t seq_len) {
  // Each module: eh_proj (2h → h), its decoder layer, and the shared LM head once more.
  const double h = static_cast<double>(c.hidden_size);
  const double module = 6.0 * 2 * h * h + layer_training_flops_per_token(c, seq_len, c.num_layers) +
                        head_training_flops_per_token(c);
  return static_cast<double>(c.num_nextn_predict_layers) * module;
}

double training_flops_per_token(const ModelConfig& c, int64_t seq_len) {
  return static_cast<double>(c.num_layers) * layer_training_flops_per_token(c, seq_len) +
         head_training_flops_per_token(c) + mtp_training_flops_per_token(c, seq_len);
}

}  // namespace dstrain
