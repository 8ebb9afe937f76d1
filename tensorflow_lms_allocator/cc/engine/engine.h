// Engine: the address-stable swapping allocator.
//
// Every allocation keeps the same virtual address for its whole life; what
// moves is the physical memory behind it (see DESIGN.md, "tensors never
// move"). The engine reserves two address ranges from its backend:
//
//   large-object range   best-fit with coalescing over granule-sized slots
//                        (BestFitArena). An allocation of one granule or more
//                        covers whole slots, each mapped to one device granule
//                        while resident or one host granule while evicted.
//   small-object region  best-fit over 256-byte units, grown a granule at a
//                        time at its end with device granules. Never evicted:
//                        small tensors are a small share of a model's memory.
//
// Residency and pins (Residency): Pin() makes an allocation active (a kernel
// uses it) and pages it in first if it was evicted; Unpin() makes it inactive
// again when the count reaches zero. Only inactive allocations are evicted,
// least recently used first (reclaim_policy.h).
//
// When the device pool cannot cover a request (engine_reclaim.cc):
//   1. take free device-pool granules;
//   2. with defragmentation on, remap granules cached at free address ranges
//      elsewhere (no data moves);
//   3. with LMS on, evict inactive allocations: copy their bytes to host
//      granules, map those at the same address, return the device granules;
//   4. fail with kResourceExhausted and a message naming what was short.
// Without defragmentation, granules cached at a free address range serve
// only allocations placed on that range: that is fragmentation, which
// defragmentation removes without moving a tensor.
//
// Thread-safety: one mutex guards all state. POSIX copies run under it; the
// CUDA backend will only enqueue them. Allocate/Free/Pin/Unpin are the fast
// paths (engine.cc); eviction and page-in live in engine_reclaim.cc.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_ENGINE_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_ENGINE_H_

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/backend.h"
#include "engine/backing_map.h"
#include "engine/best_fit_arena.h"
#include "engine/granule_pool.h"
#include "engine/residency.h"
#include "engine/statistics.h"
#include "engine/status.h"
#include "engine/strict_monitor.h"
#include "engine/thread_annotations.h"

namespace lms {

struct EngineOptions {
  // The device pool's size: the device's memory (rounded down to granules).
  size_t device_bytes = 0;
  // The host pool's size: swap space for evicted allocations
  // (TF_GPU_HOST_MEM_LIMIT_IN_MB). Zero disables eviction's destination.
  size_t host_bytes = 0;
  // Requests below this many bytes go to the small-object region and are
  // never evicted. Zero means one granule.
  size_t small_object_threshold = 0;
  // Evict inactive allocations when the device pool runs out. Off, the engine
  // is a plain capped allocator.
  bool lms_enabled = true;
  // Remap granules cached at free address ranges to where they are needed.
  // On by default: a remap moves no data and costs a mapping call, while the
  // eviction it spares copies the allocation. Off, granules cached at a free
  // range serve only allocations placed there (classic fragmentation).
  bool defrag_enabled = true;
  // Map evicted memory with no access and report unpinned touches.
  bool strict = false;
};

// What Inspect() tells about one live allocation.
struct AllocationInfo {
  uint64_t id = 0;
  uintptr_t address = 0;
  size_t requested_bytes = 0;
  size_t allocated_bytes = 0;
  bool small = false;      // in the small-object region (never evicted)
  bool evicted = false;
  uint32_t pin_count = 0;
};

class Engine {
 public:
  static Status Create(const EngineOptions& options,
                       std::unique_ptr<Backend> backend,
                       std::unique_ptr<Engine>* out);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Returns a 256-byte-aligned (granule-aligned for large requests) address,
  // or nullptr with *status saying why. With `pin`, the allocation starts
  // pinned once, so nothing can evict it before its first user pins it.
  // *allocation_id (if given) receives the new allocation's id.
  void* Allocate(size_t bytes, bool pin, Status* status,
                 uint64_t* allocation_id = nullptr);

  // `ptr` must be an address Allocate returned and not yet freed.
  Status Free(void* ptr);

  // Pins the allocation containing `ptr` (any byte of it), paging it in
  // first if it is evicted. *allocation_id (if given) receives its id, for
  // Unpin. Pinning a small-object allocation does nothing: it is never
  // evicted.
  Status Pin(const void* ptr, uint64_t* allocation_id);
  // Unpins the allocation containing `ptr`. A nonzero `allocation_id` must
  // match it, so an unpin never lands on a later allocation at a reused
  // address (kNotFound then).
  Status Unpin(const void* ptr, uint64_t allocation_id);

  // A counter that moves whenever memory may have become available (an
  // unpin to zero or a free). With WaitForRelease, a caller whose request
  // failed while other users held pins can wait for one of them to finish:
  //   uint64_t epoch = engine.ReleaseEpoch();
  //   if (engine.Allocate(...) == nullptr) engine.WaitForRelease(epoch, t);
  uint64_t ReleaseEpoch() const;
  // Returns true once the epoch has moved past `epoch`, false after `timeout`.
  bool WaitForRelease(uint64_t epoch, std::chrono::milliseconds timeout) const;

  // Evicts one inactive allocation now (tests and tools); kFailedPrecondition
  // if it is pinned, small or already evicted.
  Status Evict(const void* ptr);

