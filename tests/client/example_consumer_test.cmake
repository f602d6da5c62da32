# ctest driver: install the build's client component into a fresh prefix,
# check that the installed headers include only installed headers and no
# private one is installed (scripts/check_installed_headers.py), then
# configure, build and run tests/client/example_consumer against it.
#   cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -DPYTHON=...
#         -DREPO_DIR=... [-DHEADERS_ONLY=ON] -P example_consumer_test.cmake
# HEADERS_ONLY: stop after the header check (no consumer build).
foreach(v BUILD_DIR SOURCE_DIR WORK_DIR PYTHON REPO_DIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "${v} is not set")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

function(run step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${step} failed (${rc}):\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

run(install ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix}
    --component client)
foreach(f radixkvConfig.cmake radixkvConfigVersion.cmake client/client.h
          radix/block_key.h radixkv/v1/radixkv.pb.h radixkv/defaults.h)
  # The library dir may be lib, lib64 or lib/<multiarch> (GNUInstallDirs).
  file(GLOB_RECURSE found ${prefix}/*/${f})
  if(NOT found)
    message(FATAL_ERROR "not installed under ${prefix}: ${f}")
  endif()
endforeach()
# Private headers of the installed libraries, which a consumer never sees.
run(headers ${PYTHON} ${REPO_DIR}/scripts/check_installed_headers.py
    ${prefix}/include --source-dir ${REPO_DIR}
    --absent radix/radix_tree_internal.h --absent client/core.h
    --absent gpu/pool_internal.h --absent gpu/kv_ops_check.h
    --absent gpu/kv_cuda_launch.h --absent gpu/cuda_driver.h
    --absent grpc/health/v1/health.pb.h)
message(STATUS "${last_output}")
if(HEADERS_ONLY)
  file(REMOVE_RECURSE ${WORK_DIR})
  return()
endif()
run(configure ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -G Ninja
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
run(build ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(consumer ${WORK_DIR}/build/consumer)
if(NOT last_output MATCHES "^ok root=[0-9a-f]+ key0=[0-9a-f]+")
  message(FATAL_ERROR "consumer printed: ${last_output}")
endif()
message(STATUS "example consumer: ${last_output}")
file(REMOVE_RECURSE ${WORK_DIR})
