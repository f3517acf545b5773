#!/usr/bin/env bash
# The installed-tree test of the C ABI (ctest: capi.installed_consumers):
#   1. `cmake --install` the build tree into a fresh temporary prefix and
#      check what lands there (zinf.h as the only header, libzinf.so with its
#      SONAME, the CMake package, zinf.pc);
#   2. compile zinf.h alone as C99 and C++11 with -pedantic -Werror, with no
#      include path but the prefix's (no CUDA, liburing or MPI headers);
#   3. configure and build tests/capi/consumer with find_package(zinf) and
#      run the C and C++ consumers;
#   4. build the same two programs with nothing but `pkg-config zinf` and run
#      them again;
#   5. with a static build (ZINF_BUILD_STATIC=ON): link the C consumer against
#      libzinf.a, through zinf::zinf_static and through `pkg-config
#      zinf-static`, check it does not load libzinf.so, and run it.
# usage: installed_consumers.sh <build dir> <source dir> <cmake> <C compiler> <C++ compiler> <static ON|OFF>
set -euo pipefail
if [[ $# -ne 6 ]]; then
  echo "usage: $0 <build dir> <source dir> <cmake> <C compiler> <C++ compiler> <static ON|OFF>" >&2
  exit 2
fi
build=$1 src=$2 cmake=$3 cc=$4 cxx=$5
case "$6" in ON | on | TRUE | true | 1 | YES | yes) static=1 ;; *) static=0 ;; esac
consumer=$src/tests/capi/consumer
mkdir -p "${TMPDIR:-/tmp}"
work=$(mktemp -d "${TMPDIR:-/tmp}/zinf-capi.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
mkdir -p "$work/scratch"
unset LD_LIBRARY_PATH PKG_CONFIG_PATH CMAKE_PREFIX_PATH  # only the temporary prefix may provide zinf
step() { echo "== $*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }

step "cmake --install $build --prefix $prefix"
"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log"; fail "install"; }
lib=$(find "$prefix" -name 'libzinf.so' | head -n1)
[[ -n "$lib" ]] || fail "no libzinf.so under $prefix"
libdir=$(dirname "$lib")
headers=$(cd "$prefix" && find . -name '*.h' -o -name '*.hpp' | sort)
[[ "$headers" == "./include/zinf/zinf.h" ]] || fail "installed headers are not exactly include/zinf/zinf.h: $headers"
abi=$(sed -nE 's/^#define ZINF_ABI_VERSION ([0-9]+)$/\1/p' "$prefix/include/zinf/zinf.h")
soname=$(readelf -d "$lib" | sed -nE 's/.*\(SONAME\).*\[(.*)\]/\1/p')
[[ "$soname" == "libzinf.so.$abi" ]] || fail "SONAME is '$soname', expected libzinf.so.$abi"
[[ -e "$libdir/libzinf.so.$abi" ]] || fail "no $libdir/libzinf.so.$abi"
[[ -f "$libdir/cmake/zinf/zinfConfig.cmake" && -f "$libdir/cmake/zinf/zinfConfigVersion.cmake" ]] ||
  fail "no zinfConfig.cmake / zinfConfigVersion.cmake in $libdir/cmake/zinf"
[[ -f "$libdir/pkgconfig/zinf.pc" ]] || fail "no $libdir/pkgconfig/zinf.pc"
echo "   $(cd "$prefix" && find . -type f -o -type l | sort | tr '\n' ' ')"

step "zinf.h alone: C99 and C++11, -pedantic -Werror, include path = the prefix only"
printf '#include <zinf/zinf.h>\nint main(void) { return zinf_abi_version() == ZINF_ABI_VERSION ? 0 : 1; }\n' >"$work/h.c"
"$cc" -std=c99 -Wall -Wextra -pedantic -Werror -I"$prefix/include" -c "$work/h.c" -o "$work/h_c.o"
"$cxx" -std=c++11 -Wall -Wextra -pedantic -Werror -x c++ -I"$prefix/include" -c "$work/h.c" -o "$work/h_cxx.o"

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
step "find_package(zinf): configure and build $consumer"
"$cmake" -S "$consumer" -B "$work/cmake-build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" >"$work/configure.log" ||
  { cat "$work/configure.log"; fail "configure"; }
grep -F "zinf 0." "$work/configure.log" | sed 's/^/   /'
"$cmake" --build "$work/cmake-build" >"$work/build.log" 2>&1 || { cat "$work/build.log"; fail "build"; }
for exe in c_consumer cxx_consumer; do
  resolved=$(ldd "$work/cmake-build/$exe" | sed -nE 's/.*libzinf\.so[^ ]* => ([^ ]*).*/\1/p')
  [[ "$resolved" == "$libdir/"* ]] || fail "$exe loads libzinf from '$resolved', not from $libdir"
  step "run $exe (find_package build)"
  "$work/cmake-build/$exe" "$work/scratch"
done

step "pkg-config zinf: build and run the same consumers"
export PKG_CONFIG_PATH=$libdir/pkgconfig
version=$(pkg-config --modversion zinf)
[[ "$version" == "$(sed -nE 's/^Version: //p' "$libdir/pkgconfig/zinf.pc")" ]] || fail "pkg-config --modversion: $version"
read -r -a cflags <<<"$(pkg-config --cflags zinf)"
read -r -a libs <<<"$(pkg-config --libs zinf)"
echo "   cflags: ${cflags[*]}  libs: ${libs[*]}"
mkdir -p "$work/pc"
"$cc" -std=c99 -O2 -Wall -Wextra -pedantic -Werror "${cflags[@]}" "$consumer/c_consumer.c" -o "$work/pc/c_consumer" \
  "${libs[@]}" -lm -Wl,-rpath,"$libdir"
"$cxx" -std=c++17 -O2 -Wall -Wextra -Werror "${cflags[@]}" "$consumer/cxx_consumer.cc" -o "$work/pc/cxx_consumer" \
  "${libs[@]}" -pthread -Wl,-rpath,"$libdir"
for exe in c_consumer cxx_consumer; do
  step "run $exe (pkg-config build)"
  "$work/pc/$exe" "$work/scratch"
done

if ((static)); then
  step "libzinf.a: the C consumer linked statically (zinf::zinf_static, pkg-config zinf-static)"
  [[ -f "$libdir/libzinf.a" ]] || fail "ZINF_BUILD_STATIC is on but there is no $libdir/libzinf.a"
  [[ -f "$libdir/pkgconfig/zinf-static.pc" ]] || fail "no $libdir/pkgconfig/zinf-static.pc"
  [[ -x "$work/cmake-build/c_consumer_static" ]] || fail "find_package(zinf) did not define zinf::zinf_static"
  read -r -a slibs <<<"$(PKG_CONFIG_PATH=$libdir/pkgconfig pkg-config --libs zinf-static)"
  "$cc" -std=c99 -O2 -Wall -Wextra -pedantic -Werror "${cflags[@]}" "$consumer/c_consumer.c" \
    -o "$work/pc/c_consumer_static" "${slibs[@]}" -lm
  for exe in "$work/cmake-build/c_consumer_static" "$work/pc/c_consumer_static"; do
    if ldd "$exe" | grep -q 'libzinf\.so'; then fail "$exe loads libzinf.so"; fi
    step "run $exe"
    "$exe" "$work/scratch"
  done
else
  [[ ! -e "$libdir/libzinf.a" ]] || fail "libzinf.a installed without ZINF_BUILD_STATIC"
fi
echo "PASS: installed consumers (find_package and pkg-config$( ((static)) && echo ', shared and static'))"
