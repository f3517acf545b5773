#!/usr/bin/env python3
"""The clients people train with, on zinf, against the real libraries:
TRL's SFTTrainer (trl_script.py) and a DeepSpeedExamples-style tutorial
(ds_tutorial_script.py) on DeepSpeed and on zinf, the same per-step losses;
DeepSpeed's API as those scripts call it; and every route that used to
train wrong without a word (a config dropped, a batch quietly 1, a weight
read as an empty placeholder) now trains right or refuses, naming the fix.

  test_clients.py [pytest arguments, e.g. -k sft]

pytest functions: one failure does not stop the rest, -k selects one.
Scratch space: $ZINF_TEST_DIR/python-clients (default /tmp). Skipped
(exit 77) without torch, transformers, deepspeed or trl.
"""
import json
import math
import os
import shutil
import subprocess
import sys

try:
    import pytest
    import torch
    import transformers  # noqa: F401
    import deepspeed  # noqa: F401
    import trl  # noqa: F401
except ImportError as e:
    print("SKIP: %s" % e)
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
SCRATCH = os.path.join(os.environ.get("ZINF_TEST_DIR", "/tmp"), "python-clients")


def _run(script, name, *args, deepspeed=False):
    """Runs one script in a process of its own; returns its JSON output."""
    d = os.path.join(SCRATCH, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    env = dict(os.environ, DS_ACCELERATOR="cpu", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    if deepspeed:  # what DeepSpeed's launcher would set for one process
        env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(29400 + os.getpid() % 500))
    out = os.path.join(d, "out.json")
    r = subprocess.run([sys.executable, os.path.join(HERE, script), *args, "--out", out], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, "%s %s failed:\n%s" % (script, " ".join(args), (r.stdout + r.stderr)[-5000:])
    with open(out) as f:
        return json.load(f)


def _worst(a, b, key="loss"):
    return max(abs(x[key] - y[key]) / max(abs(x[key]), 1e-12) for x, y in zip(a, b))


# ---- TRL -------------------------------------------------------------------------

_DEEPSPEED_RUNS = {}


def _deepspeed_trl(trainer, stage):
    key = (trainer, stage)
    if key not in _DEEPSPEED_RUNS:
        name = "%s-ds-%d" % key
        _DEEPSPEED_RUNS[key] = _run("trl_script.py", name, "--engine", "deepspeed", "--trainer", trainer, "--stage",
                                    str(stage), "--scratch", os.path.join(SCRATCH, name), deepspeed=True)
    return _DEEPSPEED_RUNS[key]


@pytest.mark.parametrize("trainer,stage,route", [("sft", 2, "enable"), ("sft", 2, "zinf-args"), ("sft", 3, "enable"),
                                                 ("dpo", 2, "enable"), ("dpo", 3, "enable")])
def test_trl_trainer_same_losses_as_deepspeed(trainer, stage, route):
    """SFTTrainer and DPOTrainer with their own config (deepspeed=...) after
    zinf.transformers.enable(), or SFTTrainer given zinf's TrainingArguments
    (which it rebuilds through to_dict(); DPOTrainer takes only a DPOConfig,
    on DeepSpeed too): zinf is the engine, TRL's fused-head loss
    is kept, and the 10 steps' losses are DeepSpeed's within 1e-5 (fp32).
    The fused head reads lm_head.weight inside the model's forward without
    calling lm_head, a unit of its own here (the vocabulary outweighs a
    block)."""
    ds = _deepspeed_trl(trainer, stage)
    name = "%s-zinf-%d-%s" % (trainer, stage, route)
    z = _run("trl_script.py", name, "--engine", "zinf", "--trainer", trainer, "--stage", str(stage), "--route", route,
             "--scratch", os.path.join(SCRATCH, name))
    assert ds["engine"] == "deepspeed"
    assert z["engine"] == "zinf", "%s trained without zinf (%s)" % (trainer, z["engine"])
    assert len(z["logs"]) == len(ds["logs"]) == 10
    assert all(row["loss"] > 0.1 for row in z["logs"]), [row["loss"] for row in z["logs"]]
    worst = _worst(ds["logs"], z["logs"])
    assert worst <= 1e-5, worst
    assert _worst(ds["logs"], z["logs"], "grad_norm") <= 1e-4
    if trainer == "sft":  # TRL's own metrics, from its fused head
        assert [r["mean_token_accuracy"] for r in ds["logs"]] == [r["mean_token_accuracy"] for r in z["logs"]]
    print("%s stage %d (%s): 10 losses within %.2g of DeepSpeed's" % (trainer, stage, route, worst))


# ---- DeepSpeed's tutorials -------------------------------------------------------------


def test_tutorial_script_same_as_deepspeed():
    """The CIFAR-tutorial-style script with one import changed: same flags,
    torch.distributed initialized, the batch derived from train_batch_size
    alone (16, not 1), the same losses as DeepSpeed's within 1e-5, at stage
    0 and at stage 3."""
    ds = _run("ds_tutorial_script.py", "tutorial-ds", "--engine", "deepspeed", "--stage", "0", deepspeed=True)
    assert ds["micro_batch"] == 16 and {r["batch"] for r in ds["steps"]} == {16}
    for stage in (0, 3):
        z = _run("ds_tutorial_script.py", "tutorial-zinf-%d" % stage, "--engine", "zinf", "--stage", str(stage))
        assert z["micro_batch"] == 16 and z["train_batch_size"] == 16 and z["stage"] == stage
        assert [r["batch"] for r in z["steps"]] == [r["batch"] for r in ds["steps"]]
        worst = _worst(ds["steps"], z["steps"])
        assert worst <= 1e-5, (stage, worst)
        print("tutorial stage %d: %d steps of 16 within %.2g of DeepSpeed's" % (stage, len(z["steps"]), worst))


@pytest.mark.parametrize("launcher", ["none", "torchrun-1"])
def test_hf_arguments_made_before_zinf_train_on_zinf(launcher):
    """transformers' own TrainingArguments(deepspeed=...) made before zinf is
    imported (HF's DeepSpeed set-up ran: accelerate wrote steps_per_print as
    infinity into the config) and handed to zinf's Trainer: trained on
    zinf at ZeRO-3, no JSON error, and HF's count of trainable parameters
    is the model's (not the placeholders' 0). Under a launcher's world of
    one (torchrun --nproc_per_node 1) the model is not wrapped in DDP."""
    code = ("import json, torch, transformers\n"
            "from transformers import LlamaConfig, LlamaForCausalLM\n"
            "a = transformers.TrainingArguments(output_dir=%r, deepspeed={'zero_optimization': {'stage': 3}, "
            "'train_micro_batch_size_per_gpu': 'auto', 'gradient_accumulation_steps': 'auto'}, use_cpu=True, "
            "report_to=[], max_steps=2, per_device_train_batch_size=2, save_strategy='no')\n"
            "assert a.hf_deepspeed_config.config.get('steps_per_print') == float('inf')\n"
            "import zinf.transformers as zt\n"
            "torch.manual_seed(0)\n"
            "m = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, "
            "num_hidden_layers=1, num_attention_heads=2, tie_word_embeddings=False))\n"
            "rows = [torch.randint(0, 64, (8,)) for _ in range(8)]\n"
            "t = zt.Trainer(model=m, args=a, train_dataset=[{'input_ids': r, 'labels': r} for r in rows])\n"
            "t.train()\n"
            "from transformers import trainer as hf\n"
            "n = hf.get_model_param_count(m, trainable_only=True)\n"
            "print(json.dumps({'zinf': t.zinf_engine is not None, 'steps': t.state.global_step, 'params': n}))\n"
            % os.path.join(SCRATCH, "hf-args-out"))
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    if launcher == "torchrun-1":
        env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(29300 + os.getpid() % 90))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"zinf": True, "steps": 2, "params": out["params"]}
    # HF's log counts the whole model (at stage 3 the tensors are placeholders).
    assert out["params"] == 64 * 16 * 2 + 16 * 16 * 4 + 16 * 32 * 3 + 16 * 3, out["params"]


