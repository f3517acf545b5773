#!/usr/bin/env python3
"""Whole training steps of the same Hugging Face model on the CPU, side by
side: DeepSpeed (DS_ACCELERATOR=cpu, gloo), zinf (zinf.deepspeed: the same
script, one import changed) and torch FSDP2.

The model is a Llama-family config from transformers with random weights
(the same initial weights and the same batches for every engine), T = 256,
fp32. Configurations:
  z2cpu    ZeRO-2, the optimizer in CPU memory
  z3opt    ZeRO-3, the optimizer on NVMe
  z3nvme   ZeRO-3, parameters and optimizer on NVMe
FSDP2 runs z2cpu's equivalent (fully_shard on one rank; on a machine with no
GPU its CPU offload policy has nothing to offload from) and has no NVMe tier:
its rows for z3opt and z3nvme say so. The engine "torch" is the floor for
z2cpu: the model alone with torch.optim.AdamW, no engine around it; its
forward and backward are timed apart, which bounds what any engine can gain
over DeepSpeed here (DeepSpeed's s/step over torch's forward+backward).

--device cuda runs the same on a GPU machine (DeepSpeed's CUDA accelerator,
zinf on the GPU, FSDP2 with CPUOffloadPolicy on NCCL). Such a machine may
lack DeepSpeed and some of its dependencies: fetch them here as wheels for
its Python (3.12) and carry them, as bench/peers/README.md says.

Each (engine, configuration) runs in its own process, one after another,
round by round with the order rotated; a round takes --warmup steps then
--steps timed steps. Per engine and configuration: the median s/step and
tokens/s over the rounds, the process's peak RSS (VmHWM), the bytes read and
written on disk per step (/proc/self/io's read_bytes and write_bytes), and
each step's loss (they must agree across engines to fp32 rounding: same
weights, same batches, the same Adam). zinf/DeepSpeed ratios of throughput
and peak RSS close the table.

  .venv/bin/python bench/peers/train_step.py [--layers 9 --hidden 768 --vocab 32000] [--rounds 3]
                                             [--configs z2cpu,z3opt,z3nvme] [--engines deepspeed,zinf,fsdp2]
                                             [--path DIR] [--json] [--quick]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers_common  # noqa: E402

CONFIGS = ("z2cpu", "z3opt", "z3nvme")
ENGINES = ("deepspeed", "zinf", "fsdp2", "torch")


def ds_config(kind, nvme, threads):
    zero = {"stage": 2, "offload_optimizer": {"device": "cpu"}} if kind == "z2cpu" else {
        "stage": 3, "stage3_param_persistence_threshold": 0,
        "offload_optimizer": {"device": "nvme", "nvme_path": nvme}}
    if kind == "z3nvme":
        zero["offload_param"] = {"device": "nvme", "nvme_path": nvme}
    return {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                                      "weight_decay": 0.01}},
            "zero_optimization": zero, "steps_per_print": 10 ** 9}


def disk_io():
    with open("/proc/self/io") as f:
        d = dict(line.split(": ") for line in f.read().splitlines())
    return int(d["read_bytes"]), int(d["write_bytes"])


def peak_rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def child(args):
    """One engine, one configuration: --warmup + --steps steps; prints RESULT json."""
    peers_common.setup_environment(args.threads)
    if args.device == "cuda":
        os.environ.pop("DS_ACCELERATOR", None)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3 // 64 * 64,
                      num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                      num_key_value_heads=max(1, args.hidden // 256), max_position_embeddings=args.seq_len,
                      tie_word_embeddings=False, attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg)
    params = sum(p.numel() for p in model.parameters())
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(0)
        model = model.to(device)
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, args.vocab, (1, args.seq_len), generator=g).to(device)
               for _ in range(args.warmup + args.steps)]
    nvme = os.path.join(args.path, "nvme-%s-%s" % (args.engine, args.config))
    shutil.rmtree(nvme, ignore_errors=True)
    os.makedirs(nvme)
    out = {"engine": args.engine, "config": args.config, "params": params}
    skip = {"fsdp2": "FSDP2 has no NVMe tier (its offload policy moves state to CPU memory only)",
            "torch": "torch alone has no NVMe tier (its row is z2cpu's floor)"}
    if args.engine in skip and args.config != "z2cpu":
        out["skipped"] = skip[args.engine]
        print("RESULT " + json.dumps(out), flush=True)
        return 0
    fwd_bwd = []  # torch alone: forward + backward of each step, without the optimizer

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()
    if args.engine == "torch":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)

        def step(x):
            sync()
            t0 = time.perf_counter()
            loss = model(input_ids=x, labels=x).loss
            loss.backward()
            sync()
            fwd_bwd.append(time.perf_counter() - t0)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            return loss.item()
    elif args.engine == "fsdp2":
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        cuda = device.type == "cuda"
        dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
        mesh = init_device_mesh("cuda" if cuda else "cpu", (1,))
        extra = {"offload_policy": CPUOffloadPolicy()} if cuda else {}
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh, **extra)
        fully_shard(model, mesh=mesh, **extra)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)

        def step(x):
            loss = model(input_ids=x, labels=x).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            return loss.item()
    else:
        if args.engine == "deepspeed":
            import deepspeed
        else:
            import zinf.deepspeed as deepspeed
        config = ds_config(args.config, nvme, args.threads)
        if args.engine == "zinf":
            config["zinf"] = {"optimizer_threads": args.threads}
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)

        def step(x):
            loss = engine(input_ids=x, labels=x).loss
            engine.backward(loss)
            engine.step()
            return loss.item()
    losses, times = [], []
    for i, x in enumerate(batches):
        if i == args.warmup:
            io0 = disk_io()
        t0 = time.perf_counter()
        losses.append(step(x))
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    io1 = disk_io()
    out.update(losses=losses, step_s=statistics.median(times), times=times, peak_rss_mib=peak_rss_mib(),
               read_mib_per_step=(io1[0] - io0[0]) / args.steps / 2**20,
               written_mib_per_step=(io1[1] - io0[1]) / args.steps / 2**20)
    if fwd_bwd:
        out["fwd_bwd_s"] = statistics.median(fwd_bwd[args.warmup:])
    print("RESULT " + json.dumps(out), flush=True)
    shutil.rmtree(nvme, ignore_errors=True)
    return 0


def run_one(args, engine, config):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--engine", engine, "--config", config,
           "--layers", str(args.layers), "--hidden", str(args.hidden), "--vocab", str(args.vocab),
           "--seq-len", str(args.seq_len), "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--threads", str(args.threads), "--path", args.path, "--device", args.device]
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(29400 + (hash((engine, config, time.time())) % 500)))
    if args.device == "cuda":
        env.pop("DS_ACCELERATOR", None)  # DeepSpeed picks its CUDA accelerator
    if engine == "zinf":
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            env.pop(k)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"engine": engine, "config": config, "failed": (r.stderr or r.stdout).strip().splitlines()[-3:]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=9)  # 105.8 M parameters with the defaults below
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--path", default=os.environ.get("ZINF_TMPDIR", "/var/tmp/zinf-peers"))
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="a small model, 1 round: a smoke run")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--engine")
    ap.add_argument("--config")
    args = ap.parse_args()
    if args.child:
        return child(args)
    if args.quick:
        args.layers, args.hidden, args.vocab, args.rounds, args.steps, args.seq_len = 2, 256, 4000, 1, 2, 64
    os.makedirs(args.path, exist_ok=True)
    peers_common.setup_environment(args.threads)
    configs = args.configs.split(",")
    engines = args.engines.split(",")
    header = peers_common.versions(with_torch=True)
    if not args.json:
        peers_common.print_header("bench/peers/train_step.py: whole training steps, DeepSpeed vs zinf vs FSDP2", header)
        print("# model: Llama config, %d layers, hidden %d, vocab %d, T = %d, micro-batch 1, fp32, random weights; "
              "%d warm-up + %d timed steps a round, %d rounds, %d threads; NVMe tiers in %s"
              % (args.layers, args.hidden, args.vocab, args.seq_len, args.warmup, args.steps, args.rounds,
                 args.threads, args.path), flush=True)
    results = {(e, c): [] for e in engines for c in configs}
    for r in range(args.rounds):
        order = engines[r % len(engines):] + engines[:r % len(engines)]
        for c in configs:
            for e in order:
                res = run_one(args, e, c)
                results[(e, c)].append(res)
                if not args.json:
                    what = res.get("skipped") or ("FAILED: " + " | ".join(res["failed"]) if res.get("failed") else
                                                  "%.3f s/step" % res["step_s"])
                    print("#   round %d %-9s %-7s %s" % (r + 1, e, c, what), flush=True)
    rows = []
    for c in configs:
        for e in engines:
            runs = [x for x in results[(e, c)] if "step_s" in x]
            if not runs:
                first = results[(e, c)][0]
                rows.append({"config": c, "engine": e, "why": first.get("skipped") or " | ".join(first["failed"])})
                continue
            step_s = statistics.median(x["step_s"] for x in runs)
            rows.append({"config": c, "engine": e, "params": runs[0]["params"], "step_s": step_s,
                         "tokens_s": args.seq_len / step_s, "peak_rss_mib": max(x["peak_rss_mib"] for x in runs),
                         "read_mib": statistics.median(x["read_mib_per_step"] for x in runs),
                         "written_mib": statistics.median(x["written_mib_per_step"] for x in runs),
                         "losses": runs[0]["losses"]})
            if "fwd_bwd_s" in runs[0]:
                rows[-1]["fwd_bwd_s"] = statistics.median(x["fwd_bwd_s"] for x in runs)
    by = {(x["config"], x["engine"]): x for x in rows}
    for c in configs:
        z, d = by.get((c, "zinf")), by.get((c, "deepspeed"))
        if z and d and "step_s" in z and "step_s" in d:
            z["vs_deepspeed"] = d["step_s"] / z["step_s"]
            z["rss_vs_deepspeed"] = z["peak_rss_mib"] / d["peak_rss_mib"]
            z["loss_rel_diff"] = max(abs(a - b) / abs(b) for a, b in zip(z["losses"], d["losses"]))
    if args.json:
        print(json.dumps({"header": header, "rows": rows}))
        return 0
    print("%-7s %-9s %9s %9s %10s %11s %11s %9s %9s  %s" % ("config", "engine", "s/step", "tokens/s", "peak RSS",
                                                           "read/step", "write/step", "zinf/ds", "RSS z/ds",
                                                           "losses"))
    for x in rows:
        if "why" in x:
            print("%-7s %-9s  %s" % (x["config"], x["engine"], x["why"]))
            continue
        print("%-7s %-9s %9.3f %9.1f %7.0f MiB %7.0f MiB %7.0f MiB %9s %9s  %s" % (
            x["config"], x["engine"], x["step_s"], x["tokens_s"], x["peak_rss_mib"], x["read_mib"], x["written_mib"],
            "%.2fx" % x["vs_deepspeed"] if "vs_deepspeed" in x else "", "%.2f" % x["rss_vs_deepspeed"]
            if "rss_vs_deepspeed" in x else "", " ".join("%.5f" % v for v in x["losses"])))
    for c in configs:
        z = by.get((c, "zinf"))
        if z and "loss_rel_diff" in z:
            print("# %s: zinf's losses within %.2g of DeepSpeed's (relative)" % (c, z["loss_rel_diff"]))
        t, d = by.get((c, "torch")), by.get((c, "deepspeed"))
        if t and d and "fwd_bwd_s" in t and "step_s" in d:
            print("# %s: torch's forward+backward alone takes %.3f s/step: no engine that runs them can be more than "
                  "%.2fx DeepSpeed here" % (c, t["fwd_bwd_s"], d["step_s"] / t["fwd_bwd_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
