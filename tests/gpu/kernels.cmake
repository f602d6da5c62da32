# Kernel tests (write_kv, copy_pages, attention_prefix_suffix). Included from
# tests/gpu/CMakeLists.txt; the tests link radixkv_gpu, which holds the
# kernels (gpu/kernels.cmake).
foreach(_t kernels_kv_ops_test attention_cpu_test kernels_quant_test)
  add_executable(${_t} ${CMAKE_CURRENT_LIST_DIR}/${_t}.cc)
  target_link_libraries(${_t} PRIVATE radixkv_gpu GTest::gtest_main)
  target_include_directories(${_t} PRIVATE ${PROJECT_SOURCE_DIR})
  gtest_discover_tests(${_t} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300)
endforeach()

# CUDA versions against the CPU oracles; skipped (GTEST_SKIP) with no device.
if(RADIXKV_HAVE_CUDA)
  add_executable(kernels_cuda_test ${CMAKE_CURRENT_LIST_DIR}/kernels_cuda_test.cc)
  target_link_libraries(kernels_cuda_test PRIVATE radixkv_gpu CUDA::cudart_static
                        GTest::gtest_main)
  target_include_directories(kernels_cuda_test PRIVATE ${PROJECT_SOURCE_DIR})
  gtest_discover_tests(kernels_cuda_test DISCOVERY_TIMEOUT 60
                       PROPERTIES LABELS gpu TIMEOUT 300)
  # Typed (fp16 / bf16 / fp8 / int8) pages: the encoders against the CUDA
  # toolkit's conversions (host code, runs without a device) and the CUDA
  # write_kv / attention against the CPU.
  add_executable(kernels_quant_cuda_test
    ${CMAKE_CURRENT_LIST_DIR}/kernels_quant_cuda_test.cc)
  target_link_libraries(kernels_quant_cuda_test PRIVATE radixkv_gpu
                        CUDA::cudart_static GTest::gtest_main)
  target_include_directories(kernels_quant_cuda_test PRIVATE ${PROJECT_SOURCE_DIR})
  gtest_discover_tests(kernels_quant_cuda_test DISCOVERY_TIMEOUT 60
                       PROPERTIES LABELS gpu TIMEOUT 300)
  # Cross-layer KV pages (S + 1 groups, the bank last): write_kv, read_kv,
  # copy_pages bit-exact and attention over the bank, CUDA against the CPU.
  add_executable(kernels_xlayer_cuda_test
    ${CMAKE_CURRENT_LIST_DIR}/kernels_xlayer_cuda_test.cc)
  target_link_libraries(kernels_xlayer_cuda_test PRIVATE radixkv_gpu
                        CUDA::cudart_static GTest::gtest_main)
  target_include_directories(kernels_xlayer_cuda_test PRIVATE ${PROJECT_SOURCE_DIR})
  gtest_discover_tests(kernels_xlayer_cuda_test DISCOVERY_TIMEOUT 60
                       PROPERTIES LABELS gpu TIMEOUT 300)
endif()

# The GPU check bundle (scripts/gpu_bundle.sh): assembled from this build's
# CUDA-off binaries and its runner dry-run without a device (label bundle;
# the CUDA-on bundle is built and run by hand, see docs/BENCHMARKS.md).
if(TARGET radixkv-worker)
  add_test(NAME gpu_bundle_dry_run
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/bundle_test.sh
                   ${PROJECT_SOURCE_DIR} ${CMAKE_BINARY_DIR})
  set_tests_properties(gpu_bundle_dry_run PROPERTIES LABELS bundle TIMEOUT 300)
endif()
