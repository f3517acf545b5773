#!/usr/bin/env bash
# ABI hygiene (ctest: capi.exported_symbols): the dynamic symbols libzinf.so
# defines must be exactly the list in exported_symbols.txt, and that list
# must be exactly the functions zinf.h declares with ZINF_API — so no C++
# internal (or a dependency's symbol) leaks, and no declared function is
# missing. Also checks that every function-like declaration in zinf.h is
# marked ZINF_API and that the SONAME carries ZINF_ABI_VERSION.
# usage: check_exported_symbols.sh <libzinf.so> <zinf.h> <exported_symbols.txt>
set -euo pipefail
if [[ $# -ne 3 ]]; then
  echo "usage: $0 <libzinf.so> <zinf.h> <exported_symbols.txt>" >&2
  exit 2
fi
lib=$1 header=$2 list=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0

# Defined dynamic symbols, without version suffixes; the version node itself
# (type A, e.g. ZINF_0) is not a symbol of the API.
nm -D --defined-only "$lib" | awk '$2 != "A" { print $3 }' | sed 's/@.*//' | LC_ALL=C sort -u >"$work/exported"
sed -nE 's/^ZINF_API[^(]*[^a-zA-Z0-9_](zinf_[a-z0-9_]+)\(.*/\1/p' "$header" | LC_ALL=C sort -u >"$work/declared"
grep -vE '^[[:space:]]*(#|$)' "$list" | LC_ALL=C sort -u >"$work/listed"

# A declaration without ZINF_API would be declared but not exported.
unmarked=$(grep -nE '^[a-z].*[^a-zA-Z0-9_(*]zinf_[a-z0-9_]+\(' "$header" | grep -vE '^[0-9]+:(ZINF_API|typedef)' || true)
if [[ -n "$unmarked" ]]; then
  echo "FAIL: declarations in $header without ZINF_API:"; echo "$unmarked"; status=1
fi
if ! diff -u --label "exported by $(basename "$lib")" --label "listed in $(basename "$list")" \
       "$work/exported" "$work/listed"; then
  echo "FAIL: the exported symbols differ from $list (- exported only, + listed only)"; status=1
fi
if ! diff -u --label "declared in $(basename "$header")" --label "listed in $(basename "$list")" \
       "$work/declared" "$work/listed"; then
  echo "FAIL: the functions declared in $header differ from $list (- declared only, + listed only)"; status=1
fi
abi=$(sed -nE 's/^#define ZINF_ABI_VERSION ([0-9]+)$/\1/p' "$header")
soname=$(readelf -d "$lib" | sed -nE 's/.*\(SONAME\).*\[(.*)\]/\1/p')
if [[ "$soname" != "libzinf.so.$abi" ]]; then
  echo "FAIL: SONAME is '$soname', expected libzinf.so.$abi (ZINF_ABI_VERSION in $header)"; status=1
fi
if [[ $status -eq 0 ]]; then
  echo "PASS: $(wc -l <"$work/exported") exported symbols = $list = ZINF_API functions of $(basename "$header"); SONAME $soname"
fi
exit $status
