// PinnedHostBudget: the pinned host memory all GPUs of the process may create
// for evicted tensors, one budget for them all.
//
// Each GPU's host pool may grow to TF_GPU_HOST_MEM_LIMIT_IN_MB (by default up
// to the machine's memory), and pinned memory cannot be swapped: with one
// budget per GPU, N GPUs could pin N times the machine, and the kernel's OOM
// killer would come before any clean error. So the limit is the process's:
// every host granule a CUDA backend creates is taken from this budget first
// and given back when its pool is destroyed (a created granule stays pinned
// until then, whether or not it holds a tensor). The budget is the largest
// limit of the live GPUs' pools (every GPU reads the same setting).
//
// Thread-safe: GPUs create granules under their own engines' locks.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_PINNED_HOST_BUDGET_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_PINNED_HOST_BUDGET_H_

#include <algorithm>
#include <cstddef>
#include <set>

#include "engine/mutex.h"

namespace lms {

class PinnedHostBudget {
 public:
  // The process's budget.
  static PinnedHostBudget& Process() {
    static PinnedHostBudget* budget = new PinnedHostBudget;  // outlives every backend
    return *budget;
  }

  // A GPU's host pool that may hold up to `bytes` was created / destroyed.
  void AddPool(size_t bytes) LMS_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(mu_);
    pools_.insert(bytes);
  }
  void RemovePool(size_t bytes) LMS_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(mu_);
    auto it = pools_.find(bytes);
    if (it != pools_.end()) pools_.erase(it);
  }
  // Takes `bytes` if the budget has them.
  bool TryTake(size_t bytes) LMS_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(mu_);
    if (used_ + bytes > Limit()) return false;
    used_ += bytes;
    return true;
  }
  void Give(size_t bytes) LMS_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(mu_);
    used_ -= std::min(used_, bytes);
  }
  size_t limit() const LMS_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(mu_);
    return Limit();
  }
  size_t used() const LMS_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(mu_);
    return used_;
  }

 private:
  PinnedHostBudget() = default;
  size_t Limit() const LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pools_.empty() ? 0 : *pools_.rbegin();
  }

  mutable Mutex mu_;
  std::multiset<size_t> pools_ LMS_GUARDED_BY(mu_);  // each live host pool's limit
  size_t used_ LMS_GUARDED_BY(mu_) = 0;
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_PINNED_HOST_BUDGET_H_
