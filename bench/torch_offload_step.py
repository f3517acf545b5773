#!/usr/bin/env python3
"""zinf.torch against PyTorch alone: whole training steps (forward, backward
and the optimizer) of the same GPT (bench/torch_gpt_step.py's model) on one
GPU, timed in turn in one run.

  reference: the model's fp32 parameters on the GPU, bf16 autocast, torch's
             fused AdamW on the GPU (what a user runs when the model fits);
  zinf:      zinf.torch.initialize(model, config) with bf16 on and, by
             default, the optimizer offloaded to the CPU (ZeRO-Offload:
             fp32 masters and Adam's state in pinned host memory); bf16
             autocast too.

Prints each side's median step, tokens/s, the ratio, and zinf's peak device
memory against the reference's. The figure to read is the ratio: what
offloading the optimizer costs on this GPU and host.

  ZINF_LIBRARY=build/src/capi/libzinf.so PYTHONPATH=python \\
      python3 bench/torch_offload_step.py --preset gpt2-medium --seq-len 1024 --micro-batch 4
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt_step import PRESETS, Gpt  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="gpt2-medium", choices=sorted(PRESETS))
    p.add_argument("--layers", type=int, default=0, help="transformer blocks (0: the preset's)")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=8, help="timed steps per side (median reported)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--offload", default="cpu", choices=["cpu", "none"], help="zinf's optimizer tier")
    p.add_argument("--threads", type=int, default=8, help="zinf.optimizer_threads")
    p.add_argument("--profile", action="store_true",
                   help="after the timed steps, profile 3 more steps of each side (torch.profiler): the busiest ops")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("torch_offload_step: torch sees no CUDA GPU", file=sys.stderr)
        return 77
    import zinf.torch

    vocab, max_seq, layers, heads, d = PRESETS[a.preset]
    layers = a.layers or layers
    max_seq = max(max_seq, a.seq_len)
    dev = torch.device("cuda", 0)
    g = torch.Generator(device="cpu").manual_seed(3)
    batches = [torch.randint(0, vocab, (a.micro_batch, a.seq_len + 1), generator=g).to(dev) for _ in range(4)]

    def run(label, model, step):
        times = []
        for i in range(a.warmup + a.steps):
            seq = batches[i % len(batches)]
            torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            loss = step(seq[:, :-1].contiguous(), seq[:, 1:].contiguous())
            torch.cuda.synchronize(dev)
            dt = time.perf_counter() - t0
            if i >= a.warmup:
                times.append(dt)
            print(f"\r{label}: step {i + 1}/{a.warmup + a.steps} {dt * 1e3:.1f} ms, loss {loss:.4f}", end="",
                  file=sys.stderr, flush=True)
        print(file=sys.stderr)
        if a.profile:
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for i in range(3):
                    seq = batches[i % len(batches)]
                    step(seq[:, :-1].contiguous(), seq[:, 1:].contiguous())
                torch.cuda.synchronize(dev)
            events = prof.key_averages()
            gpu = sum(e.self_device_time_total for e in events) / 3e3
            print("# %s, profiled: %.1f ms of GPU kernels a step" % (label, gpu))
            print(events.table(sort_by="self_device_time_total", row_limit=12, max_name_column_width=48))
            print(events.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=48))
        return statistics.median(times)

    lr = 1e-4
    torch.manual_seed(1)
    model = Gpt(vocab, max_seq, layers, heads, d).to(dev)
    n_params = sum(t.numel() for t in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)
    torch.cuda.reset_peak_memory_stats(dev)

    def torch_step(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    ref = run("torch", model, torch_step)
    ref_peak = torch.cuda.max_memory_allocated(dev)
    del model, opt
    torch.cuda.empty_cache()

    torch.manual_seed(1)
    model = Gpt(vocab, max_seq, layers, heads, d).to(dev)
    cfg = {"train_micro_batch_size_per_gpu": a.micro_batch, "gradient_clipping": 0.0, "bf16": {"enabled": True},
           "optimizer": {"type": "AdamW", "params": {"lr": lr}},
           "zero_optimization": {"stage": 0, "offload_optimizer": {"device": a.offload, "pin_memory": True}},
           "zinf": {"optimizer_threads": a.threads}}
    torch.cuda.reset_peak_memory_stats(dev)
    engine = zinf.torch.initialize(model, cfg)

    def zinf_step(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        return loss.item()

    calls = {}
    if a.profile:  # the host time of each C call zinf.torch makes
        from zinf import _capi
        lib = _capi.lib()
        for name in ("zinf_engine_fetch", "zinf_engine_release", "zinf_engine_grads_ready",
                     "zinf_engine_grad_buffers", "zinf_engine_step", "zinf_stream_synchronize"):
            fn = getattr(lib, name)

            def timed(*args, _fn=fn, _name=name):
                t0 = time.perf_counter()
                rc = _fn(*args)
                n, t = calls.get(_name, (0, 0.0))
                calls[_name] = (n + 1, t + time.perf_counter() - t0)
                return rc
            setattr(lib, name, timed)
    mine = run("zinf", engine, zinf_step)
    steps_run = a.warmup + a.steps + (3 if a.profile else 0)
    for name, (n, t) in sorted(calls.items(), key=lambda kv: -kv[1][1]):
        print("# %-28s %6.1f calls, %8.3f ms a step on the host" % (name, n / steps_run, t * 1e3 / steps_run))
    stats = engine.stats()
    core = "python" if type(engine._core).__name__ == "PyCore" else "c++"  # zinf/_units.py: which ran the hooks
    engine.close()
    tokens = a.micro_batch * a.seq_len
    out = {"preset": a.preset, "layers": layers, "params": n_params, "seq_len": a.seq_len,
           "micro_batch": a.micro_batch, "device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
           "offload": a.offload, "hooks_core": core, "torch_step_s": ref, "zinf_step_s": mine,
           "zinf_over_torch": mine / ref,
           "torch_tokens_per_s": tokens / ref, "zinf_tokens_per_s": tokens / mine,
           "torch_peak_device_bytes": ref_peak, "zinf_device_bytes_in_use": stats.get("device_bytes_in_use"),
           "zinf_optimizer_seconds": stats.get("optimizer_seconds")}
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        print("# %s, %d layers (%.0f M params), T=%d, micro-batch %d, bf16 autocast, on %s (torch %s)" % (
            a.preset, layers, n_params / 1e6, a.seq_len, a.micro_batch, out["device"], torch.__version__))
        print("side     step ms  tokens/s")
        print("torch   %8.1f  %8.0f   (fused AdamW on the GPU; peak %.2f GiB)" % (ref * 1e3, tokens / ref,
                                                                                  ref_peak / 2**30))
        print("zinf    %8.1f  %8.0f   (optimizer %s; the hooks' %s core)" % (mine * 1e3, tokens / mine, a.offload,
                                                                         core))
        print("# zinf / torch: %.2f× the step time" % (mine / ref))
    return 0


if __name__ == "__main__":
    sys.exit(main())
