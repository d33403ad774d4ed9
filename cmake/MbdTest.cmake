# One helper registers every test: an executable, its label and a timeout.
#   mbd_add_test(NAME n SOURCES a.c ... [LIBS l ...] [LABELS unit|integration|gpu|fuzz|bench]
#                [TIMEOUT s] [ARGS ...])
# Every test links the test support library (tests/support: child processes,
# waiting on events, the service and worker harnesses), and GPU tests its GPU
# part as well. Tests find fixtures via MBD_FIXTURES_DIR and built programs via
# MBD_BIN_DIR.
# Fixture-based tests see MBD_FIXTURES_DIR only when the fixtures exist, so a
# missing copy reads as "skipped" (exit 77), never as a silent pass.
if(NOT EXISTS "${MBD_FIXTURES_DIR}/mamba1/tiny-d64/config.json"
   AND EXISTS "${PROJECT_SOURCE_DIR}/tests/fixtures/mamba1/tiny-d64/config.json")
  message(STATUS "mambad: shared fixtures not found at ${MBD_FIXTURES_DIR}; using the in-repo "
                 "copy of tiny-d64 (tests/fixtures); small-d256 cases will be skipped")
  set(MBD_FIXTURES_DIR "${PROJECT_SOURCE_DIR}/tests/fixtures")
endif()
if(EXISTS "${MBD_FIXTURES_DIR}/mamba1/tiny-d64/config.json")
  set(MBD_FIXTURES_FOUND ON)
else()
  set(MBD_FIXTURES_FOUND OFF)
  message(WARNING "Hugging Face fixtures not found at ${MBD_FIXTURES_DIR}: the tests that "
                  "compare against them will be SKIPPED. Set -DMBD_FIXTURES_DIR=... or SHARED_FIXTURES.")
endif()

function(mbd_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS;ARGS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  set(support mbd_test_support)
  if("gpu" IN_LIST T_LABELS)
    list(APPEND support mbd_test_support_gpu)
  endif()
  target_link_libraries(${T_NAME} PRIVATE ${support} ${T_LIBS} PkgConfig::CMOCKA)
  target_include_directories(${T_NAME} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/tests)
  add_test(NAME ${T_NAME} COMMAND ${T_NAME} ${T_ARGS})
  set(env "MBD_BIN_DIR=${PROJECT_BINARY_DIR}/bin;MBD_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
  if(MBD_FIXTURES_FOUND)
    list(APPEND env "MBD_FIXTURES_DIR=${MBD_FIXTURES_DIR}")
  endif()
  set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
    SKIP_RETURN_CODE 77 ENVIRONMENT "${env}")
endfunction()
