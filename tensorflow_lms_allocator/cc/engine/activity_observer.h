// ActivityObserver: the engine's own work as spans for a profiler.
//
// The engine never depends on TensorFlow; the TensorFlow adapter gives it an
// observer that records each span as a TraceMe activity, so that evictions,
// page-ins, reclaims and waits show in TensorBoard's trace viewer on the
// thread that did them (Note [LMS's work in the trace viewer] in
// tf_adapter/profiler_events.h). A span is begun and ended on one thread, in
// one scope (ScopedActivity), with what it moves known when it begins.
//
// Cost: with no observer, one relaxed load and a branch a span; with one but
// no profiler session, a virtual call that loads one flag. Spans are taken
// around moves and waits only (never on the allocate, free, pin or unpin fast
// paths), each of which costs microseconds or more.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_ACTIVITY_OBSERVER_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_ACTIVITY_OBSERVER_H_

#include <cstdint>

namespace lms {

enum class Activity : int {
  kReclaim,     // choosing victims for a shortage and evicting them
  kEviction,    // copying units out and remapping their addresses to host memory
  kPageIn,      // copying units back and remapping their addresses to the device
  kMoveWait,    // waiting for another thread's eviction or page-in of a unit
  kMemoryWait,  // a kernel's request waiting for other kernels to release memory
};

class ActivityObserver {
 public:
  virtual ~ActivityObserver() = default;
  // Whether spans are recorded now (a profiler session is on).
  virtual bool Active() const = 0;
  // Begins a span of `what` on this thread, moving `bytes` in `units` units
  // (0 where it moves nothing itself: a wait); returns the token End takes.
  virtual int64_t Begin(Activity what, uint64_t bytes, uint64_t units) = 0;
  // Ends the span Begin returned `token` for, on the same thread.
  virtual void End(int64_t token) = 0;
};

// A span for the enclosing scope, if `observer` is non-null and active when
// it begins. Example:
//   ScopedActivity span(observer, Activity::kEviction, bytes, victims.size());
class ScopedActivity {
 public:
  ScopedActivity(ActivityObserver* observer, Activity what, uint64_t bytes, uint64_t units)
      : observer_(observer != nullptr && observer->Active() ? observer : nullptr),
        token_(observer_ != nullptr ? observer_->Begin(what, bytes, units) : 0) {}
  ~ScopedActivity() {
    if (observer_ != nullptr) observer_->End(token_);
  }
  ScopedActivity(const ScopedActivity&) = delete;
  ScopedActivity& operator=(const ScopedActivity&) = delete;

 private:
  ActivityObserver* const observer_;
  const int64_t token_;
};

// The span's name as a profiler shows it, e.g. "LMS eviction".
inline const char* ActivityName(Activity what) {
  switch (what) {
    case Activity::kReclaim:
      return "LMS reclaim";
    case Activity::kEviction:
      return "LMS eviction";
    case Activity::kPageIn:
      return "LMS page-in";
    case Activity::kMoveWait:
      return "LMS wait for a move";
    case Activity::kMemoryWait:
      return "LMS wait for memory";
  }
  return "LMS";
}

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_ACTIVITY_OBSERVER_H_
