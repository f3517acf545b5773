#!/usr/bin/env python3
"""zinf.deepspeed against the real DeepSpeed and against torch.

1. The same DeepSpeed script (ds_script.py: a transformers Llama, parameter
   groups, a LambdaLR or the config's WarmupCosineLR run past its end,
   accumulation, clipping, a tagged checkpoint loaded back) run with `import deepspeed` (DeepSpeed 0.19.8, DS_ACCELERATOR=cpu)
   and with `import zinf.deepspeed as deepspeed`: every micro-step's loss
   within 1e-5 relative and the same lrs, at ZeRO-2 with the optimizer in CPU
   memory and at ZeRO-3 with parameters and optimizer on NVMe; zinf's resume
   from the tagged checkpoint repeats its run bit for bit.
2. The API, each item a check that failed before zinf.deepspeed existed:
   initialize's keywords and 4-tuple, the engine as an nn.Module with
   DeepSpeed's methods, parameter groups and a torch scheduler stepped by
   hand (against torch.optim.AdamW), a client Adam/AdamW accepted and other
   optimizers refused, checkpoints with tags and client state, whole tensors
   from module.state_dict() and load_state_dict() after initialize,
   GatheredParameters, frozen parameters offloaded and exported, a changed
   requires_grad or an in-place write refused, torchrun refused, a missing
   config file named, torch.utils.checkpoint recomputing (reentrant and
   not) with the activation memory it saves measured, and zero.Init building
   models (transformers' and a custom one) module by module off host memory,
   bit for bit as a plain build.

  test_deepspeed.py SCRATCH_DIR [--only NAME[,NAME...]] [pytest arguments, e.g. -k zero_init]
pytest functions: one failure does not stop the rest (under mpirun it does:
the ranks' collectives must stay in step), -k or --only selects.
Under mpirun every rank trains the same batches, so torch's single-process
reference still holds (ctest python.deepspeed.np2 runs the API items so).
Exits 77 (skipped) without torch, transformers or deepspeed.
"""
import copy
import ctypes
import json
import os
import shutil
import subprocess
import sys

try:
    import pytest
    import torch
    import torch.nn as nn
    import transformers  # noqa: F401
    import deepspeed  # noqa: F401  (the real one: the reference)
except ImportError as e:
    print("SKIP: %s cannot import %s (scripts/setup makes the Python environment)" % (sys.executable, e.name))
    sys.exit(77)

import zinf.deepspeed as zds  # noqa: E402
import zinf.torch  # noqa: E402
from zinf._capi import ZinfError  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
torch.set_num_threads(1)
WORLD = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))  # under mpirun every rank runs the same batches
RANK = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))


def fresh(path):
    """A directory of this world size; rank 0 empties it (the ranks share
    a checkpoint's directory, and a save rewrites what it names)."""
    path = "%s-np%d" % (path, WORLD)
    if RANK == 0:
        shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path, exist_ok=True)
    return path


def rel(a, b):
    return (a - b).abs().max().item() / max(a.abs().max().item(), b.abs().max().item(), 1e-30)


def tiny_llama(seed=0, vocab=128, tie=False):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        tie_word_embeddings=tie, attn_implementation="eager"))


def batches(n, vocab=128, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (2, 16), generator=g) for _ in range(n)]


def base_config(stage=0, **extra):
    c = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
         "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-6,
                                                   "weight_decay": 0.1}},
         "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
         "zinf": {"optimizer_threads": 1}}
    c.update(extra)
    return c


def groups_of(model):
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "norm" in n]
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "norm" in n)]
    return [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]


# ---- 1. the same script, real DeepSpeed and zinf ------------------------------------------------

