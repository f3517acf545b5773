# zinf_add_test(NAME <name> LABEL unit|integration|mpi|gpu|slow SOURCES ... [LIBS ...]
#               [SERIAL Suite.Case ...])
# Builds one GoogleTest binary and registers its cases with
# gtest_discover_tests, so a GTEST_SKIP shows as skipped in ctest. Each binary
# carries exactly one label. A case named in SERIAL changes the machine's
# state (the hugetlb pool, say) under every other test: it is registered on
# its own and runs alone (RUN_SERIAL). Tests find the source tree, the build tree and
# their scratch directory through tests/test_util.h: $ZINF_TEST_DIR when set,
# else <build>/test-scratch.
include(GoogleTest)

set(ZINF_TEST_DIR "${CMAKE_BINARY_DIR}/test-scratch" CACHE PATH "Scratch directory for tests that need disk")
set(_zinf_labels unit integration mpi gpu slow)

# The Python environment scripts/setup makes (.venv, or $ZINF_VENV): every
# Python test and bench runs with its interpreter, against PyPI's torch,
# transformers, tokenizers, peft, accelerate and deepspeed. A test that finds
# no interpreter there skips, saying so. $ZINF_PYTHON overrides it at run time.
if(DEFINED ENV{ZINF_VENV} AND NOT "$ENV{ZINF_VENV}" STREQUAL "")
  set(_zinf_venv "$ENV{ZINF_VENV}")
else()
  set(_zinf_venv "${PROJECT_SOURCE_DIR}/.venv")
endif()
set(ZINF_PYTHON "${_zinf_venv}/bin/python" CACHE FILEPATH "The Python interpreter of the tests (scripts/setup's environment)")
# Real tokenizer.json files (Llama 3, Qwen3, Llama 2); $ZINF_TOKENIZER_DIR
# overrides it at run time, and the tests that need them skip without them.
set(ZINF_TOKENIZER_DIR "${PROJECT_SOURCE_DIR}/../shared/data/tokenizers" CACHE PATH
    "Folder of real tokenizer.json files (llama3/, qwen3/, llama2/)")
add_custom_target(zinf_unit_tests)

# The GoogleTest binary behind both helpers: linked with the library and
# GTest, with the source, build and scratch directories compiled in.
function(_zinf_test_executable name sources libs)
  add_executable(${name} ${sources})
  target_link_libraries(${name} PRIVATE zinf_internal GTest::gtest GTest::gmock GTest::gtest_main ${libs})
  target_include_directories(${name} PRIVATE "${PROJECT_SOURCE_DIR}/tests")
  target_compile_definitions(${name} PRIVATE
    ZINF_TEST_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    ZINF_TEST_BINARY_DIR="${CMAKE_BINARY_DIR}"
    ZINF_TEST_DIR_DEFAULT="${ZINF_TEST_DIR}"
    ZINF_TEST_PYTHON_DEFAULT="${ZINF_PYTHON}"
    ZINF_TEST_TOKENIZER_DIR_DEFAULT="${ZINF_TOKENIZER_DIR}")
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/tests")
endfunction()

