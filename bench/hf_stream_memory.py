#!/usr/bin/env python3
"""A Hugging Face model larger than the memory a process may use, trained by
zinf: zinf.torch.from_pretrained builds it on the meta device and streams the
safetensors shards into zinf's tiers (parameters and optimizer state on NVMe,
ZeRO-3) unit by unit, then takes training steps. transformers' own
from_pretrained of the same folder is run under the same limit as the
reference: it must hold the whole model.

Each side runs in a child process; with --limit-mib (root, cgroup v1 memory
controller) the child runs in a memory cgroup of that size, else only its
peak RSS is measured. Prints the model's size, each side's peak RSS over its
RSS after imports, and the engine's plan (its pinned host memory and device
budget).

  hf_stream_memory.py [--layers N --hidden H --vocab V] [--limit-mib M] [--scratch DIR] [--json]
  (ZINF_LIBRARY, PYTHONPATH=python; run with scripts/setup's .venv/bin/python)
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib():
    """This process's peak RSS (VmHWM: ru_maxrss would carry the parent's
    across the fork and exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def child(args):
    import torch
    import transformers  # noqa: F401
    import zinf.torch  # noqa: F401
    torch.set_num_threads(2)
    base = rss_mib()
    t0 = time.time()
    out = {"side": args.side, "rss_after_imports_mib": base}
    if args.side == "hf":
        from transformers import AutoModelForCausalLM
        zinf.torch.empty_model(args.folder)  # the same imports as zinf's side
        out["rss_after_imports_mib"] = base = rss_mib()
        model = AutoModelForCausalLM.from_pretrained(args.folder, dtype=torch.float32)
        x = torch.randint(0, model.config.vocab_size, (1, 64))
        model(input_ids=x, labels=x).loss.backward()
    else:
        nvme = os.path.join(args.scratch, "nvme")
        os.makedirs(nvme, exist_ok=True)
        cfg = {"train_micro_batch_size_per_gpu": 1,
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
               # Sub-groups of about a layer, two swap buffers: the optimizer's
               # host memory is two layers' state (12 B a parameter).
               "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                     "sub_group_size": 14 * args.hidden * args.hidden,
                                     # at most about three layers gathered, one ahead
                                     "stage3_max_live_parameters": 40 * args.hidden * args.hidden,
                                     "stage3_prefetch_bucket_size": 13 * args.hidden * args.hidden,
                                     "reduce_bucket_size": 13 * args.hidden * args.hidden,  # a layer's gradients
                                     "offload_param": {"device": "nvme", "nvme_path": nvme, "max_in_cpu": 0,
                                                       "buffer_count": 2},
                                     "offload_optimizer": {"device": "nvme", "nvme_path": nvme, "buffer_count": 2}},
               # pinned host memory for the swap buffers and staging; the
               # accumulated gradients go to NVMe when it is short
               "zinf": {"device_memory": "%dM" % args.device_mib, "host_memory": "%dM" % args.host_mib}}
        model = zinf.torch.empty_model(args.folder)  # the model's code imported, nothing of its weights
        out["rss_after_imports_mib"] = base = rss_mib()
        engine = zinf.torch.initialize(model, cfg)  # what zinf.torch.from_pretrained does
        out["loaded_s"] = time.time() - t0
        out["rss_after_load_mib"] = rss_mib()
        out["load_peak_rss_mib"] = peak_rss_mib()
        vocab = engine.module.config.vocab_size
        losses = []
        for step in range(2):
            x = torch.randint(0, vocab, (1, 64), generator=torch.Generator().manual_seed(step))
            loss = engine(input_ids=x, labels=x).loss
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        st = engine.stats()
        out.update(losses=losses, host_peak_pinned_mib=st.get("host_peak_pinned_bytes", 0) / 2**20,
                   largest_unit_mib=max(sum(u.numels) for u in engine._units) * 4 / 2**20,
                   units=len(engine._units))
        engine.close()
    out["seconds"] = time.time() - t0
    out["peak_rss_mib"] = peak_rss_mib()
    print("RESULT " + json.dumps(out), flush=True)


