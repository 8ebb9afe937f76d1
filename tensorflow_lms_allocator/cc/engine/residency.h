// Residency: where each large allocation's bytes live and who is using them.
//
// Every live large allocation (one granule or more) has a record here, keyed
// by its chunk id in the large-object arena:
//   - resident: backed by device granules; evicted: backed by host granules
//     mapped at the same address;
//   - a pin count: pinned (count > 0) allocations are *active*, a kernel is
//     using them and they are never evicted;
//   - an unclaimed count: allocations of the unit made outside any kernel
//     that no pin has claimed yet (Note [Writers outside kernels] in
//     engine.h); their writers may still be writing them;
//   - a move: an eviction or a page-in whose copy runs without the engine's
//     lock (Note [Copies outside the lock] in engine.h), and whether a pin
//     or a writer reached the unit meanwhile (an eviction then abandoned);
//   - the LRU list holds exactly the *evictable* units: resident, unpinned,
//     not moving and with nothing unclaimed. Its front is the least recently unpinned;
//     eviction takes from there. An evicted unit is not on the list (nothing
//     to reclaim), and neither is a pinned or unclaimed one (it may not be
//     reclaimed).
//
// A record is a residency unit (Note [Residency units] in engine.h): a large
// allocation, or a small-object page (`segment` names it in SmallPages).
//
// Thread-compatible: the engine's lock guards every call.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_RESIDENCY_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_RESIDENCY_H_

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "engine/best_fit_arena.h"

namespace lms {

// Units by size, for finding the first of at least some size without
// walking past every smaller one: one class per granule count below 64,
// then one per power of two.
inline constexpr int kSizeClasses = 64 + 58;
constexpr int SizeClassOf(uint64_t granules) {
  if (granules < 64) return static_cast<int>(granules);
  return 64 + (63 - __builtin_clzll(granules)) - 6;
}

class Residency {
 public:
  // From now on, each unit that joins or leaves the LRU list is noted, once
  // until taken (a reclaim policy keeping its own order of the list:
  // LearnedPolicy, Note [A maintained reclaim order]); the units on it now
  // are noted at once.
  void KeepListChanges();
  // The units noted since the last call, each once, into `out` (cleared).
  void TakeListChanges(std::vector<ChunkId>* out);

  static constexpr uint64_t kNoSegment = ~uint64_t{0};

  // What is being done to a unit while the engine's lock is released.
  enum class Move : uint8_t { kNone, kEvicting, kPagingIn };

  // Its fields are packed (56 bytes): every pin and unpin reads one, and
  // among 100,000 units most are not in the cache.
  struct Record {
    uint64_t granules = 0;
    uint32_t pin_count = 0;
    uint32_t unclaimed = 0;  // unclaimed allocations in the unit
    bool live = false;
    bool evicted = false;
    Move move = Move::kNone;
    // Set while evicting: a pin or a new object reached the unit, whose
    // device memory may have been written after its copy read it.
    bool move_abandoned = false;
    bool in_lru = false;
    bool list_changed = false;  // in changes_ (KeepListChanges)
    // A pin of it was refused: the kernel may read it in place, unpinned,
    // with no later moment known as its last use (Note [Epochs of use]).
    bool read_in_place = false;
    ChunkId lru_prev = kNoChunk;
    ChunkId lru_next = kNoChunk;
    // Its place in the LRU list: every link at the most recently used end
    // takes the next number, so the list is in increasing order of it.
    // Kept only once something needs it (KeepListChanges, or the first
    // LeastRecentlyUsedOfAtLeast, which numbers the list then).
    uint64_t lru_seq = 0;
    uint64_t segment = kNoSegment;  // a small-object page's segment
    // The backend's ReleaseMark() at the unit's last use so far: its birth,
    // its last unpin, its last claim. Work that touched it was queued
    // before; a move waits for that work only (Note [Epochs of use] in
    // backends/cuda_backend.h).
    uint64_t last_use = 0;
  };
  static_assert(sizeof(Record) <= 56, "a record grew: pack its fields");

  // Starts tracking a new resident unit, pinned once or not, holding one
  // unclaimed allocation or none.
  void Track(ChunkId id, uint64_t granules, bool pinned, bool unclaimed = false);
  void SetSegment(ChunkId id, uint64_t segment) { records_[id].segment = segment; }
  bool IsPage(ChunkId id) const { return records_[id].segment != kNoSegment; }
  void Untrack(ChunkId id);

