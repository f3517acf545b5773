# Writes OUT (a C header) with the source tree's git revision and whether the
# tree differs from it, rewriting it only when that changed (so a build
# recompiles the one file that includes it only after a commit or an edit).
# Run at every build: cmake -DSOURCE_DIR=... -DOUT=... -P GitRevision.cmake
set(revision "unknown")
set(dirty 0)
find_package(Git QUIET)
if(GIT_FOUND AND EXISTS "${SOURCE_DIR}/.git")
  execute_process(COMMAND "${GIT_EXECUTABLE}" -C "${SOURCE_DIR}" rev-parse --short=12 HEAD
                  OUTPUT_VARIABLE revision OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc ERROR_QUIET)
  if(NOT rc EQUAL 0)
    set(revision "unknown")
  else()
    execute_process(COMMAND "${GIT_EXECUTABLE}" -C "${SOURCE_DIR}" status --porcelain --untracked-files=no
                    OUTPUT_VARIABLE changes RESULT_VARIABLE rc ERROR_QUIET)
    if(rc EQUAL 0 AND NOT changes STREQUAL "")
      set(dirty 1)
    endif()
  endif()
endif()
set(text "// Generated at build time by cmake/GitRevision.cmake.\n#pragma once\n#define ZINF_GIT_REVISION \"${revision}\"\n#define ZINF_GIT_DIRTY ${dirty}\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
else()
  set(old "")
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
