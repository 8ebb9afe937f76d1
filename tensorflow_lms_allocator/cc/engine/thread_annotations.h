// Clang thread-safety annotations in the style of TensorFlow's
// tsl/platform/thread_annotations.h, and the annotated Mutex they check.
//
// The engine has no TensorFlow dependency, so it carries its own copies.
// Under GCC they expand to nothing; `make test` compiles the engine with
// clang -Wthread-safety -Werror (make test-thread-safety), which makes every
// LMS_GUARDED_BY a check: std::mutex carries no capability attribute, so the
// engine locks a Mutex through a MutexLock.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_THREAD_ANNOTATIONS_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_THREAD_ANNOTATIONS_H_

#include <chrono>
#include <cstdint>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define LMS_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define LMS_THREAD_ANNOTATION(x)
#endif

#define LMS_CAPABILITY(x) LMS_THREAD_ANNOTATION(capability(x))
#define LMS_SCOPED_CAPABILITY LMS_THREAD_ANNOTATION(scoped_lockable)
#define LMS_GUARDED_BY(x) LMS_THREAD_ANNOTATION(guarded_by(x))
#define LMS_PT_GUARDED_BY(x) LMS_THREAD_ANNOTATION(pt_guarded_by(x))
#define LMS_EXCLUSIVE_LOCKS_REQUIRED(...) \
  LMS_THREAD_ANNOTATION(exclusive_locks_required(__VA_ARGS__))
#define LMS_LOCKS_EXCLUDED(...) \
  LMS_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define LMS_ACQUIRE(...) LMS_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define LMS_RELEASE(...) LMS_THREAD_ANNOTATION(release_capability(__VA_ARGS__))

namespace lms {

// A std::mutex the analysis knows as a capability, which counts the time
// threads waited for it: an uncontended Lock is one try_lock, as a plain
// lock(); only a thread that finds it held reads the clock.
class LMS_CAPABILITY("mutex") Mutex {
 public:
  void Lock() LMS_ACQUIRE() {
    if (!mu_.try_lock()) LockHeld();
  }
  void Unlock() LMS_RELEASE() { mu_.unlock(); }

  // Nanoseconds Lock() waited while another thread held the mutex, in all
  // (time in AwaitWithTimeout is not counted).
  int64_t waited_ns() const LMS_EXCLUSIVE_LOCKS_REQUIRED(this) { return waited_ns_; }

  // Waits on `cv` until pred(); the mutex is held on entry and on return
  // (released while waiting).
  template <typename Pred>
  void Await(std::condition_variable& cv, Pred pred) LMS_EXCLUSIVE_LOCKS_REQUIRED(this) {
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    cv.wait(lock, pred);
    lock.release();
  }

  // Waits on `cv` until pred() or the timeout; the mutex is held on entry
  // and on return (released while waiting).
  template <typename Pred>
  bool AwaitWithTimeout(std::condition_variable& cv, std::chrono::milliseconds timeout,
                        Pred pred) LMS_EXCLUSIVE_LOCKS_REQUIRED(this) {
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    const bool result = cv.wait_for(lock, timeout, pred);
    lock.release();  // still held: the caller's MutexLock unlocks it
    return result;
  }

 private:
  // Out of line, so that Lock stays a try_lock where it is inlined.
  //
  // Spins a few microseconds before sleeping: the engine holds its lock for
  // bookkeeping only (copies run outside it), a fraction of a microsecond,
  // while a thread put to sleep on a futex is woken by an interprocessor
  // interrupt (in a virtual machine, an exit on both sides), which costs
  // several microseconds on the critical path of the kernel that waits.
  __attribute__((noinline)) void LockHeld() LMS_ACQUIRE() {
    const auto start = std::chrono::steady_clock::now();
    for (int attempt = 0; attempt < kSpinAttempts; ++attempt) {
      for (int i = 0; i < kPausesPerAttempt; ++i) CpuRelax();
      if (mu_.try_lock()) {
        Waited(start);
        return;
      }
    }
    mu_.lock();
    Waited(start);
  }

  void Waited(std::chrono::steady_clock::time_point start) {
    waited_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - start)
                      .count();
  }

  static void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  // About 64 x 8 pauses, 2-20 us depending on the CPU's pause.
  static constexpr int kSpinAttempts = 64;
  static constexpr int kPausesPerAttempt = 8;

  std::mutex mu_;
  // Written and read only with mu_ held.
  int64_t waited_ns_ = 0;
};

// Holds a Mutex for its scope.
class LMS_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) LMS_ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~MutexLock() LMS_RELEASE() { mu_.Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_THREAD_ANNOTATIONS_H_
