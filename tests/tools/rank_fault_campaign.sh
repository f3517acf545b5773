#!/usr/bin/env bash
# The rank fault campaign: `zinf train` under mpirun with 2 and 4 ranks
# (ZeRO stage 2 or 3, the optimizer on cpu or nvme, a checkpoint every step)
# while one rank, chosen at random, meets one fault at a random point:
#   alloc   its Nth device allocation fails          (ZINF_FAULT=alloc:N)
#   eio     its Nth NVMe transfer fails with EIO     (ZINF_FAULT=eio:N)
#   enospc  its Nth NVMe write fails with ENOSPC     (ZINF_FAULT=enospc:N)
#   ring    its Nth io_uring submission fails hard   (ZINF_FAULT=ring:N)
#   nan     its Nth micro-step's loss is NaN         (ZINF_FAULT=nan:N, with
#           zinf.stop_on_nonfinite_loss)
#   kill    it is SIGKILLed at a random moment of the training
#   start   it is SIGKILLed at a random moment of the start-up (from launch
#           to the first checkpoint: MPI_Init, the model, the first step)
# N is drawn from the events that rank counted in a run without faults
# (ZINF_FAULT=count). Each round must end with every rank exiting non-zero
# within the collectives' deadline (zinf.comm_timeout_s, 5 s here) + 5 s,
# every survivor naming the failed rank and the cause, except inside MPI's
# start-up, where no one can say which rank is missing and the survivors'
# start-up watch names the MPI call instead (or its exit handler does, when
# MPI's runtime ends the process itself with exit()), or the survivor says
# nothing at all when MPI's runtime ends it there without exit handlers
# (counted apart); then a new run resumed
# from `latest` (or from scratch when no checkpoint was complete) must end
# with exactly the loss and gradient norm of the run that never failed.
# Prints the rounds and the median and maximum time to detection (the fault
# to the last survivor's exit).
#   rank_fault_campaign.sh ZINF SCRATCH_DIR      (ROUNDS=50 by default)
set -euo pipefail
ZINF=$(realpath "$1")
DIR=$(realpath -m "$2")/rank_fault_campaign
ROUNDS=${ROUNDS:-50}
TIMEOUT_S=5
SHAPE=(--steps 6 --layers 1 --d-model 32 --seq-len 32)
MPI=(mpirun --allow-run-as-root --oversubscribe --bind-to none --quiet --enable-recovery)
export ZINF_LOG_LEVEL=warn
rm -rf "$DIR" && mkdir -p "$DIR" && cd "$DIR"

# Each rank through this wrapper: its fault (the victim only), its pid, and
# its exit code with the time it exited. The wrapper itself exits 0: the
# verdict is read from the files, not from mpirun.
cat > rank.sh <<'EOF'
#!/bin/bash
r=$OMPI_COMM_WORLD_RANK
if [[ "$VICTIM" == all || "$VICTIM" == "$r" ]] && [[ -n "$FAULT" ]]; then export ZINF_FAULT="$FAULT"; fi
"$@" > "$OUT/out.$r" 2> "$OUT/err.$r" &
echo $! > "$OUT/pid.$r"
wait $!
echo "$? $(date +%s.%N)" > "$OUT/rc.$r"
exit 0
EOF
chmod +x rank.sh

config() {  # stage offload -> a config file
  local f="cfg-$1-$2.json"
  cat > "$f" <<EOF
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
 "bf16": {"enabled": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.01}},
 "zero_optimization": {"stage": $1, "stage3_param_persistence_threshold": 0,
   "offload_optimizer": {"device": "$2", "nvme_path": "$DIR/nvme"}},
 "zinf": {"comm_timeout_s": $TIMEOUT_S, "stop_on_nonfinite_loss": true}}
EOF
  echo "$f"
}

