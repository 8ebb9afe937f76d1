// The engine's Mutex (engine/mutex.h) and the lock waiting it counts.
#include <atomic>
#include <chrono>
#include <thread>

#include "engine/mutex.h"
#include "harness.h"

namespace lms {
namespace {

// The engine's lock counts what a thread waited while another held it
// (time_lock_waiting_ns), and nothing for a lock nobody held.
TEST(AMutexCountsOnlyTheTimeAThreadWaitedForAnotherHolder) {
  Mutex mu;
  {
    MutexLock lock(mu);
    EXPECT_EQ(mu.waited_ns(), 0);
  }
  std::atomic<bool> about_to_wait{false};
  std::thread waiter;
  {
    MutexLock lock(mu);
    waiter = std::thread([&] {
      about_to_wait = true;
      MutexLock waiting(mu);
    });
    while (!about_to_wait) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  waiter.join();
  MutexLock lock(mu);
  EXPECT_TRUE(mu.waited_ns() >= 20 * 1000 * 1000);
  EXPECT_TRUE(mu.waited_ns() < 10ll * 1000 * 1000 * 1000);
}

}  // namespace
}  // namespace lms
