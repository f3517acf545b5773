#!/usr/bin/env python3
"""PyTorch reference for `zinf bench model`: the forward and backward of the
same GPT shape in PyTorch on its own, on the GPU (or the CPU), so zinf's
model TFLOPS can be read against what a user would otherwise run.

The model is GPT-2's architecture (pre-LayerNorm blocks, tanh GELU, learned
positions, LM head tied to the token embedding), built from nn.Linear and
scaled_dot_product_attention (flash attention on CUDA where PyTorch has it).
FLOPs per step follow zinf's own count (model/gpt_config.cc, TrainingFlops):
6 N per token, N = every parameter with the embedding once, plus 12 L C T per
token for attention. The optimizer is not timed: zinf's runs on the engine's
offload tiers and is measured by `zinf bench adam` and `zinf bench offload`.

  python3 bench/torch_gpt_step.py --preset gpt-1.3b --seq-len 2048 --micro-batch 4
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
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # PyTorch before 2.0: the plain attention
            s = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            y = s.masked_fill(mask, float("-inf")).softmax(-1) @ v
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


def training_flops(vocab, max_seq, layers, d, n_params, batch, seq):
    tokens = batch * seq
    return 3.0 * tokens * (2.0 * n_params + 4.0 * layers * d * seq)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="gpt-1.3b", choices=sorted(PRESETS))
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

    vocab, max_seq, layers, heads, d = PRESETS[a.preset]
    max_seq = max(max_seq, a.seq_len)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    dev = torch.device(a.device)
    torch.manual_seed(1)
    model = Gpt(vocab, max_seq, layers, heads, d).to(device=dev, dtype=dtype)
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

    flops = training_flops(vocab, max_seq, layers, d, n_params, a.micro_batch, a.seq_len)
    med = statistics.median(times)
    tflops = flops / med / 1e12
    peak = a.peak_tflops
    if peak == 0.0 and dev.type == "cuda" and a.dtype != "fp32" and "H100" in torch.cuda.get_device_name(dev):
        peak = 989.0
    out = {
        "preset": a.preset, "params": n_params, "seq_len": a.seq_len, "micro_batch": a.micro_batch,
        "dtype": a.dtype, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__, "step_s_median": med, "tokens_per_s": a.micro_batch * a.seq_len / med,
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
