#!/usr/bin/env python3
"""PyTorch reference for `zinf bench model`: the forward and backward of the
same model shape in PyTorch on its own, on the GPU (or the CPU), so zinf's
model TFLOPS can be read against what a user would otherwise run.

Two architectures, as zinf's presets of the same names:
  GPT-2 (gpt2 ... gpt-7b, tiny): pre-LayerNorm blocks, tanh GELU, learned
    positions, LM head tied to the token embedding;
  Llama (llama-3.2-1b, llama-3.2-3b, llama-3.1-8b, tiny-llama): RMSNorm,
    rotary positions, grouped-query attention, SwiGLU, no biases, the head
    tied or not as the preset says. The q, k, v products are one nn.Linear,
    as are the gate and up products (zinf fuses them the same way); the key
    and value heads are repeated to the query heads before attention, as
    Hugging Face's Llama does for scaled_dot_product_attention. RoPE uses
    the plain frequencies (Llama 3's long-context rescaling changes no
    FLOP or time).
Attention is scaled_dot_product_attention (flash attention on CUDA where
PyTorch has it; the plain product and softmax before PyTorch 2.0). FLOPs per
step follow zinf's own count (model/gpt_config.cc, TrainingFlops): 6 N per
token, N = the parameters the products use (the embedding once when tied;
an untied head's, not the lookup table's), plus 12 L Q T per token for
attention (Q = heads x head_dim). The optimizer is not timed: zinf's runs
on the engine's offload tiers and is measured by `zinf bench adam` and
`zinf bench offload`.

  python3 bench/torch_gpt_step.py --preset gpt-1.3b --seq-len 2048 --micro-batch 4
  python3 bench/torch_gpt_step.py --preset llama-3.2-1b --seq-len 2048 --micro-batch 2
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# name: (vocab, max_seq, layers, heads, d_model), as zinf's presets.
PRESETS = {
    "tiny": (64, 16, 2, 4, 32),
    "gpt2": (50257, 1024, 12, 12, 768),
    "gpt2-medium": (50257, 1024, 24, 16, 1024),
    "gpt2-large": (50257, 1024, 36, 20, 1280),
    "gpt2-xl": (50257, 1024, 48, 25, 1600),
    "gpt-1.3b": (50257, 2048, 24, 16, 2048),
    "gpt-3b": (50257, 2048, 32, 32, 2560),
    "gpt-7b": (50257, 2048, 32, 32, 4096),
}

# name: (vocab, layers, heads, kv_heads, d_model, head_dim, ffn, rope_theta, norm_eps, tied), as zinf's presets.
LLAMA_PRESETS = {
    "llama-3.2-1b": (128256, 16, 32, 8, 2048, 64, 8192, 500000.0, 1e-5, True),
    "llama-3.2-3b": (128256, 28, 24, 8, 3072, 128, 8192, 500000.0, 1e-5, True),
    "llama-3.1-8b": (128256, 32, 32, 8, 4096, 128, 14336, 500000.0, 1e-5, False),
    "tiny-llama": (64, 2, 4, 2, 32, 8, 48, 10000.0, 1e-5, False),
}


def causal_attention(q, k, v):
    """q, k, v: [batch, heads, T, head_dim]."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t = q.shape[2]  # PyTorch before 2.0: the plain attention
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    return s.masked_fill(mask, float("-inf")).softmax(-1) @ v


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fc_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = causal_attention(q, k, v)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, vocab, max_seq, layers, heads, d):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(max_seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.lnf = nn.LayerNorm(d)

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        logits = self.lnf(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


class RmsNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.to(x.dtype) * self.weight


def rotate(x, cos, sin):
    """Rotary positions on [batch, heads, T, head_dim], halves paired."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class LlamaBlock(nn.Module):
    def __init__(self, d, heads, kv_heads, head_dim, ffn, eps):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.ln1 = RmsNorm(d, eps)
        self.qkv = nn.Linear(d, (heads + 2 * kv_heads) * head_dim, bias=False)
        self.proj = nn.Linear(heads * head_dim, d, bias=False)
        self.ln2 = RmsNorm(d, eps)
        self.gate_up = nn.Linear(d, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        hd, h, hkv = self.head_dim, self.heads, self.kv_heads
        q, k, v = self.qkv(self.ln1(x)).split([h * hd, hkv * hd, hkv * hd], dim=2)
        q = rotate(q.view(b, t, h, hd).transpose(1, 2), cos, sin)
        k = rotate(k.view(b, t, hkv, hd).transpose(1, 2), cos, sin)
        v = v.view(b, t, hkv, hd).transpose(1, 2)
        if hkv != h:
            k, v = (z.repeat_interleave(h // hkv, dim=1) for z in (k, v))
        y = causal_attention(q, k, v)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, h * hd))
        gate, up = self.gate_up(self.ln2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, vocab, layers, heads, kv_heads, d, head_dim, ffn, theta, eps, tied, seq):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(LlamaBlock(d, heads, kv_heads, head_dim, ffn, eps) for _ in range(layers))
        self.lnf = RmsNorm(d, eps)
        self.head = None if tied else nn.Linear(d, vocab, bias=False)
        inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        ang = torch.outer(torch.arange(seq, dtype=torch.float64), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)

    def forward(self, idx, targets):
        x = self.wte(idx)
        t = idx.shape[1]
        cos, sin = self.cos[:t].to(x.dtype), self.sin[:t].to(x.dtype)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        x = self.lnf(x)
        logits = self.head(x) if self.head is not None else x @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def training_flops(product_params, layers, q_dim, batch, seq):
    tokens = batch * seq
    return 3.0 * tokens * (2.0 * product_params + 4.0 * layers * q_dim * seq)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="gpt-1.3b", choices=sorted(PRESETS) + sorted(LLAMA_PRESETS))
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=10, help="timed steps (median reported)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"], help="parameters and activations")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--peak-tflops", type=float, default=0.0,
                   help="dense peak for MFU (default: 989 for an H100 SXM in bf16/fp16, none otherwise)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    dev = torch.device(a.device)
    torch.manual_seed(1)
    if a.preset in LLAMA_PRESETS:
        vocab, layers, heads, kv_heads, d, head_dim, ffn, theta, eps, tied = LLAMA_PRESETS[a.preset]
        model = Llama(vocab, layers, heads, kv_heads, d, head_dim, ffn, theta, eps, tied, a.seq_len)
        q_dim = heads * head_dim
        lookup = 0 if tied else vocab * d  # an untied embedding is a lookup, not a product
    else:
        vocab, max_seq, layers, heads, d = PRESETS[a.preset]
        model = Gpt(vocab, max(max_seq, a.seq_len), layers, heads, d)
        q_dim, lookup = d, 0
    model = model.to(device=dev, dtype=dtype)
    n_params = sum(t.numel() for t in model.parameters())
    idx = torch.randint(0, vocab, (a.micro_batch, a.seq_len), device=dev)
    tgt = torch.randint(0, vocab, (a.micro_batch, a.seq_len), device=dev)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    times = []
    for i in range(a.warmup + a.steps):
        sync()
        t0 = time.perf_counter()
        loss = model(idx, tgt)
        loss.backward()
        sync()
        dt = time.perf_counter() - t0
        for prm in model.parameters():
            prm.grad = None
        if i >= a.warmup:
            times.append(dt)
        print(f"\rstep {i + 1}/{a.warmup + a.steps}  {dt * 1e3:.1f} ms", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)

    flops = training_flops(n_params - lookup, layers, q_dim, a.micro_batch, a.seq_len)
    med = statistics.median(times)
    tflops = flops / med / 1e12
    peak = a.peak_tflops
    if peak == 0.0 and dev.type == "cuda" and a.dtype != "fp32" and "H100" in torch.cuda.get_device_name(dev):
        peak = 989.0
    out = {
        "preset": a.preset, "params": n_params, "seq_len": a.seq_len, "micro_batch": a.micro_batch,
        "dtype": a.dtype, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__, "flops_per_step": flops, "loss": loss.item(), "step_s_median": med,
        "tokens_per_s": a.micro_batch * a.seq_len / med,
        "tflops": tflops, "mfu": tflops / peak if peak > 0 else None,
        "peak_mem_gib": torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None,
    }
    if a.json:
        print(json.dumps(out))
    else:
        print(f"# PyTorch {out['torch']} on {out['device']}: {a.preset} ({n_params / 1e9:.3f} B params), "
              f"{a.micro_batch} x {a.seq_len} tokens, {a.dtype}, median of {a.steps} steps")
        print(f"forward+backward {med * 1e3:.1f} ms  {out['tokens_per_s']:.0f} tokens/s  {tflops:.1f} TFLOP/s"
              + (f"  MFU {out['mfu'] * 100:.1f}% of {peak:.0f}" if out["mfu"] else ""))


if __name__ == "__main__":
    main()
