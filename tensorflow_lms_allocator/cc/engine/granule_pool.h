// GranulePool: the free list of one pool of physical granules.
//
// The engine's device pool (the device's memory; the host pool, handed out
// in runs, is RunPool). The backend creates every granule of a pool once;
// the pool only decides which granule ids are free. A granule is either free here or backs exactly one
// address slot (an allocation, a cached free range, or the small-object
// region), so in_use() never exceeds capacity().
//
// Ids are handed out lowest first when the pool is fresh, so a new mapping
// usually gets consecutive granules and the backend maps a run in one call.
//
// Thread-compatible: the engine's lock guards every call.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_GRANULE_POOL_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_GRANULE_POOL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/backend.h"

namespace lms {

class GranulePool {
 public:
  GranulePool(PoolKind kind, size_t capacity);

  PoolKind kind() const { return kind_; }
  size_t capacity() const { return capacity_; }
  size_t free_count() const { return free_.size(); }
  size_t in_use() const { return capacity_ - free_.size(); }
  size_t peak_in_use() const { return peak_in_use_; }

  // Takes `n` granules into out[0..n), all or none. Returns false if fewer
  // than `n` are free.
  bool Take(size_t n, GranuleId* out);
  void Give(const GranuleId* ids, size_t n);
  void Give(GranuleId id) { Give(&id, 1); }

 private:
  const PoolKind kind_;
  const size_t capacity_;
  std::vector<GranuleId> free_;  // a stack; the top is handed out next
  size_t peak_in_use_ = 0;
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_GRANULE_POOL_H_
