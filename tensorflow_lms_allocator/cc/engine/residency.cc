#include "engine/residency.h"

#include <cassert>

namespace lms {

void Residency::KeepListChanges() {
  const bool numbered = ordered_;
  keep_changes_ = ordered_ = true;
  for (ChunkId c = lru_head_; c != kNoChunk; c = records_[c].lru_next) {
    if (!numbered) records_[c].lru_seq = ++lru_links_;
    NoteListChange(records_[c], c);
  }
}

void Residency::TakeListChanges(std::vector<ChunkId>* out) {
  out->swap(changes_);
  changes_.clear();
  for (ChunkId id : *out) records_[id].list_changed = false;
}

void Residency::JoinSize(const Record& r, ChunkId id) {
  SizeClass& size = sizes_[SizeClassOf(r.granules)];
  ++size.listed;
  size.joined.emplace_back(r.lru_seq, id);
  if (size.joined.size() > 2 * size.listed + 64) {  // Note [Units by size]
    auto& joined = size.joined;
    joined.erase(std::remove_if(joined.begin() + static_cast<std::ptrdiff_t>(size.front),
                                joined.end(), [this](const auto& e) { return !Current(e); }),
                 joined.end());
    joined.erase(joined.begin(), joined.begin() + static_cast<std::ptrdiff_t>(size.front));
    size.front = 0;
  }
}

ChunkId Residency::LeastRecentlyUsedOfAtLeast(uint64_t granules) {
  if (!by_size_) {  // the first call: from the list, in its order
    for (ChunkId c = lru_head_; c != kNoChunk; c = records_[c].lru_next) {
      // Numbered already if changes are kept (a policy holds the numbers).
      if (!ordered_) records_[c].lru_seq = ++lru_links_;
      JoinSize(records_[c], c);
    }
    by_size_ = ordered_ = true;
  }
  ChunkId best = kNoChunk;
  uint64_t best_seq = 0;
  for (int c = SizeClassOf(granules); c < kSizeClasses; ++c) {
    SizeClass& size = sizes_[c];
    if (size.listed == 0) {
      size.joined.clear();
      size.front = 0;
      continue;
    }
    while (!Current(size.joined[size.front])) ++size.front;  // one is current
    // A power of two's class holds smaller units too: its first of at
    // least `granules` may come later.
    for (size_t i = size.front; i < size.joined.size(); ++i) {
      const auto& entry = size.joined[i];
      if (!Current(entry) || records_[entry.second].granules < granules) continue;
      if (best == kNoChunk || entry.first < best_seq) {
        best = entry.second;
        best_seq = entry.first;
      }
      break;
    }
  }
  return best;
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
