#include "dstrain/model/parameter_shapes.h"

#include <algorithm>

#include "dstrain/core/text.h"

namespace dstrain {
namespace {

using Shapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

void add_swiglu(Shapes& shapes, const std::string& prefix, int64_t hidden, int64_t intermediate) {
  shapes.push_back({prefix + "gate_proj.weight", {intermediate, hidden}});
  shapes.push_back({prefix + "up_proj.weight", {intermediate, hidden}});
  shapes.push_back({prefix + "down_proj.weight", {hidden, intermediate}});
}

// Decoder layer `layer` under `prefix` ("model.layers.<i>."): attention, MLP or MoE, two norms.
void add_decoder_layer(Shapes& shapes, const std::string& prefix, const ModelConfig& c, int64_t layer) {
  const int64_t h = c.hidden_size, heads = c.num_heads;
  const std::string attention = prefix + "self_attn.";
  if (c.is_mla()) {
    const int64_t qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
    if (c.q_lora_rank > 0) {
      shapes.push_back({attention + "q_a_proj.weight", {c.q_lora_rank, h}});
      shapes.push_back({attention + "q_a_layernorm.weight", {c.q_lora_rank}});
      shapes.push_back({attention + "q_b_proj.weight", {heads * qk, c.q_lora_rank}});
    } else {
      shapes.push_back({attention + "q_proj.weight", {heads * qk, h}});
    }
    shapes.push_back({attention + "kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, h}});
    shapes.push_back({attention + "kv_a_layernorm.weight", {c.kv_lora_rank}});
    shapes.push_back({attention + "kv_b_proj.weight", {heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}});
    shapes.push_back({attention + "o_proj.weight", {h, heads * c.v_head_dim}});
  } else {
    const int64_t d = c.head_dim();
    shapes.push_back({attention + "q_proj.weight", {heads * d, h}});
    shapes.push_back({attention + "k_proj.weight", {c.num_kv_heads * d, h}});
    shapes.push_back({attention + "v_proj.weight", {c.num_kv_heads * d, h}});
    shapes.push_back({attention + "o_proj.weight", {h, heads * d}});
  }
  const std::string mlp = prefix + "mlp.";
  if (c.is_moe_layer(layer)) {
    shapes.push_back({mlp + "gate.weight", {c.n_routed_experts, h}});
    if (c.topk_method == TopkMethod::kNoauxTc)
      shapes.push_back({mlp + "gate.e_score_correction_bias", {c.n_routed_experts}});
    for (int64_t e = 0; e < c.n_routed_experts; ++e)
      add_swiglu(shapes, mlp + "experts." + std::to_string(e) + ".", h, c.moe_intermediate_size);
    if (c.n_shared_experts > 0)
      add_swiglu(shapes, mlp + "shared_experts.", h, c.moe_intermediate_size * c.n_shared_experts);
  } else {
    add_swiglu(shapes, mlp, h, c.intermediate_size);
  }
  shapes.push_back({prefix + "input_layernorm.weight", {h}});
  shapes.push_back({prefix + "post_attention_layernorm.weight", {h}});
}

}  // namespace

std::vector<std::pair<std::string, std::vector<int64_t>>> parameter_shapes(const ModelConfig& c) {
  const int64_t h = c.hidden_size;
  Shapes shapes = {{"model.embed_tokens.weight", {c.vocab_size, h}},
                   {"model.norm.weight", {h}},
                   {"lm_head.weight", {c.vocab_size, h}}};
  for (int64_t layer = 0; layer < c.num_layers + c.num_nextn_predict_layers; ++layer) {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    add_decoder_layer(shapes, prefix, c, layer);
    if (layer >= c.num_layers) {  // a multi-token prediction module around its decoder layer
      shapes.push_back({prefix + "enorm.weight", {h}});
      shapes.push_back({prefix + "hnorm.weight", {h}});
      shapes.push_back({prefix + "eh_proj.weight", {h, 2 * h}});
      shapes.push_back({prefix + "shared_head.norm.weight", {h}});
    }
  }
  std::sort(shapes.begin(), shapes.end());
  return shapes;
}

c10::ScalarType parameter_dtype(const std::string& name, c10::ScalarType model_dtype) {
  return ends_with(name, "e_score_correction_bias") ? c10::ScalarType::Float : model_dtype;
}

TensorParallelSplit tensor_parallel_split(const std::string& name) {
  if (name.find(".mlp.experts.") != std::string::npos) return TensorParallelSplit::kWhole;  // expert parallelism's
  for (const char* rows : {"embed_tokens.weight", "lm_head.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                           "self_attn.v_proj.weight", "self_attn.q_b_proj.weight", "self_attn.kv_b_proj.weight",
                           "gate_proj.weight", "up_proj.weight"})
    if (ends_with(name, rows)) return TensorParallelSplit::kRows;
  for (const char* columns : {"self_attn.o_proj.weight", "down_proj.weight"})
    if (ends_with(name, columns)) return TensorParallelSplit::kColumns;
  return TensorParallelSplit::kWhole;
}

int64_t tensor_parallel_dim(const std::string& name) {
  switch (tensor_parallel_split(name)) {
    case TensorParallelSplit::kRows: return 0;
    case TensorParallelSplit::kColumns: return 1;
    case TensorParallelSplit::kWhole: break;
  }
  return -1;
}

int64_t parameter_layer(const std::string& name) {
  const std::string layers = "model.layers.";
  if (name.compare(0, layers.size(), layers) != 0) return -1;
  size_t end = layers.size();
  while (end < name.size() && name[end] >= '0' && name[end] <= '9') ++end;
  if (end == layers.size() || end - layers.size() > 9 || end >= name.size() || name[end] != '.') return -1;
  return std::stoll(name.substr(layers.size(), end - layers.size()));
}

bool tensor_parallel_partial_gradient(const std::string& name, const ModelConfig& config, bool sequence_parallel) {
  if (name.find(".mlp.experts.") != std::string::npos || ends_with(name, ".mlp.gate.weight")) return true;
  if (!sequence_parallel || tensor_parallel_split(name) != TensorParallelSplit::kWhole) return false;
  return parameter_layer(name) < config.num_layers;  // the multi-token prediction modules hold the whole sequence
}

}  // namespace dstrain
