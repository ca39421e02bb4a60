# The parser fuzzers (fuzz/) in the main build. They need clang with
# libFuzzer and one CMake project has one compiler, so fuzz/ is a project of
# its own, built by ExternalProject into ${CMAKE_BINARY_DIR}/fuzz whenever
# the main build is; each target becomes a ctest test labelled `fuzz` that
# runs it for GLINT_FUZZ_SECONDS over its committed corpus (fuzz/run.sh).
# Without clang and libFuzzer (Debian: clang, libclang-rt-dev) they are
# skipped with a message.

set(GLINT_FUZZ AUTO CACHE STRING "Build the parser fuzzers: AUTO (when clang with libFuzzer is found), ON or OFF")
set(GLINT_FUZZ_SECONDS 20 CACHE STRING "How long each `fuzz` test runs its target")

function(glint_add_fuzzers)
  if(GLINT_FUZZ STREQUAL "OFF")
    message(STATUS "glint: parser fuzzers off (GLINT_FUZZ=OFF)")
    return()
  endif()
  find_program(GLINT_FUZZ_CXX NAMES clang++ clang++-14)
  find_program(GLINT_FUZZ_CC NAMES clang clang-14)
  # Whether clang links a libFuzzer target with both sanitizers: a success
  # is remembered per compiler (a probe takes a second); a failure is
  # probed again next time, so installing libclang-rt-dev is enough.
  if(GLINT_FUZZ_CXX AND GLINT_FUZZ_CC AND NOT (GLINT_FUZZ_WORKS AND GLINT_FUZZ_PROBED STREQUAL GLINT_FUZZ_CXX))
    set(dir ${CMAKE_BINARY_DIR}/fuzz-probe)
    file(WRITE ${dir}/probe.cpp
         "#include <cstddef>\n#include <cstdint>\n"
         "extern \"C\" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n")
    execute_process(COMMAND ${GLINT_FUZZ_CXX} -fsanitize=fuzzer,address,undefined ${dir}/probe.cpp -o ${dir}/probe
                    RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
    set(ok OFF)
    if(rc EQUAL 0)
      set(ok ON)
    endif()
    set(GLINT_FUZZ_WORKS ${ok} CACHE INTERNAL "clang links libFuzzer targets")
    set(GLINT_FUZZ_PROBED ${GLINT_FUZZ_CXX} CACHE INTERNAL "the compiler GLINT_FUZZ_WORKS is for")
  endif()
  if(NOT GLINT_FUZZ_CXX OR NOT GLINT_FUZZ_CC OR NOT GLINT_FUZZ_WORKS)
    set(why "clang with libFuzzer not found (Debian packages clang and libclang-rt-dev; scripts/setup.sh installs them)")
    if(GLINT_FUZZ STREQUAL "ON")
      message(FATAL_ERROR "glint: GLINT_FUZZ=ON but ${why}")
    endif()
    message(STATUS "glint: parser fuzzers skipped: ${why}")
    return()
  endif()
  message(STATUS "glint: parser fuzzers built with ${GLINT_FUZZ_CXX} into ${CMAKE_BINARY_DIR}/fuzz")

  include(ExternalProject)
  set(args -DCMAKE_CXX_COMPILER=${GLINT_FUZZ_CXX} -DCMAKE_C_COMPILER=${GLINT_FUZZ_CC})
  if(GLINT_CCACHE)
    list(APPEND args -DCMAKE_CXX_COMPILER_LAUNCHER=${GLINT_CCACHE} -DCMAKE_C_COMPILER_LAUNCHER=${GLINT_CCACHE})
  endif()
  # BUILD_ALWAYS: the sub-build's own dependency scan decides what to
  # rebuild (a no-op takes a fraction of a second).
  ExternalProject_Add(glint_fuzzers
    SOURCE_DIR ${CMAKE_SOURCE_DIR}/fuzz
    BINARY_DIR ${CMAKE_BINARY_DIR}/fuzz
    CMAKE_ARGS ${args}
    BUILD_ALWAYS ON
    INSTALL_COMMAND "")

  include(${CMAKE_SOURCE_DIR}/fuzz/targets.cmake)
  foreach(t ${GLINT_FUZZ_TARGETS})
    add_test(NAME fuzz.${t}
             COMMAND bash ${CMAKE_SOURCE_DIR}/fuzz/run.sh ${CMAKE_BINARY_DIR}/fuzz/fuzz_${t}
                     ${CMAKE_SOURCE_DIR}/fuzz/corpus/${t} ${CMAKE_BINARY_DIR}/fuzz/work/${t} ${GLINT_FUZZ_SECONDS})
    # The corpus replay and startup come on top of the fuzzing time.
    math(EXPR timeout "${GLINT_FUZZ_SECONDS} + 100")
    set_tests_properties(fuzz.${t} PROPERTIES LABELS fuzz TIMEOUT ${timeout})
  endforeach()
endfunction()
