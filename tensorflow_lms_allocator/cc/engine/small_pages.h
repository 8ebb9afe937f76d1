// SmallPages: the small-object region, as pages (Note [Residency units] in
// engine.h).
//
// Objects below the small-object threshold are packed into *pages*: one-
// granule residency units of the engine's address range, pinned, evicted and
// paged in like any allocation. What is specific to pages lives here:
//   - the sub-allocators: one BestFitArena over 256-byte units per size
//     class, whose segments are the pages (segment s covers units
//     [s*U, (s+1)*U), U = granule / 256), so an object never straddles two
//     pages; a page's segment is used in its class's arena only;
//   - the page table: segment -> the page's unit (a chunk of the engine's
//     arena), its size class, its live objects and their bytes;
//   - the segments with no page, reused before the arena grows.
//
// The engine keeps a segment available in the sub-allocator exactly while
// its page is resident, so new objects land only in device memory.
//
// Note [Size classes]. Objects below kTinyBytes (scalars, shapes, loop
// counters and conditions: TensorFlow makes thousands per step, and nearly
// every kernel reads some) share pages only with each other; larger ones
// (activations, gradients) only with larger ones. Mixed, a page of
// activations that a loop counter sits in is pinned by every kernel reading
// the counter and stays recently used, so pages of cold activations could
// not be evicted and hot ones were paged in a granule at a time for a few
// bytes. Measured by replaying a trace of an Embedding+LSTM+GRU model
// (benchmarks/mincap.py's rnn) at 16, 20 and 24 MiB: 3.3x, 2.3x and 1.2x
// fewer bytes swapped than one mixed class; more classes (cut at 32 KiB or
// 128 KiB as well) leave more half-empty pages and no longer fit at 16 MiB;
// filling one "open page" with pinned outputs until it is full (so that a
// kernel's outputs share pages) swapped 1.5-2x more from 18 MiB up
// (docs/decisions/0004-small-object-size-classes.md).
// The classes never cost a kernel its device: when an object's class can get
// no page (nothing left to evict), a resident page of another class with
// room takes it, so a device of one granule still runs a kernel holding
// tensors of both sizes. A page's objects live in its class's arena,
// whatever their size.
//
// Note [Writer pages]. An unclaimed object keeps its whole page off the
// eviction list (Note [Writers outside kernels] in engine.h), so larger
// objects made outside kernels (Hold::kWriter: tf.data batches, converted
// NumPy arrays) have a class of their own, and share no page with objects
// made in kernels while they are unclaimed:
//   - a writer's object goes into a writer's page that holds no object made
//     in a kernel, and into one that holds nothing unclaimed only within the
//     bound on unclaimed memory (Engine::PlaceObject). A new page for it
//     evicts nothing: it takes free device memory or is born evicted, and
//     the first kernel to pin one of its objects pages it in (evicting a
//     granule of kernels' tensors for a few batches cost more copies than
//     paging the batches in: docs/decisions/0001-writer-pages.md);
//   - a kernel's object that finds no room in kernels' pages may take the
//     room left in a writer's page that holds nothing unclaimed (a 1.7 MiB
//     batch leaves 0.3 MiB of its page); writers' objects then stay out of
//     that page until the kernel's objects are gone.
// Tiny objects mix, wherever they were made: a page of their own for the
// writers' few (labels, converted Python scalars) would take a granule of
// the device for good, and tiny pages are hot, rarely evicted anyway.
// Only when an object's class can get no page at all does it take room in
// any resident page (a writer's within the bound), as Note [Size classes]
// says. After its claim an object stays where it is: its page joins the
// eviction list once nothing in it is unclaimed. The measurements behind
// these rules are docs/decisions/0001-writer-pages.md.
//
// Invariants (Engine::CheckInvariants):
//   - a page's objects and bytes are the allocated chunks of its segment in
//     its class's arena; every other class's arena holds none there;
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

  // Size classes (Note [Size classes]), larger objects by who made them
  // (Note [Writer pages]).
  static constexpr size_t kTinyBytes = 4096;
  static constexpr int kTinyClass = 0;    // tiny objects, wherever made
  static constexpr int kKernelClass = 1;  // larger ones made in kernels
  static constexpr int kWriterClass = 2;  // larger ones made outside kernels
  static constexpr int kNumClasses = 3;
  int ClassOf(size_t bytes, bool writer) const {
    return bytes < tiny_bytes_ ? kTinyClass : writer ? kWriterClass : kKernelClass;
  }

  struct Page {
    ChunkId unit = kNoChunk;  // the page's chunk in the engine's arena
    int size_class = 0;
    uint32_t objects = 0;
    uint32_t kernel_objects = 0;  // of them, those not made by a writer
    int64_t bytes = 0;            // allocated bytes of its objects
  };

  // `max_pages` bounds the region: every page holds a device or a host
  // granule, so device plus host granules is enough.
  SmallPages(size_t granule, uint64_t max_pages, size_t tiny_bytes = kTinyBytes);

  // Every class's arena spans every segment (unavailable where the class
  // has no page), so they grow together.
  BestFitArena& arena(int size_class) { return arenas_[size_class]; }
  const BestFitArena& arena(int size_class) const { return arenas_[size_class]; }
  // The arena holding `segment`'s objects (the class of its page).
  BestFitArena& arena_of(uint64_t segment) { return arena(pages_[segment].size_class); }
  const BestFitArena& arena_of(uint64_t segment) const {
    return arena(pages_[segment].size_class);
  }
  uint64_t units_per_page() const { return units_per_page_; }
  // Calls fn(object) for each live object of `segment`'s page (a const
  // BestFitArena::Chunk&), in address order: the slow paths' walk (copies,
  // traces, messages, checks).
  template <typename Fn>
  void ForEachObject(uint64_t segment, Fn fn) const {
    const BestFitArena& objects = arena_of(segment);
    const uint64_t end = (segment + 1) * units_per_page_;
    for (ChunkId c = objects.SegmentHead(segment);
         c != kNoChunk && objects.chunk(c).start < end; c = objects.chunk(c).next) {
      if (!objects.chunk(c).free) fn(objects.chunk(c));
    }
  }

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
  const size_t tiny_bytes_;
  // In place, not behind pointers: every small allocate and free reaches one.
  BestFitArena arenas_[kNumClasses];
  std::vector<Page> pages_;              // by segment
  std::vector<uint64_t> free_segments_;  // a stack
  uint64_t resident_pages_ = 0;
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_SMALL_PAGES_H_
