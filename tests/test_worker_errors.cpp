// Errors inside the CPU reference's worker threads come back as the call's status: an allocation
// that fails on a worker thread gives "out of host memory", not std::terminate. The global
// operator new of this test program (replacing the library's too) fails large allocations on
// threads other than the main one while armed.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>

#include "test_support.hpp"

namespace {

std::atomic<bool> g_armed{false};
std::atomic<int> g_failed{0};
const std::thread::id g_main = std::this_thread::get_id();
constexpr size_t kLarge = size_t(64) << 10;

}  // namespace

void* operator new(size_t bytes) {
  if (g_armed && bytes >= kLarge && std::this_thread::get_id() != g_main) {
    ++g_failed;
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(bytes ? bytes : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t bytes) { return ::operator new(bytes); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }

namespace {

using namespace fptest;

TEST(WorkerErrors, AllocationFailureIsTheCallsStatus) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "no worker threads on one core";
  // Every (request, KV head) gathers 4096 keys of 64 floats (1 MiB) on whichever thread runs it.
  TestProblem t({{256, 4096}, {256, 4096}, {256, 4096}, {256, 4096}}, 2, 2, 64, FP_FLOAT32, 70);
  const fp_problem p = t.contiguous();
  Output out(p);
  g_failed = 0;
  g_armed = true;
  const fp_status status = fp_dense_attention(&p, &out.view, nullptr, 0);
  g_armed = false;
  if (g_failed == 0) GTEST_SKIP() << "the main thread ran every item";
  EXPECT_EQ(status, FP_ERROR_INTERNAL);
  EXPECT_STREQ(fp_last_error_message(), "out of host memory");
  // The library is usable afterwards.
  EXPECT_EQ(fp_dense_attention(&p, &out.view, nullptr, 0), FP_OK) << fp_last_error_message();
}

}  // namespace
