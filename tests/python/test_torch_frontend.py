#!/usr/bin/env python3
"""zinf.torch against torch.optim.AdamW: a GPT-2-shaped and a Llama-shaped
model, written here as plain nn.Modules, train through
zinf.torch.initialize at ZeRO stage 0 and at stage 3 with parameters and
optimizer state on NVMe; a deep copy trains with torch.optim.AdamW on the same
batches. Every step's loss and, at the end, every master weight agree within
1e-5 relative (fp32). Also: a model larger than the configured device budget
trains at stage 3 within it, checkpoints save and load, export_hf writes the
weights under the model's names, and bad input raises with zinf's message.

usage: test_torch_frontend.py SCRATCH_DIR [--cuda] [pytest arguments]
       (ZINF_LIBRARY: libzinf.so; PYTHONPATH: the repository's python/ folder)
pytest functions: one failure does not stop the rest (under mpirun it does:
the ranks' collectives must stay in step), -k selects; --cuda runs the GPU
check alone.
Under mpirun every rank trains on its own batches and the reference averages
them, as zinf's reduction does. Exits 77 (ctest: skipped) without torch."""
import copy
import json
import math
import os
import shutil
import struct
import sys

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    print("SKIP: torch is not installed for %s (scripts/setup makes the Python environment)" % sys.executable)
    sys.exit(77)

import zinf.torch  # noqa: E402
from zinf._capi import ZinfError  # noqa: E402

torch.set_num_threads(1)
VOCAB, CTX = 64, 16
# eps 1e-3: with a tiny eps, Adam turns the rounding noise of gradients that
# are zero in exact arithmetic (the key bias: softmax ignores it) into steps
# of +-lr whose sign rounding decides, in torch's AdamW as in any other.
LR, BETAS, EPS, WD = 3e-3, (0.9, 0.95), 1e-3, 0.1
DEVICE = torch.device("cpu")  # where the models and batches live (run_cuda: the GPU)
RANK = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
WORLD = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))


# ---- the models -------------------------------------------------------------------

class Gpt2Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.heads)
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(B, T, C))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt2(nn.Module):
    def __init__(self, d=32, layers=2, heads=4):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, d), nn.Embedding(CTX, d)
        self.blocks = nn.ModuleList([Gpt2Block(d, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)

    def forward(self, tokens, targets):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for b in self.blocks:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


class RmsNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def rope(x, theta=10000.0):
    T, D = x.shape[-2], x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float32, device=x.device) / D)
    ang = torch.arange(T, dtype=torch.float32, device=x.device)[:, None] * inv[None, :]
    cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return x * cos + torch.cat((-x2, x1), -1) * sin


class LlamaBlock(nn.Module):
    def __init__(self, d, heads, kv_heads, inter):
        super().__init__()
        self.h, self.kv, self.hd = heads, kv_heads, d // heads
        self.norm1, self.norm2 = RmsNorm(d), RmsNorm(d)
        self.q = nn.Linear(d, heads * self.hd, bias=False)
        self.k = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.v = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.o = nn.Linear(heads * self.hd, d, bias=False)
        self.gate, self.up = nn.Linear(d, inter, bias=False), nn.Linear(d, inter, bias=False)
        self.down = nn.Linear(inter, d, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        h = self.norm1(x)
        q = rope(self.q(h).view(B, T, self.h, self.hd).transpose(1, 2))
        k = rope(self.k(h).view(B, T, self.kv, self.hd).transpose(1, 2))
        v = self.v(h).view(B, T, self.kv, self.hd).transpose(1, 2)
        k, v = (t.repeat_interleave(self.h // self.kv, dim=1) for t in (k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf")).softmax(-1)
        x = x + self.o((att @ v).transpose(1, 2).reshape(B, T, C))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, d=32, layers=2, heads=4, kv_heads=2, inter=48):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d)
        self.layers = nn.ModuleList([LlamaBlock(d, heads, kv_heads, inter) for _ in range(layers)])
        self.norm = RmsNorm(d)
        self.lm_head = nn.Linear(d, VOCAB, bias=False)  # untied

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return F.cross_entropy(self.lm_head(self.norm(x)).reshape(-1, VOCAB), targets.reshape(-1))


# ---- helpers ------------------------------------------------------------------------

def batch(step, rank, B=2):
    g = torch.Generator().manual_seed(1000 * step + rank)
    seq = torch.randint(0, VOCAB, (B, CTX + 1), generator=g).to(DEVICE)
    return seq[:, :-1], seq[:, 1:]


def config(stage, nvme_dir=None, extra=None):
    c = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
         "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "eps": EPS, "weight_decay": WD}},
         "zero_optimization": {"stage": stage}, "zinf": {"device": "cpu", "optimizer_threads": 1}}
    if nvme_dir:
        c["zero_optimization"].update({
            "stage3_param_persistence_threshold": 0,
            "offload_param": {"device": "nvme", "nvme_path": nvme_dir},
            "offload_optimizer": {"device": "nvme", "nvme_path": nvme_dir}})
    for k, v in (extra or {}).items():
        c[k] = v
    return c


