#include "dstrain/ckpt/hf_config.h"

#include <cmath>
#include <sstream>
#include <tuple>

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
  const bool v3 =
      m.n_routed_experts > 0 && (m.topk_method == TopkMethod::kNoauxTc || m.scoring_func == ScoringFunction::kSigmoid);
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
  j["topk_method"] = name_of(topk_method_names(), m.topk_method);
  j["scoring_func"] = name_of(scoring_function_names(), m.scoring_func);
  j["norm_topk_prob"] = m.norm_topk_prob;
  j["routed_scaling_factor"] = m.routed_scaling_factor;
  if (!v3 && m.norm_topk_prob && m.routed_scaling_factor != 1.0)
    out.warnings.push_back("model.routed_scaling_factor = " + std::to_string(m.routed_scaling_factor) +
                           " with model.norm_topk_prob: DeepSeek-V2's code applies the factor only without "
                           "normalisation; the exported model will not compute what dstrain does");
  j["aux_loss_alpha"] = m.aux_loss_alpha;
  j["seq_aux"] = true;  // dstrain's balance loss is the sequence-wise one
  j["ep_size"] = 1;
  j["num_nextn_predict_layers"] = m.num_nextn_predict_layers;
  if (!m.is_mla())
    out.warnings.push_back("an MoE model without MLA (model.kv_lora_rank = 0): DeepSeek-V2/V3's code always uses "
                           "MLA; the exported weights do not match its attention");
  return out;
}

namespace {

bool same_value(const nlohmann::json& a, const nlohmann::json& b) {
  if (a.is_number() && b.is_number()) {
    const double x = a.get<double>(), y = b.get<double>();
    return std::abs(x - y) <= 1e-9 * std::max(std::abs(x), std::abs(y));
  }
  return a == b;
}

std::string value_text(const nlohmann::json& value) {
  if (value.is_null()) return "none";
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number_float()) {
    std::ostringstream out;
    out << value.get<double>();  // 0.707, 1e-06: as an INI file would say it
    return out.str();
  }
  return value.dump();
}

}  // namespace

HfConfigDifferences hf_config_differences(const ModelConfig& model, const nlohmann::json& theirs) {
  const nlohmann::json ours = hf_config(model, torch::kFloat32).json;
  HfConfigDifferences out;
  // `option`: the dstrain setting, "" where dstrain has none (it computes only the one way).
  auto compare = [&](const std::string& key, const nlohmann::json& there, const nlohmann::json& here,
                     const std::string& option) {
    if (same_value(there, here)) return;
    out.lines.push_back(key + ": " + value_text(there) + " there, " + value_text(here) + " here" +
                        (option.empty() ? " (dstrain computes only the latter)" : " (" + option + ")"));
    if (!option.empty()) out.overrides.push_back("--" + option + " " + (there.is_null() ? "0" : value_text(there)));
  };
  static const std::vector<std::pair<const char*, const char*>> kKeys = {
      {"vocab_size", "model.vocab_size"},
      {"hidden_size", "model.hidden_size"},
      {"intermediate_size", "model.intermediate_size"},
      {"num_hidden_layers", "model.num_layers"},
      {"num_attention_heads", "model.num_heads"},
      {"num_key_value_heads", "model.num_kv_heads"},
      {"rms_norm_eps", "model.rms_norm_eps"},
      {"rope_theta", "model.rope_theta"},
      {"q_lora_rank", "model.q_lora_rank"},
      {"kv_lora_rank", "model.kv_lora_rank"},
      {"qk_nope_head_dim", "model.qk_nope_head_dim"},
      {"qk_rope_head_dim", "model.qk_rope_head_dim"},
      {"v_head_dim", "model.v_head_dim"},
      {"n_routed_experts", "model.n_routed_experts"},
      {"n_shared_experts", "model.n_shared_experts"},
      {"moe_intermediate_size", "model.moe_intermediate_size"},
      {"num_experts_per_tok", "model.num_experts_per_tok"},
      {"first_k_dense_replace", "model.first_k_dense_replace"},
      {"moe_layer_freq", "model.moe_layer_freq"},
      {"n_group", "model.n_group"},
      {"topk_group", "model.topk_group"},
      {"topk_method", "model.topk_method"},
      {"scoring_func", "model.scoring_func"},
      {"norm_topk_prob", "model.norm_topk_prob"},
      {"routed_scaling_factor", "model.routed_scaling_factor"},
      {"hidden_act", ""},
      {"attention_bias", ""},
      {"mlp_bias", ""},
      {"tie_word_embeddings", ""}};
  const std::string type = theirs.value("model_type", std::string());
  // DeepSeek-V2's code scales the routed experts' output only when it does not renormalise their
  // weights (V3's, and dstrain, in both cases).
  const bool factor_ignored = type == "deepseek_v2" && theirs.value("norm_topk_prob", false);
  for (const auto& [key, option] : kKeys) {
    if (!theirs.contains(key)) continue;
    const nlohmann::json here = ours.contains(key) ? ours[key] : nlohmann::json();
    if (factor_ignored && key == std::string("routed_scaling_factor"))
      compare("routed_scaling_factor (which deepseek_v2 ignores with norm_topk_prob)", 1.0, here, option);
    else
      compare(key, theirs[key], here, option);
  }

  // YaRN, as config.json's rope_scaling says it (HF's defaults for the keys it leaves out);
  // without rope_scaling only the factor means anything.
  const nlohmann::json& scaling = theirs.contains("rope_scaling") ? theirs["rope_scaling"] : nlohmann::json();
  const std::vector<std::tuple<std::string, std::string, double, double>> yarn = {
      {"factor", "model.rope_scaling_factor", 1.0, model.rope_scaling_factor},
      {"original_max_position_embeddings", "model.rope_original_max_seq_len", 4096,
       static_cast<double>(model.rope_original_max_seq_len)},
      {"beta_fast", "model.rope_beta_fast", 32, model.rope_beta_fast},
      {"beta_slow", "model.rope_beta_slow", 1, model.rope_beta_slow},
      {"mscale", "model.rope_mscale", 1, model.rope_mscale},
      {"mscale_all_dim", "model.rope_mscale_all_dim", 0, model.rope_mscale_all_dim}};
  if (!scaling.is_object()) {
    compare("rope_scaling.factor", 1.0, model.rope_scaling_factor, "model.rope_scaling_factor");
  } else if (const std::string kind = scaling.value("type", scaling.value("rope_type", std::string("?")));
             kind != "yarn") {
    out.lines.push_back("rope_scaling.type: " + kind + " there (dstrain computes YaRN or no scaling)");
  } else {
    for (const auto& [key, option, fallback, here] : yarn)
      compare("rope_scaling." + key, scaling.contains(key) ? scaling[key] : nlohmann::json(fallback), here, option);
  }

  // DeepSeek-V2/V3's modelling code rotates interleaved pairs; transformers' deepseek_v3 says so
  // with rope_interleave; Llama's rotates half-split pairs.
  const bool interleaved = theirs.contains("rope_interleave") && theirs["rope_interleave"].is_boolean()
                               ? theirs["rope_interleave"].get<bool>()
                               : type == "deepseek_v2" || type == "deepseek_v3";
  compare(theirs.contains("rope_interleave") ? "rope_interleave" : "rope_interleave (as model_type " + type + " implies)",
          interleaved, model.rope_interleave, "model.rope_interleave");
  return out;
}

}  // namespace dstrain
