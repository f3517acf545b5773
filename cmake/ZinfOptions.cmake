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

if(ZINF_SANITIZE)
  string(REPLACE ";" "," _zinf_san "${ZINF_SANITIZE}")
  target_compile_options(zinf_options INTERFACE
    $<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=${_zinf_san} -fno-omit-frame-pointer -fno-sanitize-recover=all>)
  target_link_options(zinf_options INTERFACE -fsanitize=${_zinf_san})
endif()
