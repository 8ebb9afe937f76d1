#include "engine/backing_map.h"

#include <cassert>

namespace lms {

BackingMap::BackingMap(uint64_t slots)
    : slots_(slots),
      cached_((slots + 63) / 64, 0),
      summary_((cached_.size() + 63) / 64, 0),
      release_mark_(slots, 0) {}

template <typename Fn>
void BackingMap::ForEachWord(uint64_t first, uint64_t n, Fn fn) {
  while (n > 0) {
    const uint64_t bit = first & 63;
    const uint64_t take = n < 64 - bit ? n : 64 - bit;
    const uint64_t mask = (take == 64 ? ~uint64_t{0} : (uint64_t{1} << take) - 1) << bit;
    fn(first >> 6, mask, take);
    first += take;
    n -= take;
  }
}

void BackingMap::AddCachedRun(uint64_t first, uint64_t n) {
  ForEachWord(first, n, [this](uint64_t w, uint64_t mask, uint64_t) {
    assert((cached_[w] & mask) == 0);
    cached_[w] |= mask;
    summary_[w >> 6] |= uint64_t{1} << (w & 63);
  });
  cached_count_ += n;
}

uint64_t BackingMap::TakeCachedRun(uint64_t first, uint64_t n) {
  uint64_t taken = 0;
  ForEachWord(first, n, [&](uint64_t w, uint64_t mask, uint64_t bits) {
    // A whole run cached (the usual case) needs no popcount: without
    // -mpopcnt it is a library call.
    const uint64_t hit = cached_[w] & mask;
    taken += hit == mask ? bits : static_cast<uint64_t>(__builtin_popcountll(hit));
    cached_[w] &= ~mask;
    if (cached_[w] == 0) summary_[w >> 6] &= ~(uint64_t{1} << (w & 63));
  });
  cached_count_ -= taken;
  return taken;
}

uint64_t BackingMap::AnyCached() const {
  assert(cached_count_ > 0);
  for (uint64_t s = summary_.size(); s-- > 0;) {
    if (summary_[s] == 0) continue;
    const uint64_t w = s * 64 + 63 - __builtin_clzll(summary_[s]);
    return w * 64 + 63 - __builtin_clzll(cached_[w]);
  }
  return 0;  // unreachable while the cache is not empty
}

}  // namespace lms
