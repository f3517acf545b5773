#!/usr/bin/env python3
"""transformers models, folders and HF's Trainer on zinf, against the real
libraries.

1. Models unchanged: AutoModelForCausalLM for llama, mistral, qwen2, qwen3
   and gpt2 (tied and untied heads) train through zinf.torch at stage 0 and
   stage 3 with every step's loss within 1e-5 of torch.optim.AdamW on a copy;
   generate() gives the plain model's tokens at stages 0 to 3; attention
   masks and position ids reach the model; gradient_checkpointing_enable()
   recomputes each layer; a vocabulary larger than a layer splits the
   embedding and head into units of their own, fetched only while they run,
   so nothing bigger than a layer stays resident through the step.
2. Folders: zinf.torch.from_pretrained and zinf.deepspeed.zero.Init around
   transformers' from_pretrained build the model on the meta device and
   stream the shards into the tiers: the same loss and state_dict as
   transformers' own load; loading holds far less than the model
   (bench/hf_stream_memory.py, measured).
3. "auto" values resolve from the model, and what cannot be resolved is an
   error naming the key.
4. HF's Trainer: the same script (hf_trainer_script.py: "auto" DeepSpeed
   config, accumulation, clipping, logging, evaluation, checkpoints,
   save_model) with transformers' Trainer on the real DeepSpeed and with
   zinf.transformers.Trainer: 20 steps' losses within 1e-4 (fp32) and the
   same lrs, at ZeRO-2 with the optimizer in CPU memory and ZeRO-3 with NVMe
   tiers; resume_from_checkpoint repeats the run's last steps; save_model's
   folder loads with from_pretrained; a peft LoRA model trains with its base
   frozen and its adapter loads back.

  test_transformers.py SCRATCH_DIR [--only NAME] [--cuda] [pytest arguments]
pytest functions: one failure does not stop the rest, -k or --only selects.
(--cuda: part 1 on a GPU, against torch there; exits 77 without one.)
Exits 77 (skipped) without torch, transformers, peft or deepspeed.
"""
import copy
import json
import os
import shutil
import subprocess
import sys

try:
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM
    import peft  # noqa: F401
    import deepspeed  # noqa: F401
except ImportError as e:
    print("SKIP: %s cannot import %s (scripts/setup makes the Python environment)" % (sys.executable, e.name))
    sys.exit(77)

import zinf.deepspeed as zds  # noqa: E402
import zinf.torch  # noqa: E402
from zinf._capi import ZinfError  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEVICE = torch.device("cpu")  # --cuda: the models and batches on the GPU
ROOT = os.path.dirname(os.path.dirname(HERE))
torch.set_num_threads(1)

ARCHS = {
    "llama": dict(model_type="llama", tie_word_embeddings=False),
    "mistral": dict(model_type="mistral", sliding_window=None),
    "qwen2": dict(model_type="qwen2", tie_word_embeddings=True),
    "qwen3": dict(model_type="qwen3", head_dim=16, tie_word_embeddings=False),
    "gpt2": dict(model_type="gpt2", n_embd=32, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0,
                 embd_pdrop=0.0, attn_pdrop=0.0),
}


def make(arch, vocab, seed=0):
    kw = dict(ARCHS[arch])
    mt = kw.pop("model_type")
    if mt == "gpt2":
        cfg = AutoConfig.for_model(mt, vocab_size=vocab, bos_token_id=0, eos_token_id=0, **kw)
    else:
        cfg = AutoConfig.for_model(mt, vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **kw)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg).to(DEVICE)


def cfg(stage, **extra):
    c = {"train_micro_batch_size_per_gpu": 2,
         "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-6, "weight_decay": 0.1}},
         "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
         "zinf": {"optimizer_threads": 1}}
    c.update(extra)
    return c


def layer_params(model):
    layers = zinf.torch._largest_module_list(model)
    return max(sum(p.numel() for p in layer.parameters()) for layer in layers)


# ---- 1. models unchanged ------------------------------------------------------------------------

