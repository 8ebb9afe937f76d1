#include "engine/backing_map.h"

#include <algorithm>

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
    summary_top_ = std::max(summary_top_, (w >> 6) + 1);
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

uint64_t BackingMap::CountCached(uint64_t first, uint64_t n) const {
  uint64_t count = 0;
  ForEachWord(first, n, [&](uint64_t w, uint64_t mask, uint64_t) {
    count += static_cast<uint64_t>(__builtin_popcountll(cached_[w] & mask));
  });
  return count;
}

bool BackingMap::FindCachedRun(uint64_t n, uint64_t* first) const {
  uint64_t run = 0, start = 0;  // the run of cached slots ending at the scan
  for (uint64_t w = 0; w < cached_.size(); ++w) {
    uint64_t bits = cached_[w];
    if (bits == 0) {
      run = 0;
      continue;
    }
    for (uint64_t b = 0; b < 64;) {
      if ((bits >> b) & 1) {
        // Ones from bit b: the trailing ones of bits >> b.
        const uint64_t shifted = bits >> b;
        const uint64_t ones = shifted == ~uint64_t{0} ? 64 - b
                                                      : static_cast<uint64_t>(__builtin_ctzll(~shifted));
        if (run == 0) start = w * 64 + b;
        run += ones;
        if (run >= n) {
          *first = start;
          return true;
        }
        b += ones;
        if (b < 64) run = 0;  // the run ends inside this word
      } else {
        run = 0;
        const uint64_t rest = bits >> b;
        if (rest == 0) break;
        b += static_cast<uint64_t>(__builtin_ctzll(rest));
      }
    }
  }
  return false;
}

uint64_t BackingMap::AnyCached() {
  assert(cached_count_ > 0);
  while (summary_[summary_top_ - 1] == 0) --summary_top_;  // the cache is not empty
  const uint64_t s = summary_top_ - 1;
  const uint64_t w = s * 64 + 63 - __builtin_clzll(summary_[s]);
  return w * 64 + 63 - __builtin_clzll(cached_[w]);
}

bool BackingMap::PrevCached(uint64_t before, uint64_t* slot) const {
  before = std::min<uint64_t>(before, cached_.size() * 64);
  if (before == 0) return false;
  const uint64_t last = before - 1;
  uint64_t w = last >> 6;
  uint64_t bits = cached_[w] & (~uint64_t{0} >> (63 - (last & 63)));
  while (bits == 0) {
    if (w == 0) return false;
    --w;
    // The next lower word with a cached slot, through the summary.
    uint64_t s = w >> 6;
    uint64_t words = summary_[s] & (~uint64_t{0} >> (63 - (w & 63)));
    while (words == 0) {
      if (s == 0) return false;
      words = summary_[--s];
    }
    w = s * 64 + 63 - static_cast<uint64_t>(__builtin_clzll(words));
    bits = cached_[w];
  }
  *slot = w * 64 + 63 - static_cast<uint64_t>(__builtin_clzll(bits));
  return true;
}

}  // namespace lms
