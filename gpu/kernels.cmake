# Kernels of radixkv_gpu: write_kv, copy_pages and attention_prefix_suffix,
# CPU implementations always, CUDA implementations when the build has CUDA.
# Included at the end of gpu/CMakeLists.txt (so source properties set here
# apply to radixkv_gpu's sources).
set(_kernel_cc
  ${CMAKE_CURRENT_LIST_DIR}/kv_ops.cc
  ${CMAKE_CURRENT_LIST_DIR}/attention.cc
  ${CMAKE_CURRENT_LIST_DIR}/cublas_loader.cc)
target_sources(radixkv_gpu PRIVATE ${_kernel_cc})
# cuBLAS is dlopen()ed at run time (cublas_loader.cc): no link dependency.
target_link_libraries(radixkv_gpu PUBLIC ${CMAKE_DL_LIBS})
# The CPU kernels are the oracles and the reference worker's hot loops: build
# them with -O3 (vectorised inner loops) in every optimised configuration.
set_source_files_properties(${_kernel_cc} PROPERTIES
  COMPILE_OPTIONS "$<$<NOT:$<CONFIG:Debug>>:-O3>")

if(RADIXKV_HAVE_CUDA)
  target_sources(radixkv_gpu PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/kv_ops.cu
    ${CMAKE_CURRENT_LIST_DIR}/attention.cu)
  set_source_files_properties(${_kernel_cc} PROPERTIES
    COMPILE_DEFINITIONS RADIXKV_KERNELS_CUDA=1)
  target_link_libraries(radixkv_gpu PUBLIC CUDA::cudart_static)
endif()
