# The cuda-vmm backend, included by pkg/memory/CMakeLists.txt. The top-level CMakeLists.txt
# detects nvcc and sets WEIGHTCACHE_HAVE_CUDA; without it this file adds nothing and
# no_cuda.cc answers "built without CUDA".
#
# Only CUDA's headers are used here (CUDA::toolkit): the driver is dlopen()ed at run time
# (libcuda.so.1 + cuGetProcAddress), never linked, so the same binary starts without a GPU.
if(NOT WEIGHTCACHE_HAVE_CUDA)
  # Stubs for the internal extras (internal/cuda_segment.h); no_cuda.cc covers the rest.
  target_sources(wc_memory PRIVATE ${CMAKE_CURRENT_LIST_DIR}/cuda_absent.cc)
  return()
endif()

target_sources(wc_memory PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/cuda_driver.cc
  ${CMAKE_CURRENT_LIST_DIR}/cuda_backend.cc
  ${CMAKE_CURRENT_LIST_DIR}/cuda_mapping.cc)
# CUDA::toolkit carries include directories only (no libcuda, no cudart).
target_link_libraries(wc_memory PUBLIC CUDA::toolkit PRIVATE ${CMAKE_DL_LIBS} absl::synchronization)