def test_models_unchanged(scratch):
    for arch in ARCHS:
        for vocab in (128, 4096):  # the head and embedding below, then above a layer's size
            for stage in (0, 3):
                model = make(arch, vocab)
                model.train()
                ref = copy.deepcopy(model)
                opt = torch.optim.AdamW(ref.parameters(), lr=3e-3, betas=(0.9, 0.95), eps=1e-6, weight_decay=0.1)
                engine = zinf.torch.initialize(model, cfg(stage))
                # What stays resident through the step (the units held from the
                # model's forward to the end of backward) is at most a layer;
                # every other unit is fetched only while its module runs.
                resident = sum(sum(u.numels) for u in engine._rest)
                assert resident <= layer_params(ref), (arch, vocab, resident, layer_params(ref))
                if vocab == 4096:
                    assert not engine._rest, [u.name for u in engine._rest]
                g = torch.Generator().manual_seed(2)
                worst = 0.0
                for step in range(3):
                    x = torch.randint(0, vocab, (2, 12), generator=g).to(DEVICE)
                    mask = torch.ones_like(x)
                    mask[0, :3] = 0  # left padding on the first row
                    pos = (mask.cumsum(-1) - 1).clamp(min=0)
                    loss = engine(input_ids=x, attention_mask=mask, position_ids=pos, labels=x).loss
                    engine.backward(loss)
                    engine.step()
                    opt.zero_grad()
                    want = ref(input_ids=x, attention_mask=mask, position_ids=pos, labels=x).loss
                    want.backward()
                    opt.step()
                    worst = max(worst, abs(loss.item() - want.item()) / abs(want.item()))
                assert worst <= 1e-5, (arch, vocab, stage, worst)
                engine.close()
        print("  %-8s stages 0 and 3, vocabulary 128 and 4096: 3 steps within 1e-5 of torch's AdamW "
              "(masks, position ids); with 4096 the embedding and head are units fetched only while they run" % arch)
    # generate() at every stage, ZeRO-3 included, and checkpointing that recomputes.
    for arch in ("llama", "gpt2"):
        plain = make(arch, 4096)
        plain.eval()
        x = torch.randint(0, 4096, (2, 8), generator=torch.Generator().manual_seed(3)).to(DEVICE)
        want = plain.generate(x, max_new_tokens=6, do_sample=False, pad_token_id=0)
        for stage in (0, 1, 2, 3):
            model = copy.deepcopy(plain)
            engine = zinf.torch.initialize(model, cfg(stage))
            got = model.generate(x, max_new_tokens=6, do_sample=False, pad_token_id=0)
            assert torch.equal(got, want), (arch, stage, got, want)
            engine.close()
        model, ref = copy.deepcopy(plain), copy.deepcopy(plain)
        model.train()
        ref.train()
        model.gradient_checkpointing_enable()
        ref.gradient_checkpointing_enable()
        opt = torch.optim.AdamW(ref.parameters(), lr=3e-3, betas=(0.9, 0.95), eps=1e-6, weight_decay=0.1)
        layers = zinf.torch._largest_module_list(model)
        engine = zinf.torch.initialize(model, cfg(3))
        # transformers checkpoints inside each layer's forward: count the
        # forwards of a module inside layer 0 (its hooks do not see a recomputation).
        inner = layers[0].mlp
        calls = [0]
        forward = inner.forward
        def counted(*a, **k):  # noqa: E306
            calls[0] += 1
            return forward(*a, **k)
        inner.forward = counted
        loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss)
        engine.step()
        assert calls[0] == 2, "gradient checkpointing ran layer 0's MLP %d times (no recomputation)" % calls[0]
        want_loss = ref(input_ids=x, labels=x).loss
        want_loss.backward()
        opt.step()
        assert abs(loss.item() - want_loss.item()) <= 1e-5 * abs(want_loss.item())
        got = model.state_dict()
        for name, p in ref.named_parameters():
            e = (got[name].to(DEVICE) - p.detach()).abs().max().item() / max(p.detach().abs().max().item(), 1e-30)
            assert e <= 1e-5, (arch, name, e)
        engine.close()
    print("  generate() at stages 0-3 gives the plain model's tokens; gradient_checkpointing_enable() recomputes")


# ---- 2. folders larger than memory -----------------------------------------------------------

