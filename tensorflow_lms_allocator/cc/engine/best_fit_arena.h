// BestFitArena: best-fit with coalescing over an abstract range of units.
//
// The engine runs two of these: one over the large-object address range in
// granule units, one over the small-object region in 256-byte units. The
// arena knows nothing about memory; it hands out [start, start + size) unit
// ranges and merges neighbours when they are returned, as TensorFlow's
// BFCAllocator (xla/tsl/framework/bfc_allocator.h) does with bytes.
//
// Free chunks sit in segregated bins: exact bins for sizes below 16 units,
// then eight bins per power of two, so a bin's sizes differ by at most 12.5%.
// A bitmap of non-empty bins makes finding the next bin O(1). Allocation takes
// the best fit among the first kBinScanLimit chunks of the request's own bin,
// else the head of the next non-empty bin (every chunk there is big enough),
// and splits off the remainder. Freeing merges with free neighbours in address
// order, so two adjacent free chunks never exist.
//
// Segments (the small-object region's pages): with segment_units > 0, the
// units are cut into segments of that many units. A chunk never crosses a
// segment boundary (Grow makes one chunk per segment; Free never merges across
// a boundary), so every allocation lies inside one segment. A segment is
// *available* or not; only free chunks of available segments are in the bins,
// so Allocate places nothing in an unavailable segment (a page that is not
// mapped, or is evicted). The chunk that starts a segment keeps its id for
// the arena's life (a split keeps the left part's id; a merge within the
// segment keeps the left chunk's), which makes a segment walk O(its chunks).
//
// Invariants:
//   - chunks tile [0, num_units()) in address order through prev/next;
//   - a chunk is in exactly one bin list iff it is free and its segment is
//     available (always, without segments);
//   - no two address-adjacent chunks of one segment are both free;
//   - the unit table maps an allocated chunk's start unit (and, with
//     index_interior, every unit it covers) to the chunk; nothing else.
//
// Thread-compatible: the engine's lock guards every call.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_BEST_FIT_ARENA_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_BEST_FIT_ARENA_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lms {

using ChunkId = uint32_t;
inline constexpr ChunkId kNoChunk = 0xffffffffu;

class BestFitArena {
 public:
  struct Chunk {
    uint64_t start = 0;           // first unit
    uint64_t size = 0;            // units
    uint64_t requested_bytes = 0; // what the caller asked for (allocated only)
    uint64_t allocation_id = 0;   // unique per allocation (allocated only)
    bool unclaimed = false;       // the caller's marks (allocated only):
    bool made_by_writer = false;  // small_pages.h's Note [Writer pages]
    ChunkId prev = kNoChunk;      // address-order neighbours
    ChunkId next = kNoChunk;
    ChunkId bin_prev = kNoChunk;  // bin list links (free only)
    ChunkId bin_next = kNoChunk;
    int bin = -1;
    bool free = false;
  };

  // `max_units` bounds Grow(); the unit table is reserved for it up front but
  // only touched pages cost memory. With `index_interior`, ChunkAt() resolves
  // any unit inside an allocated chunk, not just its first.
  // With `segment_units` (a power of two, or 0 for none), max_units must be
  // a multiple of it and every segment starts unavailable.
  BestFitArena(uint64_t max_units, bool index_interior,
               uint64_t segment_units = 0);
  ~BestFitArena();
  BestFitArena(const BestFitArena&) = delete;
  BestFitArena& operator=(const BestFitArena&) = delete;

  // Whether the unit table's address range was reserved; if not (the host's
  // address space is exhausted, e.g. under `ulimit -v`), Grow() always fails.
  bool reserved() const { return table_ != nullptr; }
  size_t table_bytes() const { return table_bytes_; }

  // Extends the arena by `units` at its end. Returns false past max_units
  // or when the table is not reserved().
  // With segments, `units` must be a multiple of the segment size.
  bool Grow(uint64_t units);

  // Makes a segment's free chunks allocatable, or withdraws them.
  void SetSegmentAvailable(uint64_t segment, bool available);
  bool segment_available(uint64_t segment) const {
    return segment_available_[segment] != 0;
  }
  uint64_t segment_units() const { return segment_units_; }
  // The segment holding `unit` (segments only).
  uint64_t SegmentOf(uint64_t unit) const { return unit >> segment_shift_; }
  // True if no allocated chunk lies in the segment.
  bool SegmentEmpty(uint64_t segment) const {
    const Chunk& head = chunks_[segment_head_[segment]];
    return head.free && head.size == segment_units_;
  }
  // Allocates `units` at the start of an empty segment, available or not
  // (an allocation born in a page that is not resident).
  ChunkId AllocateInEmptySegment(uint64_t segment, uint64_t units);

