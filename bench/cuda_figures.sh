#!/usr/bin/env bash
# The CUDA model's figures in one pass (a GPU's time is scarce): its GPU
# tests, then forward+backward MFU with each op's share, the attention
# kernels' variants, long context, each kernel's time under Nsight Compute
# (bench/ncu_kernel_times.py) where ncu is installed, and PyTorch on the
# same shapes where its CUDA build is installed. Each part has a time limit, so a hang
# costs minutes, not the run; a failing part is reported and the rest go on.
#
#   bench/cuda_figures.sh [OUT]      (default OUT: ./cuda-figures; logs and one summary.txt)
#
# ZINF points at the zinf binary (default: build/zinf), GPU_TEST at the GPU
# test binary (default: build/tests/gpu_test; skipped when missing), and
# PYTHON at an interpreter with a CUDA PyTorch (default: python3).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OUT=${1:-cuda-figures}
ZINF=${ZINF:-$here/../build/zinf}
GPU_TEST=${GPU_TEST:-$here/../build/tests/gpu_test}
PYTHON=${PYTHON:-python3}
[[ -x "$ZINF" ]] || { echo "cuda_figures: no zinf binary at $ZINF (build first: scripts/build)" >&2; exit 1; }
mkdir -p "$OUT" || exit 2
summary=$OUT/summary.txt
: > "$summary"
t0=$SECONDS
note() { echo "$*" | tee -a "$summary"; }

# part NAME LIMIT_S CMD...: runs CMD into OUT/NAME.txt; notes its exit code and time.
part() {
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  note "== $name: rc=$rc, $((SECONDS - t0)) s in"
  return $rc
}

note "# cuda_figures: $("$ZINF" --version 2>&1 | head -1), $(date -u +%Y-%m-%dT%H:%MZ)"
if [[ -x "$GPU_TEST" ]]; then
  part gpu_test 240 "$GPU_TEST" --gtest_brief=1
  grep -E "^\[  (PASSED|FAILED|SKIPPED)|Failure|error (out|dqkv)|T=8192" "$OUT/gpu_test.txt" | head -20 | tee -a "$summary"
fi

flags=(--device cuda --dtype bf16 --grad-dtype bf16 --matmul bf16 --attention flash --steps 3)
keep() { grep -E "^(# (zinf bench model|MFU|step|activ)|forward|backward|step |  [a-z]|[a-z][a-z /-]+ +[0-9.]+ +[0-9.]+%)" "$1" \
  | head -"${2:-24}" | tee -a "$summary"; }
part llama_1b 120 "$ZINF" bench model --preset llama-3.2-1b --seq-len 2048 --micro-batch 2 "${flags[@]}" --breakdown \
  && keep "$OUT/llama_1b.txt"
part llama_1b_chunk4096 120 "$ZINF" bench model --preset llama-3.2-1b --seq-len 2048 --micro-batch 2 "${flags[@]}" \
  --loss-chunk-rows 4096 && keep "$OUT/llama_1b_chunk4096.txt" 12
part gpt_1_3b 120 "$ZINF" bench model --preset gpt-1.3b --seq-len 2048 --micro-batch 2 "${flags[@]}" --breakdown \
  && keep "$OUT/gpt_1_3b.txt" 16
part attention_llama 60 "$ZINF" bench attention --preset llama-3.2-1b --seq-len 2048 --micro-batch 2 \
  && tee -a "$summary" < "$OUT/attention_llama.txt"
part attention_d128 60 "$ZINF" bench attention --preset llama-3.2-3b --seq-len 4096 --micro-batch 1 \
  && tee -a "$summary" < "$OUT/attention_d128.txt"
part t8192 120 "$ZINF" bench model --preset llama-3.2-1b --layers 2 --seq-len 8192 --micro-batch 1 "${flags[@]}" \
  --checkpointing && keep "$OUT/t8192.txt" 10

# Nsight Compute where installed: every kernel's time in 2 layers of
# llama-3.2-1b (one step), and the flash kernels' throughput and occupancy.
if command -v ncu > /dev/null; then
  two_layers=(bench model --preset llama-3.2-1b --layers 2 --steps 1 --seq-len 2048 --micro-batch 2 "${flags[@]:0:10}")
  part ncu_kernels 240 ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw "$ZINF" \
    "${two_layers[@]}" && python3 "$here/ncu_kernel_times.py" "$OUT/ncu_kernels.txt" --top 25 | tee -a "$summary"
  part ncu_flash 180 ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
    -k regex:Flash -c 4 "$ZINF" "${two_layers[@]}" \
    && grep -E "Flash|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Theoretical Occupancy" \
      "$OUT/ncu_flash.txt" | head -60 | tee -a "$summary"
else
  note "== ncu: not installed (skipped)"
fi

if "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  for p in "llama-3.2-1b 2" "gpt-1.3b 2"; do
    set -- $p
    part "torch_$1" 180 "$PYTHON" "$here/torch_gpt_step.py" --preset "$1" --seq-len 2048 --micro-batch "$2" \
      && tail -2 "$OUT/torch_$1.txt" | tee -a "$summary"
  done
else
  note "== torch: no CUDA PyTorch for $PYTHON (skipped)"
fi
note "# done in $((SECONDS - t0)) s; logs in $OUT"