  // Returns the pin count after the change. Pinning an inactive allocation
  // takes it off the LRU list; the last unpin of a resident one puts it at the
  // most recently used end.
  uint32_t Pin(ChunkId id);
  uint32_t Unpin(ChunkId id);

  // One more unclaimed allocation in the unit (it leaves the LRU list), or
  // one fewer (the last one claimed or freed: it may join the list).
  void AddUnclaimed(ChunkId id);
  void RemoveUnclaimed(ChunkId id);

  // Moves an inactive unit to the most recently used end (a new object was
  // placed in it: its user is about to touch it). No-op for others.
  void Touch(ChunkId id) {
    // Already most recent: the common case of objects placed one after
    // another in one page.
    if (records_[id].in_lru && lru_tail_ != id) {
      Unlink(id);
      LinkAtMostRecent(id);
    }
  }

  // Evicting takes an inactive allocation off the list; paging in a pinned
  // one changes nothing else (it stays active until unpinned).
  void MarkEvicted(ChunkId id);
  void MarkResident(ChunkId id);

  // A move starts (the unit leaves the LRU list) or ends (it may rejoin).
  void BeginMove(ChunkId id, Move move);
  void EndMove(ChunkId id);
  // The unit's device memory may be written from now on: an eviction in
  // flight is abandoned. No-op for any other unit.
  void AbandonEviction(ChunkId id) {
    Record& r = records_[id];
    if (r.move == Move::kEvicting) r.move_abandoned = true;
  }

  // The unit was used up to now: `mark` is the backend's ReleaseMark().
  void NoteUse(ChunkId id, uint64_t mark) { records_[id].last_use = mark; }
  void NoteReadInPlace(ChunkId id) { records_[id].read_in_place = true; }

  const Record& record(ChunkId id) const { return records_[id]; }
  // Whether the unit belongs on the LRU list.
  static bool Evictable(const Record& r) {
    return r.live && !r.evicted && r.pin_count == 0 && r.unclaimed == 0 &&
           r.move == Move::kNone;
  }
  // Whether someone may touch the unit without a new pin: a kernel pins it,
  // or a writer outside kernels has not handed an allocation of it over.
  static bool Held(const Record& r) { return r.pin_count > 0 || r.unclaimed > 0; }
  // Whether the unit holds device granules for an unclaimed allocation.
  static bool HeldByWriter(const Record& r) {
    return r.live && !r.evicted && r.unclaimed > 0;
  }
  size_t size() const { return records_.size(); }
  bool tracked(ChunkId id) const {
    return id < records_.size() && records_[id].live;
  }

  // LRU walk: LeastRecentlyUsed(), then NextMoreRecent() until kNoChunk.
  ChunkId LeastRecentlyUsed() const { return lru_head_; }
  ChunkId NextMoreRecent(ChunkId id) const { return records_[id].lru_next; }
  // The least recently used unit on the list of at least `granules`, or
  // kNoChunk: the first the walk above would find, found from the fronts of
  // the size classes that may hold it (Note [Units by size]).
  ChunkId LeastRecentlyUsedOfAtLeast(uint64_t granules);
  uint64_t inactive_resident_granules() const { return lru_granules_; }
  // Granules of resident units holding an unclaimed allocation.
  uint64_t unclaimed_resident_granules() const { return unclaimed_granules_; }

 private:
  // Runs `change` on the record, then brings the LRU list (at its most
  // recently used end) and the unclaimed count in line with the result.
  template <typename Change>
  void Apply(ChunkId id, Change change) {
    Record& r = records_[id];
    const bool held = HeldByWriter(r);
    change(r);
    if (HeldByWriter(r) != held) {
      unclaimed_granules_ = held ? unclaimed_granules_ - r.granules
                                 : unclaimed_granules_ + r.granules;
    }
    if (r.in_lru && !Evictable(r)) Unlink(id);
    else if (!r.in_lru && Evictable(r)) LinkAtMostRecent(id);
  }
  void LinkAtMostRecent(ChunkId id);
  void Unlink(ChunkId id);

