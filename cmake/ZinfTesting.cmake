# zinf_add_test(NAME <name> LABEL unit|integration|mpi|gpu|slow SOURCES ... [LIBS ...])
# Builds one GoogleTest binary and registers its cases with
# gtest_discover_tests, so a GTEST_SKIP shows as skipped in ctest. Each binary
# carries exactly one label. Tests find the source tree, the build tree and
# their scratch directory through tests/test_util.h: $ZINF_TEST_DIR when set,
# else <build>/test-scratch.
include(GoogleTest)

set(ZINF_TEST_DIR "${CMAKE_BINARY_DIR}/test-scratch" CACHE PATH "Scratch directory for tests that need disk")
set(_zinf_labels unit integration mpi gpu slow)
add_custom_target(zinf_unit_tests)

function(zinf_add_test)
  cmake_parse_arguments(T "" "NAME;LABEL" "SOURCES;LIBS" ${ARGN})
  if(NOT T_LABEL IN_LIST _zinf_labels)
    message(FATAL_ERROR "zinf_add_test(${T_NAME}): LABEL must be one of ${_zinf_labels}, got '${T_LABEL}'")
  endif()
  if(ZINF_UNIT_TESTS_ONLY AND NOT T_LABEL STREQUAL "unit")
    return()
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE zinf_internal GTest::gtest GTest::gmock GTest::gtest_main ${T_LIBS})
  target_include_directories(${T_NAME} PRIVATE "${PROJECT_SOURCE_DIR}/tests")
  target_compile_definitions(${T_NAME} PRIVATE
    ZINF_TEST_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    ZINF_TEST_BINARY_DIR="${CMAKE_BINARY_DIR}"
    ZINF_TEST_DIR_DEFAULT="${ZINF_TEST_DIR}")
  set_target_properties(${T_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/tests")
  if(T_LABEL STREQUAL "unit")
    add_dependencies(zinf_unit_tests ${T_NAME})
  endif()
  gtest_discover_tests(${T_NAME}
    DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS ${T_LABEL})
endfunction()
