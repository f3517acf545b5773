#!/usr/bin/env python3
"""A training-level PyTorch oracle for `zinf train` on the Llama family: the
same run replayed with torch.optim.AdamW in float32, step for step, on the
same batches, then zinf's per-step losses and its exported Hugging Face
folder compared with the replay's.

  torch_train.py init --arch llama|qwen2|qwen3 --model-dir DIR --data FILE [--seed N]
      Writes DIR (config.json and model.safetensors, fp32, random weights of a
      tiny model with a 256-token vocabulary, so zinf's byte tokenizer fits)
      and FILE (ASCII text to train on).

  torch_train.py check --model-dir DIR --data FILE --config DS.json
                       --steps N --micro-batch B --grad-accum K --seq-len T --seed S
                       --run METRICS.jsonl:EXPORT_DIR [--run ...]
      Replays the run that `zinf train --model-dir DIR --data FILE --config
      DS.json --steps N --micro-batch B --grad-accum K --seq-len T --seed S`
      does and compares every --run (zinf's --metrics-json and --export-dir
      with --export-dtype fp32) with it. Exit code 0 when all match, 1 with
      every mismatch named otherwise; --float64 and --save help a diagnosis.

What the replay restates of zinf (and so checks):
  - Data: the byte tokenizer's ids are the file's bytes; zinf holds out the
    last floor(0.05 n) tokens for validation (tools/train.cc) and serves the
    rest as BatchLoader does (src/data/token_dataset.h): W = (n - 1) // T
    windows of T + 1 tokens at stride T, visited per epoch in a Fisher-Yates
    permutation driven by SplitMix64 of (seed, epoch), B windows per
    micro-step, K micro-steps per optimizer step.
  - Loss: the mean cross-entropy over a micro-batch's B·T targets; a step's
    loss is the mean over its K micro-steps, and its gradient the mean of the
    micro-steps' gradients.
  - Clipping ("gradient_clipping" > 0): torch.nn.utils.clip_grad_norm_ on the
    mean gradient (coefficient max_norm / (norm + 1e-6) when below 1).
  - Optimizer: "Adam" (adam_w_mode, DeepSpeed's default) and "AdamW" are
    torch.optim.AdamW, with the config's betas, eps and weight_decay, the
    decay applied to every parameter (zinf has no exclusion list).
  - lr: DeepSpeed's WarmupLR / WarmupDecayLR / WarmupCosineLR, or none,
    restated below from deepspeed/runtime/lr_schedules.py.

Agreement: each step's loss and gradient norm within 1e-5 of torch's,
relative (|zinf - torch| / |torch|), and its lr DeepSpeed's; each weight
tensor within 1e-5 of its scale, max|zinf - torch| / max|torch| over the
tensor; the loaded export's loss on held-out windows within 1e-5 of the
replay's weights'. The exported folder must hold exactly the model's Hugging Face
names (lm_head.weight only when the head is untied) with their shapes, in
F32, and a config.json of the same architecture; the weights are loaded into
the replay's model by those names before they are compared. The runs given
must also be bit-identical to each other (zinf promises that stage and
offload never change the numbers).

Conditioning: with a tiny Adam eps (1e-8), an element whose gradient cancels
to within a few roundings of zero moves by +-lr on the strength of those
roundings, and two correct fp32 implementations can then differ by far more
than 1e-5. Runs meant for this comparison use an eps well above the
gradients' rounding error; --float64 replays in float64 to tell such a case
(torch fp32 itself far from float64) from a bug (zinf far, torch fp32 close).
"""
import argparse
import glob
import json
import math
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "model"))
import torch_decoder  # noqa: E402  (tests/model/torch_decoder.py: the model by Hugging Face names)

TOLERANCE = 1e-5
VALID_FRACTION = 0.05  # tools/train.cc: dataset->Split(0.05)
MASK64 = (1 << 64) - 1

