#!/usr/bin/env python3
"""zinf.torch's host work per unit per micro-step, on the CPU: a model of N
tiny blocks (so that compute is negligible) trained by zinf.torch against the
same forward and backward in torch alone, interleaved; the difference per
block per micro-step is what zinf's hooks cost the host (Python and the C
calls they make: fetch, bind, gradient copy, grads_ready, release). The
optimizer step is timed apart (zinf's boundary on the host device; torch's
AdamW on the same parameters) and not counted in the per-unit figure.

  torch_hook_overhead.py [--blocks 64] [--stage 0|3] [--rounds 5] [--json] [--breakdown]

--breakdown adds a table of where the hooks' time goes: each hook's CPU
time, less the CPU the library counted inside the C calls it made, per unit
per micro-step. It measures an engine of its own, built after the headline
rounds, whose hooks are wrapped in timers (two clock reads and two library
counter reads a call, about 1 us). It counts the time inside the hooks only;
the headline figure also holds what torch spends calling them.
(ZINF_LIBRARY=build/src/capi/libzinf.so PYTHONPATH=python .venv/bin/python ...)
"""
import argparse
import copy
import ctypes
import functools
import json
import statistics
import time

import torch
import torch.nn as nn

import zinf.torch


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.a = nn.Linear(d, d)
        self.b = nn.Linear(d, d)

    def forward(self, x):
        return x + self.b(torch.tanh(self.a(x)))


class Net(nn.Module):
    def __init__(self, blocks, d):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.blocks = nn.ModuleList([Block(d) for _ in range(blocks)])

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return x.pow(2).mean()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--stage", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--micro", type=int, default=20, help="micro-steps timed per round")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--breakdown", action="store_true", help="also time each hook (an engine of its own)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Net(args.blocks, args.dim)
    ref = copy.deepcopy(model)
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": args.micro,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
           "zero_optimization": {"stage": args.stage, "stage3_param_persistence_threshold": 0},
           "zinf": {"optimizer_threads": 1}}
    engine = zinf.torch.initialize(model, cfg)
    units = len(engine._units)
    # Time the host spends blocked on zinf's stream (HostDevice: the engine's
    # own work on its threads, gradient accumulation over whole 64 Ki-element
    # blocks) apart from the hooks' own work: rounds alternate between timed
    # calls (wall time in each of zinf's calls, and waiting on its stream)
    # and the plain functions. The hooks' Python is a plain round's: the
    # thread's CPU time less what the library counted inside its own calls
    # (zinf_call_cpu_accounting: on the host device the calls run the
    # engine's host work, events and hand-offs to its stream threads) less
    # torch's forward and backward alone.
    lib = zinf.torch._capi.lib()
    lib.zinf_call_cpu_accounting(1)
    waited = [0.0]
    in_lib = [0.0]

    def timed(fn, acc):
        def call(*a):
            t0 = time.perf_counter()
            rc = fn(*a)
            acc[0] += time.perf_counter() - t0
            return rc
        return call
    plain = {}
    timed_fns = {}
    for name, acc in (("zinf_stream_synchronize", waited), ("zinf_engine_fetch", in_lib),
                      ("zinf_engine_release", in_lib), ("zinf_engine_grad_buffers", in_lib),
                      ("zinf_engine_grads_ready", in_lib), ("zinf_engine_step", in_lib),
                      ("zinf_engine_loss_scale", in_lib), ("zinf_engine_set_group_lr", in_lib)):
        plain[name] = getattr(lib, name)
        timed_fns[name] = timed(plain[name], acc)

    def use(fns):
        for name, fn in fns.items():
            setattr(lib, name, fn)
    x = torch.randn(2, args.dim)
    print("zinf.torch host work per unit per micro-step: %d blocks of 2 Linear(%d, %d) + 1 (%d units), stage %d, "
          "%d micro-steps a round, %d rounds, torch %s, 1 thread"
          % (args.blocks, args.dim, args.dim, units, args.stage, args.micro, args.rounds, torch.__version__))

    def zinf_round(timing):
        use(timed_fns if timing else plain)
        waited[0] = in_lib[0] = 0.0
        t0, c0, l0 = time.perf_counter(), time.thread_time(), lib.zinf_thread_call_cpu_seconds()
        for _ in range(args.micro - 1):
            engine.backward(engine(x))
            engine.step()
        t1, c1, l1 = time.perf_counter(), time.thread_time(), lib.zinf_thread_call_cpu_seconds()
        n = args.micro - 1
        engine.backward(engine(x))
        engine.step()  # the boundary: the optimizer
        engine.stats()
        return (t1 - t0) / n, time.perf_counter() - t1, waited[0] / n, in_lib[0] / n, (c1 - c0) / n, (l1 - l0) / n

    def torch_round():
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(args.micro - 1):
            ref(x).backward()
        return (time.perf_counter() - t0) / (args.micro - 1), (time.thread_time() - c0) / (args.micro - 1)

    zinf_round(True)
    zinf_round(False)
    torch_round()  # warm-up
    z, t, zb, zw, zc, zlib, zcpu, tcpu = [], [], [], [], [], [], [], []
    for _ in range(args.rounds):
        _, _, wait, calls, _, _ = zinf_round(True)
        zw.append(wait)
        zc.append(calls)
        micro, boundary, _, _, cpu, lib_cpu = zinf_round(False)
        z.append(micro)
        zb.append(boundary)
        zcpu.append(cpu)
        zlib.append(lib_cpu)
        tw, tc = torch_round()
        t.append(tw)
        tcpu.append(tc)
    zm, tm, wm, cm = (statistics.median(v) for v in (z, t, zw, zc))
    per_unit_us = (zm - tm) / units * 1e6
    # The hooks' Python: this thread's CPU time outside zinf's library, less
    # torch's own forward and backward (CPU time, so that the engine's stream
    # threads working beside it on the two cores do not count).
    python_us = statistics.median((c - l - tc) / units * 1e6 for c, l, tc in zip(zcpu, zlib, tcpu))
    lib_cpu_us = statistics.median(zlib) / units * 1e6
    print("%-28s %12s %12s" % ("", "zinf", "torch"))
    print("%-28s %10.1f us %10.1f us" % ("micro-step (fwd + bwd)", zm * 1e6, tm * 1e6))
    print("%-28s %10.1f us" % ("  blocked on zinf's stream", wm * 1e6))
    print("%-28s %10.1f us   (CPU time inside them: %.1f us a unit)" % ("  in zinf's C calls", cm * 1e6, lib_cpu_us))
    print("%-28s %10.1f us   (CPU time of the training thread; target <= 50)" % ("hooks' Python per unit",
                                                                                     python_us))
    print("%-28s %10.1f us   (Python, C calls and the wait)" % ("zinf's host time per unit", per_unit_us))
    print("%-28s %10.1f us   (the boundary micro-step, optimizer included)" % ("boundary micro-step", statistics.median(zb) * 1e6))
    if args.json:
        print(json.dumps({"units": units, "stage": args.stage, "zinf_micro_us": zm * 1e6, "torch_micro_us": tm * 1e6,
                          "stream_wait_us": wm * 1e6, "c_calls_us": cm * 1e6, "c_calls_cpu_per_unit_us": lib_cpu_us,
                          "python_per_unit_us": python_us,
                          "per_unit_us": per_unit_us}))
    engine.close()
    if args.breakdown:
        breakdown(args, cfg, x, statistics.median(tcpu) / units * 1e6)


