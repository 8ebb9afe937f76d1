#include "engine/granule_pool.h"

#include <algorithm>
#include <cassert>
#include <iterator>
#include <limits>

namespace lms {

GranulePool::GranulePool(PoolKind kind, size_t capacity) : kind_(kind), capacity_(capacity) {
  // Extent lengths are 32-bit; a pool larger than that (8 PiB of 2 MiB
  // granules) starts as several extents.
  constexpr size_t kMaxLength = std::numeric_limits<uint32_t>::max();
  for (size_t first = 0; first < capacity; first += kMaxLength) {
    Insert(static_cast<GranuleId>(first),
           static_cast<uint32_t>(std::min(kMaxLength, capacity - first)));
  }
  free_count_ = capacity;
}

void GranulePool::Insert(GranuleId first, uint32_t length) {
  by_start_.emplace(first, length);
  by_length_.emplace(length, first);
}

void GranulePool::Erase(Extents::iterator it) {
  by_length_.erase({it->second, it->first});
  by_start_.erase(it);
}

void GranulePool::TakeFrom(Extents::iterator it, uint32_t length, GranuleId* out) {
  const GranuleId first = it->first;
  const uint32_t rest = it->second - length;
  Erase(it);
  if (rest > 0) Insert(first + length, rest);
  for (uint32_t i = 0; i < length; ++i) out[i] = first + i;
  free_count_ -= length;
}

bool GranulePool::Take(size_t n, GranuleId* out) {
  if (n > free_count_) return false;
  size_t taken = 0;
  while (taken < n) {
    // The smallest extent that holds what is still needed, else the largest
    // (all of it), so a unit gets as few extents as the free ids allow.
    const size_t need = n - taken;
    auto fit = by_length_.lower_bound(
        {static_cast<uint32_t>(std::min<size_t>(need, std::numeric_limits<uint32_t>::max())),
         GranuleId{0}});
    if (fit == by_length_.end()) fit = std::prev(by_length_.end());
    const uint32_t length = static_cast<uint32_t>(std::min<size_t>(fit->first, need));
    TakeFrom(by_start_.find(fit->second), length, out + taken);
    taken += length;
  }
  peak_in_use_ = std::max(peak_in_use_, in_use());
  return true;
}

bool GranulePool::TakeExtent(size_t n, GranuleId* first,
                             const std::function<bool(GranuleId first)>& accept,
                             size_t tries) {
  if (n == 0 || n > free_count_ || n > std::numeric_limits<uint32_t>::max()) return false;
  for (auto fit = by_length_.lower_bound({static_cast<uint32_t>(n), GranuleId{0}});
       fit != by_length_.end() && tries > 0; ++fit, --tries) {
    if (accept && !accept(fit->second)) continue;
    *first = fit->second;
    TakeRange(fit->second, static_cast<uint32_t>(n));
    return true;
  }
  return false;
}

void GranulePool::TakeRange(GranuleId first, uint32_t length) {
  auto it = std::prev(by_start_.upper_bound(first));
  const GranuleId begin = it->first;
  const GranuleId end = begin + it->second;
  assert(begin <= first && first + length <= end);  // all of it free
  Erase(it);
  if (begin < first) Insert(begin, first - begin);
  if (first + length < end) Insert(first + length, end - (first + length));
  free_count_ -= length;
  peak_in_use_ = std::max(peak_in_use_, in_use());
}

void GranulePool::GiveRange(GranuleId first, uint32_t length) {
  Free(first, length);
  free_count_ += length;
}

void GranulePool::Free(GranuleId first, uint32_t length) {
  auto next = by_start_.lower_bound(first);
  assert(next == by_start_.end() || next->first >= first + length);  // not free twice
  if (next != by_start_.end() && next->first == first + length) {
    length += next->second;
    auto after = std::next(next);
    Erase(next);
    next = after;
  }
  if (next != by_start_.begin()) {
    auto prev = std::prev(next);
    assert(prev->first + prev->second <= first);
    if (prev->first + prev->second == first) {
      first = prev->first;
      length += prev->second;
      Erase(prev);
    }
  }
  Insert(first, length);
}

void GranulePool::Give(const GranuleId* ids, size_t n) {
  // Consecutive ids are one extent (a unit's usually are).
  for (size_t i = 0; i < n;) {
    size_t run = 1;
    while (i + run < n && ids[i + run] == ids[i] + run) ++run;
    Free(ids[i], static_cast<uint32_t>(run));
    free_count_ += run;
    i += run;
  }
}

}  // namespace lms
