// ScopedNanos: adds the time its scope took to a statistic, in nanoseconds
// of the monotonic clock. The statistics of time (time_*_ns in statistics.h)
// are sums of such scopes; reading the clock costs tens of nanoseconds, next
// to calls that take microseconds (a remap, a copy, a wait).
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_SCOPED_NANOS_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_SCOPED_NANOS_H_

#include <chrono>
#include <cstdint>

namespace lms {

class ScopedNanos {
 public:
  // `total` must outlive the scope; its owner's lock must be held for it.
  explicit ScopedNanos(int64_t* total)
      : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~ScopedNanos() {
    *total_ += std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::steady_clock::now() - start_)
                   .count();
  }
  ScopedNanos(const ScopedNanos&) = delete;
  ScopedNanos& operator=(const ScopedNanos&) = delete;

 private:
  int64_t* const total_;
  const std::chrono::steady_clock::time_point start_;
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_SCOPED_NANOS_H_
