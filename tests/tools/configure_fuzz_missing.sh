#!/usr/bin/env bash
# -DZINF_FUZZ=ON without clang, or with a clang that lacks its fuzzer and
# sanitizer runtime, must fail at configure time naming what is missing —
# never a build without the fuzz targets. Exit 77 (a skip) without clang for
# the second case.
set -u
src="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# CMake wraps long messages: compare with the whitespace squeezed.
expect_failure() {
  local dir="$1" want="$2"; shift 2
  local out rc flat
  out=$(cmake -S "$src" -B "$work/$dir" -G Ninja -DZINF_FUZZ=ON -DZINF_WITH_CUDA=OFF -DZINF_BUILD_TESTS=OFF "$@" 2>&1)
  rc=$?
  flat=$(tr -s ' \n' '  ' <<<"$out")
  if [[ $rc -eq 0 ]] || ! grep -qF "$want" <<<"$flat"; then
    echo "FAIL ($dir): expected a configure error containing: $want"; echo "$out"; exit 1
  fi
}
expect_failure gcc "ZINF_FUZZ=ON needs clang: the C++ compiler is GNU" -DCMAKE_CXX_COMPILER=g++ -DCMAKE_C_COMPILER=gcc
if ! command -v clang++ >/dev/null; then
  echo "skip: no clang++ to configure without its runtime"; exit 77
fi
# clang looking for its runtime in an empty resource directory.
expect_failure no-runtime "cannot link -fsanitize=fuzzer,address,undefined: clang's fuzzer and sanitizer runtime" \
  -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_FLAGS="-resource-dir=$work/empty" \
  -DCMAKE_EXE_LINKER_FLAGS="-resource-dir=$work/empty"
echo "ok: ZINF_FUZZ=ON without clang or its runtime fails with a clear message"
