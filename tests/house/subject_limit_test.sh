#!/bin/bash
# scripts/check_house's commit-subject limit: in a clone of this repository,
# a new commit whose subject is over 72 characters is reported (exit 1,
# naming the commit), and the clone as it was passes. Skipped (exit 77)
# outside a git checkout.
#   subject_limit_test.sh REPOSITORY_ROOT SCRATCH
set -euo pipefail
root=$1 scratch=$2
if ! git -C "$root" rev-parse --git-dir > /dev/null 2>&1; then
  echo "SKIP: $root is not a git checkout"
  exit 77
fi
rm -rf "$scratch" && mkdir -p "$scratch"
git clone -q --shared "$root" "$scratch/repo"
python3 "$root/scripts/check_house" "$scratch/repo" | tail -1
long="house: $(printf 'a%.0s' {1..70})"
git -C "$scratch/repo" -c user.name=test -c user.email=test@localhost commit -q --allow-empty -m "$long"
if out=$(python3 "$root/scripts/check_house" "$scratch/repo"); then
  echo "a subject of ${#long} characters passed: $out"
  exit 1
fi
grep -q "subject of ${#long} characters (limit 72" <<< "$out" || { echo "unclear finding: $out"; exit 1; }
echo "a subject of ${#long} characters: reported"
rm -rf "$scratch"
