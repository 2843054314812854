#include "dstrain/model/model_config.h"

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
  t.add("model.rms_norm_eps", OptionKind::kFloat, "1e-6", "RMSNorm epsilon");
  t.add("model.max_seq_len", OptionKind::kInt, "4096", "longest sequence the model is built for");
  t.add("model.init_std", OptionKind::kFloat, "0.02",
        "std of the normal initialisation (output projections scaled by 1/sqrt(2 num_layers))");
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
  if (c.hidden_size % c.num_heads != 0)
    throw config_error("model.num_heads", std::to_string(c.num_heads),
                       "must divide model.hidden_size (" + std::to_string(c.hidden_size) + ")");
  if (c.num_heads % c.num_kv_heads != 0)
    throw config_error("model.num_kv_heads", std::to_string(c.num_kv_heads),
                       "must divide model.num_heads (" + std::to_string(c.num_heads) + ")");
  if (c.head_dim() % 2 != 0)
    throw config_error("model.num_heads", std::to_string(c.num_heads),
                       "gives head dimension " + std::to_string(c.head_dim()) +
                           "; RoPE needs an even head dimension");
  return c;
}

}  // namespace dstrain
