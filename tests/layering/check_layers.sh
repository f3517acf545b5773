#!/usr/bin/env bash
# The arrows between zinf's areas, as the build enforces them: each area
# compiles against build/src/layers/<area>/, and a header of an area it may
# not use must not resolve there. The table below is the architecture
# (docs/design.md), written independently of src/CMakeLists.txt, so a change
# to either that breaks an arrow fails here.
# Usage: check_layers.sh <c++ compiler> <build>/src/layers
set -u
cxx="$1"
layers="$2"

declare -A header=(
  [common]=common/logging.h [math]=math/adam_math.h [cpu]=cpu/adam.h [nvme]=nvme/io_engine.h
  [gpu]=gpu/kernels.h [model]=model/gpt.h [data]=data/tokenizer.h [exec]=exec/gpt_device.h
  [sched]=sched/plan.h [capi]=capi/capi_internal.h)
# What each area may include (besides itself).
declare -A may=(
  [common]=""
  [math]="common"
  [cpu]="math common"
  [nvme]="common"
  [gpu]="math common"
  [model]="cpu math common"
  [data]="model cpu math common"
  [exec]="model gpu cpu math common"
  [sched]="gpu nvme cpu math common"
  [capi]="sched gpu nvme cpu math common")

failures=0
checks=0
for area in "${!may[@]}"; do
  for other in "${!header[@]}"; do
    allowed=0
    [[ "$other" == "$area" || " ${may[$area]} " == *" $other "* ]] && allowed=1
    out=$(printf '#if __has_include("%s")\nreachable\n#else\nunreachable\n#endif\n' "${header[$other]}" |
          "$cxx" -E -P -x c++ -I "$layers/$area" - 2>&1 | tr -d '[:space:]')
    checks=$((checks + 1))
    if [[ "$out" != "reachable" && "$out" != "unreachable" ]]; then
      echo "FAIL: $area -> $other: the preprocessor said: $out"
      failures=$((failures + 1))
    elif [[ $allowed == 1 && "$out" != "reachable" ]]; then
      echo "FAIL: $area may include $other, but ${header[$other]} does not resolve in $layers/$area"
      failures=$((failures + 1))
    elif [[ $allowed == 0 && "$out" != "unreachable" ]]; then
      echo "FAIL: $area must not include $other, but ${header[$other]} resolves in $layers/$area"
      failures=$((failures + 1))
    fi
  done
done
echo "$checks arrows checked, $failures wrong"
[[ $failures == 0 ]]