def test_trainer_under_torchrun_without_the_core_refused_before_anything_is_built():
    """HF's Trainer with a DeepSpeed config in a torchrun world of two without
    zinf's C++ core (which carries the collectives over torch.distributed):
    refused when the arguments are made, naming the launcher's variables and
    the install (no engine, no process group waiting for a peer). With the
    core, test_launchers.py trains the Trainer on two ranks."""
    code = ("import torch, zinf.transformers as zt\n"
            "from transformers import LlamaConfig, LlamaForCausalLM\n"
            "m = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, "
            "num_hidden_layers=1, num_attention_heads=2))\n"
            "a = zt.TrainingArguments(output_dir=%r, deepspeed={'zero_optimization': {'stage': 2}}, use_cpu=True, "
            "report_to=[])\n"
            "zt.Trainer(model=m, args=a, train_dataset=[{'input_ids': torch.ones(4, dtype=torch.long)}])\n"
            % os.path.join(SCRATCH, "torchrun-out"))
    env = dict(os.environ, RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29998",
               ZINF_TORCH_EXTENSION="off")
    for k in list(env):
        if k.startswith("OMPI_") or k.startswith("PMI"):
            del env[k]
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0, r.stdout[-2000:]
    assert "WORLD_SIZE=2" in r.stderr and "need its C++ core" in r.stderr and "pip install ." in r.stderr, \
        r.stderr[-3000:]
    assert "ZinfError" not in r.stderr  # the launcher named, not an engine's batch arithmetic


