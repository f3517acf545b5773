#!/usr/bin/env python3
"""zinf.torch's two cores (zinf/_units.py), the C++ one of the _zinf_torch
extension and the Python one, on the same model and batches: every loss
and every weight bit-identical, at stage 0 and at stage 3 (where the saved
tensors are kept as places in the units' buffers and the units are fetched
again for backward). The model covers the cores' rare paths: a block with a
frozen unit (released after its backward), a block returning a tuple (the
Python slow path of the forward hook), a block under
torch.utils.checkpoint (its hooks already on), a block that saves more
places in its buffer than the C++ core remembers, and a parameter that gets no
gradient (reported with zeros), and a script's own gradient hooks made
before and after initialize() (both fire, beside zinf's; one that changes
the gradient changes what zinf trains with). Also: the model
of a closed engine refuses to run and keeps its trained weights in torch's
own memory (stage 0; stage 3: empty), with $ZINF_TORCH_EXTENSION set the
C++ core is the one used, its forward wrapper is the extension's own
callable, and a unit's parameters keep one storage while the unit is
fetched at different addresses.

usage: test_units_core.py [--build-ext DIR] [--cuda]
  (ZINF_LIBRARY, PYTHONPATH as the other tests; ZINF_TORCH_EXTENSION: the
  built _zinf_torch module) --build-ext: the module built into DIR by
  scripts/build_torch_ext.py (as on a machine whose Python or torch is not
  the build's) is the one tested. --cuda: the model on the GPU (skipped
  where torch sees none). Exits 77 (skipped) without torch or without the
  extension."""
import contextlib
import functools
import inspect
import math
import os
import subprocess
import sys

try:
    import torch
    import torch.nn as nn
    import torch.utils.checkpoint as checkpoint
except ImportError:
    print("SKIP: torch is not installed for %s (scripts/setup makes the Python environment)" % sys.executable)
    sys.exit(77)

import zinf.torch  # noqa: E402
from zinf import _units  # noqa: E402

torch.set_num_threads(1)
D = 12
DEVICE = torch.device("cuda" if "--cuda" in sys.argv else "cpu")


class Block(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.a, self.b = nn.Linear(D, D), nn.Linear(D, D)
        self.unused = nn.Parameter(torch.ones(3))  # never in the forward: zeros for it every micro-step
        if kind == "frozen":
            self.frozen = nn.Linear(D, D)
            self.frozen.requires_grad_(False)
        if kind == "sliced":  # saves 80 places in its unit's buffer, more than the C++ core remembers (64)
            self.scale = nn.Parameter(torch.linspace(0.99, 1.01, 80))

    def body(self, x):
        if getattr(self, "fail", False):
            getattr(self, "before_failing", lambda: None)()
            raise RuntimeError("block failed on purpose")
        h = torch.tanh(self.a(x))
        if self.kind == "frozen":
            h = h + self.frozen(h)
        if self.kind == "sliced":
            for i in range(self.scale.numel()):
                h = h * self.scale[i:i + 1]
        return x + self.b(h)

    def forward(self, x):
        y = self.body(x)
        return (y, y.sum()) if self.kind == "tuple" else y


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(D, D)
        self.blocks = nn.ModuleList([Block(k) for k in ("plain", "frozen", "tuple", "checkpointed", "plain", "sliced")])

    def forward(self, x):
        x = self.inp(x)
        for blk in self.blocks:
            if blk.kind == "checkpointed":
                x = checkpoint.checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)
                if isinstance(x, tuple):
                    x = x[0] + 0.01 * x[1]
        return x.pow(2).mean()


def config(stage):
    return {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}


@contextlib.contextmanager
def choose_core(native):
    """zinf.torch.initialize inside it builds the C++ core (native) or the Python one."""
    saved = _units.extension
    if not native:
        _units.extension = lambda: (None, "ZINF_TORCH_EXTENSION=off")
    try:
        yield
    finally:
        _units.extension = saved


