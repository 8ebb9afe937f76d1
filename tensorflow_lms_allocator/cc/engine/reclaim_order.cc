#include "engine/reclaim_order.h"

#include <algorithm>

namespace lms {

ReclaimOrder::ReclaimOrder()
    : classes_(static_cast<size_t>(kSizes) * kClasses,
               Set(PoolAllocator<Entry>(&entry_nodes_))),
      windows_(PoolAllocator<Window>(&window_nodes_)) {}

void ReclaimOrder::Remove(ChunkId id) {
  if (id >= slots_.size() || slots_[id].in == kNone) return;
  Slot& s = slots_[id];
  const int size = SizeClassOf(s.granules);
  units(size, s.in).erase(s.entry);
  if (s.in == kDue || s.in == kDueNow) windows_.erase(s.window);
  --in_size_[size];
  --size_;
  s.in = kNone;
}

void ReclaimOrder::Insert(ChunkId id, Class in, uint64_t granules, uint64_t key,
                          uint64_t lru_seq, uint64_t since, uint64_t missed_after) {
  Remove(id);
  if (id >= slots_.size()) slots_.resize(id + 1);
  Slot& s = slots_[id];
  s = Slot{in, granules, key, lru_seq, since, missed_after, {}, {}};
  // A unit turning inactive now is usually the last of its class (aged: the
  // latest since; never and due now: the latest in the LRU list): the hint
  // makes that insertion O(1), and costs one comparison otherwise.
  const int size = SizeClassOf(granules);
  Set& set = units(size, in);
  s.entry = set.insert(set.end(), Entry{key, lru_seq, id});
  if (in == kDue || in == kDueNow) {
    s.window = windows_.emplace_hint(windows_.end(), missed_after, id);
  }
  ++in_size_[size];
  ++size_;
}

void ReclaimOrder::PutNever(ChunkId id, uint64_t granules, uint64_t never, uint64_t lru_seq) {
  never_rank_ = never;
  Insert(id, kNever, granules, 0, lru_seq, 0, 0);
}

void ReclaimOrder::PutAged(ChunkId id, uint64_t granules, uint64_t since, uint64_t lru_seq) {
  Insert(id, kAged, granules, since, lru_seq, since, 0);
}

void ReclaimOrder::PutDue(ChunkId id, uint64_t granules, uint64_t since, uint64_t due,
                          uint64_t missed_after, uint64_t lru_seq) {
  Insert(id, kDue, granules, ~due, lru_seq, since, missed_after);
}

RankedUnit ReclaimOrder::Ranked(const Entry& entry, Class in) const {
  switch (in) {
    case kNever:
      return RankedUnit{never_rank_, entry.lru_seq, entry.id};
    case kDue:
      return RankedUnit{~entry.key - now_, entry.lru_seq, entry.id};  // due > now_
    case kAged:
      return RankedUnit{now_ - entry.key, entry.lru_seq, entry.id};
    default:
      return RankedUnit{0, entry.lru_seq, entry.id};
  }
}

void ReclaimOrder::Push(Source source) {
  if (source.size < 0) {
    if (others_at_ == others_.size()) return;
    source.head = others_[others_at_];
  } else {
    if (source.at == units(source.size, source.in).end()) return;
    source.head = Ranked(*source.at, source.in);
  }
  heap_.push_back(source);
  std::push_heap(heap_.begin(), heap_.end(), Later);
}

void ReclaimOrder::BeginWalk(uint64_t now, std::vector<RankedUnit> others) {
  now_ = now;
  // Units whose hit window closed before now rank by their age from now on.
  while (!windows_.empty() && windows_.begin()->first < now) {
    const ChunkId id = windows_.begin()->second;
    const Slot s = slots_[id];
    Insert(id, kAged, s.granules, s.since, s.lru_seq, s.since, 0);
  }
  heap_.clear();
  for (int size = 0; size < kSizes; ++size) {
    if (in_size_[size] == 0) continue;
    // Due units now due (the earliest due last in their class) rank 0.
    Set& due = units(size, kDue);
    while (!due.empty() && ~std::prev(due.end())->key <= now) {
      const ChunkId id = std::prev(due.end())->id;
      const Slot s = slots_[id];
      Insert(id, kDueNow, s.granules, 0, s.lru_seq, s.since, s.missed_after);
    }
    for (int in = 0; in < kClasses; ++in) {
      Push(Source{{}, size, static_cast<Class>(in), units(size, static_cast<Class>(in)).begin()});
    }
  }
  others_ = std::move(others);
  others_at_ = 0;
  Push(Source{{}, -1, kNone, {}});
}

bool ReclaimOrder::Next(RankedUnit* out) {
  if (heap_.empty()) return false;
  std::pop_heap(heap_.begin(), heap_.end(), Later);
  Source source = heap_.back();
  heap_.pop_back();
  *out = source.head;
  if (source.size < 0) {
    ++others_at_;
  } else {
    ++source.at;
  }
  Push(source);
  return true;
}

bool ReclaimOrder::FirstOfAtLeast(uint64_t granules, RankedUnit* out) const {
  bool found = false;
  const auto consider = [&](const Entry& entry, Class in) {
    const RankedUnit r = Ranked(entry, in);
    if (!found || TakenBefore(r, *out)) *out = r;
    found = true;
  };
  const int first = SizeClassOf(granules);
  for (int size = first; size < kSizes; ++size) {
    if (in_size_[size] == 0) continue;
    for (int in = 0; in < kClasses; ++in) {
      const Set& set = units(size, static_cast<Class>(in));
      if (size >= 64 && size == first) {  // sizes from a power of two: some smaller
        // In its class's order: the first large enough is its best.
        for (const Entry& entry : set) {
          if (slots_[entry.id].granules < granules) continue;
          consider(entry, static_cast<Class>(in));
          break;
        }
      } else if (!set.empty()) {
        // No unit of this size was walked yet (it would have been enough),
        // so its class's first is its head.
        consider(*set.begin(), static_cast<Class>(in));
      }
    }
  }
  return found;
}

}  // namespace lms
