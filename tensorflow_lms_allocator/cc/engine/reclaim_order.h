// ReclaimOrder: the units a learned reclaim may evict, kept in the order it
// takes them as they change, instead of ranked and sorted at each reclaim
// (LearnedPolicy::Plan).
//
// Note [A maintained reclaim order]
// =================================
// A learned reclaim takes inactive units by rank, farthest first, ties in
// LRU order (Note [Learned eviction] in learned_policy.h). A unit's rank is,
// at time `now`:
//   - never: kNever, predicted not to be used again;
//   - aged: its age, now - since (no prediction, or one it has outrun: Note
//     [Overdue predictions]);
//   - due: its distance to its predicted use, due - now, 0 once due, until
//     now passes its hit window (`missed_after`): from then on, aged;
//   - a page's, from its objects' predictions, scaled by its live bytes:
//     ranked at each reclaim by the policy (its objects come and go without
//     touching the list), and merged in here. Pages hold the small objects,
//     a granule each: few beside the units they share the device with.
// Ranks move with the clock, but within a class the order does not: ages
// keep the order of `since`, distances the order of `due`. So each class is
// kept sorted by its own key, then by its place in the LRU list (lru_seq,
// for ties), and a walk merges the classes' heads (a heap): a reclaim reads
// the units it takes and a few more, each in O(log n), where ranking and
// sorting every inactive unit cost 640 us a reclaim at 100,000 units
// against 4 at 1,000 (`make bench-scale`). What the clock changes, each walk
// does first: due units now due (rank 0 all, so in LRU order) move to a
// class of their own, and units whose hit window has passed to the aged.
// Each class is kept apart for each size (one per granule count below 64,
// one per power of two above): the first unit of at least n granules, a
// reclaim's one victim that frees enough alone, is then the best of a few
// classes' heads, not found by walking past every smaller unit.
//
// The policy learns of every unit that joined or left the LRU list from the
// residency (Residency::TakeListChanges): a unit's prediction changes only
// then (its birth, first pin, last unpin, free), and its place at the next
// reclaim. The order is exact: the same units, in the same order, as
// ranking every one and sorting them stably by rank from the LRU list
// (reclaim_order_test.cc, against ranking and sorting by the rules above;
// learned_policy_test.cc, an engine against one that sorts at each reclaim:
// the same units evicted after every kernel of training-like steps).
//
// Thread-compatible: the engine's lock guards every call. A walk must end
// (or be abandoned) before the next change.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_RECLAIM_ORDER_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_RECLAIM_ORDER_H_

#include <cstdint>
#include <functional>
#include <set>
#include <utility>
#include <vector>

#include "engine/node_pool.h"
#include "engine/residency.h"

namespace lms {

// A unit and its rank at the time of a walk.
struct RankedUnit {
  uint64_t rank = 0;
  uint64_t lru_seq = 0;  // its place in the LRU list (Residency::Record)
  ChunkId id = kNoChunk;
};

// Whether a reclaim takes `a` before `b`: a higher rank, or the same and
// less recently used.
inline bool TakenBefore(const RankedUnit& a, const RankedUnit& b) {
  return a.rank != b.rank ? a.rank > b.rank : a.lru_seq < b.lru_seq;
}

class ReclaimOrder {
 public:
  ReclaimOrder();
  ReclaimOrder(const ReclaimOrder&) = delete;  // its sets' nodes are its pools'
  ReclaimOrder& operator=(const ReclaimOrder&) = delete;

  // Puts `id` in the order (anywhere it was before, it leaves), freeing
  // `granules`, in one class: rank `never` always; or aged since `since`;
  // or due at `due` (>= since) until the clock passes `missed_after` (>=
  // due), then aged since `since`.
  void PutNever(ChunkId id, uint64_t granules, uint64_t never, uint64_t lru_seq);
  void PutAged(ChunkId id, uint64_t granules, uint64_t since, uint64_t lru_seq);
  void PutDue(ChunkId id, uint64_t granules, uint64_t since, uint64_t due,
              uint64_t missed_after, uint64_t lru_seq);
  // Takes `id` out of the order; no-op if it is not in it.
  void Remove(ChunkId id);
  size_t size() const { return size_; }

  // Starts a walk over every unit at time `now` (never earlier than a
  // previous walk's), with `others` (ranked by the caller, sorted by
  // TakenBefore) merged in; Next gives them in the order a reclaim takes
  // them, false at the end.
  void BeginWalk(uint64_t now, std::vector<RankedUnit> others);
  bool Next(RankedUnit* out);
  // During a walk, if no unit Next gave has at least `granules`: of the
  // units (not `others`) of at least `granules`, the one a reclaim takes
  // first; false if there is none.
  bool FirstOfAtLeast(uint64_t granules, RankedUnit* out) const;

 private:
  // In order of the walk's sources; kNone: not in the order.
  enum Class : uint8_t { kNever, kDue, kDueNow, kAged, kClasses, kNone = kClasses };
  static constexpr int kSizes = kSizeClasses;  // residency.h's

  // Ordered by `key` (never, due now: 0; due: ~due, the latest first; aged:
  // since), then lru_seq.
  struct Entry {
    uint64_t key;
    uint64_t lru_seq;
    ChunkId id;
    bool operator<(const Entry& o) const {
      return key != o.key ? key < o.key : lru_seq < o.lru_seq;
    }
  };
  // Nodes from pools of their own (Note [Nodes from slabs] in node_pool.h).
  using Set = PooledSet<Entry>;
  using Window = std::pair<uint64_t, ChunkId>;  // missed_after, unit
  using Windows = PooledSet<Window>;
  struct Slot {
    Class in = kNone;
    uint64_t granules = 0;
    uint64_t key = 0;
    uint64_t lru_seq = 0;
    uint64_t since = 0;         // due and aged
    uint64_t missed_after = 0;  // due and due now
    // Its entry in its class's set, and (due and due now) in windows_: a
    // removal finds neither by a search.
    Set::iterator entry;
    Windows::iterator window;
  };
  // A walk's source: a class of one size, from `at`; or (size < 0) others_.
  struct Source {
    RankedUnit head;
    int size;
    Class in;
    Set::const_iterator at;
  };
  // The heap's order: the source whose head a reclaim takes first on top.
  static bool Later(const Source& a, const Source& b) { return TakenBefore(b.head, a.head); }

  void Insert(ChunkId id, Class in, uint64_t granules, uint64_t key, uint64_t lru_seq,
              uint64_t since, uint64_t missed_after);
  // The unit of `entry` (in class `in`) with its rank at now_.
  RankedUnit Ranked(const Entry& entry, Class in) const;
  // Pushes `source` on the heap if it has a unit left, with it as its head.
  void Push(Source source);

  // The class of `size` (granules' size class) and `in`.
  Set& units(int size, Class in) { return classes_[static_cast<size_t>(size) * kClasses + in]; }
  const Set& units(int size, Class in) const {
    return classes_[static_cast<size_t>(size) * kClasses + in];
  }

  std::vector<Slot> slots_;  // by ChunkId
  uint64_t never_rank_ = 0;
  // Declared before the sets: they give their nodes back to them.
  NodePool entry_nodes_;
  NodePool window_nodes_;
  std::vector<Set> classes_;  // kSizes * kClasses, by units()
  size_t in_size_[kSizes] = {};  // units of each size
  size_t size_ = 0;
  Windows windows_;  // due and due now, by missed_after

  // The walk.
  uint64_t now_ = 0;
  std::vector<Source> heap_;
  std::vector<RankedUnit> others_;
  size_t others_at_ = 0;
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_RECLAIM_ORDER_H_