def train(stage, native):
    """Losses and final weights of 6 micro-steps under the chosen core."""
    with choose_core(native):
        torch.manual_seed(0)
        model = Net().to(DEVICE)
        # A script's own gradient hooks, one made before initialize() and one
        # after: both fire every micro-step, beside zinf's.
        seen = {"before": 0, "after": 0}
        model.blocks[0].a.weight.register_hook(lambda g: seen.__setitem__("before", seen["before"] + 1))
        engine = zinf.torch.initialize(model, config(stage))
        model.blocks[4].b.weight.register_hook(lambda g: seen.__setitem__("after", seen["after"] + 1))
    is_native = not isinstance(engine._core, _units.PyCore)
    assert is_native == native, "asked for the %s core, got %s" % ("C++" if native else "Python", type(engine._core))
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(6):
        loss = engine(torch.randn(4, D, generator=gen).to(DEVICE))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    assert seen == {"before": 6, "after": 6}, "the script's gradient hooks fired %s times in 6 micro-steps" % seen
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    counts = engine._core.counts()
    engine.close()
    try:
        model(torch.randn(4, D, device=DEVICE))
    except RuntimeError as e:
        assert "closed" in str(e), str(e)
    else:
        raise AssertionError("the model of a closed engine ran (%s core)" % ("C++" if native else "Python"))
    check_closed_params(model, weights, stage, native)
    return losses, weights, counts


def check_closed_params(model, weights, stage, native):
    """After close(), parameters that were bound to the engine's memory
    (stage 0) hold their trained values in torch's own memory, still after
    another engine has trained in memory the closed one freed; at stage 3
    they are empty (the units were released)."""
    core = "C++" if native else "Python"
    torch.manual_seed(2)
    other = Net().to(DEVICE)
    engine = zinf.torch.initialize(other, config(stage))
    for _ in range(2):
        engine.backward(engine(torch.randn(4, D, device=DEVICE)))
        engine.step()
    for name, p in model.named_parameters():
        if stage == 3:
            assert p.numel() == 0, "stage 3, %s core: %s holds %s after close" % (core, name, tuple(p.shape))
        else:
            assert torch.equal(p.detach(), weights[name]), (
                "stage %d, %s core: %s changed after close, once another engine trained" % (stage, core, name))
    engine.close()


def check_hook_changes_gradient(stage, native):
    """A script's gradient hook made after initialize() that returns a new
    gradient (here zeros) changes what zinf trains with, as it changes what
    torch would accumulate: zinf takes each gradient at the parameter's
    accumulator, after the script's hooks. With zero gradients and no weight
    decay, AdamW leaves the weight exactly as it was."""
    with choose_core(native):
        torch.manual_seed(0)
        model = Net().to(DEVICE)
        cfg = config(stage)
        cfg["optimizer"]["params"]["weight_decay"] = 0.0
        engine = zinf.torch.initialize(model, cfg)
    held, moved = "blocks.0.a.weight", "blocks.4.a.weight"
    before = {k: v.clone() for k, v in model.state_dict().items()}
    dict(model.named_parameters())[held].register_hook(torch.zeros_like)
    for _ in range(4):
        engine.backward(engine(torch.randn(4, D, device=DEVICE)))
        engine.step()
    after = model.state_dict()
    core = "C++" if native else "Python"
    assert torch.equal(after[held], before[held]), (
        "stage %d, %s core: %s moved by %.3g although a hook zeroed its gradient"
        % (stage, core, held, (after[held] - before[held]).abs().max().item()))
    assert not torch.equal(after[moved], before[moved]), "stage %d, %s core: %s did not train" % (stage, core, moved)
    engine.close()


