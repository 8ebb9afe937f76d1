#include "engine/residency.h"

#include <cassert>

namespace lms {

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

void Residency::BeginMove(ChunkId id, Move move) {
  Apply(id, [move](Record& r) {
    assert(r.move == Move::kNone);
    r.move = move;
    r.move_abandoned = false;
  });
}

void Residency::EndMove(ChunkId id) {
  Apply(id, [](Record& r) {
    r.move = Move::kNone;
    r.move_abandoned = false;
  });
}

void Residency::MarkEvicted(ChunkId id) {
  Apply(id, [](Record& r) { r.evicted = true; });
}

void Residency::MarkResident(ChunkId id) {
  Apply(id, [](Record& r) { r.evicted = false; });
}

}  // namespace lms
