#include "engine/residency.h"

#include <cassert>

namespace lms {

void Residency::Track(ChunkId id, uint64_t granules, bool pinned, bool unclaimed) {
  if (id >= records_.size()) records_.resize(id + 1);
  Apply(id, [&](Record& r) {
    r = Record();
    r.granules = granules;
    r.live = true;
    r.pin_count = pinned ? 1 : 0;
    r.unclaimed = unclaimed ? 1 : 0;
  });
}

void Residency::Untrack(ChunkId id) {
  Apply(id, [](Record& r) { r.live = false; });
  records_[id] = Record();
}

void Residency::AddUnclaimed(ChunkId id) {
  Apply(id, [](Record& r) { ++r.unclaimed; });
}

void Residency::RemoveUnclaimed(ChunkId id) {
  Apply(id, [](Record& r) {
    assert(r.unclaimed > 0);
    --r.unclaimed;
  });
}

uint32_t Residency::Pin(ChunkId id) {
  Apply(id, [](Record& r) { ++r.pin_count; });
  return records_[id].pin_count;
}

uint32_t Residency::Unpin(ChunkId id) {
  Apply(id, [](Record& r) {
    assert(r.pin_count > 0);
    --r.pin_count;
  });
  return records_[id].pin_count;
}

void Residency::MarkEvicted(ChunkId id) {
  Apply(id, [](Record& r) { r.evicted = true; });
}

void Residency::MarkResident(ChunkId id) {
  Apply(id, [](Record& r) { r.evicted = false; });
}

void Residency::LinkAtMostRecent(ChunkId id) {
  Record& r = records_[id];
  r.lru_prev = lru_tail_;
  r.lru_next = kNoChunk;
  if (lru_tail_ != kNoChunk) records_[lru_tail_].lru_next = id;
  else lru_head_ = id;
  lru_tail_ = id;
  r.in_lru = true;
  lru_granules_ += r.granules;
}

void Residency::Unlink(ChunkId id) {
  Record& r = records_[id];
  if (r.lru_prev != kNoChunk) records_[r.lru_prev].lru_next = r.lru_next;
  else lru_head_ = r.lru_next;
  if (r.lru_next != kNoChunk) records_[r.lru_next].lru_prev = r.lru_prev;
  else lru_tail_ = r.lru_prev;
  r.lru_prev = r.lru_next = kNoChunk;
  r.in_lru = false;
  lru_granules_ -= r.granules;
}

}  // namespace lms