def test_same_script(scratch):
    env = dict(os.environ, DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29600 + os.getpid() % 300),
               RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    for zero, sched in (("z2cpu", "lambda"), ("z3nvme", "cosine")):
        out = {}
        for engine in ("deepspeed", "zinf"):
            d = os.path.join(scratch, "script-%s-%s" % (engine, zero))
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
            r = subprocess.run([sys.executable, os.path.join(HERE, "ds_script.py"), "--engine", engine, "--zero", zero,
                                "--sched", sched, "--out", os.path.join(d, "out.json"), "--scratch", d],
                               env=env, capture_output=True, text=True, timeout=600)
            assert r.returncode == 0, "%s %s failed:\n%s" % (engine, zero, (r.stdout + r.stderr)[-4000:])
            out[engine] = json.load(open(os.path.join(d, "out.json")))
        ds, z = out["deepspeed"], out["zinf"]
        worst = max(abs(a - b) / abs(a) for a, b in zip(ds["losses"], z["losses"]))
        assert len(ds["losses"]) == len(z["losses"]) == 12
        assert worst <= 1e-5, "%s: losses differ by %.3g relative\n%s\n%s" % (zero, worst, ds["losses"], z["losses"])
        assert ds["lrs"] == z["lrs"], (ds["lrs"], z["lrs"])
        n = len(z["resumed"])
        assert z["resumed"] == z["losses"][-n:], "zinf's resume from the tagged checkpoint changed the losses"
        ds_resume = max(abs(a - b) / abs(a) for a, b in zip(ds["losses"][-n:], ds["resumed"]))
        print("  same script, %s, %s scheduler: 12 losses within %.2g of DeepSpeed's, lrs equal (%s); zinf's resume "
              "exact, DeepSpeed's own resume within %.2g" % (zero, sched, worst, " ".join("%.4g" % v[0] for v in z["lrs"]),
                                                              ds_resume))


# ---- 2. the API ---------------------------------------------------------------------------------

def test_initialize_and_engine_api(scratch):
    model = tiny_llama()
    rows = [row for x in batches(4) for row in x]  # 8 sequences: 4 micro-batches of 2
    engine, optimizer, loader, sched = zds.initialize(model=model, model_parameters=model.parameters(),
                                                      training_data=rows,
                                                      config=base_config(gradient_accumulation_steps=2))
    assert isinstance(engine, nn.Module) and engine.module is model
    assert isinstance(optimizer, torch.optim.Optimizer)
    assert sched is None and loader is not None and len(loader) == 4
    engine.eval()
    assert not model.training
    engine.train()
    assert model.training
    assert len(list(engine.parameters())) == len(list(model.parameters()))
    assert engine.gradient_accumulation_steps() == 2 and engine.train_micro_batch_size_per_gpu() == 2
    assert engine.get_lr() == [3e-3]
    seen = []
    for x in loader:
        seen.append(engine.is_gradient_accumulation_boundary())
        loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss)
        engine.step()
    assert seen == [False, True, False, True], seen
    assert engine.global_steps == 2 and engine.micro_steps == 4
    norm = engine.get_global_grad_norm()
    assert norm is not None and norm > 0, norm
    with torch.no_grad():  # generation and evaluation go through the same hooks
        out = engine(input_ids=rows[0][None].expand(2, 16)).logits
    assert out.shape == (2, 16, 128)
    engine.close()
    # A config file that does not exist is named, not read as JSON text.
    try:
        zds.initialize(model=tiny_llama(), config=os.path.join(scratch, "no-such-config.json"))
    except FileNotFoundError as e:
        assert "no-such-config.json" in str(e), str(e)
    else:
        raise AssertionError("a missing config file was accepted")
    print("  initialize: 4-tuple, nn.Module engine, accumulation boundaries, dataloader; missing config named")


def torch_reference(model, groups_fn, steps, xs, lr_at, accum=1):
    """torch.optim.AdamW over the same groups, lr set per step."""
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(groups_fn(ref), lr=3e-3, betas=(0.9, 0.95), eps=1e-6)
    losses = []
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.zero_grad()
        for k in range(accum):
            x = xs[step * accum + k]
            loss = ref(input_ids=x, labels=x).loss
            (loss / accum).backward()
            losses.append(loss.item())
        opt.step()
    return ref, losses