def test_from_pretrained(scratch):
    folder = os.path.join(scratch, "hf-folder")
    shutil.rmtree(folder, ignore_errors=True)
    model = make("qwen2", 4096)  # tied head
    model.save_pretrained(folder, max_shard_size="64KB")
    shards = [f for f in os.listdir(folder) if f.endswith(".safetensors")]
    assert len(shards) >= 3, shards
    x = torch.randint(0, 4096, (2, 12), generator=torch.Generator().manual_seed(5))
    want = model(input_ids=x, labels=x).loss.item()
    engine = zinf.torch.from_pretrained(folder, cfg(3))
    got = engine(input_ids=x, labels=x).loss.item()
    assert got == want, (got, want)
    sd = engine.module.state_dict()
    for k, v in model.state_dict().items():
        assert torch.equal(sd[k], v), k
    engine.backward(engine(input_ids=x, labels=x).loss)
    engine.step()
    engine.close()
    with zds.zero.Init(config_dict_or_path=cfg(3)):
        meta = AutoModelForCausalLM.from_pretrained(folder)
    assert next(meta.parameters()).is_meta
    engine, _, _, _ = zds.initialize(model=meta, config=cfg(3))
    assert engine(input_ids=x, labels=x).loss.item() == want
    assert not engine.built_under_zero_init
    engine.close()
    # A folder missing a tensor is refused, naming it.
    os.remove(os.path.join(folder, sorted(shards)[-1]))
    index = json.load(open(os.path.join(folder, "model.safetensors.index.json")))
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != sorted(shards)[-1]}
    json.dump(index, open(os.path.join(folder, "model.safetensors.index.json"), "w"))
    try:
        zinf.torch.from_pretrained(folder, cfg(3))
    except KeyError as e:
        assert "has no tensor for parameter" in str(e), str(e)
    else:
        raise AssertionError("a folder missing tensors loaded")
    print("  from_pretrained and zero.Init + transformers' from_pretrained stream %d shards: the same loss and "
          "state_dict; a missing tensor is named" % len(shards))
    # Memory: the loading phase holds about a sub-group and a unit, not the model.
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "hf_stream_memory.py"), "--layers", "24",
                        "--hidden", "512", "--vocab", "4000", "--host-mib", "512", "--device-mib", "256",
                        "--scratch", os.path.join(scratch, "stream-memory"), "--json"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    z = res["zinf"]
    assert not z.get("failed"), z
    load_growth = z["load_peak_rss_mib"] - z["rss_after_imports_mib"]
    sub_group = 14 * 512 * 512 * 12 / 2**20
    bound = sub_group + 4 * z["largest_unit_mib"] + 64
    assert load_growth <= bound, "loading grew RSS by %.0f MiB, more than a sub-group and a few units (%.0f)" % (
        load_growth, bound)
    assert load_growth < 0.5 * res["fp32_mib"], (load_growth, res["fp32_mib"])
    hf = res["hf"]
    print("  streaming a %.0f MiB (fp32) model: loading peak %.0f MiB over imports (bound %.0f), training peak %.0f; "
          "transformers' own load %.0f MiB over imports" % (res["fp32_mib"], load_growth, bound,
                                                             z["peak_rss_mib"] - z["rss_after_imports_mib"],
                                                             hf["peak_rss_mib"] - hf["rss_after_imports_mib"]))


# ---- 3. "auto" ----------------------------------------------------------------------------------

