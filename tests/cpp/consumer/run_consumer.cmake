# Builds and runs the consumer project against torch_openreg's package, found
# either in the build tree (TREE=build) or in a fresh install of it
# (TREE=install), with the linker in --as-needed mode as on Ubuntu; then
# checks that the program records libtorch_openreg.so as needed, by name.
#
#   cmake -DTREE=build|install -DBUILD_DIR=<torch_openreg build dir>
#         -DSOURCE_DIR=<this dir> -DWORK_DIR=<scratch dir>
#         -DGENERATOR=<generator> -DMAKE_PROGRAM=<its build program>
#         -DCXX_COMPILER=<compiler> -P run_consumer.cmake

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "`${ARGN}` failed (${status}):\n${out}")
  endif()
  set(output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")

if(TREE STREQUAL "install")
  run("${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${WORK_DIR}/prefix")
  set(locate "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix")
else()
  set(locate "-Dtorch_openreg_DIR=${BUILD_DIR}")
endif()

run("${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
    "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" -DCMAKE_BUILD_TYPE=Release
    "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed" "${locate}")
run("${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
run("${WORK_DIR}/build/consumer")
message(STATUS "${output}")

find_program(READELF readelf)
if(READELF)
  run("${READELF}" -d "${WORK_DIR}/build/consumer")
  if(NOT output MATCHES "\\(NEEDED\\)[^\n]*\\[libtorch_openreg\\.so\\]")
    message(FATAL_ERROR "consumer does not record libtorch_openreg.so as NEEDED:\n${output}")
  endif()
endif()
