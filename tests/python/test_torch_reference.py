#!/usr/bin/env python3
"""bench/torch_gpt_step.py builds the model `zinf bench model` runs: for a GPT
and a Llama preset, on the CPU in fp32, the same parameter count and the
same FLOPs per step as zinf reports, and a finite loss near ln(vocab) at
initialization for Llama (whose head reads normed, small-weight inputs).

  test_torch_reference.py ZINF_BINARY
Exits 77 (skipped) without PyTorch.
"""
import json
import math
import os
import subprocess
import sys

try:
    import torch  # noqa: F401
except ImportError:
    print("PyTorch not installed: skipped")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "torch_gpt_step.py")


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out[out.index("{"):])


def main():
    zinf = sys.argv[1]
    failures = []
    for preset, seq, batch in (("tiny", 16, 2), ("tiny-llama", 16, 3), ("tiny-llama", 11, 1)):
        shape = ["--preset", preset, "--seq-len", str(seq), "--micro-batch", str(batch)]
        ref = run_json([sys.executable, SCRIPT, *shape, "--steps", "1", "--warmup", "0", "--dtype", "fp32",
                        "--device", "cpu", "--json"])
        z = run_json([zinf, "bench", "model", *shape, "--steps", "1", "--threads", "1", "--json"])
        print(f"{preset} T={seq} B={batch}: params torch {ref['params']} zinf {z['params']}, "
              f"FLOPs torch {ref['flops_per_step']:.6g} zinf {z['flops_per_step']:.6g}, loss {ref['loss']:.4f}")
        if ref["params"] != z["params"]:
            failures.append(f"{preset}: params {ref['params']} != zinf's {z['params']}")
        if ref["flops_per_step"] != z["flops_per_step"]:
            failures.append(f"{preset}: FLOPs {ref['flops_per_step']} != zinf's {z['flops_per_step']}")
        if not math.isfinite(ref["loss"]):
            failures.append(f"{preset}: loss {ref['loss']}")
        if preset == "tiny-llama" and abs(ref["loss"] - math.log(64)) > 1.5:
            failures.append(f"{preset}: initial loss {ref['loss']:.3f} far from ln(64) = {math.log(64):.3f}")
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
