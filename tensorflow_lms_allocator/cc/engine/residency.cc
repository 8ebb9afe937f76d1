#include "engine/residency.h"

#include <cassert>

namespace lms {

void Residency::Track(ChunkId id, uint64_t granules, bool pinned) {
  if (id >= records_.size()) records_.resize(id + 1);
  Record& r = records_[id];
  r = Record();
  r.granules = granules;
  r.live = true;
  r.pin_count = pinned ? 1 : 0;
  if (!pinned) LinkAtMostRecent(id);
}

void Residency::Untrack(ChunkId id) {
  if (records_[id].in_lru) Unlink(id);
  records_[id] = Record();
}

uint32_t Residency::Pin(ChunkId id) {
  Record& r = records_[id];
  if (r.in_lru) Unlink(id);
  return ++r.pin_count;
}

uint32_t Residency::Unpin(ChunkId id) {
  Record& r = records_[id];
  assert(r.pin_count > 0);
  if (--r.pin_count == 0 && !r.evicted) LinkAtMostRecent(id);
  return r.pin_count;
}

void Residency::MarkEvicted(ChunkId id) {
  Record& r = records_[id];
  if (r.in_lru) Unlink(id);
  r.evicted = true;
}

void Residency::MarkResident(ChunkId id) {
  Record& r = records_[id];
  r.evicted = false;
  if (r.pin_count == 0) LinkAtMostRecent(id);
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