def test_groups_and_scheduler(scratch):
    for stage, label in ((0, "stage 0"), (3, "stage 3")):
        model = tiny_llama(seed=3)
        xs = batches(6, seed=4)
        lam = lambda s: 0.5 ** s  # noqa: E731
        ref, ref_losses = torch_reference(model, groups_of, 6, xs, lambda s: 3e-3 * lam(s))
        engine, optimizer, _, _ = zds.initialize(model=model, model_parameters=groups_of(model),
                                                 config=base_config(stage))
        # A scheduler the script makes on the returned optimizer and steps by hand.
        sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lam)
        losses, lrs = [], []
        for x in xs:
            lrs.append(engine.get_lr()[0])
            loss = engine(input_ids=x, labels=x).loss
            engine.backward(loss)
            engine.step()
            sched.step()
            losses.append(loss.item())
        assert lrs == [3e-3 * lam(s) for s in range(6)], lrs
        worst = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
        assert worst <= 1e-5, (label, losses, ref_losses)
        got = engine.module.state_dict()
        for name, p in ref.named_parameters():
            assert got[name].shape == p.shape, (name, got[name].shape)
            e = rel(got[name], p.detach())
            assert e <= 1e-5, "%s: %s off by %.3g (no decay on norms and a scheduled lr)" % (label, name, e)
        engine.close()
        print("  %s: param groups (no decay on norms) and a LambdaLR stepped by hand match torch's AdamW "
              "(losses within %.2g)" % (label, worst))


def test_client_optimizers(scratch):
    model = tiny_llama(seed=5)
    xs = batches(4, seed=6)
    ref, ref_losses = torch_reference(model, groups_of, 4, xs, lambda s: 3e-3)
    opt = torch.optim.AdamW(groups_of(model), lr=3e-3, betas=(0.9, 0.95), eps=1e-6)
    engine, optimizer, _, _ = zds.initialize(model=model, optimizer=opt,
                                             config={"train_micro_batch_size_per_gpu": 2,
                                                     "zinf": {"optimizer_threads": 1}})
    losses = []
    for x in xs:
        loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
    assert worst <= 1e-5, (losses, ref_losses)
    engine.close()
    for bad in (torch.optim.SGD(tiny_llama().parameters(), lr=0.1),
                torch.optim.Adam(tiny_llama().parameters(), lr=0.1, amsgrad=True)):
        try:
            zds.initialize(model=tiny_llama(), optimizer=bad, config={"train_micro_batch_size_per_gpu": 1})
        except ValueError as e:
            assert "SGD" in str(e) or "amsgrad" in str(e), str(e)
        else:
            raise AssertionError("%s was accepted" % type(bad).__name__)
    print("  a client AdamW with groups matches torch's (losses within %.2g); SGD and amsgrad refused" % worst)


