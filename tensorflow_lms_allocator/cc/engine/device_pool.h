// DevicePool: the engine's device granules, handed out so that a unit costs
// the backend as few mappings as its driver allows.
//
// Where the backend maps any run of consecutive ids of a piece (CUDA on a
// driver that maps at an offset into a handle; POSIX, whose remaps cost per
// byte), the backend makes the pieces and this pool keeps free ids as
// extents (GranulePool): a unit handed one extent is one mapping. Where it
// maps only whole pieces (CUDA on a driver that refuses an offset, as driver
// 580 did on an H100), the pieces are cut here to the units (RunPool): one
// granule each until the engine's first eviction, then one piece a unit
// wherever the ids allow (Note [Device pieces cut to units] in engine.h).
//
// Thread-compatible: the engine's lock guards every call.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_DEVICE_POOL_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_DEVICE_POOL_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "engine/backend.h"
#include "engine/granule_pool.h"
#include "engine/run_pool.h"

namespace lms {

class DevicePool {
 public:
  using Run = GranuleRun;

  explicit DevicePool(size_t capacity) : extents_(PoolKind::kDevice, capacity) {}

  // Cuts the pieces here from now on, one granule each, before any Take.
  // `made`: the backend made every granule a piece of its own when it
  // created the pool (appended to *ahead, to be defined to it: they are
  // already made).
  void CutPieces(bool made, std::vector<Run>* ahead);
  bool cuts_pieces() const { return runs_ != nullptr; }
  // Cutting pieces: one piece a unit from now on (the first eviction).
  void CutUnits() {
    if (runs_) runs_->set_cutting(RunPool::Cutting::kUnits);
  }

  size_t capacity() const { return extents_.capacity(); }
  size_t free_count() const { return runs_ ? runs_->free_count() : extents_.free_count(); }
  size_t in_use() const { return capacity() - free_count(); }

  // Takes `n` granules into out[0..n), all or none. Cutting pieces, appends
  // to *released the pieces to release (before anything else) and to *cut
  // the pieces to define (RunPool::Take). False if fewer than `n` are free.
  // `releasable`: as RunPool::Take's.
  bool Take(size_t n, GranuleId* out, std::vector<Run>* released, std::vector<Run>* cut,
            const RunPool::Releasable& releasable = nullptr) {
    return runs_ ? runs_->Take(n, out, released, cut, releasable) : extents_.Take(n, out);
  }
  void Give(const GranuleId* ids, size_t n) {
    if (runs_) {
      runs_->Give(ids, n);
    } else {
      extents_.Give(ids, n);
    }
  }
  void Give(GranuleId id) { Give(&id, 1); }

 private:
  GranulePool extents_;
  std::unique_ptr<RunPool> runs_;  // cutting pieces
};

inline void DevicePool::CutPieces(bool made, std::vector<Run>* ahead) {
  runs_ = std::make_unique<RunPool>(extents_.capacity());
  runs_->set_cutting(RunPool::Cutting::kGranules);
  if (made) runs_->MakeAhead(extents_.capacity(), 1, ahead);
}

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_DEVICE_POOL_H_
