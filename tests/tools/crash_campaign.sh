#!/usr/bin/env bash
# The checkpoint crash campaign: `zinf train --save-every 1` is killed with
# SIGKILL at a random moment (during a step, during a save, between the
# rename and the pointer update), ROUNDS times. Each time, the newest
# complete checkpoint (`latest`) must load, verify and resume to the end of
# the run with exactly the losses and gradient norms of a run that was never
# interrupted. Usage: crash_campaign.sh ZINF SCRATCH_DIR
set -euo pipefail
ZINF=$(realpath "$1")
DIR=$(realpath -m "$2")/crash_campaign
ROUNDS=${ROUNDS:-40}
SHAPE="--steps 24 --layers 1 --d-model 32 --seq-len 32 --micro-batch 4"
export ZINF_LOG_LEVEL=warn
rm -rf "$DIR" && mkdir -p "$DIR" && cd "$DIR"

"$ZINF" train $SHAPE --metrics-json ref.jsonl > ref.out 2>&1
tail -n 1 ref.jsonl > ref.last

killed_before_first_save=0
resumed=0
for round in $(seq 1 "$ROUNDS"); do
  rm -rf ck run.jsonl
  "$ZINF" train $SHAPE --save-dir ck --save-every 1 --keep 2 > run.out 2>&1 &
  pid=$!
  # 20 .. 700 ms: the whole run takes about a second here.
  sleep "0.$(printf '%03d' $(( (RANDOM % 680) + 20 )))"
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  if [[ ! -f ck/latest ]]; then
    killed_before_first_save=$((killed_before_first_save + 1))
    continue
  fi
  latest=$(cat ck/latest)
  [[ -f "ck/$latest/manifest.json" ]] || { echo "round $round: latest -> $latest has no manifest"; exit 1; }
  if ! "$ZINF" train $SHAPE --save-dir ck --resume latest --metrics-json run.jsonl > resume.out 2>&1; then
    echo "round $round: resume from $latest failed:"; cat resume.out; exit 1
  fi
  if [[ -s run.jsonl ]]; then
    # The resumed run's last step equals the uninterrupted run's, bit for bit
    # (the JSON numbers print every digit of the doubles).
    python3 - ref.last run.jsonl <<'PY' || { echo "round $round: resumed from $latest, different result"; exit 1; }
import json, sys
ref = json.loads(open(sys.argv[1]).read())
last = json.loads(open(sys.argv[2]).read().splitlines()[-1])
assert last["step"] == ref["step"], (last["step"], ref["step"])
assert last["loss"] == ref["loss"] and last["grad_norm"] == ref["grad_norm"], (last, ref)
PY
  fi
  resumed=$((resumed + 1))
done
echo "crash campaign: $ROUNDS kills, $resumed resumed bit-exactly from latest, $killed_before_first_save before the first save"
[[ $resumed -gt 0 ]] || { echo "no round reached a checkpoint: the kill window is too early"; exit 1; }