def test_auto_values(scratch):
    model = make("llama", 128)
    c = cfg(3)
    c["zero_optimization"].update(reduce_bucket_size="auto", stage3_prefetch_bucket_size="auto",
                                  stage3_param_persistence_threshold="auto")
    engine = zinf.torch.initialize(model, c)
    notes = "\n".join(engine.auto_notes)
    assert "stage3_param_persistence_threshold = 320" in notes, notes  # 10 * hidden_size
    assert "reduce_bucket_size = 65536" in notes, notes  # 32^2, raised to one norm block
    engine.close()
    bad = cfg(0)
    bad["scheduler"] = {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto"}}
    try:
        zinf.torch.initialize(make("llama", 128), bad)
    except ZinfError as e:
        assert "scheduler.params.total_num_steps" in str(e), str(e)
    else:
        raise AssertionError("an \"auto\" total_num_steps nobody can resolve was accepted")
    plain = torch.nn.Sequential(torch.nn.Linear(8, 8))
    c = cfg(2)
    c["zero_optimization"]["reduce_bucket_size"] = "auto"
    try:
        zinf.torch.initialize(plain, c)
    except ZinfError as e:
        assert "reduce_bucket_size" in str(e) and "hidden size" in str(e), str(e)
    else:
        raise AssertionError("an \"auto\" bucket without a hidden size was accepted")
    print("  \"auto\": bucket sizes from the model's hidden size; unresolvable keys named")


# ---- 4. HF's Trainer -------------------------------------------------------------------------------

def run_trainer(scratch, engine, zero, *extra):
    d = os.path.join(scratch, "trainer-%s-%s%s" % (engine, zero, "".join(extra).replace("-", "")))
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    env = dict(os.environ, DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29700 + os.getpid() % 200))
    if engine == "deepspeed":
        env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    r = subprocess.run([sys.executable, os.path.join(HERE, "hf_trainer_script.py"), "--engine", engine, "--zero", zero,
                        "--out", os.path.join(d, "out.json"), "--scratch", d, *extra],
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, "%s %s %s failed:\n%s" % (engine, zero, extra, (r.stdout + r.stderr)[-4000:])
    return d, json.load(open(os.path.join(d, "out.json")))


def test_trainer(scratch):
    for zero, saves in (("z2cpu", "10"), ("z3nvme", "0")):  # DeepSpeed 0.19.8 fails saving ZeRO-3 NVMe on the CPU
        _, ds = run_trainer(scratch, "deepspeed", zero, "--save-steps", saves)
        zd, z = run_trainer(scratch, "zinf", zero)
        assert len(ds["logs"]) == len(z["logs"]) == 20
        worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(ds["logs"], z["logs"]))
        assert worst <= 1e-4, (zero, worst)
        assert [a["learning_rate"] for a in ds["logs"]] == [b["learning_rate"] for b in z["logs"]]
        norms = max(abs(a["grad_norm"] - b["grad_norm"]) / a["grad_norm"] for a, b in zip(ds["logs"], z["logs"]))
        assert norms <= 1e-4, norms
        assert abs(ds["eval_loss"] - z["eval_loss"]) <= 1e-4 * ds["eval_loss"]
        # The saved folder loads with transformers and gives the trained model's eval loss.
        final = AutoModelForCausalLM.from_pretrained(os.path.join(zd, "final"))
        print("  Trainer %s: 20 steps within %.2g of DeepSpeed's, lrs equal, grad norms within %.2g, eval loss %.6f "
              "vs %.6f; save_model loads (%s)" % (zero, worst, norms, z["eval_loss"], ds["eval_loss"],
                                                   type(final).__name__))
        if zero == "z3nvme":
            # resume_from_checkpoint: steps 11-20 again from checkpoint-10
            rd = os.path.join(scratch, "trainer-resume")
            shutil.rmtree(rd, ignore_errors=True)
            os.makedirs(rd)
            shutil.copytree(os.path.join(zd, "out"), os.path.join(rd, "out"))
            shutil.rmtree(os.path.join(rd, "out", "checkpoint-20"))
            env = dict(os.environ, DS_ACCELERATOR="cpu")
            r = subprocess.run([sys.executable, os.path.join(HERE, "hf_trainer_script.py"), "--engine", "zinf",
                                "--zero", zero, "--resume", "--out", os.path.join(rd, "out.json"), "--scratch", rd],
                               env=env, capture_output=True, text=True, timeout=900)
            assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
            again = json.load(open(os.path.join(rd, "out.json")))
            full = {row["step"]: row for row in z["logs"]}
            assert [row["step"] for row in again["logs"]] == list(range(11, 21)), again["logs"]
            for row in again["logs"]:
                assert row["loss"] == full[row["step"]]["loss"], (row, full[row["step"]])
            print("  resume_from_checkpoint (checkpoint-10): steps 11-20 repeat bit for bit")
    # peft LoRA: the base frozen (on NVMe with ZeRO-3), the adapter trained and exported.
    ld, lora = run_trainer(scratch, "zinf", "z3nvme", "--lora", "--save-steps", "0")
    losses = [row["loss"] for row in lora["logs"]]
    assert len(losses) == 20 and all(l == l for l in losses)
    from peft import PeftModel
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        tie_word_embeddings=False, attn_implementation="eager"))
    tuned = PeftModel.from_pretrained(base, os.path.join(ld, "final"))
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, 128, (16,), generator=g) for _ in range(96)][80:]
    x = torch.stack(rows)
    with torch.no_grad():
        ev = tuned(input_ids=x, labels=x).loss.item()
    assert abs(ev - lora["eval_loss"]) <= 1e-5 * lora["eval_loss"], (ev, lora["eval_loss"])
    print("  peft LoRA on zinf (frozen base on NVMe): 20 steps, adapter saved; loaded back, eval loss %.6f = %.6f"
          % (ev, lora["eval_loss"]))


def main():
    global DEVICE
    args = sys.argv[1:]
    scratch = args.pop(0) if args and not args[0].startswith("-") else "/tmp/zinf-transformers"
    os.makedirs(scratch, exist_ok=True)
    if "--cuda" in args:
        # The GPU variant: the models unchanged, generate() and checkpointing
        # on CUDA, against torch on the same GPU.
        if not torch.cuda.is_available():
            print("SKIP: torch sees no CUDA GPU (torch %s)" % torch.__version__)
            sys.exit(77)
        DEVICE = torch.device("cuda", 0)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        print("zinf with transformers %s on %s" % (transformers.__version__, torch.cuda.get_device_name(0)))
        test_models_unchanged(scratch)
        print("ok")
        return 0
    os.environ["ZINF_TEST_SCRATCH"] = scratch
    if "--only" in args:
        i = args.index("--only")
        args[i:i + 2] = ["-k", args[i + 1]]
    print("zinf with transformers %s, peft %s, DeepSpeed %s, torch %s" % (
        transformers.__version__, peft.__version__, deepspeed.__version__, torch.__version__))
    import pytest  # here: the GPU check (--cuda) runs where pytest is not installed
    return pytest.main([__file__, "-v", "-s", "--durations=8", "-p", "no:cacheprovider", *args])


if __name__ == "__main__":
    sys.exit(main())
