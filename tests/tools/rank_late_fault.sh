#!/usr/bin/env bash
# A fault after the last collective: under mpirun with 4 ranks (ZeRO stage
# 3), rank 1's device allocation fails while `zinf train` reads the trained
# weights back, the last work the ranks do before rank 0's report. Every
# rank must exit non-zero, the others naming rank 1 and the cause: a rank
# that had nothing collective left once ended well here.
#
# The allocation is found by counting: a run without faults counts rank 1's
# allocations (ZINF_FAULT=count), then the last ones are failed in turn,
# latest first, until one fails in "read weights".
#   rank_late_fault.sh ZINF SCRATCH_DIR
set -euo pipefail
ZINF=$(realpath "$1")
DIR=$(realpath -m "$2")/rank_late_fault
N=4
VICTIM=1
MPI=(mpirun --allow-run-as-root --oversubscribe --bind-to none --quiet)
export ZINF_LOG_LEVEL=warn
rm -rf "$DIR" && mkdir -p "$DIR" && cd "$DIR"

cat > cfg.json <<'EOF'
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.003}},
 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "offload_optimizer": {"device": "cpu"}},
 "zinf": {"comm_timeout_s": 10}}
EOF

# Each rank writes its output and exit status; the victim gets the fault.
cat > rank.sh <<'EOF'
#!/bin/bash
r=$OMPI_COMM_WORLD_RANK
[[ "$r" == "$VICTIM" ]] && export ZINF_FAULT="$FAULT"
"$@" > "$OUT/out.$r" 2> "$OUT/err.$r"
echo $? > "$OUT/rc.$r"
exit 0
EOF
chmod +x rank.sh

run() {  # OUT FAULT
  rm -rf "$1" && mkdir -p "$1"
  OUT=$DIR/$1 VICTIM=$VICTIM FAULT=$2 timeout -k 5 120 "${MPI[@]}" -x OUT -x VICTIM -x FAULT -x ZINF_LOG_LEVEL \
    -np $N ./rank.sh "$ZINF" train --config cfg.json --steps 2 --layers 1 --d-model 32 --seq-len 32 \
    --threads 1 --sample-tokens 8 > "$1/mpirun.log" 2>&1 || true
  for r in $(seq 0 $((N - 1))); do
    [[ -f "$1/rc.$r" ]] || { echo "$1: rank $r never exited"; cat "$1/mpirun.log"; exit 1; }
  done
}

run ref count
for r in $(seq 0 $((N - 1))); do
  [[ "$(cat ref/rc.$r)" == 0 ]] || { echo "the run without faults failed on rank $r:"; cat "ref/err.$r"; exit 1; }
done
allocs=$(sed -nE 's/.*ZINF_FAULT counts: alloc ([0-9]+),.*/\1/p' "ref/err.$VICTIM")
[[ -n "$allocs" ]] || { echo "rank $VICTIM counted no allocations:"; cat "ref/err.$VICTIM"; exit 1; }

for ((k = allocs; k > 0 && k > allocs - 40; --k)); do
  run f "alloc:$k"
  grep -q "read weights" "f/err.$VICTIM" || continue
  echo "alloc:$k of $allocs fails rank $VICTIM in the final read of the weights"
  for r in $(seq 0 $((N - 1))); do
    rc=$(cat "f/rc.$r")
    [[ "$rc" != 0 ]] || { echo "rank $r exited 0 after rank $VICTIM's fault:"; cat "f/err.$r"; exit 1; }
    [[ $r == "$VICTIM" ]] && continue
    grep -q "rank $VICTIM stopped" "f/err.$r" || { echo "rank $r does not name rank $VICTIM:"; cat "f/err.$r"; exit 1; }
    grep -q "OutOfMemory" "f/err.$r" || { echo "rank $r does not name the cause:"; cat "f/err.$r"; exit 1; }
  done
  echo "every rank exited non-zero, naming rank $VICTIM and the cause"
  exit 0
done
echo "none of rank $VICTIM's last 40 allocations (of $allocs) falls in the final read of the weights"
exit 1
