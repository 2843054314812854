#include "dstrain/model/model_config.h"

#include <cmath>
#include <string>

#include "dstrain/core/error.h"

namespace dstrain {

void add_model_options(OptionTable& t) {
  t.add("model.vocab_size", OptionKind::kInt, "257", "vocabulary size (at least the corpus's)");
  t.add("model.hidden_size", OptionKind::kInt, "64", "width of the residual stream");
  t.add("model.intermediate_size", OptionKind::kInt, "176", "width of the SwiGLU MLP");
  t.add("model.num_layers", OptionKind::kInt, "2", "decoder layers");
  t.add("model.num_heads", OptionKind::kInt, "4", "attention (query) heads; must divide hidden_size");
  t.add("model.num_kv_heads", OptionKind::kInt, "4",
        "key/value heads (GQA when fewer than num_heads); must divide num_heads");
  t.add("model.rope_theta", OptionKind::kFloat, "10000", "RoPE base frequency");
  t.add("model.rope_interleave", OptionKind::kBool, "false",
        "RoPE on interleaved pairs (DeepSeek-V2/V3 checkpoints) instead of half-split (Llama format)");
  t.add("model.rms_norm_eps", OptionKind::kFloat, "1e-6",
        "RMSNorm epsilon (MLA's q_a_layernorm and kv_a_layernorm keep 1e-6, as DeepSeek's code does)");
  t.add("model.max_seq_len", OptionKind::kInt, "4096", "longest sequence the model is built for");
  t.add("model.init_std", OptionKind::kFloat, "0.02",
        "std of the normal initialisation (output projections scaled by 1/sqrt(2 num_layers))");
  // Multi-head Latent Attention.
  t.add("model.kv_lora_rank", OptionKind::kInt, "0",
        "MLA: rank of the compressed key/value latent (0: multi-head or grouped-query attention)");
  t.add("model.q_lora_rank", OptionKind::kInt, "0", "MLA: rank of the compressed query (0: a plain q_proj)");
  t.add("model.qk_nope_head_dim", OptionKind::kInt, "0", "MLA: per-head query/key dimension without RoPE");
  t.add("model.qk_rope_head_dim", OptionKind::kInt, "0", "MLA: dimension of the decoupled RoPE key, shared by the heads");
  t.add("model.v_head_dim", OptionKind::kInt, "0", "MLA: per-head value dimension");
  t.add("model.rope_scaling_factor", OptionKind::kFloat, "1",
        "YaRN context extension factor (1: none); with it the softmax scale is multiplied by mscale^2");
  t.add("model.rope_mscale_all_dim", OptionKind::kFloat, "0", "YaRN mscale_all_dim (0: no softmax correction)");
  t.add("model.rope_mscale", OptionKind::kFloat, "1", "YaRN mscale of the rotary tables");
  t.add("model.rope_original_max_seq_len", OptionKind::kInt, "4096", "YaRN: the context length the model was trained at");
  t.add("model.rope_beta_fast", OptionKind::kFloat, "32", "YaRN: pairs turning more often than this keep their frequency");
  t.add("model.rope_beta_slow", OptionKind::kFloat, "1", "YaRN: pairs turning less often than this are interpolated");
  // DeepSeekMoE.
  t.add("model.n_routed_experts", OptionKind::kInt, "0", "MoE: routed experts per MoE layer (0: a dense model)");
  t.add("model.n_shared_experts", OptionKind::kInt, "0", "MoE: shared experts, which every token passes through");
  t.add("model.moe_intermediate_size", OptionKind::kInt, "0", "MoE: width of each expert's SwiGLU MLP");
  t.add("model.num_experts_per_tok", OptionKind::kInt, "0", "MoE: routed experts per token (top-k)");
  t.add("model.scoring_func", OptionKind::kString, "softmax", "MoE: router scores, softmax (V2) or sigmoid (V3)");
  t.add("model.topk_method", OptionKind::kString, "greedy",
        "MoE: expert choice: greedy, group_limited_greedy (V2: groups ranked by their best score), "
        "noaux_tc (V3: groups ranked by their two best scores, with the load-balancing bias)");
  t.add("model.n_group", OptionKind::kInt, "1", "MoE: groups the routed experts are divided into");
  t.add("model.topk_group", OptionKind::kInt, "1", "MoE: groups each token's experts may come from");
  t.add("model.norm_topk_prob", OptionKind::kBool, "false", "MoE: renormalise the chosen experts' weights to sum 1");
  t.add("model.routed_scaling_factor", OptionKind::kFloat, "1", "MoE: factor on the routed experts' output");
  t.add("model.first_k_dense_replace", OptionKind::kInt, "0", "MoE: the first k layers keep a dense MLP");
  t.add("model.moe_layer_freq", OptionKind::kInt, "1", "MoE: every n-th layer after those is an MoE layer");
  t.add("model.aux_loss_alpha", OptionKind::kFloat, "0", "MoE: weight of the sequence-wise balance loss (0: none)");
  t.add("model.bias_update_speed", OptionKind::kFloat, "0.001",
        "MoE with noaux_tc: speed gamma of the auxiliary-loss-free balancing bias, updated after each step");
  // Multi-token prediction.
  t.add("model.num_nextn_predict_layers", OptionKind::kInt, "0", "MTP: extra tokens predicted (0: off)");
  t.add("model.mtp_loss_weight", OptionKind::kFloat, "0.3", "MTP: weight lambda of the extra losses");
}

double ModelConfig::softmax_scale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  if (rope_scaling_factor > 1.0 && rope_mscale_all_dim > 0) {
    const double mscale = 0.1 * rope_mscale_all_dim * std::log(rope_scaling_factor) + 1.0;  // YaRN's
    scale *= mscale * mscale;
  }
  return scale;
}