# Tiny shapes of the presets tiny-llama / tiny-qwen2 / tiny-qwen3
# (src/model/gpt_config.cc) with the byte tokenizer's vocabulary. The Llama
# case adds Llama 3's rope scaling, with an original context of 8 positions
# so that the head's four frequencies fall in all three bands.
ARCHS = {
    "llama": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "head_dim": 8, "rms_norm_eps": 1e-5,
              "tie_word_embeddings": False, "attention_bias": False, "rope_theta": 500000.0,
              "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 8}},
    "qwen2": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "head_dim": 8, "rms_norm_eps": 1e-6,
              "tie_word_embeddings": True, "attention_bias": True, "rope_theta": 10000.0},
    "qwen3": {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "head_dim": 16, "rms_norm_eps": 1e-6,
              "tie_word_embeddings": False, "attention_bias": False, "rope_theta": 10000.0},
}


# ---- Hugging Face folders ---------------------------------------------------------

def decoder_config(cfg):
    """config.json -> torch_decoder's config dict (Llama family only)."""
    heads = cfg["num_attention_heads"]
    c = {"vocab_size": cfg["vocab_size"], "max_seq_len": cfg["max_position_embeddings"],
         "num_layers": cfg["num_hidden_layers"], "embed_dim": cfg["hidden_size"], "num_heads": heads,
         "kv_heads": cfg.get("num_key_value_heads", heads),
         "head_dim": cfg.get("head_dim", cfg["hidden_size"] // heads), "mlp_dim": cfg["intermediate_size"],
         "norm": "rmsnorm", "norm_eps": cfg["rms_norm_eps"], "positions": "rope",
         "rope_theta": cfg.get("rope_theta", 10000.0), "mlp": "swiglu",
         "qkv_bias": cfg.get("attention_bias", cfg["model_type"] == "qwen2"), "linear_bias": False,
         "qk_norm": cfg["model_type"] == "qwen3", "tied_head": cfg.get("tie_word_embeddings", False)}
    s = cfg.get("rope_scaling")
    if s:
        assert s.get("rope_type", s.get("type")) == "llama3", s
        c["rope_scaling"] = {"factor": s["factor"], "low_freq_factor": s["low_freq_factor"],
                             "high_freq_factor": s["high_freq_factor"],
                             "original_max_position": s["original_max_position_embeddings"]}
    return c


def hf_shapes(c):
    """The model's Hugging Face tensors (name -> shape), as the folder stores
    them: torch_decoder's renaming applied to a zero model; a tied head has no
    lm_head.weight."""
    total = sum(math.prod(shape) for unit in torch_decoder.unit_tensors(c) for _, shape in unit)
    w = torch_decoder.to_hf(c, torch_decoder.load_units(c, torch.zeros(total)))
    return {name: tuple(t.shape) for name, t in w.items() if not (name == "lm_head.weight" and c["tied_head"])}


def write_safetensors(path, tensors):
    """name -> float32 numpy array, as one safetensors file (F32)."""
    header, offset = {}, 0
    for name, a in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for a in tensors.values():
            f.write(np.ascontiguousarray(a, dtype="<f4").tobytes())


def read_hf_folder(d):
    """(config.json, name -> (safetensors dtype, float64 tensor)) of a folder,
    single-file or sharded with an index."""
    cfg = json.load(open(os.path.join(d, "config.json")))
    index = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else [
        "model.safetensors"]
    tensors = {}
    for f in files:
        path = os.path.join(d, f)
        with open(path, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
        dtypes = {name: t["dtype"] for name, t in header.items() if name != "__metadata__"}
        for name, t in torch_decoder.read_safetensors(path).items():
            assert name not in tensors, f"{d}: {name} is in two shards"
            tensors[name] = (dtypes[name], t)
    return cfg, tensors


def init(args):
    rng = np.random.default_rng(args.seed)
    cfg = {"vocab_size": 256, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
           "hidden_act": "silu", "mlp_bias": False, "torch_dtype": "float32"}
    cfg.update(ARCHS[args.arch])
    c = decoder_config(cfg)
    tensors = {}
    for name, shape in hf_shapes(c).items():
        # RMSNorm gains near 1 but not all equal; everything else N(0, 0.1^2).
        a = 0.1 * rng.standard_normal(shape)
        tensors[name] = (a + 1.0 if name.endswith("norm.weight") else a).astype(np.float32)
    os.makedirs(args.model_dir, exist_ok=True)
    with open(os.path.join(args.model_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    write_safetensors(os.path.join(args.model_dir, "model.safetensors"), tensors)
    # Text with some structure (words, punctuation, newlines) so that the
    # model has something to learn and the batches differ.
    words = ["the", "engine", "moves", "bytes", "between", "tiers", "and", "never", "changes", "numbers", "of",
             "a", "step", "zero", "stage", "three", "offload", "Adam", "writes", "parameters", "to", "disk"]
    out, n = [], 0
    while n < args.data_bytes:
        sentence = " ".join(words[i] for i in rng.integers(0, len(words), rng.integers(4, 12)))
        sentence = sentence[0].upper() + sentence[1:] + rng.choice([". ", "! ", "? ", ".\n"])
        out.append(sentence)
        n += len(sentence)
    with open(args.data, "w") as f:
        f.write("".join(out)[:args.data_bytes])
    print(f"wrote {args.model_dir} ({args.arch}: {sum(a.size for a in tensors.values())} parameters) and "
          f"{args.data} ({args.data_bytes} bytes)")


# ---- The data zinf trains on ------------------------------------------------------

def read_tokens(data):
    """The byte tokenizer's ids of `data`; where zinf left its token cache
    beside it, its ids must be these."""
    tokens = np.frombuffer(open(data, "rb").read(), dtype=np.uint8).astype(np.int64)
    for cache in glob.glob(glob.escape(data) + ".byte-*.tokens"):
        raw = open(cache, "rb").read()
        assert raw[:8] == b"ZINFTOK1", cache
        num = struct.unpack_from("<Q", raw, 16)[0]
        ids = np.frombuffer(raw[64:64 + 4 * num], dtype="<i4")
        assert np.array_equal(ids, tokens), f"{cache}: zinf's token ids are not the file's bytes"
    return tokens


class Batches:
    """BatchLoader (src/data/token_dataset.h) restated: non-overlapping windows
    of T + 1 tokens at stride T, each epoch in a permutation that depends only
    on (seed, epoch)."""

    def __init__(self, tokens, B, T, seed, shuffle=True):
        self.tokens, self.B, self.T, self.seed, self.shuffle = tokens, B, T, seed, shuffle
        self.windows = (len(tokens) - 1) // T
        self.epoch, self.window = 0, 0
        self.order = self.permutation()

    def permutation(self):
        # Fisher-Yates; the draws are SplitMix64 outputs of a state seeded
        # with seed ^ (0xD1B54A32D192ED03 * (epoch + 1)), bounded to [0, i]
        # by Lemire's multiply-shift (the high 64 bits of draw * (i + 1)).
        state = (self.seed ^ (0xD1B54A32D192ED03 * (self.epoch + 1))) & MASK64
        order = list(range(self.windows))
        if not self.shuffle:
            return order
        for i in range(self.windows - 1, 0, -1):
            state = (state + 0x9E3779B97F4A7C15) & MASK64
            z = state
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
            z ^= z >> 31
            j = (z * (i + 1)) >> 64
            order[i], order[j] = order[j], order[i]
        return order

    def next(self):
        rows = []
        for _ in range(self.B):
            w = self.order[self.window]
            rows.append(self.tokens[w * self.T:w * self.T + self.T + 1])
            self.window += 1
            if self.window == self.windows:
                self.window, self.epoch = 0, self.epoch + 1
                self.order = self.permutation()
        rows = torch.from_numpy(np.stack(rows))
        return rows[:, :-1].reshape(-1), rows[:, 1:].reshape(-1)


# ---- DeepSpeed's optimizer, scheduler and clipping --------------------------------

def training_config(path):
    """The parts of a DeepSpeed config that decide the numbers; anything this
    replay does not implement is refused rather than ignored."""
    ds = json.load(open(path))
    for half in ("fp16", "bf16"):
        assert not ds.get(half, {}).get("enabled", False), f"{path}: {half} is enabled; the replay is fp32"
    opt = ds["optimizer"]
    assert opt["type"].lower() in ("adam", "adamw"), opt["type"]
    p = opt.get("params", {})
    assert p.get("adam_w_mode", True), "Adam with L2 decay is not replayed"
    assert p.get("bias_correction", True), "Adam without bias correction is not replayed"
    sched = ds.get("scheduler")
    return {"lr": p["lr"], "betas": tuple(p.get("betas", (0.9, 0.999))), "eps": p.get("eps", 1e-8),
            "weight_decay": p.get("weight_decay", 0.0), "clipping": ds.get("gradient_clipping", 0.0),
            "scheduler": sched}


def lr_at(tc, completed):
    """DeepSpeed's lr after `completed` optimizer steps (deepspeed/runtime/
    lr_schedules.py): a warmup over W = max(2, warmup_num_steps) steps, linear
    (s / W) or log (log(s + 1) / log(W)); WarmupDecayLR then falls linearly to
    warmup_min_lr at total_num_steps; WarmupCosineLR scales the optimizer's lr
    by a ratio that follows a cosine after the warmup."""
    sched = tc["scheduler"]
    if not sched:
        return tc["lr"]
    kind, p = sched["type"], sched["params"]
    s = completed
    W = max(2, p["warmup_num_steps"])
    gamma = math.log(s + 1) / math.log(W) if p.get("warmup_type", "log") == "log" else s / W
    if kind == "WarmupCosineLR":
        lo = p.get("warmup_min_ratio", 0.0)
        if s < W:
            ratio = lo + (1 - lo) * gamma
        else:
            cos_min = p.get("cos_min_ratio", 0.0001)
            progress = (s - W + 1) / (p["total_num_steps"] - W)
            ratio = max(0.0, cos_min + (1 - cos_min) * (1 + math.cos(math.pi * progress)) / 2)
        return tc["lr"] * ratio
    lo, hi = p.get("warmup_min_lr", 0.0), p.get("warmup_max_lr", 0.001)
    if s < W:
        return lo + (hi - lo) * gamma
    if kind == "WarmupLR":
        return hi
    assert kind == "WarmupDecayLR", kind
    T = p["total_num_steps"]
    return lo + (hi - lo) * max(0.0, (T - s) / max(1.0, T - W))


# ---- The replay and the comparison ------------------------------------------------

def with_head(c, tensors):
    """The tensors by Hugging Face name as the model uses them: a tied head is
    the embedding."""
    w = dict(tensors)
    if c["tied_head"]:
        w["lm_head.weight"] = w["model.embed_tokens.weight"]
    return w


def replay(args, c, tc, initial):
    dtype = torch.float64 if args.float64 else torch.float32
    params = {name: t.to(dtype).clone().requires_grad_(True) for name, t in initial.items()}
    w = with_head(c, params)
    opt = torch.optim.AdamW(list(params.values()), lr=tc["lr"], betas=tc["betas"], eps=tc["eps"],
                            weight_decay=tc["weight_decay"])
    tokens = read_tokens(args.data)
    train = tokens[:len(tokens) - int(len(tokens) * VALID_FRACTION)]
    batches = Batches(train, args.micro_batch, args.seq_len, args.seed)
    steps = []
    for step in range(args.steps):
        opt.zero_grad(set_to_none=False)
        loss_sum = 0.0
        for _ in range(args.grad_accum):
            x, y = batches.next()
            loss = torch_decoder.forward(c, w, x, y, args.micro_batch, args.seq_len)
            (loss / args.grad_accum).backward()
            loss_sum += loss.item()
        if tc["clipping"] > 0:
            norm = torch.nn.utils.clip_grad_norm_(list(params.values()), tc["clipping"]).item()
        else:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params.values()])).item()
        lr = lr_at(tc, step)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        steps.append({"loss": loss_sum / args.grad_accum, "lr": lr, "grad_norm": norm})
    return steps, {name: p.detach() for name, p in params.items()}


def relative(a, b):
    """max|a - b| / max|b| over a tensor (|a - b| / |b| for numbers)."""
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / scale if scale > 0 else (a - b).abs().max().item()


def compare_run(label, c, cfg_in, steps, final, initial, probe, metrics_path, export_dir):
    """Every mismatch of one zinf run against the replay, as lines (none when
    it agrees), and the run's weights as loaded by name."""
    bad = []
    rows = [json.loads(line) for line in open(metrics_path) if line.strip()]
    if len(rows) != len(steps):
        return [f"{label}: {metrics_path} has {len(rows)} steps, the replay {len(steps)}"], {}
    worst_loss = 0.0
    for i, (z, t) in enumerate(zip(rows, steps)):
        if z.get("skipped"):
            bad.append(f"{label}: zinf skipped step {i + 1}")
        if not math.isclose(z["lr"], t["lr"], rel_tol=1e-9, abs_tol=1e-15):
            bad.append(f"{label}: step {i + 1} lr {z['lr']!r}, DeepSpeed's schedule {t['lr']!r}")
        for key in ("loss", "grad_norm"):
            r = relative(z[key], t[key])
            if key == "loss":
                worst_loss = max(worst_loss, r)
            if not r <= TOLERANCE:
                bad.append(f"{label}: step {i + 1} {key} {z[key]!r}, torch {t[key]!r} (relative {r:.3e})")
        print(f"  {label} step {i + 1}: loss {z['loss']:.8f} torch {t['loss']:.8f} (rel {relative(z['loss'], t['loss']):.2e})"
              f"  lr {z['lr']:.6g}  grad norm {z['grad_norm']:.6g} torch {t['grad_norm']:.6g}"
              f"{'  clipped' if z.get('clip_coef', 1) < 1 else ''}")

    cfg, exported = read_hf_folder(export_dir)
    for key in ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta",
                "tie_word_embeddings", "rope_scaling"):
        if cfg.get(key) != cfg_in.get(key):
            bad.append(f"{label}: {export_dir}/config.json {key} = {cfg.get(key)!r}, the model's {cfg_in.get(key)!r}")
    expected = hf_shapes(c)
    missing, extra = sorted(set(expected) - set(exported)), sorted(set(exported) - set(expected))
    if missing or extra:
        bad.append(f"{label}: {export_dir} lacks {missing} and has unexpected {extra}")
    # Load the folder into the model by name: each tensor must be one of the
    # model's, with its shape, in F32.
    loaded = {}
    for name, shape in expected.items():
        if name not in exported:
            continue
        dtype, t = exported[name]
        if dtype != "F32" or tuple(t.shape) != shape:
            bad.append(f"{label}: {name} is {dtype} {list(t.shape)}, expected F32 {list(shape)}")
            continue
        loaded[name] = t.float()
    worst = (0.0, None)
    for name, t in loaded.items():
        r = relative(t, final[name])
        moved = relative(final[name], initial[name])
        if not r <= TOLERANCE:
            bad.append(f"{label}: {name} differs from torch by {r:.3e} of its scale "
                       f"(max|torch| {final[name].abs().max().item():.4g}; training moved it by {moved:.3e})")
        worst = max(worst, (r, name), key=lambda p: p[0])
    print(f"  {label}: {len(loaded)} tensors loaded by Hugging Face name; worst weight {worst[1]} "
          f"rel {worst[0]:.2e}; worst step loss rel {worst_loss:.2e}")
    if len(loaded) == len(expected):
        # The loaded model runs: its loss on held-out windows is the replay's.
        x, y, B, T = probe
        with torch.no_grad():
            z = torch_decoder.forward(c, with_head(c, loaded), x, y, B, T)
            t = torch_decoder.forward(c, with_head(c, final), x, y, B, T)
        r = relative(z.item(), t.item())
        print(f"  {label}: held-out loss of the loaded export {z.item():.8f}, torch's weights {t.item():.8f} (rel {r:.2e})")
        if not r <= TOLERANCE:
            bad.append(f"{label}: the loaded export's held-out loss {z.item()!r}, torch {t.item()!r} (relative {r:.3e})")
    return bad, loaded


