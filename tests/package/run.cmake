# Installs the weft build tree into a fresh prefix, then configures, builds and runs an outside
# project against it. Any failed step fails the test.
#
# Run by ctest as: cmake -DWEFT_BINARY_DIR=<weft build> -DWORK_DIR=<scratch> -DGENERATOR=<generator>
#                        -DCXX_COMPILER=<compiler> [-DPROJECT_DIR=<project>] -P run.cmake
# PROJECT_DIR is the outside project; by default this folder, whose program weft_package_consumer
# is run. Any other project (examples/custom_layer) is run through its own tests: ctest in its build.
cmake_minimum_required(VERSION 3.25)

if(NOT PROJECT_DIR)
  set(PROJECT_DIR "${CMAKE_CURRENT_LIST_DIR}")
endif()
set(prefix "${WORK_DIR}/prefix")
set(consumer_build "${WORK_DIR}/build")
file(REMOVE_RECURSE "${WORK_DIR}")  # a stale install must not hide a broken one

function(run_step description)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "package test: ${description} failed (${result})")
  endif()
endfunction()

run_step("installing weft" "${CMAKE_COMMAND}" --install "${WEFT_BINARY_DIR}" --prefix "${prefix}")
# The package registry is off so that only the fresh prefix can provide weft.
run_step("configuring the consumer against the installed weft"
  "${CMAKE_COMMAND}" -S "${PROJECT_DIR}" -B "${consumer_build}" -G "${GENERATOR}"
  "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DCMAKE_PREFIX_PATH=${prefix}"
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_BUILD_TYPE=Release)

# An older weft installed system-wide would also satisfy find_package; make sure it was this one.
file(STRINGS "${consumer_build}/CMakeCache.txt" weft_dir_line REGEX "^weft_DIR:")
string(REGEX REPLACE "^weft_DIR:[A-Z]+=" "" weft_dir "${weft_dir_line}")
cmake_path(IS_PREFIX prefix "${weft_dir}" NORMALIZE from_prefix)
if(NOT from_prefix)
  message(FATAL_ERROR "package test: find_package(weft) found '${weft_dir}', not the fresh install under ${prefix}")
endif()

run_step("building the consumer" "${CMAKE_COMMAND}" --build "${consumer_build}")
if(PROJECT_DIR STREQUAL CMAKE_CURRENT_LIST_DIR)
  run_step("running the consumer" "${consumer_build}/weft_package_consumer")
else()
  run_step("running the project's tests" "${CMAKE_CTEST_COMMAND}" --test-dir "${consumer_build}" --output-on-failure)
endif()
