# fp_l2_bandwidth: the GPU's L2-to-SM read bandwidth by plain loads and by bulk (TMA-engine)
# copies (tools/l2_bandwidth.cu), the rate a tiling that loads K and V twice per FLOP would need.
if(FP_ENABLE_CUDA)
  add_executable(fp_l2_bandwidth ${CMAKE_SOURCE_DIR}/tools/l2_bandwidth.cu)
  target_include_directories(fp_l2_bandwidth SYSTEM PRIVATE ${FP_CUTLASS_INCLUDE})
  target_compile_options(fp_l2_bandwidth PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -O3>)
  target_link_libraries(fp_l2_bandwidth PRIVATE CUDA::cudart_static)
endif()