def check(args):
    cfg_in, initial = read_hf_folder(args.model_dir)
    c = decoder_config(cfg_in)
    initial = {name: t for name, (_, t) in initial.items()}
    tc = training_config(args.config)
    torch.set_num_threads(1)
    steps, final = replay(args, c, tc, initial)
    # Held-out windows (zinf's validation split, in order) for the loaded exports.
    tokens = read_tokens(args.data)
    valid = tokens[len(tokens) - int(len(tokens) * VALID_FRACTION):]
    B = min(4, (len(valid) - 1) // args.seq_len)
    probe = (*Batches(valid, B, args.seq_len, 0, shuffle=False).next(), B, args.seq_len)
    if args.save:
        torch.save(final, args.save)
    # The replay must move every tensor, or a missing update could pass.
    still = [n for n in final if relative(final[n], initial[n]) < 1e-3]
    if still:
        print(f"MISMATCH\ntraining moved {still} by less than 1e-3 of their scale: raise the lr")
        return 1
    bad, exports = [], []
    for run in args.run:
        metrics, export = run.split(":", 1)
        label = os.path.basename(export.rstrip("/"))
        b, loaded = compare_run(label, c, cfg_in, steps, final, initial, probe, metrics, export)
        bad += b
        exports.append((label, loaded))
    for label, loaded in exports[1:]:
        for name, t in loaded.items():
            ref = exports[0][1].get(name)
            if ref is not None and not torch.equal(t, ref):
                bad.append(f"{label}: {name} is not bit-identical to {exports[0][0]}'s "
                           f"(max difference {(t - ref).abs().max().item():.3e})")
    if bad:
        print("MISMATCH\n" + "\n".join(bad))
        return 1
    print(f"PASS: {len(args.run)} run(s) match torch.optim.AdamW over {args.steps} steps within {TOLERANCE:g}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    i = sub.add_parser("init")
    i.add_argument("--arch", choices=sorted(ARCHS), required=True)
    i.add_argument("--model-dir", required=True)
    i.add_argument("--data", required=True)
    i.add_argument("--data-bytes", type=int, default=4000)
    i.add_argument("--seed", type=int, default=1)
    k = sub.add_parser("check")
    k.add_argument("--model-dir", required=True)
    k.add_argument("--data", required=True)
    k.add_argument("--config", required=True)
    for name in ("--steps", "--micro-batch", "--grad-accum", "--seq-len", "--seed"):
        k.add_argument(name, type=int, required=True)
    k.add_argument("--run", action="append", required=True, help="METRICS.jsonl:EXPORT_DIR")
    k.add_argument("--float64", action="store_true",
                   help="replay in float64 instead (a diagnosis: how far each side is from exact arithmetic)")
    k.add_argument("--save", help="write the replay's final weights here (torch.save of name -> tensor), for a diagnosis")
    args = ap.parse_args()
    if args.command == "init":
        init(args)
        return 0
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
