#!/usr/bin/env bash
# zinf plan's predicted step time and memory against zinf train's measured
# ones, with the plan's rates measured on this machine in the same run.
#
#   bench/plan_vs_measured.sh [DIR]      (default DIR: /var/tmp; NVMe state and a 2 GiB probe file)
#
# 1. Rates: `zinf bench adam` (2 threads, bf16 copy), `zinf aio read|write`
#    at the engine's default aio block (1M, queue depth 8, one ring, fixed
#    buffers), `zinf bench copy` (HostDevice), and `zinf bench model` for the
#    very model each run trains.
# 2. Runs: the embedded default (stage 3, parameters on cpu, optimizer on
#    NVMe); gpt2 at T=128, micro-batch 2 (same offload); gpt2-medium at
#    T=32 with parameters and optimizer on NVMe and a 2 GiB device
#    (bench/configs/gpt2-xl-2g-nvme.json with nvme_path set to DIR).
# Prints each run's summary lines: the plan's step time beside the median
# measured one (plan/measured), and the plan's memory peaks beside the
# measured ones. ZINF points at the zinf binary (default: build/zinf).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
DIR=${1:-/var/tmp}
ZINF=${ZINF:-$here/../build/zinf}
[[ -x "$ZINF" ]] || { echo "plan_vs_measured: no zinf binary at $ZINF (build first: scripts/build)" >&2; exit 1; }
[[ -d "$DIR" && -w "$DIR" ]] || { echo "plan_vs_measured: $DIR is not a writable directory" >&2; exit 2; }
work=$(mktemp -d "$DIR/zinf-plan-vs-measured.XXXXXX")
trap 'rm -rf "$work"' EXIT

echo "# plan_vs_measured: rates measured now ($("$ZINF" --version | head -1))"
"$ZINF" bench adam --params 100M --threads 2 --param-copy bf16 --json > "$work/adam.json" 2>/dev/null
"$ZINF" aio write --path "$work/probe" --size 2G --block-size 1M --queue-depth 8 --threads 1 --loops 1 --fixed-buffers \
  --json > "$work/aio_w.json" 2>/dev/null
"$ZINF" aio read --path "$work/probe" --size 2G --block-size 1M --queue-depth 8 --threads 1 --loops 1 --fixed-buffers \
  --json > "$work/aio_r.json" 2>/dev/null
rm -f "$work/probe"
copy=$("$ZINF" bench copy --device cpu --json 2>/dev/null | python3 -c \
  'import json,sys; j=json.load(sys.stdin); print(min(j["h2d_gb_per_s"], j["d2h_gb_per_s"]))')
rates=(--adam-json "$work/adam.json" --aio-json "$work/aio_r.json" --aio-json "$work/aio_w.json" --copy-gbps "$copy")

run() {  # NAME MODEL-BENCH-ARGS -- TRAIN-ARGS
  local name=$1; shift
  local model_args=()
  while [[ $1 != -- ]]; do model_args+=("$1"); shift; done
  shift
  "$ZINF" bench model "${model_args[@]}" --dtype bf16 --steps 3 --json > "$work/model.json" 2>/dev/null
  echo "## $name"
  (cd "$work" && ZINF_TMPDIR="$work" "$ZINF" train --sample-tokens 0 "$@" "${rates[@]}" --model-json "$work/model.json" 2>&1) |
    grep -E 'predicted step|step time:|memory:'
}
run "embedded default" --preset tiny --layers 2 --d-model 64 --heads 4 --vocab 256 --seq-len 64 --micro-batch 8 --
run "gpt2, T=128, micro-batch 2, 5 steps" --preset gpt2 --seq-len 128 --micro-batch 2 -- \
  --model gpt2 --seq-len 128 --micro-batch 2 --steps 5
sed "s|/var/tmp|$work|g" "$here/configs/gpt2-xl-2g-nvme.json" > "$work/nvme.json"
run "gpt2-medium, T=32, parameters and optimizer on NVMe, 2 GiB device, 5 steps" \
  --preset gpt2-medium --seq-len 32 --micro-batch 1 -- \
  --model gpt2-medium --config "$work/nvme.json" --device-memory 2G --seq-len 32 --micro-batch 1 --steps 5
