# fp_gpu_fp8_check: the e4m3 attention kernel (tests/gpu/fp8_attention_check.cu), launched
# directly, against the CPU FP8 reference and float32 attention, and timed beside the library's
# bf16 dense attention. It compiles the kernel and the scheduler's preparation itself: the C ABI
# does not reach the FP8 kernel yet.
if(FP_ENABLE_CUDA)
  add_executable(fp_gpu_fp8_check tests/gpu/fp8_attention_check.cu
    src/cuda/attention/schedule_prep.cu)
  target_include_directories(fp_gpu_fp8_check PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_include_directories(fp_gpu_fp8_check SYSTEM PRIVATE ${FP_CUTLASS_INCLUDE})
  target_compile_options(fp_gpu_fp8_check PRIVATE
                         $<$<COMPILE_LANGUAGE:CUDA>:${FP_CUDA_FLAGS}>)
  target_link_libraries(fp_gpu_fp8_check PRIVATE flashprefill CUDA::cudart_static)
endif()