def make_folder(args):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=int(args.hidden * 2.75) // 64 * 64,
                      num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                      num_key_value_heads=max(1, args.hidden // 256), max_position_embeddings=256,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(args.folder, max_shard_size="200MB")
    return n


def run_child(args, side, limit_mib):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", side, "--folder", args.folder, "--scratch", args.scratch,
           "--hidden", str(args.hidden), "--host-mib", str(args.host_mib), "--device-mib", str(args.device_mib)]
    pre = None
    cgroup = None
    if limit_mib:
        cgroup = "/sys/fs/cgroup/memory/zinf-stream-%d-%s" % (os.getpid(), side)
        os.makedirs(cgroup)
        with open(os.path.join(cgroup, "memory.limit_in_bytes"), "w") as f:
            f.write(str(int(limit_mib * 2**20)))
        with open(os.path.join(cgroup, "memory.memsw.limit_in_bytes"), "a") if os.path.exists(
                os.path.join(cgroup, "memory.memsw.limit_in_bytes")) else open(os.devnull, "w") as f:
            f.write(str(int(limit_mib * 2**20)))

        def pre():
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=pre, timeout=3600)
    finally:
        if cgroup:
            for _ in range(50):
                try:
                    os.rmdir(cgroup)
                    break
                except OSError:
                    time.sleep(0.1)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    killed = r.returncode < 0 or r.returncode == 137
    return {"side": side, "failed": True, "returncode": r.returncode,
            "why": "killed at the memory limit" if killed else (r.stderr or r.stdout)[-800:]}


def cgroup_usable():
    path = "/sys/fs/cgroup/memory"
    return os.geteuid() == 0 and os.path.isdir(path) and os.access(path, os.W_OK)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--limit-mib", type=float, default=0, help="memory cgroup limit for each side (0: none)")
    ap.add_argument("--host-mib", type=int, default=1024, help="zinf.host_memory: the engine's pinned host budget")
    ap.add_argument("--device-mib", type=int, default=384, help="zinf.device_memory: HostDevice's arena")
    ap.add_argument("--scratch", default=os.environ.get("ZINF_TMPDIR", "/var/tmp/zinf-hf-stream"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", choices=["zinf", "hf"])
    ap.add_argument("--folder")
    args = ap.parse_args()
    if args.child:
        args.side = args.child
        return child(args)
    if args.limit_mib and not cgroup_usable():
        print("SKIP: --limit-mib needs root and a writable cgroup v1 memory controller (/sys/fs/cgroup/memory)")
        return 77
    shutil.rmtree(args.scratch, ignore_errors=True)
    os.makedirs(args.scratch)
    args.folder = os.path.join(args.scratch, "model")
    n = make_folder(args)
    fp32_mib = n * 4 / 2**20
    print("model: Llama, %d layers, hidden %d, vocab %d: %.1f M parameters, %.0f MiB in fp32; limit %s"
          % (args.layers, args.hidden, args.vocab, n / 1e6, fp32_mib,
             "%.0f MiB" % args.limit_mib if args.limit_mib else "none (peak RSS measured)"), flush=True)
    results = {"params": n, "fp32_mib": fp32_mib, "limit_mib": args.limit_mib}
    for side in ("zinf", "hf"):
        res = run_child(args, side, args.limit_mib)
        results[side] = res
        if res.get("failed"):
            print("  %-4s failed: %s" % (side, res["why"].strip().splitlines()[-1] if res["why"].strip() else res))
        else:
            grown = res["peak_rss_mib"] - res["rss_after_imports_mib"]
            extra = ""
            if side == "zinf":
                extra = ("; loading peak %.0f MiB (%.0f over its imports); %d units, the largest %.0f MiB in fp32; pinned host peak %.0f MiB; "
                         "losses %s" % (res["load_peak_rss_mib"], res["load_peak_rss_mib"] - res["rss_after_imports_mib"],
                                        res["units"], res["largest_unit_mib"],
                                        res["host_peak_pinned_mib"],
                            " ".join("%.4f" % v for v in res["losses"])))
            print("  %-4s peak RSS %.0f MiB, %.0f MiB over its imports (%.2f of the fp32 model)%s (%.1f s)"
                  % (side, res["peak_rss_mib"], grown, grown / fp32_mib, extra, res["seconds"]), flush=True)
    if args.json:
        print(json.dumps(results))
    shutil.rmtree(args.scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
