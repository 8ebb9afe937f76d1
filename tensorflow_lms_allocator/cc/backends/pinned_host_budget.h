// PinnedHostBudget: the pinned host memory all GPUs of the process may create
// for evicted tensors, one budget for them all.
//
// Pinned memory cannot be swapped: with no process-wide bound, N GPUs could
// pin N times TF_GPU_HOST_MEM_LIMIT_IN_MB, and the kernel's OOM killer would
// come before any clean error. The setting is split among the GPUs
// (HostShareBytes in env_options.h: each GPU's host pool holds its share),
// and the budget is the sum of the live GPUs' pools' limits:
//
//   limit() == sum over live host pools of the pool's limit
//   used()  == sum over live host pools of the granules they have created
//
// so the process never pins more than the setting (the shares add up to no
// more than it), and each GPU can always create its whole pool: a GPU's
// limit is exactly what it can get, whatever the others hold. Every host
// granule a CUDA backend creates is taken from this budget first and given
// back when it is released (a created granule stays pinned until then,
// whether or not it holds a tensor).
//
// Thread-safe: GPUs create granules under their own engines' locks.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_PINNED_HOST_BUDGET_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_PINNED_HOST_BUDGET_H_

#include <algorithm>
#include <cstddef>

#include "engine/mutex.h"

namespace lms {

class PinnedHostBudget {
 public:
  // The process's budget, which every CUDA backend's host pool draws on.
  static PinnedHostBudget& Process() {
    static PinnedHostBudget* budget = new PinnedHostBudget;  // outlives every backend
    return *budget;
  }

  // An empty budget (limit 0); tests make their own, the backends use
  // Process().
  PinnedHostBudget() = default;
  PinnedHostBudget(const PinnedHostBudget&) = delete;
  PinnedHostBudget& operator=(const PinnedHostBudget&) = delete;

  // A GPU's host pool that may hold up to `bytes` was created / destroyed:
  // the limit grows / shrinks by `bytes`.
  void AddPool(size_t bytes) LMS_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(mu_);
    limit_ += bytes;
  }
  void RemovePool(size_t bytes) LMS_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(mu_);
    limit_ -= std::min(limit_, bytes);
  }
  // Takes `bytes` if the budget has them.
  bool TryTake(size_t bytes) LMS_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(mu_);
    if (used_ + bytes > limit_) return false;
    used_ += bytes;
    return true;
  }
  void Give(size_t bytes) LMS_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(mu_);
    used_ -= std::min(used_, bytes);
  }
  size_t limit() const LMS_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(mu_);
    return limit_;
  }
  size_t used() const LMS_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(mu_);
    return used_;
  }

 private:
  mutable Mutex mu_;
  size_t limit_ LMS_GUARDED_BY(mu_) = 0;  // the live host pools' limits, summed
  size_t used_ LMS_GUARDED_BY(mu_) = 0;
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_PINNED_HOST_BUDGET_H_