const EnumNames<ScoringFunction>& scoring_function_names() {
  static const EnumNames<ScoringFunction> names = {{"softmax", ScoringFunction::kSoftmax},
                                                   {"sigmoid", ScoringFunction::kSigmoid}};
  return names;
}

const EnumNames<TopkMethod>& topk_method_names() {
  static const EnumNames<TopkMethod> names = {{"greedy", TopkMethod::kGreedy},
                                              {"group_limited_greedy", TopkMethod::kGroupLimitedGreedy},
                                              {"noaux_tc", TopkMethod::kNoauxTc}};
  return names;
}

ModelConfig read_model_config(const Options& o) {
  ModelConfig c;
  c.vocab_size = o.get_int("model.vocab_size", 1);
  c.hidden_size = o.get_int("model.hidden_size", 1);
  c.intermediate_size = o.get_int("model.intermediate_size", 1);
  c.num_layers = o.get_int("model.num_layers", 1);
  c.num_heads = o.get_int("model.num_heads", 1);
  c.num_kv_heads = o.get_int("model.num_kv_heads", 1);
  c.rope_theta = o.get_float("model.rope_theta", 1.0, 1e12);
  c.rope_interleave = o.get_bool("model.rope_interleave");
  c.rms_norm_eps = o.get_float("model.rms_norm_eps", 0.0, 1.0);
  c.max_seq_len = o.get_int("model.max_seq_len", 1);
  c.init_std = o.get_float("model.init_std", 0.0, 10.0);
  c.kv_lora_rank = o.get_int("model.kv_lora_rank", 0);
  if (c.kv_lora_rank == 0 && c.hidden_size % c.num_heads != 0)
    throw config_error("model.num_heads", std::to_string(c.num_heads),
                       "must divide model.hidden_size (" + std::to_string(c.hidden_size) + ")");
  if (c.kv_lora_rank == 0 && c.num_heads % c.num_kv_heads != 0)
    throw config_error("model.num_kv_heads", std::to_string(c.num_kv_heads),
                       "must divide model.num_heads (" + std::to_string(c.num_heads) + ")");
  c.q_lora_rank = o.get_int("model.q_lora_rank", 0);
  c.qk_nope_head_dim = o.get_int("model.qk_nope_head_dim", 0);
  c.qk_rope_head_dim = o.get_int("model.qk_rope_head_dim", 0);
  c.v_head_dim = o.get_int("model.v_head_dim", 0);
  c.rope_scaling_factor = o.get_float("model.rope_scaling_factor", 1.0, 1e6);
  c.rope_mscale_all_dim = o.get_float("model.rope_mscale_all_dim", 0.0, 100.0);
  c.rope_mscale = o.get_float("model.rope_mscale", 0.0, 100.0);
  c.rope_original_max_seq_len = o.get_int("model.rope_original_max_seq_len", 1);
  c.rope_beta_fast = o.get_float("model.rope_beta_fast", 1e-6, 1e6);
  c.rope_beta_slow = o.get_float("model.rope_beta_slow", 1e-6, 1e6);
  c.n_routed_experts = o.get_int("model.n_routed_experts", 0);
  c.n_shared_experts = o.get_int("model.n_shared_experts", 0);
  c.moe_intermediate_size = o.get_int("model.moe_intermediate_size", 0);
  c.num_experts_per_tok = o.get_int("model.num_experts_per_tok", 0);
  c.scoring_func = o.get_enum("model.scoring_func", scoring_function_names());
  c.topk_method = o.get_enum("model.topk_method", topk_method_names());
  c.n_group = o.get_int("model.n_group", 1);
  c.topk_group = o.get_int("model.topk_group", 1);
  c.norm_topk_prob = o.get_bool("model.norm_topk_prob");
  c.routed_scaling_factor = o.get_float("model.routed_scaling_factor", 0.0, 1e6);
  c.first_k_dense_replace = o.get_int("model.first_k_dense_replace", 0);
  c.moe_layer_freq = o.get_int("model.moe_layer_freq", 1);
  c.aux_loss_alpha = o.get_float("model.aux_loss_alpha", 0.0, 1e3);
  c.bias_update_speed = o.get_float("model.bias_update_speed", 0.0, 1.0);
  c.num_nextn_predict_layers = o.get_int("model.num_nextn_predict_layers", 0, 16);
  c.mtp_loss_weight = o.get_float("model.mtp_loss_weight", 0.0, 100.0);
  if (c.is_mla()) {
    for (const char* key : {"model.qk_nope_head_dim", "model.qk_rope_head_dim", "model.v_head_dim"})
      if (o.get_int(key, 0) == 0) throw config_error(key, "0", "MLA (model.kv_lora_rank > 0) needs it");
    if (c.qk_rope_head_dim % 2 != 0)
      throw config_error("model.qk_rope_head_dim", std::to_string(c.qk_rope_head_dim), "RoPE needs an even dimension");
  }
  if (c.n_routed_experts > 0) {
    if (c.moe_intermediate_size == 0)
      throw config_error("model.moe_intermediate_size", "0", "an MoE model (model.n_routed_experts > 0) needs it");
    if (c.num_experts_per_tok < 1 || c.num_experts_per_tok > c.n_routed_experts)
      throw config_error("model.num_experts_per_tok", std::to_string(c.num_experts_per_tok),
                         "expected 1 to model.n_routed_experts = " + std::to_string(c.n_routed_experts));
    if (c.n_group < 1 || c.n_routed_experts % c.n_group != 0)
      throw config_error("model.n_group", std::to_string(c.n_group),
                         "must divide model.n_routed_experts = " + std::to_string(c.n_routed_experts));
    // V3's noaux_tc ranks a group by the sum of its two best scores.
    if (c.topk_method == TopkMethod::kNoauxTc && c.n_group > 1 && c.n_routed_experts / c.n_group < 2)
      throw config_error("model.n_group", std::to_string(c.n_group),
                         "model.topk_method = noaux_tc ranks each group by its two best experts, and " +
                             std::to_string(c.n_routed_experts) + " routed experts in " + std::to_string(c.n_group) +
                             " groups leave one a group; at most " + std::to_string(c.n_routed_experts / 2) +
                             " groups");
    if (c.topk_group < 1 || c.topk_group > c.n_group ||
        c.topk_group * (c.n_routed_experts / c.n_group) < c.num_experts_per_tok)
      throw config_error("model.topk_group", std::to_string(c.topk_group),
                         "expected 1 to model.n_group, with enough experts in that many groups for "
                         "model.num_experts_per_tok");
    if (c.moe_layer_freq < 1) throw config_error("model.moe_layer_freq", std::to_string(c.moe_layer_freq), "expected at least 1");
  }
  if (!c.is_mla() && c.head_dim() % 2 != 0)
    throw config_error("model.num_heads", std::to_string(c.num_heads),
                       "gives head dimension " + std::to_string(c.head_dim()) +
                           "; RoPE needs an even head dimension");
  return c;
}

}  // namespace dstrain
