# fp_gpu_fp8_check: the e4m3 attention through the public C ABI (tests/gpu/fp8_attention_check.cu)
# against the CPU FP8 reference and float32 attention, a CUDA graph of it, and a timing beside
# the library's bf16 dense attention (scripts/gpu/25_fp8_attention.sh runs it).
if(FP_ENABLE_CUDA)
  add_executable(fp_gpu_fp8_check ${CMAKE_SOURCE_DIR}/tests/gpu/fp8_attention_check.cu)
  target_include_directories(fp_gpu_fp8_check PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_compile_options(fp_gpu_fp8_check PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -O2>)
  target_link_libraries(fp_gpu_fp8_check PRIVATE flashprefill CUDA::cudart_static)
endif()
