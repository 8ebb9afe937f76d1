#include "engine/backing_map.h"

namespace lms {

BackingMap::BackingMap(uint64_t slots)
    : slots_(slots), cache_index_(slots, kNotCached), release_mark_(slots, 0) {}

void BackingMap::AddCached(uint64_t slot) {
  cache_index_[slot] = static_cast<uint32_t>(cached_.size());
  cached_.push_back(slot);
}

void BackingMap::RemoveCached(uint64_t slot) {
  const uint32_t pos = cache_index_[slot];
  const uint64_t moved = cached_.back();
  cached_[pos] = moved;
  cache_index_[moved] = pos;
  cached_.pop_back();
  cache_index_[slot] = kNotCached;
}

}  // namespace lms
