// Mutex: the lock of the engine, the backends, the adapter and the fake CUDA
// driver, a futex lock that the thread-safety analysis knows as a capability
// (engine/thread_annotations.h), and MutexLock, which holds it for a scope.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_MUTEX_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_MUTEX_H_

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <ctime>

#include "engine/thread_annotations.h"

namespace lms {

// A mutex the analysis knows as a capability, which counts the time threads
// waited for it.
//
// Every engine operation takes it once and holds it a fraction of a
// microsecond (copies run outside it), so its two atomic instructions were a
// fifth of an allocate+free pair. The uncontended path is one compare-and-swap
// to lock and one plain store to unlock (a std::mutex unlocks with a second
// locked instruction); only a thread that finds it held reads the clock.
//
// State: 0 free, 1 held, 2 held and a thread may be asleep on it. A thread
// that finds it held spins a few microseconds, then marks it 2 and sleeps on
// the futex. Unlock stores 0 and wakes one sleeper if it saw 2. Its load and
// store are not one atomic step, so a thread that marks the state 2 between
// them and falls asleep before the store lands is not woken by this unlock
// (its mark is overwritten); every sleep therefore ends after kSleep, when the
// sleeper tries again. Invariants: only a successful compare-and-swap or an
// exchange that returns 0 takes the lock (mutual exclusion); a sleeper wakes
// within kSleep whatever happens (progress); a lost wake costs at most kSleep,
// and needs the unlocking thread stopped between two adjacent instructions.
//
// BasicLockable (lock/unlock) for std::condition_variable_any, which the
// engine waits on through Await.
class LMS_CAPABILITY("mutex") Mutex {
 public:
  void Lock() LMS_ACQUIRE() {
    if (!TryLock()) LockHeld();
  }
  void Unlock() LMS_RELEASE() {
    const int state = state_.load(std::memory_order_relaxed);
    state_.store(kFree, std::memory_order_release);
    if (state == kHeldWithSleepers) WakeOne();
  }
  void lock() LMS_ACQUIRE() { Lock(); }
  void unlock() LMS_RELEASE() { Unlock(); }

  // Nanoseconds Lock() waited while another thread held the mutex, in all
  // (the time Await waits for its condition is not counted; taking the mutex
  // again after it is).
  int64_t waited_ns() const LMS_EXCLUSIVE_LOCKS_REQUIRED(this) { return waited_ns_; }

  // Waits on `cv` until pred(); the mutex is held on entry and on return
  // (released while waiting).
  template <typename Pred>
  void Await(std::condition_variable_any& cv, Pred pred) LMS_EXCLUSIVE_LOCKS_REQUIRED(this) {
    cv.wait(*this, pred);
  }

  // Waits on `cv` until pred() or the timeout; the mutex is held on entry
  // and on return (released while waiting).
  template <typename Pred>
  bool AwaitWithTimeout(std::condition_variable_any& cv, std::chrono::milliseconds timeout,
                        Pred pred) LMS_EXCLUSIVE_LOCKS_REQUIRED(this) {
    return cv.wait_for(*this, timeout, pred);
  }

 private:
  static constexpr int kFree = 0;
  static constexpr int kHeld = 1;
  static constexpr int kHeldWithSleepers = 2;

  bool TryLock() {
    int expected = kFree;
    return state_.compare_exchange_strong(expected, kHeld, std::memory_order_acquire,
                                          std::memory_order_relaxed);
  }

  // Out of line, so that Lock stays one compare-and-swap where it is inlined.
  //
  // Spins a few microseconds before sleeping: a thread put to sleep on a
  // futex is woken by an interprocessor interrupt (in a virtual machine, an
  // exit on both sides), which costs several microseconds on the critical
  // path of the kernel that waits.
  __attribute__((noinline)) void LockHeld() LMS_ACQUIRE() {
    const auto start = std::chrono::steady_clock::now();
    for (int attempt = 0; attempt < kSpinAttempts; ++attempt) {
      for (int i = 0; i < kPausesPerAttempt; ++i) CpuRelax();
      if (TryLock()) {
        Waited(start);
        return;
      }
    }
    // Taken with the sleepers' mark: whoever takes it this way may have
    // overwritten another sleeper's mark, so its own unlock wakes one.
    while (state_.exchange(kHeldWithSleepers, std::memory_order_acquire) != kFree) {
      Sleep();
    }
    Waited(start);
  }

  // Sleeps while the state is kHeldWithSleepers, for at most kSleep.
  void Sleep() {
    timespec timeout{0, kSleep.count()};
    syscall(SYS_futex, &state_, FUTEX_WAIT_PRIVATE, kHeldWithSleepers, &timeout, nullptr, 0);
  }
  __attribute__((noinline)) void WakeOne() {
    syscall(SYS_futex, &state_, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
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
  // The longest sleep: what a lost wake can cost.
  static constexpr std::chrono::nanoseconds kSleep = std::chrono::milliseconds(1);

  std::atomic<int> state_{kFree};
  // Written and read only with the mutex held.
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

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_MUTEX_H_