  std::vector<Record> records_;
  bool keep_changes_ = false;
  std::vector<ChunkId> changes_;
  // Notes a change of `r` (unit `id`) in the list, if changes are kept.
  void NoteListChange(Record& r, ChunkId id) {
    if (!keep_changes_ || r.list_changed) return;
    r.list_changed = true;
    changes_.push_back(id);
  }
  uint64_t lru_links_ = 0;  // the last lru_seq given
  // Note [Units by size]
  // ====================
  // Each size class keeps, in the order they joined the list, the units
  // that joined it: (lru_seq, id). An entry is stale once its unit left the
  // list or joined it again (its lru_seq is no longer the entry's); stale
  // entries are dropped from the front as LeastRecentlyUsedOfAtLeast finds
  // them, and all of a class's at once when it holds more than twice its
  // listed units and 64 (so a unit that stays on the list at the front
  // cannot make it grow without bound). A link appends and an unlink only
  // counts: unlike a second linked list, neither touches another unit's
  // record (two cache misses a pin and unpin among 100,000 units). The
  // classes are made from the LRU list at the first call that needs them
  // and kept from then on: until memory runs short nothing pays for them
  // (an allocate+free pair with room to spare cost 12% more, `make
  // bench-allocator`).
  struct SizeClass {
    std::vector<std::pair<uint64_t, ChunkId>> joined;  // from `front` on
    size_t front = 0;
    size_t listed = 0;
  };
  bool Current(const std::pair<uint64_t, ChunkId>& entry) const {
    const Record& r = records_[entry.second];
    return r.in_lru && r.lru_seq == entry.first;
  }
  SizeClass sizes_[kSizeClasses];
  bool by_size_ = false;  // sizes_ are kept (made on demand)
  // by_size_ or keep_changes_: lru_seq is kept (else 0), and what they need.
  bool ordered_ = false;
  void JoinSize(const Record& r, ChunkId id);
  ChunkId lru_head_ = kNoChunk;  // least recently used
  ChunkId lru_tail_ = kNoChunk;  // most recently used
  uint64_t lru_granules_ = 0;
  uint64_t unclaimed_granules_ = 0;
};

// Inline: every allocate and free tracks or untracks a unit.
inline void Residency::Track(ChunkId id, uint64_t granules, bool pinned, bool unclaimed) {
  if (id >= records_.size()) records_.resize(id + 1);
  static constexpr Record kFresh{};  // see BestFitArena::NewChunk
  Apply(id, [&](Record& r) {
    const bool noted = r.list_changed;  // still in changes_
    r = kFresh;
    r.list_changed = noted;
    r.granules = granules;
    r.live = true;
    r.pin_count = pinned ? 1 : 0;
    r.unclaimed = unclaimed ? 1 : 0;
  });
}

inline void Residency::Untrack(ChunkId id) {
  static constexpr Record kFresh{};
  Apply(id, [](Record& r) { r.live = false; });
  const bool noted = records_[id].list_changed;  // still in changes_
  records_[id] = kFresh;
  records_[id].list_changed = noted;
}

inline void Residency::LinkAtMostRecent(ChunkId id) {
  Record& r = records_[id];
  r.lru_prev = lru_tail_;
  r.lru_next = kNoChunk;
  if (lru_tail_ != kNoChunk) records_[lru_tail_].lru_next = id;
  else lru_head_ = id;
  lru_tail_ = id;
  r.in_lru = true;
  lru_granules_ += r.granules;
  if (ordered_) {  // one branch on the fast path while neither is needed
    r.lru_seq = ++lru_links_;
    if (by_size_) JoinSize(r, id);
    NoteListChange(r, id);
  }
}

inline void Residency::Unlink(ChunkId id) {
  Record& r = records_[id];
  if (r.lru_prev != kNoChunk) records_[r.lru_prev].lru_next = r.lru_next;
  else lru_head_ = r.lru_next;
  if (r.lru_next != kNoChunk) records_[r.lru_next].lru_prev = r.lru_prev;
  else lru_tail_ = r.lru_prev;
  r.lru_prev = r.lru_next = kNoChunk;
  r.in_lru = false;
  lru_granules_ -= r.granules;
  if (ordered_) {
    if (by_size_) --sizes_[SizeClassOf(r.granules)].listed;
    NoteListChange(r, id);
  }
}

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_RESIDENCY_H_