def test_checkpoint_tags_and_state_dict(scratch):
    d = fresh(os.path.join(scratch, "ckpt-tags"))
    model = tiny_llama(seed=7)
    xs = batches(6, seed=8)
    engine, _, _, _ = zds.initialize(model=model, config=base_config(3))
    for x in xs[:3]:
        engine.backward(engine(input_ids=x, labels=x).loss)
        engine.step()
    engine.save_checkpoint(d, tag="epoch1", client_state={"epoch": 1, "note": "x"})
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    assert all(v.numel() > 0 for v in saved.values()), "state_dict returned empty tensors"
    assert saved["model.embed_tokens.weight"].shape == (128, 32)
    for x in xs[3:]:
        engine.backward(engine(input_ids=x, labels=x).loss)
        engine.step()
    assert rel(model.state_dict()["model.embed_tokens.weight"], saved["model.embed_tokens.weight"]) > 0
    path, client_sd = engine.load_checkpoint(d)
    assert client_sd == {"epoch": 1, "note": "x"}, client_sd
    assert open(os.path.join(d, "latest")).read().strip() == "epoch1"
    assert engine.global_steps == 3
    for k, v in model.state_dict().items():
        assert torch.equal(v, saved[k]), k
    # load_state_dict after initialize: the values reach the tiers and the
    # next forward uses them.
    other = tiny_llama(seed=99)
    missing = model.load_state_dict(other.state_dict())
    assert not missing.missing_keys and not missing.unexpected_keys
    for k, v in other.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    x = xs[0]
    with torch.no_grad():
        got = engine(input_ids=x, labels=x).loss.item()
        want = other(input_ids=x, labels=x).loss.item()
    assert abs(got - want) <= 1e-6 * abs(want), (got, want)
    # GatheredParameters: whole values inside; what the modifier rank writes
    # reaches every rank (the others write something else, which is dropped,
    # as DeepSpeed's broadcast drops it), and the next forward uses it.
    w = model.model.norm.weight
    modifier = WORLD - 1
    with zds.zero.GatheredParameters([w], modifier_rank=modifier):
        assert w.shape == (32,)
        with torch.no_grad():
            w.fill_(0.5 if RANK == modifier else -7.0)
    assert torch.equal(model.state_dict()["model.norm.weight"], torch.full((32,), 0.5))
    with torch.no_grad():
        got = engine(input_ids=x, labels=x).loss.item()
        other.model.norm.weight.fill_(0.5)
        want = other(input_ids=x, labels=x).loss.item()
    assert abs(got - want) <= 1e-6 * abs(want), (got, want)
    # Without a modifier_rank a write inside is not kept.
    with zds.zero.GatheredParameters([w]):
        with torch.no_grad():
            w.fill_(3.0)
    assert torch.equal(model.state_dict()["model.norm.weight"], torch.full((32,), 0.5))
    zds.comm.barrier()
    # An in-place write outside it is refused at the next step, not lost.
    with torch.no_grad():
        torch.nn.init.normal_(model.model.layers[0].mlp.up_proj.weight)
    engine.backward(engine(input_ids=x, labels=x).loss)
    try:
        engine.step()
    except RuntimeError as e:
        assert "written in place" in str(e), str(e)
    else:
        raise AssertionError("an in-place write after initialize was ignored")
    engine.close()
    # save_16bit_model
    model = tiny_llama(seed=7)
    engine, _, _, _ = zds.initialize(model=model, config=base_config(3, bf16={"enabled": True}))
    d16 = os.path.join(scratch, "16bit-np%d" % WORLD)
    engine.save_16bit_model(d16, "model.bin")
    sd = torch.load(os.path.join(d16, "model.bin"))
    assert sd["lm_head.weight"].dtype == torch.bfloat16 and sd["lm_head.weight"].shape == (128, 32)
    engine.close()
    print("  checkpoint tag and client state, whole state_dict, load_state_dict, GatheredParameters, "
          "save_16bit_model; an in-place write refused")


class _Scaled(nn.Module):
    """A module with a parameter of its own and a child: the loader copies
    `scale` before it reaches the child."""

    def __init__(self, d):
        super().__init__()
        self.scale = nn.Parameter(torch.rand(d) + 0.5)
        self.inner = nn.Sequential(nn.Linear(d, d))

    def forward(self, x):
        return torch.tanh(self.inner(x)) * self.scale


class _ScaledNet(nn.Module):
    def __init__(self, d=8, blocks=3):
        super().__init__()
        self.blocks = nn.ModuleList([_Scaled(d) for _ in range(blocks)])
        self.head = nn.Linear(d, 1)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x).pow(2).mean()


def test_load_state_dict_that_raises(scratch):
    """A load_state_dict that raises midway (here a script's own pre-hook on
    one Linear, after zinf's) leaves the model as torch leaves it: what the
    loader reached before the raise has the new values (a parent's own
    parameter included), the rest the old ones; the next forward uses
    exactly that, and the loader's copies are not taken for in-place writes."""
    def refuse(*args):
        raise RuntimeError("refused by the script")
    for stage in (1, 3):
        torch.manual_seed(3)
        model = _ScaledNet()
        ref = copy.deepcopy(model)
        torch.manual_seed(4)
        new = _ScaledNet().state_dict()
        engine, _, _, _ = zds.initialize(model=model, config=base_config(stage))
        for m in (model, ref):
            m.blocks[1].inner[0].register_load_state_dict_pre_hook(refuse)
            try:
                m.load_state_dict(new)
            except RuntimeError as e:
                assert "refused by the script" in str(e), str(e)
            else:
                raise AssertionError("the script's pre-hook did not raise")
        want = ref.state_dict()
        assert torch.equal(want["blocks.1.scale"], new["blocks.1.scale"])  # torch: the parent's own, copied
        assert not torch.equal(want["blocks.1.inner.0.weight"], new["blocks.1.inner.0.weight"])
        x = torch.randn(4, 8)
        with torch.no_grad():
            got_loss, want_loss = engine(x).item(), ref(x).item()
        got = model.state_dict()
        for k, v in want.items():
            assert torch.equal(got[k], v), "stage %d: %s is not what torch kept after the failed load" % (stage, k)
        assert abs(got_loss - want_loss) <= 1e-6 * abs(want_loss), (stage, got_loss, want_loss)
        engine.backward(engine(x))
        engine.step()  # the loader's copies are not in-place writes
        engine.close()
    print("  a load_state_dict that raised midway: the values torch keeps, at stages 1 and 3")


