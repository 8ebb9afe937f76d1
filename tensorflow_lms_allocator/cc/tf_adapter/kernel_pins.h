// KernelPins: what each running kernel holds pinned.
//
// When an OpKernelContext is constructed, every input tensor whose buffer the
// engine may evict is pinned (sub-slices included: the engine resolves any
// address inside an allocation), paging it in first if it was evicted. While
// the kernel runs, what it allocates on its thread starts pinned and joins
// the same list. When the context is destroyed, everything on the list is
// unpinned and becomes inactive, ready for eviction in LRU order.
//
// A context's list is found by the context's address (sharded maps). The
// thread's current context is a thread-local pointer set at construction and
// restored at destruction, so a kernel that runs another inline (a nested
// context) gets its own list and the outer one back afterwards. A context
// destroyed on another thread (asynchronous kernels) leaves the creating
// thread's pointer stale; allocations recorded against a context that no
// longer exists are unpinned at once, never leaked.
//
// Thread-safety: all methods may be called from any thread.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_KERNEL_PINS_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_KERNEL_PINS_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "engine/thread_annotations.h"

namespace lms {

class KernelPins {
 public:
  explicit KernelPins(Engine* engine) : engine_(engine) {}

  // `context` is a tensorflow::OpKernelContext*, `params` its Params*.
  void OnContextCreated(void* context, void* params);
  void OnContextDestroyed(void* context);

  // Whether this thread is inside a kernel (allocations should start pinned).
  bool InKernel() const;
  // Whether kernels other than this thread's current one are running (and
  // may release pinned memory when they finish).
  bool OtherKernelsRunning() const {
    return live_contexts_.load(std::memory_order_relaxed) > (InKernel() ? 1 : 0);
  }
  // Runs `attempt` (an allocation or a pin) again each time another kernel
  // releases memory, while it fails with kResourceExhausted, LMS is on and
  // other kernels are running, for at most kRetryBudget in all. Memory pinned
  // by kernels on other threads comes back when they finish, so a request that
  // fits once they are done waits for that (as TensorFlow's GPU allocator
  // retries) instead of failing.
  // (A template, so the fast path calls `attempt` with no std::function.)
  template <typename Attempt>
  Status RetryWhileOthersRelease(Attempt attempt) {
    Status status = attempt();
    if (status.code() != StatusCode::kResourceExhausted) return status;
    const auto deadline = std::chrono::steady_clock::now() + kRetryBudget;
    while (engine_->lms_enabled() && OtherKernelsRunning()) {
      // Read the epoch, then try again: a release after the read wakes the
      // wait, so none is missed between the failure and the wait.
      const uint64_t epoch = engine_->ReleaseEpoch();
      status = attempt();
      if (status.code() != StatusCode::kResourceExhausted) break;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !engine_->WaitForRelease(epoch, left)) break;
    }
    return status;
  }
  static constexpr std::chrono::seconds kRetryBudget{10};

  // Adds an allocation made pinned on this thread to the current kernel.
  void RecordAllocation(const void* ptr, uint64_t allocation_id);

 private:
  struct Pin {
    const void* ptr;
    uint64_t allocation_id;
  };
  struct Entry {
    void* previous_context = nullptr;
    std::vector<Pin> pins;
  };
  struct Shard {
    std::mutex mu;
    std::unordered_map<void*, Entry> entries LMS_GUARDED_BY(mu);
  };
  static constexpr int kShards = 16;

  Shard& ShardFor(void* context) {
    return shards_[(reinterpret_cast<uintptr_t>(context) >> 6) % kShards];
  }
  void UnpinAll(const std::vector<Pin>& pins);

  Engine* const engine_;
  Shard shards_[kShards];
  std::atomic<int64_t> live_contexts_{0};
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_KERNEL_PINS_H_
