# Helpers shared by every pkg/ folder.

# weightcache_library(NAME SOURCES... PUBLIC_DEPS ... PRIVATE_DEPS ...)
# One library per pkg/ folder, aliased as weightcache::NAME. Headers are included as
# "pkg/NAME/header.h" from the repository root.
function(weightcache_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(wc_${name} ${ARG_SOURCES})
  add_library(weightcache::${name} ALIAS wc_${name})
  target_include_directories(wc_${name} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  target_link_libraries(wc_${name} PUBLIC ${ARG_PUBLIC_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
endfunction()

# weightcache_test(NAME SOURCES... DEPS ... [LABELS ...] [DEFINITIONS ...] [NEEDS targets...]
#                  [OPTIMIZED])
# A GoogleTest binary whose cases ctest discovers one by one. DEFINITIONS: its compile
# definitions; NEEDS: targets built before it (e.g. a binary it runs); TIMEOUT: seconds per
# case (default 120), for a binary whose cases are measured to need more. Everything about a test
# goes through here: with WEIGHTCACHE_TESTS=OFF none of it exists (the Dockerfile's build).
# OPTIMIZED: a test whose own code does the heavy work (reference digests, buffers filled and
# compared byte by byte) keeps the build's optimisation under ASan (see below).
function(weightcache_test name)
  if(NOT WEIGHTCACHE_TESTS)
    return()
  endif()
  cmake_parse_arguments(ARG "OPTIMIZED" "TIMEOUT" "SOURCES;DEPS;LABELS;DEFINITIONS;NEEDS" ${ARGN})
  # WEIGHTCACHE_CPU_TESTS=OFF (CI's g++ build): only the suites a sanitizer build cannot run.
  if(NOT WEIGHTCACHE_CPU_TESTS AND NOT "gpu" IN_LIST ARG_LABELS AND NOT "torch" IN_LIST ARG_LABELS)
    return()
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  if(ARG_DEFINITIONS)
    target_compile_definitions(${name} PRIVATE ${ARG_DEFINITIONS})
  endif()
  # Under ASan+UBSan the tests' own code is compiled without optimisation: a third less compile
  # time (daemon_test.cc 9.0 -> 6.0 s with clang 14) in the build that compiles every suite;
  # the code under test, in the libraries, keeps the build's -O1 (docs/benchmarks.md, "CI time").
  # Four suites ran 3-13 s longer each so (45 s in all): they are OPTIMIZED.
  if(WEIGHTCACHE_SANITIZE AND NOT ARG_OPTIMIZED)
    target_compile_options(${name} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:-O0>")
  endif()
  if(ARG_NEEDS)
    add_dependencies(${name} ${ARG_NEEDS})
  endif()
  set(labels unit)
  if(ARG_LABELS)
    set(labels ${ARG_LABELS})
  endif()
  set(timeout 120)
  if(ARG_TIMEOUT)
    set(timeout ${ARG_TIMEOUT})
  endif()
  gtest_discover_tests(${name} TEST_PREFIX "${name}." PROPERTIES LABELS "${labels}"
                       TIMEOUT ${timeout} DISCOVERY_TIMEOUT 60)
endfunction()
