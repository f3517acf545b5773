#!/usr/bin/env python3
"""A training-level oracle for `zinf train` on the Llama family: the same run
replayed with transformers' own model and torch.optim.AdamW in float32, step
for step, on the same batches, with DeepSpeed's own lr schedule; then zinf's
per-step losses and its exported Hugging Face folder compared with the
replay's.

  torch_train.py init --arch llama|mistral|qwen2|qwen3 --model-dir DIR --data FILE [--seed N]
      Builds a tiny random model with transformers
      (AutoModelForCausalLM.from_config on a LlamaConfig, MistralConfig,
      Qwen2Config or Qwen3Config; a 256-token vocabulary, so zinf's byte
      tokenizer fits) and writes it to DIR with save_pretrained (fp32
      safetensors), and FILE (ASCII text to train on).

  torch_train.py check --model-dir DIR --data FILE --config DS.json
                       --steps N --micro-batch B --grad-accum K --seq-len T --seed S
                       --run METRICS.jsonl:EXPORT_DIR [--run ...]
      Replays the run that `zinf train --model-dir DIR --data FILE --config
      DS.json --steps N --micro-batch B --grad-accum K --seq-len T --seed S`
      does and compares every --run (zinf's --metrics-json and --export-dir
      with --export-dtype fp32) with it. Exit code 0 when all match, 1 with
      every mismatch named otherwise; --float64 and --save help a diagnosis.

The replay's model is DIR loaded with AutoModelForCausalLM.from_pretrained
(eager attention): the forward, its gradients and the loss
(model.loss_function, transformers' ForCausalLMLoss, given the targets
already shifted) are transformers'. What the replay restates of zinf (and so
checks):
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
  - lr: the config's "scheduler" built by DeepSpeed itself
    (deepspeed.runtime.lr_schedules.WarmupLR / WarmupDecayLR /
    WarmupCosineLR on the AdamW above, as DeepSpeed's engine builds it from
    the config), stepped after each optimizer step as DeepSpeed's engine
    steps it: the first step runs at the lr its constructor set, step s + 1
    at index s - 1 (src/sched/lr_schedule.h).

Agreement: each step's loss and gradient norm within 1e-5 of torch's,
relative (|zinf - torch| / |torch|), and its lr DeepSpeed's; each weight
tensor within 1e-5 of its scale, max|zinf - torch| / max|torch| over the
tensor; the export loaded with from_pretrained gives a loss on held-out
windows within 1e-5 of the replay's model's. The exported folder must load
with nothing missing, unexpected or mismatched, hold exactly the model's
tensors (lm_head.weight only when the head is untied) in F32, and have a
config.json of the same architecture. The runs given must also be
bit-identical to each other (zinf promises that stage and offload never
change the numbers).

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

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed's schedules need no GPU
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

TOLERANCE = 1e-5
VALID_FRACTION = 0.05  # tools/train.cc: dataset->Split(0.05)
MASK64 = (1 << 64) - 1

# Tiny shapes of the presets tiny-llama / tiny-qwen2 / tiny-qwen3
# (src/model/gpt_config.cc) with the byte tokenizer's vocabulary. The Llama
# case adds Llama 3's rope scaling, with an original context of 8 positions
# so that the head's four frequencies fall in all three bands. Mistral has
# one key/value head for four query heads and an attention window of 16
# positions, the test's --seq-len: zinf's attention is full causal and it
# takes a Mistral folder only when --seq-len is at most the window.
COMMON = {"vocab_size": 256, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64, "hidden_act": "silu",
          "attention_dropout": 0.0}
ARCHS = {
    "llama": ("LlamaConfig", {"head_dim": 8, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
                              "attention_bias": False, "mlp_bias": False,
                              "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                  "original_max_position_embeddings": 8}}),
    "mistral": ("MistralConfig", {"head_dim": 8, "num_key_value_heads": 1, "rms_norm_eps": 1e-5,
                                  "tie_word_embeddings": False, "sliding_window": 16,
                                  "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}),
    "qwen2": ("Qwen2Config", {"rms_norm_eps": 1e-6, "tie_word_embeddings": True, "use_sliding_window": False,
                              "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    "qwen3": ("Qwen3Config", {"head_dim": 16, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
                              "attention_bias": False, "use_sliding_window": False,
                              "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
}


# ---- Hugging Face folders ---------------------------------------------------------

def load_model(d, dtype=torch.float32):
    """A folder through from_pretrained, with eager attention; anything
    missing, unexpected or mismatched is an error, not a warning."""
    import transformers
    model, info = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=dtype, attn_implementation="eager",
                                                                    output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    assert not problems, f"{d}: from_pretrained reports {problems}"
    return model


def safetensors_dtypes(d):
    """name -> safetensors dtype ("F32", ...) of every tensor a folder stores,
    single-file or sharded with an index."""
    index = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else [
        "model.safetensors"]
    dtypes = {}
    for f in files:
        with open(os.path.join(d, f), "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
        for name, t in header.items():
            if name == "__metadata__":
                continue
            assert name not in dtypes, f"{d}: {name} is in two shards"
            dtypes[name] = t["dtype"]
    return dtypes


def init(args):
    import transformers
    kind, params = ARCHS[args.arch]
    config = getattr(transformers, kind)(**{**COMMON, **params})
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # transformers' own initialization draws N(0, 0.02^2) with every RMSNorm
    # gain 1; larger weights and gains near 1 but not all equal make a swapped
    # or misplaced tensor show in the first step.
    rng = np.random.default_rng(args.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            a = 0.1 * rng.standard_normal(tuple(p.shape))
            p.copy_(torch.from_numpy((a + 1.0 if name.endswith("norm.weight") else a).astype(np.float32)))
    model.save_pretrained(args.model_dir, safe_serialization=True)
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
    print(f"wrote {args.model_dir} ({type(model).__name__}: {sum(p.numel() for p in model.parameters())} "
          f"parameters) and {args.data} ({args.data_bytes} bytes)")


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
    return {"lr": p["lr"], "betas": tuple(p.get("betas", (0.9, 0.999))), "eps": p.get("eps", 1e-8),
            "weight_decay": p.get("weight_decay", 0.0), "clipping": ds.get("gradient_clipping", 0.0),
            "scheduler": ds.get("scheduler")}


def deepspeed_scheduler(optimizer, sched):
    """The config's "scheduler" as DeepSpeed's engine builds it
    (DeepSpeedEngine._scheduler_from_config): the class of that name in
    deepspeed.runtime.lr_schedules, given the optimizer and the params."""
    import logging
    from deepspeed.runtime import lr_schedules
    from deepspeed.utils import logger
    logger.setLevel(logging.ERROR)  # "before it has started": the constructor's get_lr() at index -1
    return getattr(lr_schedules, sched["type"])(optimizer, **sched.get("params", {}))


# ---- The replay and the comparison ------------------------------------------------

def loss_of(model, x, y, B, T):
    logits = model(input_ids=x.reshape(B, T), use_cache=False).logits
    if logits.dtype == torch.float32:
        # transformers' ForCausalLMLoss; the targets are already shifted.
        return model.loss_function(logits=logits, labels=None, vocab_size=model.config.vocab_size,
                                   shift_labels=y.reshape(B, T))
    # (ForCausalLMLoss casts the logits to float32: for --float64, the same
    # mean cross-entropy without the cast.)
    return torch.nn.functional.cross_entropy(logits.reshape(B * T, -1), y)


def replay(args, tc):
    model = load_model(args.model_dir, torch.float64 if args.float64 else torch.float32)
    model.train()
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    params = [p for _, p in model.named_parameters()]  # a tied head is the embedding, once
    opt = torch.optim.AdamW(params, lr=tc["lr"], betas=tc["betas"], eps=tc["eps"], weight_decay=tc["weight_decay"])
    sched = deepspeed_scheduler(opt, tc["scheduler"]) if tc["scheduler"] else None
    tokens = read_tokens(args.data)
    train = tokens[:len(tokens) - int(len(tokens) * VALID_FRACTION)]
    batches = Batches(train, args.micro_batch, args.seq_len, args.seed)
    steps = []
    for step in range(args.steps):
        opt.zero_grad(set_to_none=False)
        loss_sum = 0.0
        for _ in range(args.grad_accum):
            x, y = batches.next()
            loss = loss_of(model, x, y, args.micro_batch, args.seq_len)
            (loss / args.grad_accum).backward()
            loss_sum += loss.item()
        if tc["clipping"] > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, tc["clipping"]).item()
        else:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])).item()
        lr = opt.param_groups[0]["lr"]
        opt.step()
        if sched:
            sched.step()  # after the optimizer, as DeepSpeed's engine does
        steps.append({"loss": loss_sum / args.grad_accum, "lr": float(lr), "grad_norm": norm})
    model.eval()
    return model, steps, initial


def relative(a, b):
    """max|a - b| / max|b| over a tensor (|a - b| / |b| for numbers)."""
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / scale if scale > 0 else (a - b).abs().max().item()


def held_out_loss(model, probe):
    x, y, B, T = probe
    with torch.no_grad():
        return torch.nn.functional.cross_entropy(
            model(input_ids=x.reshape(B, T), use_cache=False).logits.double().reshape(B * T, -1), y).item()


def compare_steps(label, steps, metrics_path):
    bad, worst = [], 0.0
    rows = [json.loads(line) for line in open(metrics_path) if line.strip()]
    if len(rows) != len(steps):
        return [f"{label}: {metrics_path} has {len(rows)} steps, the replay {len(steps)}"], worst
    for i, (z, t) in enumerate(zip(rows, steps)):
        if z.get("skipped"):
            bad.append(f"{label}: zinf skipped step {i + 1}")
        if not math.isclose(z["lr"], t["lr"], rel_tol=1e-9, abs_tol=1e-15):
            bad.append(f"{label}: step {i + 1} lr {z['lr']!r}, DeepSpeed's schedule {t['lr']!r}")
        for key in ("loss", "grad_norm"):
            r = relative(z[key], t[key])
            if key == "loss":
                worst = max(worst, r)
            if not r <= TOLERANCE:
                bad.append(f"{label}: step {i + 1} {key} {z[key]!r}, torch {t[key]!r} (relative {r:.3e})")
        print(f"  {label} step {i + 1}: loss {z['loss']:.8f} torch {t['loss']:.8f} "
              f"(rel {relative(z['loss'], t['loss']):.2e})  lr {z['lr']:.6g}  grad norm {z['grad_norm']:.6g} "
              f"torch {t['grad_norm']:.6g}{'  clipped' if z.get('clip_coef', 1) < 1 else ''}")
    return bad, worst


def compare_export(label, model, initial, probe, export_dir):
    """Every mismatch of an exported folder against the replay's model, and
    the folder's parameters as from_pretrained loads them."""
    bad = []
    src = json.load(open(os.path.join(model.name_or_path, "config.json")))
    cfg = json.load(open(os.path.join(export_dir, "config.json")))
    for key in sorted((set(src) | set(cfg)) - {"dtype", "torch_dtype", "transformers_version"}):
        if cfg.get(key) != src.get(key):
            bad.append(f"{label}: {export_dir}/config.json {key} = {cfg.get(key)!r}, the model's {src.get(key)!r}")
    final = {name: p.detach() for name, p in model.named_parameters()}
    stored = safetensors_dtypes(export_dir)
    missing, extra = sorted(set(final) - set(stored)), sorted(set(stored) - set(final))
    if missing or extra:
        bad.append(f"{label}: {export_dir} lacks {missing} and has unexpected {extra}")
    not_f32 = sorted(name for name, dtype in stored.items() if dtype != "F32")
    if not_f32:
        bad.append(f"{label}: {not_f32} are not F32")
    try:
        loaded_model = load_model(export_dir)
    except Exception as e:  # noqa: BLE001  (named in the report, with the rest)
        return bad + [f"{label}: from_pretrained({export_dir}): {e}"], {}
    if type(loaded_model) is not type(model):
        bad.append(f"{label}: {export_dir} loads as {type(loaded_model).__name__}, the model is {type(model).__name__}")
    loaded = {name: p.detach() for name, p in loaded_model.named_parameters()}
    worst = (0.0, None)
    for name, t in loaded.items():
        if name not in final:
            continue
        r = relative(t, final[name])
        if not r <= TOLERANCE:
            moved = relative(final[name], initial[name])
            bad.append(f"{label}: {name} differs from torch by {r:.3e} of its scale "
                       f"(max|torch| {final[name].abs().max().item():.4g}; training moved it by {moved:.3e})")
        worst = max(worst, (r, name), key=lambda p: p[0])
    print(f"  {label}: from_pretrained gives a {type(loaded_model).__name__} of {len(loaded)} tensors; worst "
          f"weight {worst[1]} rel {worst[0]:.2e}")
    # The loaded model runs: its loss on held-out windows is the replay's.
    z, t = held_out_loss(loaded_model, probe), held_out_loss(model, probe)
    r = relative(z, t)
    print(f"  {label}: held-out loss of the loaded export {z:.8f}, torch's model {t:.8f} (rel {r:.2e})")
    if not r <= TOLERANCE:
        bad.append(f"{label}: the loaded export's held-out loss {z!r}, torch {t!r} (relative {r:.3e})")
    return bad, loaded


def check(args):
    import transformers
    transformers.utils.logging.disable_progress_bar()
    tc = training_config(args.config)
    torch.set_num_threads(1)
    model, steps, initial = replay(args, tc)
    print(f"  replay: transformers {type(model).__name__}, torch.optim.AdamW, "
          f"{'DeepSpeed ' + tc['scheduler']['type'] if tc['scheduler'] else 'constant lr'}, "
          f"{'float64' if args.float64 else 'float32'}")
    # Held-out windows (zinf's validation split, in order) for the loaded exports.
    tokens = read_tokens(args.data)
    valid = tokens[len(tokens) - int(len(tokens) * VALID_FRACTION):]
    B = min(4, (len(valid) - 1) // args.seq_len)
    probe = (*Batches(valid, B, args.seq_len, 0, shuffle=False).next(), B, args.seq_len)
    final = {name: p.detach() for name, p in model.named_parameters()}
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
        b, worst_loss = compare_steps(label, steps, metrics)
        print(f"  {label}: worst step loss rel {worst_loss:.2e}")
        b2, loaded = compare_export(label, model, initial, probe, export)
        bad += b + b2
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
