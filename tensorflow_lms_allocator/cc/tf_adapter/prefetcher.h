// Prefetcher: the helper thread that pages in, ahead of use, what the
// learned policy predicts the next kernels will pin (Note [Learned eviction]
// in engine/learned_policy.h), so that on the emulated device the copy runs
// beside the kernels computing meanwhile instead of inside the pin of the
// kernel that needs it. (On a GPU the page-in's copy already runs on the
// backend's copy stream; the thread issues it earlier.)
//
// Each kernel start Notify()s it; it then calls Engine::Prefetch, which takes
// the engine's lock like any other call and never evicts. Notify is
// lock-free (an atomic flag and a notify without the mutex), so a process
// forked while the thread holds its mutex cannot deadlock in the child,
// where the thread does not exist and prefetching simply stops; a lost
// wake-up costs one wait slice.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_PREFETCHER_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_PREFETCHER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "engine/engine.h"

namespace lms {

class Prefetcher {
 public:
  // Uses within which a predicted use is prefetched: a few kernels ahead.
  static constexpr uint64_t kLookahead = 8;

  explicit Prefetcher(Engine* engine);
  ~Prefetcher();  // stops and joins the thread
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  void Notify() {
    pending_.store(true, std::memory_order_release);
    wake_.notify_one();
  }

 private:
  void Run();

  Engine* const engine_;
  std::atomic<bool> pending_{false};
  std::atomic<bool> stop_{false};
  std::mutex mu_;  // for the condition variable only
  std::condition_variable wake_;
  std::thread thread_;
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_PREFETCHER_H_
