# ZINF_FUZZ: libFuzzer targets for every input format zinf reads (tests/fuzz),
# built by clang with -fsanitize=fuzzer,address,undefined. Off by default;
# ON needs clang and its libFuzzer runtime, and anything else is a configure
# error naming what is missing (never a build without the targets). A fuzz
# build is its own tree:
#   CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DZINF_FUZZ=ON -DZINF_WITH_CUDA=OFF
#   cmake --build build-fuzz --target zinf_fuzz
option(ZINF_FUZZ "Build the libFuzzer targets of tests/fuzz (needs clang and its fuzzer runtime)" OFF)
if(NOT ZINF_FUZZ)
  return()
endif()

if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "ZINF_FUZZ=ON needs clang: the C++ compiler is ${CMAKE_CXX_COMPILER_ID} "
                      "${CMAKE_CXX_COMPILER_VERSION} (${CMAKE_CXX_COMPILER}). Configure a separate build directory "
                      "with CC=clang CXX=clang++ (Debian: apt-get install clang libclang-rt-14-dev, or "
                      "scripts/setup --with clang --with libclang-rt-14-dev).")
endif()
include(CheckCXXSourceCompiles)
set(CMAKE_REQUIRED_FLAGS "-fsanitize=fuzzer,address,undefined")
set(CMAKE_REQUIRED_LINK_OPTIONS "-fsanitize=fuzzer,address,undefined")
check_cxx_source_compiles([[
#include <cstddef>
#include <cstdint>
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return data && size ? 0 : 0; }
]] ZINF_HAVE_LIBFUZZER)
unset(CMAKE_REQUIRED_FLAGS)
unset(CMAKE_REQUIRED_LINK_OPTIONS)
if(NOT ZINF_HAVE_LIBFUZZER)
  string(REGEX MATCH "^[0-9]+" _zinf_clang_major "${CMAKE_CXX_COMPILER_VERSION}")
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libclang_rt.fuzzer-${CMAKE_SYSTEM_PROCESSOR}.a
                  OUTPUT_VARIABLE _zinf_fuzzer_rt OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  message(FATAL_ERROR "ZINF_FUZZ=ON: ${CMAKE_CXX_COMPILER} ${CMAKE_CXX_COMPILER_VERSION} cannot link "
                      "-fsanitize=fuzzer,address,undefined: clang's fuzzer and sanitizer runtime "
                      "(${_zinf_fuzzer_rt}) is missing. Debian: apt-get install libclang-rt-${_zinf_clang_major}-dev "
                      "(or scripts/setup --with libclang-rt-14-dev).")
endif()