def test_frozen_parameters(scratch):
    model = tiny_llama(seed=11)
    for n, p in model.named_parameters():
        p.requires_grad = "mlp" in n  # a base model with only the MLPs trainable (as LoRA leaves one)
    frozen_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    nvme = os.path.join(scratch, "frozen-nvme-np%d-r%d" % (WORLD, RANK))
    shutil.rmtree(nvme, ignore_errors=True)
    os.makedirs(nvme)
    cfg = base_config(3)
    cfg["zero_optimization"].update({"offload_param": {"device": "nvme", "nvme_path": nvme},
                                     "offload_optimizer": {"device": "nvme", "nvme_path": nvme}})
    engine, _, _, _ = zds.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                     config=cfg)
    for n, p in model.named_parameters():
        assert p.numel() == 0, "%s stays in torch memory (%d elements)" % (n, p.numel())
    frozen_units = [u for u in engine._units if u.frozen]
    assert frozen_units, "no frozen unit"
    xs = batches(3, seed=12)
    for x in xs:
        engine.backward(engine(input_ids=x, labels=x).loss)
        engine.step()
    sd = model.state_dict()
    for n, v in frozen_before.items():
        assert torch.equal(sd[n], v), "frozen %s moved or is missing" % n
    assert rel(sd["model.layers.0.mlp.up_proj.weight"], torch.zeros(1)) > 0
    out = os.path.join(scratch, "frozen-export-np%d.safetensors" % WORLD)
    zinf.torch.export_hf(engine, out, dtype=torch.float32)  # every rank reads; rank 0 writes
    from safetensors.torch import load_file
    exported = load_file(out) if RANK == 0 else sd
    assert set(exported) == set(sd), sorted(set(sd) ^ set(exported))
    assert torch.equal(exported["model.embed_tokens.weight"], frozen_before["model.embed_tokens.weight"])
    model.model.layers[1].self_attn.q_proj.weight.requires_grad = True
    engine.backward(engine(input_ids=xs[0], labels=xs[0]).loss)
    try:
        engine.step()
    except RuntimeError as e:
        assert "requires_grad" in str(e), str(e)
    else:
        raise AssertionError("unfreezing after initialize was ignored")
    engine.close()
    print("  frozen parameters: %d frozen units on NVMe, unchanged, in state_dict and the export; unfreezing "
          "refused" % len(frozen_units))


def test_torchrun_refused(scratch):
    """A torchrun world of two without zinf's C++ core (which carries zinf's
    collectives over torch.distributed): refused before any engine or
    process group exists, naming the fix (tests/python/test_launchers.py
    trains under the launchers)."""
    code = ("import torch, zinf.deepspeed as ds\n"
            "m = torch.nn.Sequential(torch.nn.Linear(4, 4))\n"
            "ds.initialize(model=m, config={'train_micro_batch_size_per_gpu': 1})\n")
    env = dict(os.environ, RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29999",
               ZINF_TORCH_EXTENSION="off")
    for k in list(env):
        if k.startswith("OMPI_") or k.startswith("PMI"):
            del env[k]
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "need its C++ core" in r.stderr and "pip install ." in r.stderr, r.stderr[-2000:]
    print("  torchrun's WORLD_SIZE=2 without the C++ core: refused, naming the install")


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.a, self.b = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x + self.b(torch.tanh(self.a(x)))