def check_forward_wrapper(native):
    """At stage 3 the units' modules run zinf's work in a wrapper of their
    forward: the module keeps its signature and has no hooks of zinf's, and
    keyword arguments reach its forward; a
    forward that raises leaves no saved-tensor hooks on and its units
    released, and the next micro-step trains; when the work after a
    failed forward fails too, its error is raised with the forward's as
    its context; a module whose forward is already an instance attribute
    gets hooks instead."""
    with choose_core(native):
        torch.manual_seed(0)
        model = Net().to(DEVICE)
        wrapped = model.blocks[4]
        wrapped.forward = functools.partial(Block.forward, wrapped)  # a script's own wrapper
        engine = zinf.torch.initialize(model, config(3))
    core = "C++" if native else "Python"
    blk = model.blocks[0]
    assert inspect.signature(blk.forward) == inspect.signature(Block.forward.__get__(blk)), core
    assert not blk._forward_pre_hooks and not blk._forward_hooks, "%s core: zinf's hooks on a wrapped module" % core
    assert wrapped._forward_pre_hooks and wrapped._forward_hooks, "%s core: no hooks where forward was wrapped" % core
    model.blocks[2].fail = True
    try:
        engine(torch.randn(4, D, device=DEVICE))
    except RuntimeError as e:
        assert "on purpose" in str(e), str(e)
    else:
        raise AssertionError("the failing block did not raise")
    assert _units._top_saved_hooks(False) is None, "%s core: saved-tensor hooks left on after a failed forward" % core
    fetched = [u.name for um in engine._unit_modules for u in um.units if engine._core.fetched(u.index)]
    assert not fetched, "%s core: units left fetched after a failed forward: %s" % (core, fetched)
    model.blocks[2].fail = False
    pres = engine._core.counts()["pre"]
    loss = engine(torch.randn(4, D, device=DEVICE))
    engine.backward(loss)
    engine.step()
    assert math.isfinite(loss.item()), core
    assert engine._core.counts()["pre"] - pres >= len(model.blocks), "%s core: %s" % (core, engine._core.counts())
    x = torch.randn(4, D, device=DEVICE)
    with torch.no_grad():
        assert torch.equal(blk(x), blk(x=x)), "%s core: a keyword argument reached the forward otherwise" % core
    if native:
        # The C++ core's wrapper is a callable of its own, and each unit's
        # parameters stay views of one storage, pointed wherever the unit
        # is fetched: a fetch makes no tensor.
        assert type(blk.forward).__name__ == "UnitForward", type(blk.forward)
        assert blk.forward.__wrapped__ == Block.forward.__get__(blk), blk.forward.__wrapped__
        seen = []
        probe = blk.a.register_forward_hook(
            lambda m, i, o: seen.append((m.weight.data_ptr(), m.weight.untyped_storage()._cdata)))
        for _ in range(4):
            engine.backward(engine(torch.randn(4, D, device=DEVICE)))
            engine.step()
        probe.remove()
        assert len(seen) == 4 and len({s for _, s in seen}) == 1, "a unit's parameters changed storage: %s" % seen
        print("  stage 3: a unit's parameters kept one storage over 4 micro-steps, fetched at %d address(es)"
              % len({a for a, _ in seen}))
    # A forward that raises after closing the engine: the work after it
    # fails too, and raises with the forward's error as its context.
    victim = model.blocks[3]
    victim.fail, victim.before_failing = True, engine.close
    try:
        engine(torch.randn(4, D, device=DEVICE))
    except RuntimeError as e:
        assert "on purpose" not in str(e) and "on purpose" in str(e.__context__), "%s core: %r from %r" % (
            core, e, e.__context__)
    else:
        raise AssertionError("%s core: the failing block did not raise" % core)
    engine.close()


def main():
    if DEVICE.type == "cuda" and not torch.cuda.is_available():
        print("SKIP: torch sees no CUDA GPU (torch %s)" % torch.__version__)
        sys.exit(77)
    if "--build-ext" in sys.argv:
        out = sys.argv[sys.argv.index("--build-ext") + 1]
        script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "build_torch_ext.py")
        got = subprocess.run([sys.executable, script, out], check=True, capture_output=True, text=True)
        path = got.stdout.strip().splitlines()[-1]
        print("  %s" % got.stdout.strip().splitlines()[0])
        os.environ["ZINF_TORCH_EXTENSION"] = path
    module, why = _units.extension()
    if module is None:
        if os.environ.get("ZINF_TORCH_EXTENSION", "").lower() not in ("", "0", "off", "no", "false"):
            raise AssertionError("ZINF_TORCH_EXTENSION is set but the C++ core is not used: %s" % why)
        print("SKIP: zinf.torch's C++ core is not available here: %s" % why)
        sys.exit(77)
    print("C++ core: %s, on %s" % (module.__file__, DEVICE))
    for stage in (0, 3):
        a = train(stage, native=True)
        b = train(stage, native=False)
        assert a[0] == b[0], "stage %d: losses differ: C++ %s, Python %s" % (stage, a[0], b[0])
        for k in a[1]:
            assert torch.equal(a[1][k], b[1][k]), "stage %d: %s differs between the cores" % (stage, k)
        assert a[2] == b[2], "stage %d: the cores' calls differ: C++ %s, Python %s" % (stage, a[2], b[2])
        needed = ("pre", "post", "grad", "fetch") + (("pack", "unpack", "backward_fetch") if stage == 3 else ())
        missing = [name for name in needed if not a[2][name]]
        assert not missing, "stage %d: no %s call" % (stage, ", ".join(missing))
        print("  stage %d: 6 micro-steps, losses %s and %d tensors identical; calls %s" % (
            stage, " ".join("%.5f" % v for v in a[0]), len(a[1]),
            ", ".join("%s %d" % (k, a[2][k]) for k in sorted(a[2]))))
        for native in (True, False):
            check_hook_changes_gradient(stage, native)
        print("  stage %d: a script's hook that zeroes a gradient holds its weight, under both cores" % stage)
    for native in (True, False):
        check_forward_wrapper(native)
    print("  stage 3: the forward wrapper keeps the signature, and a failing forward leaves nothing behind")
    print("ok")


if __name__ == "__main__":
    main()