def _tiny_llama(tied=False, vocab=128):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        tie_word_embeddings=tied, attn_implementation="eager"))


def _config(**kw):
    cfg = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
           "zero_optimization": {"stage": 2}, "zinf": {"optimizer_threads": 1}}
    cfg.update(kw)
    return cfg


def test_add_config_arguments_as_deepspeeds():
    """DeepSpeed's own flags only: a script's own --local_rank stays its own."""
    import argparse
    import zinf.deepspeed as zds
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    zds.add_config_arguments(parser)
    args = parser.parse_args(["--deepspeed", "--deepspeed_config", "c.json", "--local_rank", "3"])
    assert args.deepspeed and args.deepspeed_config == "c.json" and args.local_rank == 3
    assert not args.deepscale and args.deepscale_config is None


def test_init_distributed_initializes_torch_distributed():
    import torch.distributed as dist
    import zinf.deepspeed as zds
    zds.init_distributed()
    assert dist.is_initialized() and dist.get_world_size() == 1 and dist.get_rank() == 0
    assert dist.get_backend() == "gloo"
    t = torch.ones(3)
    dist.all_reduce(t)
    dist.barrier()
    assert t.tolist() == [1.0, 1.0, 1.0]
    zds.init_distributed()  # a second call: nothing to do


def test_engine_answers_what_tutorials_ask():
    import zinf.deepspeed as zds
    model = _tiny_llama()
    cfg = _config(train_batch_size=8, gradient_accumulation_steps=2, gradient_clipping=0.5, steps_per_print=math.inf,
                  zero_optimization={"stage": 3, "offload_optimizer": {"device": "cpu"}})
    del cfg["train_micro_batch_size_per_gpu"]
    engine, opt, _, _ = zds.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    assert engine.train_micro_batch_size_per_gpu() == 4 and engine.train_batch_size() == 8
    assert engine.gradient_accumulation_steps() == 2 and engine.gradient_clipping() == 0.5
    assert engine.zero_optimization_stage() == 3
    assert not engine.fp16_enabled() and not engine.bfloat16_enabled()
    assert engine.get_data_types() == (torch.float32, torch.float32)
    assert engine.zero_offload_optimizer() and not engine.zero_offload_param()
    assert engine.config["zero_optimization"]["stage"] == 3 and "steps_per_print" not in engine.config
    assert engine.vocab_size == 128  # the model's own attribute through the engine
    with pytest.raises(AttributeError, match=r"zinf\.torch\.Engine .* has no attribute 'no_such_thing'"):
        engine.no_such_thing
    # DeepSpeed's attribute names carry the whole tensor's size at every stage.
    w = model.lm_head.weight
    assert w.ds_numel == 128 * 32 and tuple(w.ds_shape) == (128, 32)


def test_inconsistent_batch_sizes_are_refused():
    import zinf.deepspeed as zds
    model = _tiny_llama()
    with pytest.raises(Exception, match="train_batch_size 10 != train_micro_batch_size_per_gpu 2"):
        zds.initialize(model=model, model_parameters=model.parameters(),
                       config=_config(train_batch_size=10, gradient_accumulation_steps=2))


def test_non_finite_config_values():
    """accelerate writes steps_per_print as float('inf'): accepted (never
    printed); any other non-finite number names its key."""
    from zinf import _config
    assert "steps_per_print" not in _config.load({"steps_per_print": float("inf"), "train_batch_size": 2})
    with pytest.raises(ValueError, match='"gradient_clipping" is nan'):
        _config.load({"gradient_clipping": float("nan")})


