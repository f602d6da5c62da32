# ctest driver: install the build's client component into a fresh prefix,
# then configure, build and run tests/client/example_consumer against it.
#   cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -P example_consumer_test.cmake
foreach(v BUILD_DIR SOURCE_DIR WORK_DIR)
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
run(configure ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -G Ninja
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
run(build ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(consumer ${WORK_DIR}/build/consumer)
if(NOT last_output MATCHES "^ok root=[0-9a-f]+ key0=[0-9a-f]+")
  message(FATAL_ERROR "consumer printed: ${last_output}")
endif()
message(STATUS "example consumer: ${last_output}")
file(REMOVE_RECURSE ${WORK_DIR})