# run OUT RANKS VICTIM FAULT -- zinf train arguments: mpirun in the background
# mpirun can outlive its ranks: after a rank is killed inside MPI_Init it
# was seen waiting on with every rank exited, deaf to SIGTERM. So once each
# rank has written its exit code, mpirun gets 5 s to leave before it is
# killed; and the 120 s limit ends with SIGKILL if SIGTERM does not.
run() {
  local out=$1 n=$2 victim=$3 fault=$4; shift 4
  rm -rf "$out" && mkdir -p "$out"
  OUT=$DIR/$out VICTIM=$victim FAULT=$fault timeout -k 5 120 "${MPI[@]}" -x OUT -x VICTIM -x FAULT -x ZINF_LOG_LEVEL \
    -np "$n" ./rank.sh "$ZINF" train "$@" > "$out/mpirun.log" 2>&1 &
  local pid=$! ticks=0
  while kill -0 "$pid" 2>/dev/null; do
    if [[ $(find "$out" -maxdepth 1 -name 'rc.*' | wc -l) -ge $n ]] && ((++ticks > 50)); then
      echo "mpirun still running 5 s after its $n ranks exited: killed" >> "$out/mpirun.log"
      pkill -KILL -P "$pid"  # mpirun, the child of timeout
      wait "$pid" || true
      return 0  # the ranks' verdicts are in their files
    fi
    sleep 0.1
  done
  wait "$pid"
}

mkdir -p nvme
declare -A REF_LAST REF_SECONDS REF_START REF_COUNTS  # by ranks-stage-offload
CONFIGS=()
for n in 2 4; do
  for stage in 2 3; do
    for offload in cpu nvme; do
      key="$n-$stage-$offload"
      CONFIGS+=("$key")
      cfg=$(config "$stage" "$offload")
      launched=$(date +%s.%N)
      run "ref-$key" "$n" all count --config "$cfg" "${SHAPE[@]}" --save-dir "ck-ref-$key" --save-every 1 --keep 1000 \
        --metrics-json "ref-$key/m.jsonl"
      for r in $(seq 0 $((n - 1))); do
        read -r rc _ < "ref-$key/rc.$r"
        [[ "$rc" == 0 ]] || { echo "reference $key: rank $r exited $rc"; cat "ref-$key/err.$r"; exit 1; }
      done
      REF_LAST[$key]=$(tail -n 1 "ref-$key/m.jsonl")
      # The training's own span, from the first checkpoint to the last: the
      # window a kill lands in.
      REF_SECONDS[$key]=$(awk "BEGIN { print $(stat -c %.9Y "ck-ref-$key/step-${SHAPE[1]}") - \
                                              $(stat -c %.9Y "ck-ref-$key/step-1") }")
      # The start-up: from the launch to the first checkpoint.
      REF_START[$key]=$(awk "BEGIN { print $(stat -c %.9Y "ck-ref-$key/step-1") - $launched }")
      for r in $(seq 0 $((n - 1))); do
        REF_COUNTS[$key-$r]=$(grep -o 'ZINF_FAULT counts: .*' "ref-$key/err.$r")
      done
    done
  done
done

count_of() {  # "ZINF_FAULT counts: alloc A, read R, write W, submit S, loss L" kind
  local c=$1 kind=$2 a r w s l
  read -r a r w s l <<< "$(sed -E 's/.*alloc ([0-9]+), read ([0-9]+), write ([0-9]+), submit ([0-9]+), loss ([0-9]+).*/\1 \2 \3 \4 \5/' <<< "$c")"
  case $kind in
    alloc) echo "$a" ;; eio) echo $((r + w)) ;; enospc) echo "$w" ;; ring) echo "$s" ;; nan) echo "$l" ;;
  esac
}

