#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "reference/reference.hpp"

namespace flashprefill::ref {

void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  const int64_t threads =
      std::min<int64_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  if (threads <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  // The first exception of any thread (std::bad_alloc included) stops the others from taking new
  // items and is rethrown here, so the entry point reports it as the call's status.
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    try {
      for (int64_t i = next++; i < n; i = next++) fn(i);
    } catch (...) {
      next = n;
      const std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  try {
    for (int64_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  } catch (const std::system_error&) {
    // A thread that cannot start: the started ones and this one share the work.
  }
  worker();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace flashprefill::ref