class Stack(nn.Module):
    def __init__(self, d=64, n=4, mode=None):
        super().__init__()
        self.blocks = nn.ModuleList([Block(d) for _ in range(n)])
        self.head = nn.Linear(d, 1)
        self.mode = mode

    def forward(self, x):
        for b in self.blocks:
            if self.mode is None:
                x = b(x)
            else:
                x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=self.mode == "reentrant")
        return self.head(x).pow(2).mean()


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def _live_bytes():
    """Bytes malloc has handed out and not got back (heap and mmapped): what
    torch's CPU tensors hold, whatever the allocator keeps cached."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    m = libc.mallinfo2()
    return m.uordblks + m.hblkhd


def test_activation_checkpointing(scratch):
    # Reentrant checkpointing backpropagates through a block only when an
    # input requires grad (torch's rule, as HF's enable_input_require_grads).
    x = torch.randn(2048, 64).requires_grad_()
    results = {}
    for mode in (None, "reentrant", "non-reentrant"):
        torch.manual_seed(21)
        model = Stack(mode=mode)
        ref = copy.deepcopy(model)
        ref.mode = None
        engine = zinf.torch.initialize(model, base_config(3))
        before = _live_bytes()
        loss = engine(x)
        grown = _live_bytes() - before
        engine.backward(loss)
        engine.step()
        calls = [b.calls for b in model.blocks]
        ref_loss = ref(x)
        assert abs(loss.item() - ref_loss.item()) <= 1e-5 * abs(ref_loss.item())
        results[mode] = (grown, calls)
        engine.close()
    plain, _ = results[None]
    for mode in ("reentrant", "non-reentrant"):
        grown, calls = results[mode]
        assert calls == [2] * 4, "%s checkpointing: forward ran %s times per block (no recomputation)" % (mode, calls)
        assert grown < plain / 2, "%s checkpointing kept %d bytes of activations, plain %d" % (mode, grown, plain)
    print("  torch.utils.checkpoint: every block recomputed; activations after forward %.1f MiB plain, "
          "%.1f MiB reentrant, %.1f MiB non-reentrant" % (results[None][0] / 2**20, results["reentrant"][0] / 2**20,
                                                         results["non-reentrant"][0] / 2**20))


_INIT_MEMORY = r"""
import sys, torch, transformers
import zinf.deepspeed as zds


def status(key):  # kB
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))


cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1536, num_hidden_layers=40,
                               num_attention_heads=8, num_key_value_heads=8)
torch.manual_seed(0)
torch.nn.Linear(64, 64)  # torch's first-use allocations, outside the measurement
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak (VmHWM) starts again from here: the imports' own peak does not count
base = status("VmRSS")
if sys.argv[1] == "init":
    with zds.zero.Init(config_dict_or_path=sys.argv[2]):
        model = transformers.LlamaForCausalLM(cfg)
else:
    model = transformers.LlamaForCausalLM(cfg)
