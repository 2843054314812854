#!/usr/bin/env python3
"""The PyTorch reference for `dstrain bench step`: the same dense DeepSeek-LLM model (RMSNorm, RoPE
half-split, causal attention, SwiGLU, untied LM head), batch and sequence length, trained the way
PyTorch users train it on one GPU: fp32 parameters under bf16 autocast, fused RMSNorm, scaled_dot_product_attention,
fused AdamW, global-norm clipping, and optionally torch.compile. Prints tokens/s and MFU counted with
the same FLOP formula as dstrain (PaLM's: 6 x matmul parameters + 12 x layers x heads x head_dim x seq).

    python3 bench/pytorch_reference.py --config input/deepseek-llm-1b.ini [--compile] [--json out.json]
"""
import argparse
import configparser
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def read_config(path):
    ini = configparser.ConfigParser(inline_comment_prefixes=("#",))
    ini.read(path)
    m, t = ini["model"], ini["train"]
    return dict(
        vocab=m.getint("vocab_size"), hidden=m.getint("hidden_size"), ffn=m.getint("intermediate_size"),
        layers=m.getint("num_layers"), heads=m.getint("num_heads"), kv_heads=m.getint("num_kv_heads"),
        theta=m.getfloat("rope_theta", 10000.0), eps=m.getfloat("rms_norm_eps", 1e-6),
        seq=t.getint("seq_len"), micro_batch=t.getint("micro_batch"), grad_accum=t.getint("grad_accum", 1),
        precision=t.get("precision", "bf16"))


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x):  # F.rms_norm: the fused kernel, as torchtitan's nn.RMSNorm
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads, self.kv_heads, self.dim = c["heads"], c["kv_heads"], c["hidden"] // c["heads"]
        self.q_proj = nn.Linear(c["hidden"], self.heads * self.dim, bias=False)
        self.k_proj = nn.Linear(c["hidden"], self.kv_heads * self.dim, bias=False)
        self.v_proj = nn.Linear(c["hidden"], self.kv_heads * self.dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.dim, c["hidden"], bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.dim).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c["hidden"], c["ffn"], bias=False)
        self.up_proj = nn.Linear(c["hidden"], c["ffn"], bias=False)
        self.down_proj = nn.Linear(c["ffn"], c["hidden"], bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(c["hidden"], c["eps"]), RMSNorm(c["hidden"], c["eps"])
        self.self_attn, self.mlp = Attention(c), MLP(c)

    def forward(self, x, cos, sin):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab"], c["hidden"])
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["hidden"], c["eps"])
        self.lm_head = nn.Linear(c["hidden"], c["vocab"], bias=False)
        dim = c["hidden"] // c["heads"]
        inv_freq = c["theta"] ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        angles = torch.outer(torch.arange(c["seq"], dtype=torch.float64), inv_freq)
        both = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", both.cos().float(), persistent=False)
        self.register_buffer("sin", both.sin().float(), persistent=False)

    def forward(self, ids):
        h = self.embed_tokens(ids)
        cos, sin = self.cos[: ids.shape[1]].to(h.dtype), self.sin[: ids.shape[1]].to(h.dtype)
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.lm_head(self.norm(h))


def flops_per_token(c):
    dim = c["hidden"] // c["heads"]
    per_layer = (c["hidden"] * c["heads"] * dim * 2 + 2 * c["hidden"] * c["kv_heads"] * dim + 3 * c["hidden"] * c["ffn"])
    matmul = c["layers"] * per_layer + c["vocab"] * c["hidden"]
    return 6 * matmul + 12 * c["layers"] * c["heads"] * dim * c["seq"]


PEAK_TFLOPS = {"H200": 989.4, "H100 PCIe": 756.0, "H100": 989.4, "A100": 312.0}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--profile", action="store_true", help="also print the GPU kernels that take the time")
    parser.add_argument("--micro-batch", type=int, help="override train.micro_batch")
    parser.add_argument("--grad-accum", type=int, help="override train.grad_accum")
    args = parser.parse_args()
    c = read_config(args.config)
    c["micro_batch"] = args.micro_batch or c["micro_batch"]
    c["grad_accum"] = args.grad_accum or c["grad_accum"]
    torch.manual_seed(0)
    device = torch.device("cuda")
    model = Model(c).to(device)
    for name, p in model.named_parameters():
        if not name.endswith("norm.weight"):
            nn.init.normal_(p, 0.0, 0.02)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    forward = torch.compile(model) if args.compile else model
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(c["precision"])
    batches = [torch.randint(0, c["vocab"] - 1, (c["micro_batch"], c["seq"] + 1), device=device) for _ in range(4)]

    def step(i):
        optimizer.zero_grad(set_to_none=True)
        for micro in range(c["grad_accum"]):
            batch = batches[(i * c["grad_accum"] + micro) % len(batches)]
            with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
                logits = forward(batch[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, c["vocab"]), batch[:, 1:].reshape(-1)) / c["grad_accum"]
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        return loss

    for i in range(args.warmup):
        step(i)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for i in range(args.steps):
        loss = step(args.warmup + i)
    final_loss = loss.item()
    seconds = time.perf_counter() - start
    if args.profile:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for i in range(2):
                step(i)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))
    tokens = args.steps * c["micro_batch"] * c["grad_accum"] * c["seq"]
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_TFLOPS.items() if k in name), 0.0)
    result = {"bench": "pytorch_reference", "compile": args.compile, "device": name, "torch": torch.__version__,
              "params": sum(p.numel() for p in model.parameters()), "tokens_per_s": tokens / seconds,
              "flops_per_token": flops_per_token(c), "final_loss": final_loss,
              "peak_memory_bytes": torch.cuda.max_memory_allocated()}
    result["mfu"] = result["flops_per_token"] * result["tokens_per_s"] / (peak * 1e12) if peak else 0.0
    print(f"pytorch {'compiled' if args.compile else 'eager'}: {result['tokens_per_s']:.0f} tok/s, "
          f"MFU {100 * result['mfu']:.1f}%, peak memory {result['peak_memory_bytes'] / 2**30:.1f} GiB, "
          f"loss {final_loss:.3f}", flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)


if __name__ == "__main__":
    main()
