#include "dstrain/ckpt/hf_config.h"

#include "dstrain/core/error.h"

namespace dstrain {

const char* hf_torch_dtype(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kBFloat16: return "bfloat16";
    case torch::kFloat16: return "float16";
    case torch::kFloat32: return "float32";
    default: throw Error(ExitCode::kInternal, std::string("config.json: no torch_dtype for ") + c10::toString(dtype));
  }
}

HfConfig hf_config(const ModelConfig& m, torch::ScalarType dtype) {
  HfConfig out;
  nlohmann::json& j = out.json;
  const bool v3 = m.n_routed_experts > 0 && (m.topk_method == "noaux_tc" || m.scoring_func == "sigmoid");
  const bool deepseek = v3 || m.is_mla() || m.n_routed_experts > 0;
  j["model_type"] = v3 ? "deepseek_v3" : deepseek ? "deepseek_v2" : "llama";
  j["architectures"] = {v3 ? "DeepseekV3ForCausalLM" : deepseek ? "DeepseekV2ForCausalLM" : "LlamaForCausalLM"};
  j["vocab_size"] = m.vocab_size;
  j["hidden_size"] = m.hidden_size;
  j["intermediate_size"] = m.intermediate_size;
  j["num_hidden_layers"] = m.num_layers;
  j["num_attention_heads"] = m.num_heads;
  // MLA has as many key/value heads as query heads (DeepSeek's configs say so too).
  j["num_key_value_heads"] = m.is_mla() ? m.num_heads : m.num_kv_heads;
  j["max_position_embeddings"] = m.max_seq_len;
  j["rms_norm_eps"] = m.rms_norm_eps;
  j["rope_theta"] = m.rope_theta;
  if (m.rope_scaling_factor > 1.0) {
    j["rope_scaling"] = {{"type", "yarn"},
                         {"rope_type", "yarn"},
                         {"factor", m.rope_scaling_factor},
                         {"original_max_position_embeddings", m.rope_original_max_seq_len},
                         {"beta_fast", m.rope_beta_fast},
                         {"beta_slow", m.rope_beta_slow},
                         {"mscale", m.rope_mscale},
                         {"mscale_all_dim", m.rope_mscale_all_dim}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["hidden_act"] = "silu";
  j["initializer_range"] = m.init_std;
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["tie_word_embeddings"] = false;
  j["use_cache"] = true;
  j["torch_dtype"] = hf_torch_dtype(dtype);
  if (!deepseek) {
    j["head_dim"] = m.head_dim();
    j["mlp_bias"] = false;
    if (m.rope_interleave)
      out.warnings.push_back("model.rope_interleave = true: Llama's code rotates half-split pairs; the exported "
                             "model will not compute what dstrain does");
    return out;
  }
  auto or_null = [](int64_t value) { return value > 0 ? nlohmann::json(value) : nlohmann::json(nullptr); };
  j["q_lora_rank"] = or_null(m.q_lora_rank);
  j["kv_lora_rank"] = or_null(m.kv_lora_rank);
  j["qk_nope_head_dim"] = m.qk_nope_head_dim;
  j["qk_rope_head_dim"] = m.qk_rope_head_dim;
  j["v_head_dim"] = m.v_head_dim;
  j["rope_interleave"] = m.rope_interleave;
  if (!m.rope_interleave)
    out.warnings.push_back("model.rope_interleave = false: DeepSeek-V2/V3's code rotates interleaved pairs (only "
                           "transformers' deepseek_v3 reads rope_interleave); the exported model may not compute "
                           "what dstrain does");
  j["n_routed_experts"] = or_null(m.n_routed_experts);
  j["n_shared_experts"] = or_null(m.n_shared_experts);
  j["moe_intermediate_size"] = m.moe_intermediate_size;
  j["num_experts_per_tok"] = or_null(m.num_experts_per_tok);
  j["first_k_dense_replace"] = m.first_k_dense_replace;
  j["moe_layer_freq"] = m.moe_layer_freq;
  j["n_group"] = m.n_group;
  j["topk_group"] = m.topk_group;
  j["topk_method"] = m.topk_method;
  j["scoring_func"] = m.scoring_func;
  j["norm_topk_prob"] = m.norm_topk_prob;
  j["routed_scaling_factor"] = m.routed_scaling_factor;
  j["aux_loss_alpha"] = m.aux_loss_alpha;
  j["seq_aux"] = true;  // dstrain's balance loss is the sequence-wise one
  j["ep_size"] = 1;
  j["num_nextn_predict_layers"] = m.num_nextn_predict_layers;
  if (!m.is_mla())
    out.warnings.push_back("an MoE model without MLA (model.kv_lora_rank = 0): DeepSeek-V2/V3's code always uses "
                           "MLA; the exported weights do not match its attention");
  return out;
}

}  // namespace dstrain
