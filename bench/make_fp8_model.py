#!/usr/bin/env python3
"""Writes a synthetic DeepSeek-V3-shaped model in DeepSeek's FP8 layout, with the Python standard
library alone: what `dstrain ckpt import-hf`'s peak memory is measured on (bench/fp8_import_memory.sh).

    make_fp8_model.py OUT_DIR [--layers N] [--hidden H] [--experts E] [--moe-intermediate M]
                      [--vocab V] [--shard-bytes B]

OUT_DIR gets config.json (model_type deepseek_v3 with quantization_config, fp8 e4m3 in 128 x 128
blocks), shards model-0000i-of-0000N.safetensors of at most B bytes (a larger tensor alone) and
model.safetensors.index.json, laid out as DeepSeek-V3's published files: the projections of
attention and of the MLPs, experts and shared experts F8_E4M3, each with weight_scale_inv (F32,
one per 128 x 128 block); the embedding, norms, router, head and the multi-token prediction
module's eh_proj BF16; e_score_correction_bias F32; one multi-token prediction layer (layer N)
with its copies of the embedding and head. The first layer is dense, the others MoE. Codes are
random bytes (never E4M3's NaN codes), scales random powers of two times 1 to 2, BF16 values
random of magnitudes 2^-7 to 2^-3.
"""
import argparse
import json
import os
import random
import struct

BLOCK = 128


def fp8_bytes(count):
    # 0x7F and 0xFF are NaN: moved to the neighbouring finite codes.
    table = bytes(c - 1 if c & 0x7F == 0x7F else c for c in range(256))
    return os.urandom(count).translate(table)


def bf16_bytes(count):
    data = bytearray(os.urandom(2 * count))
    # The high byte: a random sign and the exponent's upper bits 0x3C or 0x3D: magnitudes 2^-7 to
    # 2^-3, never inf or NaN.
    data[1::2] = os.urandom(count).translate(bytes((c & 0x81) | 0x3C for c in range(256)))
    return bytes(data)


def scale_bytes(count, rng):
    return struct.pack("<%df" % count, *(2.0 ** rng.randint(-12, -6) * (1 + rng.random()) for _ in range(count)))