function(zinf_add_test)
  cmake_parse_arguments(T "" "NAME;LABEL" "SOURCES;LIBS;SERIAL" ${ARGN})
  if(NOT T_LABEL IN_LIST _zinf_labels)
    message(FATAL_ERROR "zinf_add_test(${T_NAME}): LABEL must be one of ${_zinf_labels}, got '${T_LABEL}'")
  endif()
  if(ZINF_UNIT_TESTS_ONLY AND NOT T_LABEL STREQUAL "unit")
    return()
  endif()
  _zinf_test_executable(${T_NAME} "${T_SOURCES}" "${T_LIBS}")
  if(T_LABEL STREQUAL "unit")
    add_dependencies(zinf_unit_tests ${T_NAME})
  endif()
  set(_filter "")
  if(T_SERIAL)
    list(JOIN T_SERIAL ":" _serial)
    set(_filter TEST_FILTER "-${_serial}")
  endif()
  gtest_discover_tests(${T_NAME}
    DISCOVERY_TIMEOUT 60
    ${_filter}
    PROPERTIES LABELS ${T_LABEL})
  foreach(_case IN LISTS T_SERIAL)
    add_test(NAME ${_case} COMMAND ${T_NAME} --gtest_filter=${_case})
    set_tests_properties(${_case} PROPERTIES LABELS ${T_LABEL} RUN_SERIAL TRUE
                         SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
  endforeach()
endfunction()

# zinf_add_mpi_test(NAME <name> SOURCES ... RANKS 1 2 4 [LIBS ...] [TIMEOUT <s>] [LABEL gpu])
# Builds one GoogleTest binary (set up as zinf_add_test does) and registers
# one ctest per rank count, <name>.np<N>, running it under
#   ${ZINF_MPIEXEC} -np N <binary>
# with label mpi (and LABEL's, if given). Every rank runs every test; the job
# fails if any rank does.
# The MPI tests share one RESOURCE_LOCK: two 4-rank jobs at once on a 2-core
# machine only starve each other. Nothing is built with ZINF_UNIT_TESTS_ONLY.
set(ZINF_MPIEXEC "${MPIEXEC_EXECUTABLE}" --allow-run-as-root --oversubscribe --bind-to none)
function(zinf_add_mpi_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT;LABEL" "SOURCES;LIBS;RANKS" ${ARGN})
  if(ZINF_UNIT_TESTS_ONLY)
    return()
  endif()
  if(NOT T_RANKS)
    message(FATAL_ERROR "zinf_add_mpi_test(${T_NAME}): RANKS is required, e.g. RANKS 1 2 4")
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 60)
  endif()
  _zinf_test_executable(${T_NAME} "${T_SOURCES}" "${T_LIBS}")
  foreach(n IN LISTS T_RANKS)
    add_test(NAME ${T_NAME}.np${n} COMMAND ${ZINF_MPIEXEC} -np ${n} $<TARGET_FILE:${T_NAME}>)
    set_tests_properties(${T_NAME}.np${n} PROPERTIES LABELS "mpi;${T_LABEL}" TIMEOUT ${T_TIMEOUT} RESOURCE_LOCK zinf_mpi)
  endforeach()
endfunction()

# zinf_add_python_test(NAME <name> LABEL <label> SCRIPT <file.py> [ARGS ...]
#                      [TIMEOUT <s>] [RANKS <n>] [ENV VAR=value ...] [RESOURCE_LOCK <lock>])
# A Python script run by ZINF_PYTHON (through tests/python/with_python.sh,
# which exits 77 naming the interpreter where it is missing) with zinf's
# package on PYTHONPATH and libzinf.so as ZINF_LIBRARY. Exit code 77 is a
# skip. RANKS n runs it under mpirun with n ranks (label mpi added). Not in
# unit-only or sanitizer builds: libzinf.so would be loaded into an
# uninstrumented interpreter.
function(zinf_add_python_test)
  cmake_parse_arguments(T "" "NAME;LABEL;SCRIPT;TIMEOUT;RANKS;RESOURCE_LOCK" "ARGS;ENV" ${ARGN})
  if(ZINF_UNIT_TESTS_ONLY OR ZINF_SANITIZE)
    return()
  endif()
  if(NOT T_LABEL IN_LIST _zinf_labels)
    message(FATAL_ERROR "zinf_add_python_test(${T_NAME}): LABEL must be one of ${_zinf_labels}, got '${T_LABEL}'")
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  set(_env "ZINF_LIBRARY=$<TARGET_FILE:zinf_shared>" "PYTHONPATH=${PROJECT_SOURCE_DIR}/python"
           "ZINF_LOG_LEVEL=warn" "ZINF_TEST_DIR=${ZINF_TEST_DIR}" "ZINF_TOKENIZER_DIR=${ZINF_TOKENIZER_DIR}"
           "DS_ACCELERATOR=cpu" "TOKENIZERS_PARALLELISM=false" "HF_HUB_OFFLINE=1" "TRANSFORMERS_OFFLINE=1"
           ${T_ENV})
  if(TARGET zinf_torch_ext)  # zinf.torch's C++ hooks (src/torch); a test's ENV may turn them off
    list(PREPEND _env "ZINF_TORCH_EXTENSION=$<TARGET_FILE:zinf_torch_ext>")
  endif()
  set(_run bash "${PROJECT_SOURCE_DIR}/tests/python/with_python.sh" "${ZINF_PYTHON}" "${T_SCRIPT}" ${T_ARGS})
  set(_labels ${T_LABEL})
  if(T_RANKS)
    set(_forward)
    foreach(e IN LISTS _env)
      string(REGEX REPLACE "=.*" "" _name "${e}")
      list(APPEND _forward -x ${_name})
    endforeach()
    set(_run ${ZINF_MPIEXEC} -np ${T_RANKS} ${_forward} ${_run})
    list(APPEND _labels mpi)
    list(REMOVE_DUPLICATES _labels)
    if(NOT T_RESOURCE_LOCK)
      set(T_RESOURCE_LOCK zinf_mpi)
    endif()
  endif()
  add_test(NAME ${T_NAME} COMMAND ${_run})
  set_tests_properties(${T_NAME} PROPERTIES LABELS "${_labels}" TIMEOUT ${T_TIMEOUT} SKIP_RETURN_CODE 77
                       ENVIRONMENT "${_env}")
  if(T_RESOURCE_LOCK)
    set_tests_properties(${T_NAME} PROPERTIES RESOURCE_LOCK ${T_RESOURCE_LOCK})
  endif()
endfunction()

# A fresh build tree has no timings for ctest to order by (CI's clean clone):
# the longest tests start first, so that the short ones fill in beside them
# instead of one long test running alone at the end. The figures are seconds
# under CI on the 2-core machine (2026-12-02); ctest's own timings replace
# them after a run. set_tests_properties reaches only the current
# directory's tests: each tests/ folder with long tests calls this last.
function(zinf_order_long_tests)
  foreach(_cost IN ITEMS "python.clients=510" "python.deepspeed=110" "python.launchers=450" "rank_fault_campaign=280"
                         "mpi_engine_test.np4=250" "mpi_engine_test.np2=150" "python.transformers=130"
                         "python.wheel_install=120" "mpi_engine_test.np1=100" "python.units_core.built_by_torch=65")
    string(REPLACE "=" ";" _cost "${_cost}")
    list(GET _cost 0 _name)
    list(GET _cost 1 _seconds)
    if(TEST "${_name}")
      set_tests_properties("${_name}" PROPERTIES COST "${_seconds}")
    endif()
  endforeach()
endfunction()