KINDS=(alloc eio enospc ring nan kill start)
declare -A BY_KIND
startup_watched=0 mpi_silent=0
detections=()
survived=0 not_fired=0
for round in $(seq 1 "$ROUNDS"); do
  key=${CONFIGS[$((RANDOM % ${#CONFIGS[@]}))]}
  IFS=- read -r n stage offload <<< "$key"
  cfg="cfg-$stage-$offload.json"
  kind=${KINDS[$((RANDOM % ${#KINDS[@]}))]}
  victim=$((RANDOM % n))
  fault=""
  if [[ $kind != kill && $kind != start ]]; then
    events=$(count_of "${REF_COUNTS[$key-$victim]}" "$kind")
    if [[ "$events" -lt 1 ]]; then kind=kill; else fault="$kind:$(( (RANDOM * 32768 + RANDOM) % events + 1 ))"; fi
  fi
  rm -rf ck f && mkdir -p ck
  what="round $round: $n ranks, stage $stage, optimizer on $offload, rank $victim, ${fault:-SIGKILL}"
  [[ $kind == start ]] && what+=" during start-up"
  if [[ $kind == kill || $kind == start ]]; then
    run f "$n" none "" --config "$cfg" "${SHAPE[@]}" --save-dir ck --save-every 1 &
    mpirun_pid=$!
    if [[ $kind == kill ]]; then
      # A random moment of the training: after the first step.
      for _ in $(seq 1 3000); do
        [[ -d ck/step-1 ]] && break
        kill -0 "$mpirun_pid" 2>/dev/null || break
        sleep 0.02
      done
      span=${REF_SECONDS[$key]}
    else
      # A random moment of the start-up, from the victim's launch.
      for _ in $(seq 1 3000); do
        [[ -f f/pid.$victim ]] && break
        kill -0 "$mpirun_pid" 2>/dev/null || break
        sleep 0.005
      done
      span=${REF_START[$key]}
    fi
    delay=$(awk "BEGIN { printf \"%.3f\", $span * ($RANDOM % 1000) / 1000 }")
    sleep "$delay"
    fault_at=$(date +%s.%N)
    if [[ -f f/pid.$victim ]] && kill -9 "$(cat f/pid.$victim)" 2>/dev/null; then :; else fault_at=""; fi
    wait "$mpirun_pid" || true
  else
    run f "$n" "$victim" "$fault" --config "$cfg" "${SHAPE[@]}" --save-dir ck --save-every 1 || true
    fault_at=$(grep -o '^\[[0-9-]* [0-9:.]*\] \[zinf\] \[warning\] ZINF_FAULT: injecting' "f/err.$victim" | head -n 1 |
               sed -E 's/^\[([^]]*)\].*/\1/' || true)
    [[ -n "$fault_at" ]] && fault_at=$(date -d "$fault_at" +%s.%N)
  fi
  all_ok=1
  for r in $(seq 0 $((n - 1))); do
    [[ -f f/rc.$r ]] || { echo "$what: rank $r never exited (mpirun timed out)"; exit 1; }
    read -r rc _ < "f/rc.$r"
    [[ "$rc" == 0 ]] || all_ok=0
  done
  if [[ -z "$fault_at" ]]; then
    # The fault never fired (the run ended before event N, or before the kill).
    [[ $all_ok == 1 ]] || { echo "$what: failed without its fault:"; cat f/err.*; exit 1; }
    not_fired=$((not_fired + 1))
    continue
  fi
  if [[ ($kind == kill || $kind == start) && "$(cat ck/latest 2>/dev/null)" == "step-${SHAPE[1]}" ]]
  then
    # Killed after the last checkpoint was complete: the training was over,
    # so survivors that had left their last collective may end well, and a
    # victim that had already exited (kill still finds a process that is
    # being torn down) ends well too. A start-up kill lands there when this
    # run started faster than the reference run the delay is drawn from.
    not_fired=$((not_fired + 1))
    continue
  fi
  case $kind in
    alloc) cause="OutOfMemory" ;; eio | ring) cause="Input/output error" ;; enospc) cause="No space left on device" ;;
    nan) cause="the loss is nan" ;; kill) cause="silent ranks" ;; start) cause="silent ranks|MPI start-up" ;;
  esac
  last_exit=$fault_at
  for r in $(seq 0 $((n - 1))); do
    read -r rc t < "f/rc.$r"
    if [[ "$rc" == 0 ]]; then echo "$what: rank $r exited 0 after the fault"; cat "f/err.$r"; exit 1; fi
    [[ $r == "$victim" ]] && continue
    if [[ $kind == start ]] && grep -q "MPI start-up (" "f/err.$r"; then
      startup_watched=$((startup_watched + 1))  # stuck in MPI's start-up: the call is named, not the rank
    elif [[ $kind == start && ! -s "f/err.$r" && ! -s "f/out.$r" ]]; then
      # Open MPI's runtime ended it inside its start-up without running its
      # exit handlers (seen: status 1 or 195, 2 s after the kill, nothing
      # written): no code of the process's own can speak there.
      mpi_silent=$((mpi_silent + 1))
      last_exit=$(awk "BEGIN { printf \"%.6f\", ($t > $last_exit) ? $t : $last_exit }")
      continue
    else
      grep -Eq "rank $victim stopped|silent ranks: ([0-9]+, )*$victim\b" "f/err.$r" ||
        { echo "$what: rank $r (exit status $rc) does not name rank $victim:"; cat "f/err.$r"
          echo "mpirun's output:"; tail -n 20 f/mpirun.log; exit 1; }
    fi
    grep -Eq "$cause" "f/err.$r" || { echo "$what: rank $r does not name the cause ($cause):"; cat "f/err.$r"; exit 1; }
    last_exit=$(awk "BEGIN { printf \"%.6f\", ($t > $last_exit) ? $t : $last_exit }")
  done
  detection=$(awk "BEGIN { printf \"%.3f\", $last_exit - $fault_at }")
  if awk "BEGIN { exit !($detection > $TIMEOUT_S + 5) }"; then echo "$what: detection took $detection s"; exit 1; fi
  detections+=("$detection")
  # Resume: from latest when a checkpoint was complete, else from scratch.
  resume=()
  [[ -f ck/latest ]] && resume=(--resume latest)
  run g "$n" none "" --config "$cfg" "${SHAPE[@]}" --save-dir ck --save-every 1 "${resume[@]}" \
    --metrics-json "g/m.jsonl" || true
  for r in $(seq 0 $((n - 1))); do
    read -r rc _ < "g/rc.$r"
    [[ "$rc" == 0 ]] || { echo "$what: the resumed run failed on rank $r:"; cat "g/err.$r"; exit 1; }
  done
  # The final state, bit for bit: every rank's shard of every master, m and v
  # in the last checkpoint equals the uninterrupted run's; and the last
  # step's loss and gradient norm too, when the resumed run had steps left.
  final="step-${SHAPE[1]}"
  for r in $(seq 0 $((n - 1))); do
    cmp -s "ck/$final/rank-$r.bin" "ck-ref-$key/$final/rank-$r.bin" ||
      { echo "$what: resumed, rank $r's final state differs from the uninterrupted run's"; exit 1; }
  done
  if [[ -s g/m.jsonl ]]; then
    python3 - "${REF_LAST[$key]}" g/m.jsonl <<'PY' || { echo "$what: resumed, different result"; exit 1; }
import json, sys
ref = json.loads(sys.argv[1])
last = json.loads(open(sys.argv[2]).read().splitlines()[-1])
assert last["step"] == ref["step"], (last["step"], ref["step"])
assert last["loss"] == ref["loss"] and last["grad_norm"] == ref["grad_norm"], (last, ref)
PY
  fi
  survived=$((survived + 1))
  BY_KIND[$kind]=$(( ${BY_KIND[$kind]:-0} + 1 ))
  echo "$what: every rank stopped in $detection s; resumed ${resume[*]:-from scratch} bit-exactly"
done
sorted=$(printf '%s\n' "${detections[@]}" | sort -g)
count=$(wc -l <<< "$sorted")
median=$(sed -n "$(( (count + 1) / 2 ))p" <<< "$sorted")
max=$(tail -n 1 <<< "$sorted")
kinds=""
for k in "${KINDS[@]}"; do kinds+="${kinds:+, }$k ${BY_KIND[$k]:-0}"; done
echo "rank fault campaign: $ROUNDS rounds, $survived stopped every rank and resumed bit-exactly ($kinds), $not_fired faults never fired; time to detection median $median s, max $max s; $startup_watched survivors ended by the start-up watch, $mpi_silent ended silently by MPI's runtime in its start-up"
[[ $survived -ge $(( ROUNDS * 3 / 4 )) ]] || { echo "too few faults fired"; exit 1; }
