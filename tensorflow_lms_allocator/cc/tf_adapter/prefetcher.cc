#include "tf_adapter/prefetcher.h"

#include <chrono>

namespace lms {

Prefetcher::Prefetcher(Engine* engine) : engine_(engine), thread_([this] { Run(); }) {}

Prefetcher::~Prefetcher() {
  stop_.store(true, std::memory_order_release);
  wake_.notify_one();
  thread_.join();
}

void Prefetcher::Run() {
  constexpr auto kSlice = std::chrono::milliseconds(20);
  while (!stop_.load(std::memory_order_acquire)) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait_for(lock, kSlice, [this] {
        return pending_.load(std::memory_order_acquire) ||
               stop_.load(std::memory_order_acquire);
      });
    }
    if (!pending_.exchange(false, std::memory_order_acq_rel)) continue;
    uint64_t units = 0;
    // A failed page-in leaves the unit evicted and loses nothing; its
    // kernel's pin pages it in (or reports why it cannot).
    (void)engine_->Prefetch(kLookahead, &units);
  }
}

}  // namespace lms
