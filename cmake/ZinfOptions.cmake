# One INTERFACE target carrying zinf's warnings and code-generation flags.
# -ffp-contract=off is not optional: the Adam sequence must not be contracted
# into FMAs, or the SIMD levels, the scalar twin and CUDA stop agreeing bit for
# bit (see DESIGN.md, non-negotiables).
add_library(zinf_options INTERFACE)
target_compile_options(zinf_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX,C>:-Wall -Wextra -Wshadow -Wnon-virtual-dtor -Wno-unused-parameter -ffp-contract=off>
  $<$<COMPILE_LANGUAGE:CUDA>:--fmad=false -Xcompiler=-ffp-contract=off
     # nvcc warns when a [[nodiscard]] class (Status) is assigned to, which
     # discards nothing; gcc and clang do not.
     --diag-suppress=2810>)

# CI builds with ZINF_WERROR=ON, so a new warning fails it. Host code only:
# nvcc's own diagnostics vary with the toolkit's version.
option(ZINF_WERROR "Treat compiler warnings in C and C++ as errors" OFF)
if(ZINF_WERROR)
  target_compile_options(zinf_options INTERFACE $<$<COMPILE_LANGUAGE:CXX,C>:-Werror>)
endif()

# clang's thread-safety analysis (src/common/thread_annotations.h): the
# locking written as GUARDED_BY and REQUIRES is checked as the code compiles,
# and a finding is an error. clang only; CI builds src/sched with it.
option(ZINF_THREAD_SAFETY_ANALYSIS "Check the locking annotations with clang's -Wthread-safety, as errors" OFF)
if(ZINF_THREAD_SAFETY_ANALYSIS)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "ZINF_THREAD_SAFETY_ANALYSIS=ON needs clang; the C++ compiler is ${CMAKE_CXX_COMPILER_ID} "
                        "(configure with CXX=clang++)")
  endif()
  target_compile_options(zinf_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wthread-safety -Werror=thread-safety>)
endif()

if(ZINF_SANITIZE)
  string(REPLACE ";" "," _zinf_san "${ZINF_SANITIZE}")
  target_compile_options(zinf_options INTERFACE
    $<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=${_zinf_san} -fno-omit-frame-pointer -fno-sanitize-recover=all>)
  target_link_options(zinf_options INTERFACE -fsanitize=${_zinf_san})
endif()
