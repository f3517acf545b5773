#!/usr/bin/env bash
# -DZINF_WITH_CUDA=ON with no usable nvcc must fail at configure time with a
# message that names the missing compiler — never a quietly CPU-only build.
set -u
src="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out=$(cmake -S "$src" -B "$work" -G Ninja -DZINF_WITH_CUDA=ON -DCMAKE_CUDA_COMPILER=/nonexistent/bin/nvcc \
        -DZINF_BUILD_TESTS=OFF 2>&1)
rc=$?
if [[ $rc -eq 0 ]]; then
  echo "FAIL: configure succeeded with ZINF_WITH_CUDA=ON and no nvcc"; echo "$out"; exit 1
fi
# CMake wraps long messages: compare with the whitespace squeezed.
flat=$(tr -s ' \n' '  ' <<<"$out")
if ! grep -qF "ZINF_WITH_CUDA=ON but no CUDA compiler was found (looked for CMAKE_CUDA_COMPILER=/nonexistent/bin/nvcc)" <<<"$flat"; then
  echo "FAIL: configure failed without the expected message"; echo "$out"; exit 1
fi
out=$(cmake -S "$src" -B "$work/nccl" -G Ninja -DZINF_WITH_CUDA=OFF -DZINF_WITH_NCCL=ON -DZINF_BUILD_TESTS=OFF 2>&1)
rc=$?
flat=$(tr -s ' \n' '  ' <<<"$out")
if [[ $rc -eq 0 ]] || ! grep -qF "ZINF_WITH_NCCL=ON needs ZINF_WITH_CUDA=ON" <<<"$flat"; then
  echo "FAIL: ZINF_WITH_NCCL=ON without CUDA was not a clear configure error"; echo "$out"; exit 1
fi
echo "ok: both misconfigurations fail with a clear message"
