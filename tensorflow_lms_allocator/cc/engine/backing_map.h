// BackingMap: which physical granule backs each granule-sized slot of the
// large-object address range.
//
// A slot is unmapped, or mapped to one device granule, or to one host
// granule (or unmapped with the host granule that holds its evicted bytes
// recorded). Slots of a free address range may stay mapped to device granules
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

#include <algorithm>
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
  // The slot maps nothing, but `granule` holds its bytes (Note [Evicted
  // tensors unmapped] in engine.h).
  void SetUnmapped(uint64_t slot, PoolKind pool, GranuleId granule) {
    slots_[slot] = Backing{granule, false, pool};
  }
  void Clear(uint64_t slot) { slots_[slot] = Backing(); }

  // The cache of device-mapped free slots: a bitmap, so that a unit's
  // whole range enters or leaves it in a few word operations (an
  // allocate+free of n granules did n set insertions and removals before).
  void AddCached(uint64_t slot) { AddCachedRun(slot, 1); }
  void RemoveCached(uint64_t slot) { TakeCachedRun(slot, 1); }
  // Adds [first, first + n), none of it cached.
  void AddCachedRun(uint64_t first, uint64_t n);
  // Removes whatever of [first, first + n) is cached; returns how many were.
  uint64_t TakeCachedRun(uint64_t first, uint64_t n);
  bool IsCached(uint64_t slot) const {
    return (cached_[slot >> 6] >> (slot & 63)) & 1;
  }
  uint64_t cached_count() const { return cached_count_; }
  // How many of [first, first + n) are cached.
  uint64_t CountCached(uint64_t first, uint64_t n) const;
  // The lowest start of n consecutive cached slots, if there is one:
  // O(bitmap words), for the slow path only.
  bool FindCachedRun(uint64_t n, uint64_t* first) const;
  // The highest cached slot; the cache must not be empty. Amortized
  // constant time: it scans down from the highest summary word it last
  // found (or a higher one set since).
  uint64_t AnyCached();
  // The highest cached slot below `before`, if there is one: O(bitmap words
  // skipped / 64) through the summary.
  bool PrevCached(uint64_t before, uint64_t* slot) const;

  // The backend's ReleaseMark() when the slot's allocation was last freed
  // (0 if never): what UnmapReleased needs to skip waiting for queued work.
  // A slot keeps its mark across leaving and re-entering the cache.
  void SetReleaseMarks(uint64_t first, uint64_t n, uint64_t mark) {
    std::fill_n(release_mark_.begin() + first, n, mark);
  }
  uint64_t release_mark(uint64_t slot) const { return release_mark_[slot]; }

 private:
  // Calls fn(word index, mask, bits set in mask) for the words covering
  // [first, first + n).
  template <typename Fn>
  static void ForEachWord(uint64_t first, uint64_t n, Fn fn);

  std::vector<Backing> slots_;
  // Bit s of cached_ is slot s; bit w of summary_ says cached_[w] != 0.
  std::vector<uint64_t> cached_;
  std::vector<uint64_t> summary_;
  // Invariant: no word of summary_ from summary_top_ on is nonzero. Adding
  // raises it; AnyCached lowers it to one past the highest nonzero word, so
  // it does not scan the whole summary at each call (at 100,000 units, 2%
  // of `make bench-scale`'s step did). Taking leaves it: an allocate+free
  // of the only cached run would otherwise scan it down at every free.
  uint64_t summary_top_ = 0;
  uint64_t cached_count_ = 0;
  std::vector<uint64_t> release_mark_;
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_BACKING_MAP_H_
