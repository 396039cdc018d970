# The libFuzzer target over the C ABI, fuzz/fuzz_abi.cpp. scripts/fuzz.sh configures a clang build
# with FP_BUILD_FUZZER=ON, sanitizers and coverage flags for the library too, and runs it.
option(FP_BUILD_FUZZER "Build the libFuzzer target fuzz_abi (clang only)" OFF)
if(FP_BUILD_FUZZER)
  add_executable(fuzz_abi fuzz/fuzz_abi.cpp)
  target_link_libraries(fuzz_abi PRIVATE flashprefill)
  target_link_options(fuzz_abi PRIVATE -fsanitize=fuzzer)
  # The dot products and axpys carry no decisions: comparison tracing there only slows each run.
  set_source_files_properties(src/reference/numerics.cpp PROPERTIES
    COMPILE_OPTIONS -fno-sanitize-coverage=trace-cmp)
endif()
