// Checked size arithmetic: every element count, offset and byte size the library derives from a
// problem goes through Size, so a problem whose sizes do not fit gets an error, never a wrap.
// Plain C++ (no compiler builtins), usable from the CUDA host code too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

namespace flashprefill {

// A non-negative 64-bit count that remembers whether any step overflowed (or started negative).
class Size {
 public:
  constexpr Size(int64_t v) : v_(v < 0 ? 0 : v), ok_(v >= 0) {}  // NOLINT: implicit on purpose

  constexpr bool ok() const { return ok_; }
  constexpr int64_t value() const { return v_; }
  // The value as a byte count, or SIZE_MAX when it overflowed (backend.hpp's convention).
  constexpr size_t bytes_or_max() const {
    return ok_ ? size_t(v_) : std::numeric_limits<size_t>::max();
  }
  // True when valid and at most `limit`.
  constexpr bool fits(int64_t limit) const { return ok_ && v_ <= limit; }

  friend constexpr Size operator+(Size a, Size b) {
    if (!a.ok_ || !b.ok_ || a.v_ > kMax - b.v_) return invalid();
    return Size(a.v_ + b.v_);
  }
  friend constexpr Size operator*(Size a, Size b) {
    if (!a.ok_ || !b.ok_ || (a.v_ != 0 && b.v_ > kMax / a.v_)) return invalid();
    return Size(a.v_ * b.v_);
  }
  // ceil(a / b) for b >= 1.
  friend constexpr Size div_up(Size a, int64_t b) {
    if (!a.ok_ || b < 1) return invalid();
    return Size(a.v_ / b + (a.v_ % b != 0));
  }
  // Rounded up to a multiple of `align` (>= 1).
  constexpr Size align_up(int64_t align) const { return div_up(*this, align) * Size(align); }

 private:
  static constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  static constexpr Size invalid() {
    Size s(0);
    s.ok_ = false;
    return s;
  }
  int64_t v_;
  bool ok_;
};

// The larger of two sizes (an overflowed one wins).
inline constexpr Size larger(Size a, Size b) {
  if (!a.ok() || !b.ok()) return a.ok() ? b : a;
  return a.value() >= b.value() ? a : b;
}

}  // namespace flashprefill