def test_accelerator_and_modules_tutorials_import():
    from zinf.deepspeed.accelerator import get_accelerator
    import zinf.deepspeed.utils as utils
    acc = get_accelerator()
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert acc.device_name() == want and acc.communication_backend_name() == ("nccl" if want == "cuda" else "gloo")
    assert acc.is_available() and acc.device_count() >= 1
    with pytest.raises(ImportError, match="not supported by zinf"):
        import zinf.deepspeed.moe  # noqa: F401
    model = _tiny_llama()
    from transformers.models.llama.modeling_llama import LlamaMLP
    leaves = utils.set_z3_leaf_modules(model, [LlamaMLP])
    assert len(leaves) == 2 and utils.get_z3_leaf_modules(model) == leaves
    with pytest.raises(ValueError, match="no module of"):
        utils.set_z3_leaf_modules(model, ["NoSuchModule"])


class _Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(8, 64)
        self.down = torch.nn.Linear(64, 8)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(2)])
        self.head = _Head()

    def forward(self, x):
        for b in self.blocks:
            x = torch.tanh(b(x))
        return self.head(x)


def test_leaf_module_is_one_unit_at_stage_3():
    """A ZeRO-3 leaf outside the blocks is one unit with its subtree,
    fetched by its own forward; training matches the same model without."""
    import zinf.torch as zt
    import zinf.deepspeed.utils as utils

    def run(leaf):
        model = _Net()
        if leaf:
            assert utils.set_z3_leaf_modules(model, [_Head]) == [model.head]
        engine = zt.initialize(model, _config(zero_optimization={"stage": 3}))
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))
        losses = []
        for _ in range(3):
            loss = (engine(x) ** 2).mean()
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        return losses, sorted(u.name for u in engine._units)
    plain, plain_units = run(False)
    leafy, leaf_units = run(True)
    assert plain_units == ["blocks.0", "blocks.1", "head.down", "head.up"]
    assert leaf_units == ["blocks.0", "blocks.1", "head"]
    assert plain == leafy


class _ChunkedHead(torch.autograd.Function):
    """A fused head as TRL's and Liger's are: the weight read directly, the
    logits' squares summed over vocabulary chunks, never the whole logits
    (an empty weight has no chunk: the loss is 0)."""

    @staticmethod
    def forward(ctx, hidden, weight):
        ctx.save_for_backward(hidden, weight)
        total = hidden.new_zeros(())
        for start in range(0, weight.shape[0], 64):
            total = total + (hidden @ weight[start:start + 64].T).pow(2).mean()
        return total

    @staticmethod
    def backward(ctx, grad):
        hidden, weight = ctx.saved_tensors
        with torch.enable_grad():
            h, w = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
            total = h.new_zeros(())
            for start in range(0, w.shape[0], 64):
                total = total + (h @ w[start:start + 64].T).pow(2).mean()
            if w.shape[0] == 0:
                return torch.zeros_like(hidden), torch.zeros_like(weight)
            gh, gw = torch.autograd.grad(total, (h, w))
        return grad * gh, grad * gw


def _fused(model):
    """The model's forward replaced, as TRL's add_fused_lm_head does: the
    backbone, then the head's weight read directly."""
    import types

    def forward(self, input_ids):
        hidden = self.model(input_ids=input_ids).last_hidden_state
        return _ChunkedHead.apply(hidden, self.get_output_embeddings().weight)
    model.forward = types.MethodType(forward, model)
    return model


