#!/bin/bash
# scripts/gpu_bundle packages an existing build, and scripts/gpu_check runs
# from that bundle end to end: here, without a GPU, its GPU steps skip and
# the bundle step (checksums, `zinf --version` through the bundle's own
# lib/) passes; the results are the two files a GPU machine sends back.
#   gpu_check_test.sh SOURCE_DIR BUILD_DIR SCRATCH
set -euo pipefail
src=$1 build=$2 scratch=$3
rm -rf "$scratch" && mkdir -p "$scratch"
cd "$src"
scripts/gpu_bundle "$scratch/bundle" --from "$build"
size_kib=$(du -sk "$scratch/bundle" | cut -f1)
(( size_kib <= 60 * 1024 )) || { echo "FAIL: the bundle is $((size_kib / 1024)) MiB"; exit 1; }
# Nothing of the build tree is needed: zinf runs from the bundle alone.
readelf -d "$scratch/bundle/zinf" | grep -q 'RUNPATH.*\$ORIGIN/lib' || { echo "FAIL: zinf's rpath"; exit 1; }
if ldd "$scratch/bundle/zinf" | grep -q "$build"; then echo "FAIL: zinf loads from the build tree"; exit 1; fi
scripts/gpu_check "$scratch/bundle" "$scratch/out"
files=$(cd "$scratch/out" && ls | sort | tr '\n' ' ')
[[ $files == "gpu-check.tar.gz summary.json " ]] || { echo "FAIL: OUT holds: $files"; exit 1; }
python3 - "$scratch/out/summary.json" <<'PY'
import json, subprocess, sys
s = json.load(open(sys.argv[1]))
steps = {x["step"]: x for x in s["steps"]}
assert s["limits_s"] <= 540, s["limits_s"]
assert steps["bundle"]["status"] == "ok", steps["bundle"]
gpu = subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0 if __import__("shutil").which("nvidia-smi") else False
for name in ("memcheck", "gpu_test", "model_llama1b", "model_gpt13b", "attention", "torch_step", "torch_frontend",
             "torch_offload", "transformers", "offload", "torch_ext"):
    assert name in steps, name
    if not gpu:
        assert steps[name]["status"] == "skipped: no GPU", steps[name]
print("gpu_check from the bundle: %d steps, limits %d s, revision %s" % (len(steps), s["limits_s"], s["revision"]))
PY
tar -tzf "$scratch/out/gpu-check.tar.gz" | grep -q "gpu-check/bundle.log"
echo PASS
