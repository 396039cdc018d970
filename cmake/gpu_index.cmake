# GPU check of the CUDA index stage (tests/gpu/index_check.cu): drives the C ABI on the CPU and
# on CUDA, plus graph capture and incremental pooling (it compiles the pooling kernel itself to
# reach its internal entry, and the reference numerics, which the library does not export). Run
# on a GPU machine by scripts/gpu/10_index.sh.
if(FP_ENABLE_CUDA)
  add_executable(fp_gpu_index_check tests/gpu/index_check.cu src/cuda/index/pool.cu
    src/reference/numerics.cpp)
  target_include_directories(fp_gpu_index_check PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_compile_options(fp_gpu_index_check PRIVATE
                         $<$<COMPILE_LANGUAGE:CUDA>:${FP_CUDA_FLAGS}>)
  target_link_libraries(fp_gpu_index_check PRIVATE flashprefill CUDA::cudart_static)
endif()
