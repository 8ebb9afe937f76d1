// SmallPages: the small-object region, as pages (Note [Residency units] in
// engine.h).
//
// Objects below the small-object threshold are packed into *pages*: one-
// granule residency units of the engine's address range, pinned, evicted and
// paged in like any allocation. What is specific to pages lives here:
//   - the sub-allocator: a BestFitArena over 256-byte units whose segments
//     are the pages (segment s covers units [s*U, (s+1)*U), U = granule /
//     256), so an object never straddles two pages;
//   - the page table: segment -> the page's unit (a chunk of the engine's
//     arena), its live objects and their bytes;
//   - the segments with no page, reused before the arena grows.
//
// The engine keeps a segment available in the sub-allocator exactly while
// its page is resident, so new objects land only in device memory.
//
// Invariants (Engine::CheckInvariants):
//   - a page's objects and bytes are the allocated chunks of its segment;
//   - a live page with no object is pinned (an unpinned empty page is
//     released at once, so the region shrinks);
//   - a segment is free (on the list) iff it has no page.
//
// Thread-compatible: the engine's lock guards every call.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_SMALL_PAGES_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_SMALL_PAGES_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/best_fit_arena.h"

namespace lms {

class SmallPages {
 public:
  static constexpr size_t kUnit = 256;

  struct Page {
    ChunkId unit = kNoChunk;  // the page's chunk in the engine's arena
    uint32_t objects = 0;
    int64_t bytes = 0;        // allocated bytes of its objects
  };

  // `max_pages` bounds the region: every page holds a device or a host
  // granule, so device plus host granules is enough.
  SmallPages(size_t granule, uint64_t max_pages);

  BestFitArena& arena() { return arena_; }
  const BestFitArena& arena() const { return arena_; }
  uint64_t units_per_page() const { return units_per_page_; }

  // A segment with no page (growing the sub-allocator if needed), or false
  // when max_pages pages exist.
  bool TakeSegment(uint64_t* segment);
  void ReturnSegment(uint64_t segment);

  Page& page(uint64_t segment) { return pages_[segment]; }
  const Page& page(uint64_t segment) const { return pages_[segment]; }
  uint64_t num_segments() const { return pages_.size(); }
  uint64_t live_pages() const { return pages_.size() - free_segments_.size(); }

  // Pages whose unit is resident (device granules), kept by the engine.
  uint64_t resident_pages() const { return resident_pages_; }
  void AddResident(int64_t delta) { resident_pages_ += delta; }

 private:
  const uint64_t units_per_page_;
  const uint64_t max_pages_;
  BestFitArena arena_;
  std::vector<Page> pages_;              // by segment
  std::vector<uint64_t> free_segments_;  // a stack
  uint64_t resident_pages_ = 0;
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_SMALL_PAGES_H_
