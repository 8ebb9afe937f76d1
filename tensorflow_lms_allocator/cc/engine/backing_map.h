// BackingMap: which physical granule backs each granule-sized slot of the
// large-object address range.
//
// A slot is unmapped, or mapped to one device granule, or to one host
// granule. Slots of a free address range may stay mapped to device granules
// as a cache, so a repeated allocate/free of the same range costs no mapping
// call; those slots are *cached*, and the set of them is kept here so that
// defragmentation can take their granules without searching.
//
// Invariant (kept by the engine): a slot is cached iff it is device-mapped
// and no allocation covers it.
//
// Thread-compatible: the engine's lock guards every call.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_BACKING_MAP_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_BACKING_MAP_H_

#include <cstdint>
#include <vector>

#include "engine/backend.h"

namespace lms {

class BackingMap {
 public:
  struct Backing {
    GranuleId granule = 0;
    bool mapped = false;
    PoolKind pool = PoolKind::kDevice;
  };

  explicit BackingMap(uint64_t slots);

  const Backing& at(uint64_t slot) const { return slots_[slot]; }
  void Set(uint64_t slot, PoolKind pool, GranuleId granule) {
    slots_[slot] = Backing{granule, true, pool};
  }
  void Clear(uint64_t slot) { slots_[slot] = Backing(); }

  // The cache of device-mapped free slots.
  void AddCached(uint64_t slot);
  void RemoveCached(uint64_t slot);
  bool IsCached(uint64_t slot) const { return cache_index_[slot] != kNotCached; }
  uint64_t cached_count() const { return cached_.size(); }
  // Any cached slot; the cache must not be empty.
  uint64_t AnyCached() const { return cached_.back(); }

  // The backend's ReleaseMark() when the slot's allocation was last freed
  // (0 if never): what UnmapReleased needs to skip waiting for queued work.
  // A slot keeps its mark across leaving and re-entering the cache.
  void SetReleaseMark(uint64_t slot, uint64_t mark) { release_mark_[slot] = mark; }
  uint64_t release_mark(uint64_t slot) const { return release_mark_[slot]; }

 private:
  static constexpr uint32_t kNotCached = 0xffffffffu;

  std::vector<Backing> slots_;
  std::vector<uint64_t> cached_;       // dense set of cached slots
  std::vector<uint32_t> cache_index_;  // slot -> position in cached_
  std::vector<uint64_t> release_mark_;
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_BACKING_MAP_H_