def tensors(a):
    """(name, dtype, shape) of every tensor, in DeepSeek-V3's names."""
    h, heads, nope, rope, v = a.hidden, a.heads, 128, 64, 128
    q_lora, kv_lora, inter, moe, shared = a.q_lora, a.kv_lora, a.intermediate, a.moe_intermediate, 1
    out = [("model.embed_tokens.weight", "BF16", [a.vocab, h]), ("model.norm.weight", "BF16", [h]),
           ("lm_head.weight", "BF16", [a.vocab, h])]
    for layer in range(a.layers + 1):  # the last: the multi-token prediction module
        p = "model.layers.%d." % layer
        out += [(p + "input_layernorm.weight", "BF16", [h]), (p + "post_attention_layernorm.weight", "BF16", [h]),
                (p + "self_attn.q_a_proj.weight", "F8_E4M3", [q_lora, h]),
                (p + "self_attn.q_a_layernorm.weight", "BF16", [q_lora]),
                (p + "self_attn.q_b_proj.weight", "F8_E4M3", [heads * (nope + rope), q_lora]),
                (p + "self_attn.kv_a_proj_with_mqa.weight", "F8_E4M3", [kv_lora + rope, h]),
                (p + "self_attn.kv_a_layernorm.weight", "BF16", [kv_lora]),
                (p + "self_attn.kv_b_proj.weight", "F8_E4M3", [heads * (nope + v), kv_lora]),
                (p + "self_attn.o_proj.weight", "F8_E4M3", [h, heads * v])]
        if layer == 0:
            out += [(p + "mlp.gate_proj.weight", "F8_E4M3", [inter, h]), (p + "mlp.up_proj.weight", "F8_E4M3", [inter, h]),
                    (p + "mlp.down_proj.weight", "F8_E4M3", [h, inter])]
        else:
            out += [(p + "mlp.gate.weight", "BF16", [a.experts, h]),
                    (p + "mlp.gate.e_score_correction_bias", "F32", [a.experts])]
            for e in ["experts.%d." % i for i in range(a.experts)] + ["shared_experts."]:
                width = moe * (shared if e == "shared_experts." else 1)
                out += [(p + "mlp." + e + "gate_proj.weight", "F8_E4M3", [width, h]),
                        (p + "mlp." + e + "up_proj.weight", "F8_E4M3", [width, h]),
                        (p + "mlp." + e + "down_proj.weight", "F8_E4M3", [h, width])]
        if layer == a.layers:
            out += [(p + "enorm.weight", "BF16", [h]), (p + "hnorm.weight", "BF16", [h]),
                    (p + "eh_proj.weight", "BF16", [h, 2 * h]), (p + "shared_head.norm.weight", "BF16", [h]),
                    (p + "embed_tokens.weight", "BF16", [a.vocab, h]),
                    (p + "shared_head.head.weight", "BF16", [a.vocab, h])]
    with_scales = []
    for name, dtype, shape in out:
        with_scales.append((name, dtype, shape))
        if dtype == "F8_E4M3":
            with_scales.append((name + "_scale_inv", "F32", [-(-shape[0] // BLOCK), -(-shape[1] // BLOCK)]))
    return with_scales


def nbytes(dtype, shape):
    count = 1
    for d in shape:
        count *= d
    return count * {"F8_E4M3": 1, "BF16": 2, "F32": 4}[dtype]


def data(name, dtype, shape, rng, copies):
    count = nbytes(dtype, shape) // {"F8_E4M3": 1, "BF16": 2, "F32": 4}[dtype]
    if name.endswith("_scale_inv"):
        return scale_bytes(count, rng)
    if dtype == "F8_E4M3":
        return fp8_bytes(count)
    if dtype == "F32":
        return bytes(4 * count)
    # The multi-token prediction module's embedding and head are copies of the main model's.
    for suffix, original in ((".embed_tokens.weight", "model.embed_tokens.weight"),
                             (".shared_head.head.weight", "lm_head.weight")):
        if name.endswith(suffix) and name != original:
            return copies[original]
    values = bf16_bytes(count)
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        copies[name] = values
    return values


def write_shard(path, entries, rng, copies):
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape in entries:
        size = nbytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, dtype, shape in entries:
            f.write(data(name, dtype, shape, rng, copies))


def config(a):
    return {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": a.vocab,
            "hidden_size": a.hidden, "intermediate_size": a.intermediate, "moe_intermediate_size": a.moe_intermediate,
            "num_hidden_layers": a.layers, "num_nextn_predict_layers": 1, "num_attention_heads": a.heads,
            "num_key_value_heads": a.heads, "n_shared_experts": 1, "n_routed_experts": a.experts,
            "routed_scaling_factor": 2.5, "kv_lora_rank": a.kv_lora, "q_lora_rank": a.q_lora, "qk_rope_head_dim": 64,
            "v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4,
            "num_experts_per_tok": 8, "moe_layer_freq": 1, "first_k_dense_replace": 1, "norm_topk_prob": True,
            "scoring_func": "sigmoid", "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-06,
            "rope_theta": 10000, "rope_scaling": None, "attention_bias": False, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                    "weight_block_size": [BLOCK, BLOCK]}}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--q-lora", type=int, default=512)
    parser.add_argument("--kv-lora", type=int, default=256)
    parser.add_argument("--intermediate", type=int, default=5632)
    parser.add_argument("--moe-intermediate", type=int, default=768)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--shard-bytes", type=int, default=1 << 30)
    a = parser.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = random.Random(1)
    shards, size = [[]], 0
    for entry in tensors(a):
        b = nbytes(entry[1], entry[2])
        if shards[-1] and size + b > a.shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += b
    weight_map, copies, total = {}, {}, 0
    for i, entries in enumerate(shards):
        name = "model-%05d-of-%05d.safetensors" % (i + 1, len(shards))
        write_shard(os.path.join(a.out, name), entries, rng, copies)
        for entry in entries:
            weight_map[entry[0]] = name
            total += nbytes(entry[1], entry[2])
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config(a), f, indent=2)
    largest = max(tensors(a), key=lambda e: nbytes(e[1], e[2]))
    print("%d tensors, %.2f GB in %d shards; largest %s %s %s (%.1f MB)" % (
        len(weight_map), total / 1e9, len(shards), largest[0], largest[1], largest[2], nbytes(largest[1], largest[2]) / 1e6))


if __name__ == "__main__":
    main()