  // Returns the allocated chunk, or kNoChunk if no free chunk is big enough.
  ChunkId Allocate(uint64_t units);

  // Allocates exactly [start, start + units), which must lie inside one free
  // chunk (no segments). O(chunks): for the engine's slow paths.
  ChunkId AllocateAt(uint64_t start, uint64_t units);

  // Allocates the last `units` of the largest free chunk (no segments), or
  // returns kNoChunk if it is smaller: the range best fit reaches last.
  ChunkId AllocateAtEndOfLargest(uint64_t units);

  // Returns an allocated chunk; it may merge with its neighbours.
  void Free(ChunkId id);

  // The allocated chunk starting at (or, with index_interior, covering)
  // `unit`, or kNoChunk.
  ChunkId ChunkAt(uint64_t unit) const {
    if (unit >= num_units_) return kNoChunk;
    return table_[unit] - 1;  // 0 in the table means "none"
  }

  Chunk& chunk(ChunkId id) { return chunks_[id]; }
  const Chunk& chunk(ChunkId id) const { return chunks_[id]; }

  uint64_t num_units() const { return num_units_; }
  uint64_t max_units() const { return max_units_; }
  // Free units in the bins (of available segments).
  uint64_t free_units() const { return free_units_; }
  // The largest free chunk, in units (O(1): the top non-empty bin is scanned).
  uint64_t LargestFreeChunk() const;
  // Address-order walks: for (c = FirstChunk(); c != kNoChunk;
  // c = chunk(c).next), and the same from SegmentHead(s) while inside it.
  ChunkId FirstChunk() const { return first_; }
  ChunkId SegmentHead(uint64_t segment) const { return segment_head_[segment]; }
  // Calls fn(chunk) for every chunk in address order (tests and diagnostics).
  template <typename Fn>
  void ForEachChunk(Fn fn) const {
    for (ChunkId c = first_; c != kNoChunk; c = chunks_[c].next) fn(chunks_[c]);
  }

 private:
  static constexpr int kNumBins = 16 + 60 * 8;
  static constexpr int kBitmapWords = (kNumBins + 63) / 64;
  static constexpr int kBinScanLimit = 16;

  static int BinFor(uint64_t units);
  ChunkId NewChunk();
  // The largest free chunk (the top non-empty bin scanned), or kNoChunk.
  ChunkId LargestFreeChunkId() const;
  // Appends a chunk of `units` at the end, in no bin and not free.
  ChunkId AppendChunk(uint64_t units);
  void ReleaseChunk(ChunkId id);
  void InsertFree(ChunkId id);
  void RemoveFree(ChunkId id);
  int NextNonEmptyBin(int from) const;
  void SetTable(const Chunk& c, ChunkId value);
  // Marks a chunk free, in its bin if its segment is available.
  void MarkFree(ChunkId id);
  // Takes a free chunk out of its bin (if it is in one) and marks it used.
  void UnmarkFree(ChunkId id);
  bool SameSegment(const Chunk& a, const Chunk& b) const {
    return segment_units_ == 0 || ((a.start ^ b.start) >> segment_shift_) == 0;
  }
  bool Available(const Chunk& c) const {
    return segment_units_ == 0 || segment_available_[c.start >> segment_shift_];
  }
  // Splits `units` off the front of free chunk `found` and allocates them.
  ChunkId TakeFront(ChunkId found, uint64_t units);
  // Cuts chunk `id` after its first `units` (address order only: no bin or
  // free mark changes); returns the new right part.
  ChunkId SplitFront(ChunkId id, uint64_t units);

  const uint64_t max_units_;
  const bool index_interior_;
  const uint64_t segment_units_;
  const int segment_shift_;
  std::vector<uint8_t> segment_available_;
  std::vector<ChunkId> segment_head_;  // the chunk starting each segment
  uint64_t num_units_ = 0;
  uint64_t free_units_ = 0;
  ChunkId first_ = kNoChunk;
  ChunkId last_ = kNoChunk;
  std::vector<Chunk> chunks_;
  std::vector<ChunkId> spare_ids_;
  ChunkId bin_heads_[kNumBins];
  uint64_t bin_bitmap_[kBitmapWords] = {};
  ChunkId* table_ = nullptr;  // max_units_ entries of chunk id + 1, lazily zero
  size_t table_bytes_ = 0;
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_BEST_FIT_ARENA_H_