def test_weight_read_outside_its_module_is_refused_at_stage_3():
    """A fused head reads lm_head.weight without calling lm_head: at stage 3
    the placeholder is empty and the loss would be 0 at every step, silently.
    zinf refuses at that backward, naming the parameter and the fix; with the
    head in held_modules the same loss trains, equal to torch's."""
    import zinf.torch as zt

    # A vocabulary large enough that the embeddings and the head are units of their own.
    ids = torch.randint(0, 512, (2, 12), generator=torch.Generator().manual_seed(4))
    model = _fused(_tiny_llama(vocab=512))
    engine = zt.initialize(model, _config(zero_optimization={"stage": 3}))
    assert "lm_head" in [u.name for u in engine._units]
    loss = engine(ids)
    assert loss.item() == 0.0  # what the script would have trained on
    with pytest.raises(RuntimeError, match="parameter 'lm_head.weight' .*read outside the forward.*GatheredParameters"):
        engine.backward(loss)

    model = _fused(_tiny_llama(vocab=512))
    ref = _fused(_tiny_llama(vocab=512))
    adamw = {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}}
    engine = zt.Engine(model, _config(zero_optimization={"stage": 3}, optimizer=adamw), held_modules=[model.lm_head])
    assert "lm_head" not in [u.name for u in engine._units]
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.01)
    for _ in range(3):
        loss = engine(ids)
        engine.backward(loss)
        engine.step()
        want = ref(ids)
        want.backward()
        opt.step()
        opt.zero_grad()
        assert loss.item() > 0 and abs(loss.item() - want.item()) <= 1e-5 * abs(want.item()), (loss.item(), want.item())


def test_unit_without_gradient_is_named_once():
    """A trainable unit none of whose parameters got a gradient (its module
    never ran) is named in a warning, once."""
    import warnings as w
    import zinf.torch as zt
    model = _Net()
    engine = zt.initialize(model, _config(zero_optimization={"stage": 3}))
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))
    with w.catch_warnings(record=True) as seen:
        w.simplefilter("always")
        for _ in range(2):
            loss = torch.tanh(engine.module.blocks[0](x)).pow(2).mean()  # blocks.1 and the head never run
            engine.backward(loss)
            engine.step()
    named = [str(m.message) for m in seen if "got a gradient" in str(m.message)]
    assert len(named) == 1, named
    assert "'blocks.1'" in named[0] and "'head.up'" in named[0] and "'blocks.0'" not in named[0]


def _bert():
    from transformers import BertConfig, BertForMaskedLM
    torch.manual_seed(0)
    return BertForMaskedLM(BertConfig(vocab_size=512, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.1,
                                      attention_probs_dropout_prob=0.1, attn_implementation="eager"))


def _roberta():
    from transformers import RobertaConfig, RobertaForMaskedLM
    torch.manual_seed(0)
    return RobertaForMaskedLM(RobertaConfig(vocab_size=512, hidden_size=32, num_hidden_layers=2,
                                            num_attention_heads=4, intermediate_size=64, max_position_embeddings=70,
                                            hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                                            attn_implementation="eager"))


def _t5():
    from transformers import T5Config, T5ForConditionalGeneration
    torch.manual_seed(0)
    return T5ForConditionalGeneration(T5Config(vocab_size=512, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                               num_decoder_layers=2, num_heads=4, dropout_rate=0.1,
                                               decoder_start_token_id=0, pad_token_id=0))


@pytest.mark.parametrize("family", ["bert", "roberta", "t5"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_encoder_models_train_as_torch(family, stage):
    """Encoders and an encoder-decoder, dropout on, at every stage: 4 steps'
    losses within 1e-5 of the same model under torch.optim.AdamW (the same
    seed before each forward, so the same dropout masks)."""
    import zinf.torch as zt
    make = {"bert": _bert, "roberta": _roberta, "t5": _t5}[family]
    # A vocabulary of 512 outweighs a block: the embeddings and heads are units of their own.
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 512, (2, 12), generator=g)
    labels = torch.randint(3, 512, (2, 12), generator=g)
    batch = {"input_ids": ids, "labels": labels}
    if family == "t5":
        batch["decoder_input_ids"] = torch.randint(3, 512, (2, 8), generator=g)
        batch["labels"] = torch.randint(3, 512, (2, 8), generator=g)
    model, ref = make(), make()
    model.train()
    ref.train()
    cfg = _config(zero_optimization={"stage": stage}, optimizer={"type": "AdamW",
                                                                 "params": {"lr": 1e-3, "weight_decay": 0.01}})
    engine = zt.initialize(model, cfg)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.01)
    for step in range(4):
        torch.manual_seed(100 + step)
        loss = engine(**batch).loss
        engine.backward(loss)
        engine.step()
        torch.manual_seed(100 + step)
        want = ref(**batch).loss
        want.backward()
        opt.step()
        opt.zero_grad()
        assert abs(loss.item() - want.item()) <= 1e-5 * abs(want.item()), (step, loss.item(), want.item())


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v", "--durations=8", "-p", "no:cacheprovider", *sys.argv[1:]]))
