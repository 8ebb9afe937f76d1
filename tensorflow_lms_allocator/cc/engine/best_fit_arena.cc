#include "engine/best_fit_arena.h"

#include <sys/mman.h>

#include <cassert>

namespace lms {

// The bin-list primitives run several times in every allocate and free;
// left to itself GCC calls them (measured: a call each was a tenth of an
// allocate+free pair).
#define LMS_ARENA_INLINE [[gnu::always_inline]] inline

BestFitArena::BestFitArena(uint64_t max_units, bool index_interior,
                           uint64_t segment_units)
    : max_units_(max_units),
      index_interior_(index_interior),
      segment_units_(segment_units),
      segment_shift_(segment_units == 0 ? 0 : __builtin_ctzll(segment_units)) {
  assert(segment_units == 0 || (segment_units & (segment_units - 1)) == 0);
  assert(segment_units == 0 || max_units % segment_units == 0);
  for (ChunkId& h : bin_heads_) h = kNoChunk;
  // An anonymous mapping is zero-filled on first touch, so a table sized for
  // the whole reservation costs memory only where chunks are.
  table_bytes_ = (max_units_ == 0 ? 1 : max_units_) * sizeof(ChunkId);
  void* p = mmap(nullptr, table_bytes_, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  // Without a table the arena cannot grow (Grow fails); its owner reports
  // reserved() == false as an error instead of the process aborting.
  table_ = p == MAP_FAILED ? nullptr : static_cast<ChunkId*>(p);
}

BestFitArena::~BestFitArena() {
  if (table_ != nullptr) munmap(table_, table_bytes_);
}

int BestFitArena::BinFor(uint64_t units) {
  if (units < 16) return static_cast<int>(units);
  const int log2 = 63 - __builtin_clzll(units);            // >= 4
  const int sub = static_cast<int>((units >> (log2 - 3)) & 7);
  return 16 + (log2 - 4) * 8 + sub;
}

ChunkId BestFitArena::NewChunk() {
  if (!spare_ids_.empty()) {
    ChunkId id = spare_ids_.back();
    spare_ids_.pop_back();
    // Copied from a constant: assigning a temporary builds it on the stack
    // and reloads it wider than it was stored, a store-forwarding stall on
    // every allocation (measured: the arena's most expensive line).
    static constexpr Chunk kFresh{};
    chunks_[id] = kFresh;
    return id;
  }
  chunks_.emplace_back();
  return static_cast<ChunkId>(chunks_.size() - 1);
}

void BestFitArena::ReleaseChunk(ChunkId id) { spare_ids_.push_back(id); }

LMS_ARENA_INLINE void BestFitArena::InsertFree(ChunkId id) {
  Chunk& c = chunks_[id];
  c.bin = BinFor(c.size);
  c.bin_prev = kNoChunk;
  c.bin_next = bin_heads_[c.bin];
  if (c.bin_next != kNoChunk) chunks_[c.bin_next].bin_prev = id;
  bin_heads_[c.bin] = id;
  bin_bitmap_[c.bin >> 6] |= uint64_t{1} << (c.bin & 63);
  free_units_ += c.size;
}

LMS_ARENA_INLINE void BestFitArena::RemoveFree(ChunkId id) {
  Chunk& c = chunks_[id];
  if (c.bin_prev != kNoChunk) {
    chunks_[c.bin_prev].bin_next = c.bin_next;
  } else {
    bin_heads_[c.bin] = c.bin_next;
    if (c.bin_next == kNoChunk) {
      bin_bitmap_[c.bin >> 6] &= ~(uint64_t{1} << (c.bin & 63));
    }
  }
  if (c.bin_next != kNoChunk) chunks_[c.bin_next].bin_prev = c.bin_prev;
  c.bin_prev = c.bin_next = kNoChunk;
  c.bin = -1;
  free_units_ -= c.size;
}

LMS_ARENA_INLINE void BestFitArena::MarkFree(ChunkId id) {
  chunks_[id].free = true;
  if (Available(chunks_[id])) InsertFree(id);
}

LMS_ARENA_INLINE void BestFitArena::UnmarkFree(ChunkId id) {
  if (chunks_[id].bin != -1) RemoveFree(id);
  chunks_[id].free = false;
}

void BestFitArena::SetSegmentAvailable(uint64_t segment, bool available) {
  if (segment_available_[segment] == (available ? 1 : 0)) return;
  segment_available_[segment] = available ? 1 : 0;
  const uint64_t end = (segment + 1) << segment_shift_;
  for (ChunkId c = segment_head_[segment]; c != kNoChunk && chunks_[c].start < end;
       c = chunks_[c].next) {
    if (!chunks_[c].free) continue;
    if (available) InsertFree(c);
    else RemoveFree(c);
  }
}

int BestFitArena::NextNonEmptyBin(int from) const {
  if (from >= kNumBins) return -1;
  int word = from >> 6;
  uint64_t bits = bin_bitmap_[word] & (~uint64_t{0} << (from & 63));
  while (true) {
    if (bits != 0) return word * 64 + __builtin_ctzll(bits);
    if (++word == kBitmapWords) return -1;
    bits = bin_bitmap_[word];
  }
}

void BestFitArena::SetTable(const Chunk& c, ChunkId value) {
  if (!index_interior_) {
    table_[c.start] = value;
    return;
  }
  for (uint64_t u = c.start; u < c.start + c.size; ++u) table_[u] = value;
}

bool BestFitArena::Grow(uint64_t units) {
  if (units == 0) return true;
  if (table_ == nullptr || units > max_units_ - num_units_) return false;
  if (segment_units_ != 0) {
    assert(units % segment_units_ == 0);
    // One chunk per segment, each unavailable until the owner says so.
    for (uint64_t s = 0; s < units; s += segment_units_) {
      const ChunkId id = AppendChunk(segment_units_);
      segment_available_.push_back(0);
      segment_head_.push_back(id);
      chunks_[id].free = true;
    }
    return true;
  }
  const ChunkId id = AppendChunk(units);
  Chunk& c = chunks_[id];
  // Merge with a free last chunk so the tail stays one chunk.
  if (c.prev != kNoChunk && chunks_[c.prev].free) {
    ChunkId prev = c.prev;
    RemoveFree(prev);
    chunks_[prev].size += units;
    chunks_[prev].next = kNoChunk;
    last_ = prev;
    ReleaseChunk(id);
    MarkFree(prev);
  } else {
    MarkFree(id);
  }
  return true;
}

ChunkId BestFitArena::AppendChunk(uint64_t units) {
  ChunkId id = NewChunk();
  Chunk& c = chunks_[id];
  c.start = num_units_;
  c.size = units;
  c.prev = last_;
  if (last_ != kNoChunk) chunks_[last_].next = id;
  if (first_ == kNoChunk) first_ = id;
  last_ = id;
  num_units_ += units;
  return id;
}

ChunkId BestFitArena::Allocate(uint64_t units) {
  assert(units > 0);
  const int own_bin = BinFor(units);
  ChunkId found = kNoChunk;
  // Best fit among the first few chunks of the request's own bin: they may
  // be smaller than the request, but an exact fit ends the scan.
  int scanned = 0;
  for (ChunkId c = bin_heads_[own_bin]; c != kNoChunk && scanned < kBinScanLimit;
       c = chunks_[c].bin_next, ++scanned) {
    const uint64_t size = chunks_[c].size;
    if (size >= units && (found == kNoChunk || size < chunks_[found].size)) {
      found = c;
      if (size == units) break;
    }
  }
  if (found == kNoChunk) {
    const int bin = NextNonEmptyBin(own_bin + 1);
    if (bin < 0) return kNoChunk;
    found = bin_heads_[bin];
  }
  return TakeFront(found, units);
}

ChunkId BestFitArena::AllocateInEmptySegment(uint64_t segment, uint64_t units) {
  assert(SegmentEmpty(segment) && units <= segment_units_);
  return TakeFront(segment_head_[segment], units);
}

ChunkId BestFitArena::TakeFront(ChunkId found, uint64_t units) {
  UnmarkFree(found);
  if (chunks_[found].size > units) MarkFree(SplitFront(found, units));
  SetTable(chunks_[found], found + 1);
  return found;
}

ChunkId BestFitArena::AllocateAt(uint64_t start, uint64_t units) {
  assert(segment_units_ == 0 && units > 0);
  ChunkId c = first_;
  while (c != kNoChunk && chunks_[c].start + chunks_[c].size <= start) c = chunks_[c].next;
  if (c == kNoChunk || !chunks_[c].free || chunks_[c].start > start ||
      chunks_[c].start + chunks_[c].size < start + units) {
    return kNoChunk;
  }
  // The parts left and right of the range stay free; their other
  // neighbours are allocated (no two free chunks touch), so nothing merges.
  UnmarkFree(c);
  if (chunks_[c].start < start) {
    const ChunkId right = SplitFront(c, start - chunks_[c].start);
    MarkFree(c);
    c = right;
  }
  if (chunks_[c].size > units) MarkFree(SplitFront(c, units));
  SetTable(chunks_[c], c + 1);
  return c;
}

ChunkId BestFitArena::SplitFront(ChunkId id, uint64_t units) {
  const ChunkId rest_id = NewChunk();  // may reallocate chunks_: fetch after
  Chunk& chunk = chunks_[id];
  Chunk& rest = chunks_[rest_id];
  rest.start = chunk.start + units;
  rest.size = chunk.size - units;
  rest.prev = id;
  rest.next = chunk.next;
  if (rest.next != kNoChunk) chunks_[rest.next].prev = rest_id;
  else last_ = rest_id;
  chunk.next = rest_id;
  chunk.size = units;
  return rest_id;
}

void BestFitArena::Free(ChunkId id) {
  SetTable(chunks_[id], 0);
  chunks_[id].requested_bytes = 0;
  chunks_[id].allocation_id = 0;
  // Merge with the next chunk, then the previous, so at most one survives;
  // never across a segment boundary.
  ChunkId next = chunks_[id].next;
  if (next != kNoChunk && chunks_[next].free && SameSegment(chunks_[id], chunks_[next])) {
    UnmarkFree(next);
    chunks_[id].size += chunks_[next].size;
    chunks_[id].next = chunks_[next].next;
    if (chunks_[id].next != kNoChunk) chunks_[chunks_[id].next].prev = id;
    else last_ = id;
    ReleaseChunk(next);
  }
  ChunkId prev = chunks_[id].prev;
  if (prev != kNoChunk && chunks_[prev].free && SameSegment(chunks_[id], chunks_[prev])) {
    UnmarkFree(prev);
    chunks_[prev].size += chunks_[id].size;
    chunks_[prev].next = chunks_[id].next;
    if (chunks_[prev].next != kNoChunk) chunks_[chunks_[prev].next].prev = prev;
    else last_ = prev;
    ReleaseChunk(id);
    id = prev;
  }
  MarkFree(id);
}

ChunkId BestFitArena::LargestFreeChunkId() const {
  for (int word = kBitmapWords - 1; word >= 0; --word) {
    if (bin_bitmap_[word] == 0) continue;
    const int bin = word * 64 + 63 - __builtin_clzll(bin_bitmap_[word]);
    ChunkId best = kNoChunk;
    for (ChunkId c = bin_heads_[bin]; c != kNoChunk; c = chunks_[c].bin_next) {
      if (best == kNoChunk || chunks_[c].size > chunks_[best].size) best = c;
    }
    return best;
  }
  return kNoChunk;
}

uint64_t BestFitArena::LargestFreeChunk() const {
  const ChunkId c = LargestFreeChunkId();
  return c == kNoChunk ? 0 : chunks_[c].size;
}

ChunkId BestFitArena::AllocateAtEndOfLargest(uint64_t units) {
  assert(segment_units_ == 0 && units > 0);
  ChunkId c = LargestFreeChunkId();
  if (c == kNoChunk || chunks_[c].size < units) return kNoChunk;
  // The front stays free; its other neighbour is allocated, so nothing merges.
  UnmarkFree(c);
  if (chunks_[c].size > units) {
    const ChunkId back = SplitFront(c, chunks_[c].size - units);
    MarkFree(c);
    c = back;
  }
  SetTable(chunks_[c], c + 1);
  return c;
}

}  // namespace lms
