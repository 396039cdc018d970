# fp_gpu_attention_check: the attention operator on the GPU against the CPU reference and
# float32 attention, through the public C ABI (scripts/gpu/20_attention.sh runs it).
if(FP_ENABLE_CUDA)
  add_executable(fp_gpu_attention_check ${CMAKE_SOURCE_DIR}/tests/gpu/attention_check.cu)
  target_include_directories(fp_gpu_attention_check PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_compile_options(fp_gpu_attention_check PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -O2>)
  target_link_libraries(fp_gpu_attention_check PRIVATE flashprefill CUDA::cudart_static)
endif()