  // True if `ptr` lies in the large-object range, the only memory that is
  // ever evicted. Lock-free, so callers skip pinning anything else cheaply.
  bool InEvictableRange(const void* ptr) const {
    const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
    return a >= large_base_ && a < large_base_ + large_slots_ * granule_;
  }
  // True if `ptr` lies in memory this engine hands out.
  bool Owns(const void* ptr) const {
    return InEvictableRange(ptr) || InSmallRegion(ptr);
  }

  Status Inspect(const void* ptr, AllocationInfo* info) const;
  size_t RequestedSize(const void* ptr) const;
  size_t AllocatedSize(const void* ptr) const;
  uint64_t AllocationId(const void* ptr) const;

  Statistics GetStatistics() const;
  void ResetPeaks();

  void SetLmsEnabled(bool enabled);
  bool lms_enabled() const;
  void SetDefragEnabled(bool enabled);
  bool defrag_enabled() const;

  size_t granule_bytes() const { return granule_; }
  size_t small_object_threshold() const { return small_threshold_; }
  size_t device_granules() const { return device_pool_.capacity(); }
  size_t host_granules() const { return host_pool_.capacity(); }
  // Device granules taken from the pool (never above device_granules()).
  size_t device_granules_in_use() const;
  size_t cached_granules() const;
  // Strict mode's report (empty unless options.strict).
  std::vector<UnpinnedTouch> UnpinnedTouches() const;
  void ClearUnpinnedTouches();
  const Backend& backend() const { return *backend_; }

  // The fork handlers (engine_fork.cc, Note [Fork] in fork_handlers.h):
  // PrepareFork takes the lock and keeps it across fork(); the After calls
  // carry the backend's memory over and release it, in each process.
  void PrepareFork() LMS_THREAD_ANNOTATION(acquire_capability(mu_));
  void AfterForkInParent() LMS_THREAD_ANNOTATION(release_capability(mu_));
  void AfterForkInChild() LMS_THREAD_ANNOTATION(release_capability(mu_));

 private:
  Engine(const EngineOptions& options, std::unique_ptr<Backend> backend);
  Status Init();

  // Fast paths (engine.cc).
  void* AllocateSmall(size_t bytes, Status* status, uint64_t* allocation_id)
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void* AllocateLarge(size_t bytes, bool pin, Status* status,
                      uint64_t* allocation_id) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Status FreeLarge(ChunkId id) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The large chunk containing ptr, or kNoChunk.
  ChunkId LargeChunkAt(const void* ptr) const LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool InSmallRegion(const void* ptr) const {
    const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
    return a >= small_base_ && a < small_base_ + small_reserved_bytes_;
  }
  uintptr_t SlotAddress(uint64_t slot) const {
    return large_base_ + slot * granule_;
  }
  void RefreshPoolStatistics() LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the release epoch and wakes waiters, if any.
  void NoteRelease() LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Out-of-memory path, eviction and page-in (engine_reclaim.cc).
  // Ensures the device pool holds at least `granules` free granules.
  Status ObtainDeviceGranules(uint64_t granules)
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t StealCachedGranules(uint64_t granules)
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Status EvictChunk(ChunkId id) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Status PageIn(ChunkId id) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Status GrowSmallRegion(uint64_t granules) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Maps granules[0..count) at the consecutive slots from `first_slot` and
  // records them in the backing map.
  Status MapSlots(uint64_t first_slot, uint64_t count, PoolKind pool,
                  const GranuleId* granules, Access access)
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Status OutOfMemory(uint64_t granules, const char* what) const
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const EngineOptions options_;
  const std::unique_ptr<Backend> backend_;
  const size_t granule_;
  const int granule_shift_;
  const size_t small_threshold_;
  static constexpr size_t kSmallUnit = 256;

  mutable std::mutex mu_;
  mutable std::condition_variable released_;
  uint64_t release_epoch_ LMS_GUARDED_BY(mu_) = 0;
  mutable int release_waiters_ LMS_GUARDED_BY(mu_) = 0;
  GranulePool device_pool_ LMS_GUARDED_BY(mu_);
  GranulePool host_pool_ LMS_GUARDED_BY(mu_);

  uintptr_t large_base_ = 0;
  uint64_t large_slots_ = 0;
  BestFitArena large_arena_ LMS_GUARDED_BY(mu_);
  BackingMap backing_ LMS_GUARDED_BY(mu_);
  Residency residency_ LMS_GUARDED_BY(mu_);

  uintptr_t small_base_ = 0;
  size_t small_reserved_bytes_ = 0;
  BestFitArena small_arena_ LMS_GUARDED_BY(mu_);
  std::vector<GranuleId> small_granules_ LMS_GUARDED_BY(mu_);

  bool lms_enabled_ LMS_GUARDED_BY(mu_);
  bool defrag_enabled_ LMS_GUARDED_BY(mu_);
  uint64_t next_allocation_id_ LMS_GUARDED_BY(mu_) = 1;
  Statistics stats_ LMS_GUARDED_BY(mu_);
  std::unique_ptr<StrictMonitor> strict_;
  // Granule ids for AllocateLarge, kept to avoid allocating on every call.
  std::vector<GranuleId> scratch_ LMS_GUARDED_BY(mu_);
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_ENGINE_H_
