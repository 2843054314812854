#include "dstrain/model/flops.h"

namespace dstrain {
namespace {

int64_t layer_matmul_parameters(const ModelConfig& c) {
  const int64_t head_dim = c.head_dim();
  const int64_t attention = c.hidden_size * c.num_heads * head_dim          // q_proj
                            + 2 * c.hidden_size * c.num_kv_heads * head_dim  // k_proj, v_proj
                            + c.num_heads * head_dim * c.hidden_size;        // o_proj
  const int64_t mlp = 3 * c.hidden_size * c.intermediate_size;              // gate, up, down
  return attention + mlp;
}

}  // namespace

ParameterCounts count_parameters(const ModelConfig& c) {
  const int64_t norms_per_layer = 2 * c.hidden_size;
  ParameterCounts counts;
  counts.embedding = c.vocab_size * c.hidden_size;
  counts.matmul = c.num_layers * layer_matmul_parameters(c) + c.vocab_size * c.hidden_size;  // + lm_head
  counts.total = counts.embedding + counts.matmul + c.num_layers * norms_per_layer + c.hidden_size;
  return counts;
}

double layer_training_flops_per_token(const ModelConfig& c, int64_t seq_len) {
  return 6.0 * static_cast<double>(layer_matmul_parameters(c)) +
         12.0 * static_cast<double>(c.num_heads * c.head_dim() * seq_len);
}

double head_training_flops_per_token(const ModelConfig& c) {
  return 6.0 * static_cast<double>(c.vocab_size * c.hidden_size);
}

double training_flops_per_token(const ModelConfig& c, int64_t seq_len) {
  return static_cast<double>(c.num_layers) * layer_training_flops_per_token(c, seq_len) +
         head_training_flops_per_token(c);
}

}  // namespace dstrain