def rel(a, b):
    """max |a - b| over the larger of the two tensors' max |.|."""
    return (a - b).abs().max().item() / max(a.abs().max().item(), b.abs().max().item(), 1e-30)


def train_against_torch(make, cfg, steps, label, accum=1):
    torch.manual_seed(7)
    model = make().to(DEVICE)
    reference = copy.deepcopy(model)
    opt = torch.optim.AdamW(reference.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    cfg["gradient_accumulation_steps"] = accum
    engine = zinf.torch.initialize(model, cfg)
    worst_loss = 0.0
    for step in range(steps):
        opt.zero_grad()
        for k in range(accum):
            micro = step * accum + k
            loss = engine(*batch(micro, RANK))
            engine.backward(loss)
            assert engine.step() == (k == accum - 1), "boundary at the last micro-step only"
            # The reference: the mean of every rank's and micro-step's loss
            # (zinf averages the ranks' gradients and the micro-steps').
            ref_losses = [reference(*batch(micro, r)) for r in range(WORLD)]
            (sum(ref_losses) / (WORLD * accum)).backward()
            mine = ref_losses[RANK].item()
            err = abs(loss.item() - mine) / abs(mine)
            worst_loss = max(worst_loss, err)
            assert err <= 1e-5, "%s step %d: loss %.9g vs torch %.9g (rel %.3g)" % (label, step, loss.item(), mine, err)
        opt.step()
    masters = engine.master_weights()
    worst, worst_name = 0.0, ""
    moved = 0.0
    initial = dict(make_initial(make).named_parameters())
    for name, ref_p in reference.named_parameters():
        e = rel(masters[name], ref_p.detach().cpu())
        moved = max(moved, rel(ref_p.detach().cpu(), initial[name].detach()))
        if e > worst:
            worst, worst_name = e, name
    assert worst <= 1e-5, "%s: weight %s off by %.3g relative" % (label, worst_name, worst)
    assert moved > 1e-3, "%s: the weights hardly moved (%.3g); the check would be weak" % (label, moved)
    print("  %-28s losses within %.2g, weights within %.2g (worst %s), moved %.2g" % (
        label, worst_loss, worst, worst_name, moved))
    return engine


def make_initial(make):
    torch.manual_seed(7)
    return make()


# ---- the tests -----------------------------------------------------------------------

def offload(cfg, optimizer=None, param=None, nvme=None):
    z = cfg["zero_optimization"]
    if optimizer:
        z["offload_optimizer"] = {"device": optimizer, "nvme_path": nvme} if nvme else {"device": optimizer}
    if param:
        z["offload_param"] = {"device": param, "nvme_path": nvme} if nvme else {"device": param}
        z["stage3_param_persistence_threshold"] = 0
    return cfg


def test_matches_torch_adamw(scratch):
    for make, name in ((Gpt2, "gpt2"), (Llama, "llama")):
        e = train_against_torch(make, config(0), 20, name + " stage 0")
        e.close()
        nvme = os.path.join(scratch, "nvme-%s-%d" % (name, RANK))
        shutil.rmtree(nvme, ignore_errors=True)
        os.makedirs(nvme)
        e = train_against_torch(make, config(3, [nvme]), 20, name + " stage 3, NVMe")
        stats = e.stats()
        assert stats["nvme_bytes_read"] > 0 and stats["nvme_bytes_written"] > 0, stats
        e.close()
    # The other tiers, shorter.
    nvme = os.path.join(scratch, "nvme-tiers-%d" % RANK)
    shutil.rmtree(nvme, ignore_errors=True)
    os.makedirs(nvme)
    for cfg, label in ((offload(config(1), "cpu"), "stage 1, optimizer cpu"),
                       (offload(config(2), "nvme", nvme=[nvme]), "stage 2, optimizer nvme, 2 micro-steps"),
                       (offload(config(3), "cpu", "cpu"), "stage 3, cpu and cpu"),
                       (offload(config(3), "none", "nvme", [nvme]), "stage 3, parameters nvme")):
        train_against_torch(Llama, cfg, 4, "llama " + label, accum=2 if "micro" in label else 1).close()


def test_device_budget(scratch):
    if WORLD > 1:
        import pytest
        pytest.skip("one rank's device budget")
    # Every parameter of the model alone takes more than the budget: stage 3
    # keeps only the units in use on the device.
    torch.manual_seed(3)
    model = Llama(d=128, layers=8, heads=4, kv_heads=2, inter=384)
    state = sum(p.numel() for p in model.parameters()) * 4
    budget = 4 << 20
    assert state > budget, state
    cfg = config(3, extra={"zinf": {"device": "cpu", "device_memory": budget, "optimizer_threads": 1}})
    cfg["zero_optimization"].update({"stage3_param_persistence_threshold": 0, "reduce_bucket_size": 262144,
                                     "stage3_prefetch_bucket_size": 262144, "stage3_max_live_parameters": 524288})
    cfg["zero_optimization"]["offload_param"] = {"device": "cpu"}
    cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    engine = zinf.torch.initialize(model, cfg)
    losses = []
    for step in range(4):
        loss = engine(*batch(step, RANK))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        early = engine.stats(wait=False)  # the latest finished step's, and how many are still running
        assert early["boundary"] >= 1 and early["boundary"] + early["behind"] == step + 1, early
        stats = engine.stats()
        assert stats["behind"] == 0 and stats["boundary"] == step + 1, stats
        assert stats["device_bytes_in_use"] <= budget, stats
    print("  device budget %d KiB for %d KiB of parameters: losses %s" % (
        budget >> 10, state >> 10, " ".join("%.4f" % x for x in losses)))
    engine.close()


def test_checkpoint_and_export(scratch):
    directory = os.path.join(scratch, "torch-ckpt-%d" % WORLD)
    if RANK == 0:
        shutil.rmtree(directory, ignore_errors=True)
    torch.manual_seed(5)
    engine = zinf.torch.initialize(Gpt2(), config(2))
    for step in range(2):
        engine.backward(engine(*batch(step, RANK)))
        engine.step()
    assert engine.save_checkpoint(directory, tag="two", client_state={"step": 2}) is True
    saved = engine.master_weights()
    engine.backward(engine(*batch(2, RANK)))
    engine.step()
    assert rel(engine.master_weights()["wte.weight"], saved["wte.weight"]) > 0
    path, client = engine.load_checkpoint(directory)  # the tag `latest` names
    assert client == {"step": 2} and os.path.basename(path) == "two", (path, client)
    for name, t in engine.master_weights().items():
        assert torch.equal(t, saved[name]), name
    out = os.path.join(scratch, "torch-export-%d.safetensors" % WORLD)
    zinf.torch.export_hf(engine, out, dtype=torch.float32)  # every rank: collective at stage 2
    if RANK == 0:
        with open(out, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            body = f.read()
        assert set(header) == set(saved), sorted(header)
        lo, hi = header["blocks.1.fc.weight"]["data_offsets"]
        got = torch.frombuffer(bytearray(body[lo:hi]), dtype=torch.float32).view(header["blocks.1.fc.weight"]["shape"])
        assert torch.equal(got, saved["blocks.1.fc.weight"])
    engine.close()
    print("  checkpoint round trip and export_hf: %s" % os.path.basename(path))


def test_bf16_compute(scratch):
    # The compute copy in bf16: the blocks run on bf16 tensors bound to
    # zinf's buffers (no fp32 oracle at 1e-5 for that: a smoke test).
    torch.manual_seed(11)
    model = Llama()
    seen = set()
    model.layers[0].register_forward_hook(lambda m, i, o: seen.add(m.q.weight.dtype))
    cfg = config(3, extra={"bf16": {"enabled": True}})
    cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    engine = zinf.torch.initialize(model, cfg)
    losses = []
    for step in range(3):
        tokens, targets = batch(step, RANK)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = engine(tokens, targets)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    assert seen == {torch.bfloat16}, seen
    assert all(math.isfinite(x) for x in losses), losses
    print("  bf16 compute copy: losses %s" % " ".join("%.4f" % x for x in losses))
    engine.close()


def test_nonfinite_loss(scratch):
    # zinf.stop_on_nonfinite_loss: backward hands the loss to the engine, and a
    # NaN stops it (every rank here reports one).
    cfg = config(2)
    cfg["zinf"]["stop_on_nonfinite_loss"] = True
    torch.manual_seed(5)
    engine = zinf.torch.initialize(Gpt2(), cfg)
    engine.backward(engine(*batch(0, RANK)))
    engine.step()
    try:
        engine.backward(engine(*batch(1, RANK)) * float("nan"))
    except ZinfError as e:
        assert "the loss is nan" in str(e), str(e)
        print("  NaN loss: %s" % str(e).splitlines()[0][:120])
    else:
        raise AssertionError("a NaN loss was accepted with zinf.stop_on_nonfinite_loss")
    try:
        engine.step()
    except ZinfError as e:
        assert "the loss is nan" in str(e), str(e)
    else:
        raise AssertionError("the engine stepped after a NaN loss")
    engine.close()


def test_bad_input(scratch):
    try:
        zinf.torch.initialize(Gpt2(), {"zero_optimization": {"stage": 7}})
    except ZinfError as e:
        assert "stage" in str(e), str(e)
        print("  bad config: %s" % str(e).splitlines()[0][:120])
    else:
        raise AssertionError("stage 7 was accepted")


def run_cuda(scratch):
    # The model on a GPU: the engine runs there on torch's stream. The
    # reference trains a deep copy on the same GPU with torch's AdamW, so both
    # sides run torch's own CUDA kernels for the model; the optimizers differ
    # (zinf's Adam on the host or the GPU against torch's), within 1e-5.
    global DEVICE
    DEVICE = torch.device("cuda", 0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        for make, name in ((Gpt2, "gpt2"), (Llama, "llama")):
            cfg = config(0)
            del cfg["zinf"]["device"]  # the model's device decides
            train_against_torch(make, cfg, 10, name + " cuda, stage 0").close()
        nvme = os.path.join(scratch, "nvme-cuda-%d" % RANK)
        shutil.rmtree(nvme, ignore_errors=True)
        os.makedirs(nvme)
        for cfg, label in ((offload(config(2), "cpu"), "stage 2, optimizer cpu"),
                           (offload(config(3), "cpu", "cpu"), "stage 3, cpu and cpu"),
                           (offload(config(3), "nvme", "nvme", [nvme]), "stage 3, nvme and nvme")):
            cfg["zinf"]["device"] = "cuda"
            train_against_torch(Llama, cfg, 4, "llama cuda " + label).close()
        # A config that names another device than the model's is refused.
        try:
            zinf.torch.initialize(Gpt2().to(DEVICE), config(0))  # zinf.device "cpu"
        except ValueError as e:
            assert "zinf.device" in str(e), str(e)
        else:
            raise AssertionError("a CUDA model was accepted with zinf.device cpu")
    finally:
        DEVICE = torch.device("cpu")


def main():
    args = sys.argv[1:]
    scratch = args.pop(0) if args and not args[0].startswith("-") else "/tmp"
    os.makedirs(scratch, exist_ok=True)
    if "--cuda" in args:
        if not torch.cuda.is_available():
            print("SKIP: torch sees no CUDA GPU (torch %s)" % torch.__version__)
            sys.exit(77)
        print("zinf.torch on %s, rank %d of %d" % (torch.cuda.get_device_name(0), RANK, WORLD))
        run_cuda(scratch)
        print("ok")
        return 0
    os.environ["ZINF_TEST_SCRATCH"] = scratch
    if WORLD > 1:
        args.append("-x")
    print("zinf.torch, rank %d of %d" % (RANK, WORLD))
    import pytest  # here: the GPU check (--cuda) runs where pytest is not installed
    return pytest.main([__file__, "-v", "-s", "--durations=5", "-p", "no:cacheprovider", *args])


if __name__ == "__main__":
    sys.exit(main())