print(sum(p.numel() for p in model.parameters()) * 4, (status("VmHWM") - base) * 1024)
"""


def test_zero_init(scratch):
    from transformers import GPT2Config, GPT2LMHeadModel
    nvme = os.path.join(scratch, "init-nvme-np%d-r%d" % (WORLD, RANK))
    shutil.rmtree(nvme, ignore_errors=True)
    os.makedirs(nvme)
    cfg = base_config(3)
    cfg["zero_optimization"].update({"offload_param": {"device": "nvme", "nvme_path": nvme},
                                     "offload_optimizer": {"device": "nvme", "nvme_path": nvme}})

    class Custom(nn.Module):  # a parent that changes its children's parameters after building them
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(128, 32, padding_idx=0)
            self.mix = nn.Linear(32, 32)
            self.head = nn.Linear(32, 128)
            with torch.no_grad():
                nn.init.orthogonal_(self.mix.weight)
                self.mix.weight.data.mul_(0.5)
                self.head.weight[0].fill_(0.25)
                self.head.bias.copy_(self.mix.weight[:, 0].repeat(4))
            self.gain = nn.Parameter(torch.full((32,), float(self.mix.weight.detach().abs().max())))

        def forward(self, input_ids, labels=None):
            h = torch.tanh(self.mix(self.emb(input_ids)) * self.gain)
            logits = self.head(h)
            return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 128), labels[:, 1:].reshape(-1))

    builds = {
        "llama (tied)": lambda: tiny_llama(seed=5, tie=True),
        "gpt2": lambda: (torch.manual_seed(5), GPT2LMHeadModel(GPT2Config(
            vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0)))[1],
        "custom": lambda: (torch.manual_seed(5), Custom())[1],
    }
    xs = batches(3)
    for name, build in builds.items():
        eager = build()
        after_eager = torch.rand(4)
        with zds.zero.Init(config_dict_or_path=cfg):
            lazy = build()
        after_lazy = torch.rand(4)
        assert all(p.is_meta for p in lazy.parameters()), "%s: parameters left in host memory under Init" % name
        assert torch.equal(after_eager, after_lazy), "%s: Init drew other random numbers than a plain build" % name
        # Before initialize, GatheredParameters reads (and with a modifier, writes) the values kept aside.
        first_eager, first_lazy = next(eager.parameters()), next(lazy.parameters())
        with zds.zero.GatheredParameters([first_lazy]):
            assert torch.equal(first_lazy.sum(), first_eager.detach().sum()), name
            with torch.no_grad():
                first_lazy.add_(1.0)  # no modifier_rank: dropped
        with zds.zero.GatheredParameters([first_lazy], modifier_rank=0):
            assert torch.equal(first_lazy.clone(), first_eager.detach()), "%s: a write without modifier kept" % name
        losses = {}
        for kind, model in (("eager", eager), ("init", lazy)):
            engine, _, _, _ = zds.initialize(model=model, config=cfg)
            assert not engine.built_under_zero_init
            losses[kind] = []
            for x in xs:
                out = engine(input_ids=x, labels=x)
                loss = out if torch.is_tensor(out) else out.loss
                engine.backward(loss)
                engine.step()
                losses[kind].append(loss.item())
            engine.close()
        assert losses["eager"] == losses["init"], "%s: %s != %s" % (name, losses["eager"], losses["init"])
    # Memory: a 169 M-parameter Llama built under Init grows the process by a fraction of its size.
    measured = {}
    for mode in ("plain", "init"):
        r = subprocess.run([sys.executable, "-c", _INIT_MEMORY, mode, json.dumps(cfg)], capture_output=True, text=True,
                           timeout=600, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
        assert r.returncode == 0, r.stdout + r.stderr[-3000:]
        model_bytes, grown = map(int, r.stdout.split()[-2:])
        measured[mode] = grown
    assert measured["plain"] >= model_bytes, measured  # the measurement sees a plain build
    assert measured["init"] <= model_bytes / 2, "built under Init the process grew by %d MiB for a %d MiB model" % (
        measured["init"] >> 20, model_bytes >> 20)
    print("  zero.Init: llama, gpt2 and a custom parent init built bit for bit as a plain build (same random "
          "numbers, same losses at ZeRO-3 on NVMe); a %d MiB Llama grows the process by %d MiB under Init, "
          "%d MiB plain" % (model_bytes >> 20, measured["init"] >> 20, measured["plain"] >> 20))


def main():
    args = sys.argv[1:]
    if args and not args[0].startswith("-"):
        os.environ["ZINF_TEST_SCRATCH"] = args.pop(0)
    if "--only" in args:
        i = args.index("--only")
        args[i:i + 2] = ["-k", " or ".join(args[i + 1].split(","))]
    if WORLD > 1:
        args.append("-x")
    print("zinf.deepspeed against DeepSpeed %s and torch %s" % (deepspeed.__version__, torch.__version__))
    return pytest.main([__file__, "-v", "-s", "--durations=8", "-p", "no:cacheprovider", *args])


if __name__ == "__main__":
    sys.exit(main())