# What torch calls per unit per micro-step, by what it does. The unit
# modules' forward hooks, the gradient hooks, the fetch before a module's
# backward and the saved-tensor hooks are the core's (zinf/_units.py): the
# C++ core times its own (Core.set_timing), the Python core's methods are
# wrapped. The engine's own hooks are wrapped in both.
_CORE_HOOKS = (("forward pre-hook: fetch, bind, saved-tensor hooks on", "pre", None),
               ("forward post-hook: release, backward fetch hook", "post", None),
               ("gradient hooks: copy, buffers, grads_ready, release", "grad", "_on_grad"),
               ("backward fetch (a pre-hook on the output's node)", "backward_fetch", "_backward_fetch"),
               ("saved tensor packed (forward)", "pack", "_pack"),
               ("saved tensor unpacked (backward)", "unpack", "_unpack"))
_ENGINE_HOOKS = (("model pre-hook (the units outside the blocks)", "_model_pre_hook"),
                 ("model post-hook", "_model_post_hook"),
                 ("engine.step (the boundaries' optimizer included)", "step"))


def breakdown(args, cfg, x, torch_us):
    """Each hook's CPU time per unit per micro-step, less the library's CPU
    inside it, on a fresh engine (the Python methods are wrapped before it is
    built: the hooks bind them at initialize). Nested timed calls count once,
    in the outermost. torch_us: torch alone's CPU per unit, for the last
    rows."""
    lib = zinf.torch._capi.lib()
    lib.zinf_call_cpu_accounting(1)
    lib_seconds = lib.zinf_thread_call_cpu_seconds
    clock = time.thread_time_ns
    busy = [False]
    acc = {}  # name -> [CPU ns, library CPU s, calls]

    def timed(fn, name):
        slot = acc.setdefault(name, [0, 0.0, 0])

        @functools.wraps(fn)
        def call(*a, **k):
            if busy[0]:
                return fn(*a, **k)
            busy[0] = True
            c0, l0 = clock(), lib_seconds()
            try:
                return fn(*a, **k)
            finally:
                slot[0] += clock() - c0
                slot[1] += lib_seconds() - l0
                slot[2] += 1
                busy[0] = False
        return call

    from zinf import _units
    saved = [(zinf.torch.Engine, name, getattr(zinf.torch.Engine, name)) for _, name in _ENGINE_HOOKS]
    saved += [(_units.PyCore, method, getattr(_units.PyCore, method)) for _, _, method in _CORE_HOOKS if method]
    saved.append((_units.PyCore, "module_hooks", _units.PyCore.module_hooks))
    for cls, name, fn in saved:
        if name == "module_hooks":
            def factory(self, m, engine, fn=fn):
                pre, post = fn(self, m, engine)
                return timed(pre, "pre"), timed(post, "post")
            setattr(cls, name, factory)
        else:
            key = next((k for _, k, method in _CORE_HOOKS if method == name), name)
            setattr(cls, name, timed(fn, key))
    engine = None
    try:  # wrapped while the engine lives: some hooks bind the methods on first use
        torch.manual_seed(0)
        engine = zinf.torch.initialize(Net(args.blocks, args.dim), cfg)
        core = engine._core
        native = hasattr(core, "set_timing")  # the C++ core times its own hooks
        units = len(engine._units)
        hooked = len(engine._unit_modules)  # the modules whose hooks fetch units (the blocks)
        params = sum(len(u.params) for u in engine._units if not u.frozen)  # a gradient hook each
        for _ in range(args.micro):  # warm-up: one accumulation window
            engine.backward(engine(x))
            engine.step()
        if native:
            core.set_timing(True, ctypes.cast(lib.zinf_thread_call_cpu_seconds, ctypes.c_void_p).value)
        for slot in acc.values():
            slot[:] = [0, 0.0, 0]
        counts0, times0 = core.counts(), core.times() if native else {}
        steps = args.micro * args.rounds
        c0, l0 = clock(), lib_seconds()
        for _ in range(steps):
            engine.backward(engine(x))
            engine.step()
        total_us = (clock() - c0) / 1e3 / steps / units
        total_lib_us = (lib_seconds() - l0) * 1e6 / steps / units
        counts1, times1 = core.counts(), core.times() if native else {}
        core_name = "C++ (%s)" % type(core).__module__ if native else "Python (zinf._units.PyCore)"
    finally:
        if engine is not None:
            engine.close()
        for cls, name, fn in saved:
            setattr(cls, name, fn)
    for name in times1:  # the C++ core's own account, in the same form
        acc[name] = [(times1[name][0] - times0[name][0]) * 1e9, times1[name][1] - times0[name][1],
                     counts1[name] - counts0[name]]
    print("\nwhere the hooks' time goes (%s core, %d micro-steps; per unit per micro-step):" % (core_name, steps))
    print("%-56s %9s %9s  %s" % ("", "CPU", "Python", "calls a micro-step"))
    in_hooks = in_python = 0.0
    for label, name in [(label, name) for label, name, _ in _CORE_HOOKS] + list(_ENGINE_HOOKS):
        cpu_ns, lib_s, calls = acc.get(name, (0, 0.0, 0))
        cpu = cpu_ns / 1e3 / steps / units
        py = cpu - lib_s * 1e6 / steps / units
        in_hooks += cpu
        in_python += py
        if calls:
            print("%-56s %6.1f us %6.1f us  %9.1f" % (label, cpu, py, calls / steps))
    print("%-56s %6.1f us %6.1f us" % ("in the hooks (two clock reads a call included)", in_hooks, in_python))
    # What every unit's micro-step goes through at this stage: a hook that
    # never fired means the table above misses part of the work.
    calls = {k: counts1[k] - counts0.get(k, 0) for k in counts1}
    needed = {"pre": hooked, "post": hooked, "grad": params}
    if args.stage == 3:
        needed.update({"pack": hooked, "unpack": hooked, "backward_fetch": hooked})
    short = ["%s (%d calls, %d needed)" % (name, calls[name], steps * n)
             for name, n in needed.items() if calls[name] < steps * n]
    if short:
        raise SystemExit("torch_hook_overhead: hooks fired too few times: " + ", ".join(short))
    print("%-56s %6.1f us   (of which the library's C calls: %.1f us)" % (
        "the training thread in all (boundaries included)", total_us, total_lib_us))
    outside = total_us - in_hooks - (total_lib_us - (in_hooks - in_python))
    print("%-56s %6.1f us   (torch alone: %.1f us)" % ("outside the hooks, less the library's C calls", outside,
                                                       torch_us))

if __name__ == "__main__":
    main()
