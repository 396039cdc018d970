#include <algorithm>
#include <atomic>
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
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t i = next++; i < n; i = next++) fn(i);
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
}

}  // namespace flashprefill::ref
