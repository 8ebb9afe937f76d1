#include "engine/run_pool.h"

#include <algorithm>
#include <cassert>
#include <iterator>

namespace lms {

RunPool::RunPool(size_t capacity)
    : capacity_(capacity),
      open_(PoolKind::kDevice, capacity),
      free_count_(capacity),
      run_start_(capacity, kUnmade),
      run_length_(capacity, 0),
      part_start_(capacity, kUnmade),
      part_length_(capacity, 0),
      part_taken_(capacity, 0) {
  if (capacity > 0) unmade_[0] = static_cast<uint32_t>(capacity);
}

void RunPool::set_cutting(Cutting cutting) {
  assert(!splits_);
  assert(cutting_ == cutting || free_count_ == capacity_ ||
         (cutting_ == Cutting::kGranules && cutting == Cutting::kUnits));
  cutting_ = cutting;
}

void RunPool::MakeAhead(size_t n, size_t most, std::vector<Run>* cut) {
  assert((splits_ || (cutting_ == Cutting::kGranules && most == 1)) &&
         free_count_ == capacity_ && most > 0);
  while (n > 0 && !unmade_.empty()) {
    auto range = unmade_.begin();
    const Run run{range->first, static_cast<uint32_t>(std::min({n, most, size_t{range->second}}))};
    Cut(range, run.first, run.length);
    MakeRun(run);
    SetPart(run.first, run.length, /*taken=*/false);
    free_parts_.insert({run.length, run.first});
    cut->push_back(run);
    ahead_ += run.length;
    n -= run.length;
  }
}

void RunPool::ForgetAhead(std::vector<Run>* released) {
  for (auto it = free_parts_.begin(); it != free_parts_.end();) {
    const Run run{it->second, it->first};
    if (!IsWholeRun(run)) {
      ++it;
      continue;
    }
    it = free_parts_.erase(it);
    Release(run);
    released->push_back(run);
  }
  ahead_ = 0;
}

bool RunPool::Take(size_t n, GranuleId* out, std::vector<Run>* released,
                   std::vector<Run>* cut, const Releasable& releasable) {
  if (n > free_count_) return false;
  std::vector<Run> parts;  // reused free parts, then new runs
  std::vector<Run> fresh;
  uint64_t need = n;
  // A free part of exactly what is needed; with splits, else the smallest
  // that holds it all (one mapping rather than several).
  auto fits = free_parts_.lower_bound({static_cast<uint32_t>(n), 0});
  if (fits != free_parts_.end() && (fits->first == n || splits_)) {
    parts.push_back(Split(fits, static_cast<uint32_t>(n)));
    need = 0;
  }
  // Cutting units: else one run of consecutive ids not taken. They leave
  // open_ here; every other part leaves it below.
  const bool stretch = need > 0 && cutting_ == Cutting::kUnits && n >= kLeastStretch &&
                       TakeStretch(n, releasable, released, &fresh);
  if (stretch) need = 0;
  // Else the longest that fits, and again. (length, kUnmade) sorts after
  // every free part of that length.
  while (need > 0 && !free_parts_.empty()) {
    const uint32_t want = static_cast<uint32_t>(need);
    auto it = free_parts_.lower_bound({want, 0});
    if (it == free_parts_.end() || it->first != want) {
      it = free_parts_.upper_bound({want, kUnmade});
      if (it == free_parts_.begin()) break;
      it = free_parts_.lower_bound({std::prev(it)->first, 0});  // its lowest id
    }
    need -= it->first;
    parts.push_back(Split(it, it->first));
  }
  // With splits, every free part left is longer than what is still needed:
  // the shortest is split, so unmade ids are cut only when no made memory
  // is free.
  if (need > 0 && splits_) {
    auto it = free_parts_.upper_bound({static_cast<uint32_t>(need), kUnmade});
    if (it != free_parts_.end()) {
      parts.push_back(Split(it, static_cast<uint32_t>(need)));
      need = 0;
    }
  }
  // Then unmade ids, first fit (cutting granules: a run each).
  while (need > 0 && !unmade_.empty()) {
    auto range = unmade_.begin();
    const uint32_t length = cutting_ == Cutting::kGranules
                                ? 1
                                : static_cast<uint32_t>(std::min<uint64_t>(need, range->second));
    fresh.push_back({range->first, length});
    Cut(range, range->first, length);
    need -= length;
  }
  if (need > 0) {
    // Runs mapped whole only (with splits no free part is left here): every
    // free part is a run longer than what is still needed, and together
    // they hold it: the shortest is released and cut; the shortest of the
    // first few that `releasable` accepts, if it accepts one.
    auto it = free_parts_.upper_bound({static_cast<uint32_t>(need), kUnmade});
    assert(!splits_ && it != free_parts_.end());
    if (releasable) {
      size_t tries = kStretchTries;
      for (auto other = it; other != free_parts_.end() && tries > 0; ++other, --tries) {
        if (releasable({{other->second, other->first}})) {
          it = other;
          break;
        }
      }
    }
    const Run longer{it->second, it->first};
    free_parts_.erase(it);
    Release(longer);
    released->push_back(longer);
    auto range = std::prev(unmade_.upper_bound(longer.first));
    fresh.push_back({longer.first, static_cast<uint32_t>(need)});
    Cut(range, longer.first, static_cast<uint32_t>(need));
  }
  // New runs that adjoin are one (cutting granules: never).
  std::sort(fresh.begin(), fresh.end(),
            [](const Run& a, const Run& b) { return a.first < b.first; });
  const size_t reused = parts.size();
  for (const Run& r : fresh) {
    if (parts.size() > reused && cutting_ != Cutting::kGranules &&
        parts.back().first + parts.back().length == r.first) {
      parts.back().length += r.length;
    } else {
      parts.push_back(r);
    }
  }
  for (size_t r = reused; r < parts.size(); ++r) {
    MakeRun(parts[r]);
    SetPart(parts[r].first, parts[r].length, /*taken=*/true);
    cut->push_back(parts[r]);
  }
  size_t k = 0;
  for (const Run& part : parts) {
    for (uint32_t i = 0; i < part.length; ++i) out[k++] = part.first + i;
    if (cutting_ != Cutting::kAsNeeded && !stretch) open_.TakeRange(part.first, part.length);
  }
  free_count_ -= n;
  peak_in_use_ = std::max(peak_in_use_, in_use());
  while (cutting_ == Cutting::kAsNeeded && made_ > std::max(peak_in_use_, ahead_)) {
    // Only free runs can be what is over (a run with a part taken is in
    // use): the longest goes, of the first few whole ones `releasable`
    // accepts. One it refuses (its release would wait on the host for the
    // GPU) stays made, within the pool's capacity, for a later Take to
    // release once it waits for nothing.
    auto it = free_parts_.end();
    bool found = false;
    size_t tries = kStretchTries;
    while (!found && tries > 0 && it != free_parts_.begin()) {
      --it;
      if (!IsWholeRun({it->second, it->first})) continue;
      --tries;
      found = !releasable || releasable({{it->second, it->first}});
    }
    if (!found) break;
    const Run run{it->second, it->first};
    free_parts_.erase(it);
    Release(run);
    released->push_back(run);
  }
  return true;
}

void RunPool::Give(const GranuleId* ids, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const GranuleId start = part_start_[ids[i]];
    assert(run_start_[ids[i]] != kUnmade && part_taken_[start] > 0);
    if (--part_taken_[start] != 0) continue;
    // Free: merged with the free parts beside it in its run.
    GranuleId first = start;
    uint32_t length = part_length_[start];
    if (splits_) {
      const GranuleId run = run_start_[start];
      const GranuleId next = first + length;
      if (next < run + run_length_[run] && part_taken_[next] == 0) {
        free_parts_.erase({part_length_[next], next});
        length += part_length_[next];
      }
      if (first > run && part_taken_[part_start_[first - 1]] == 0) {
        const GranuleId prev = part_start_[first - 1];
        free_parts_.erase({part_length_[prev], prev});
        length += part_length_[prev];
        first = prev;
      }
    }
    SetPart(first, length, /*taken=*/false);
    free_parts_.insert({length, first});
    if (cutting_ != Cutting::kAsNeeded) open_.GiveRange(first, length);
  }
  free_count_ += n;
}

void RunPool::FreeRunsIn(GranuleId first, size_t n, std::vector<Run>* runs) const {
  const GranuleId end = first + static_cast<GranuleId>(n);
  for (GranuleId id = first; id < end;) {
    const GranuleId run = run_start_[id];
    if (run == kUnmade) {
      ++id;
      continue;
    }
    runs->push_back({run, run_length_[run]});
    id = run + run_length_[run];
  }
}

bool RunPool::TakeStretch(size_t n, const Releasable& releasable, std::vector<Run>* released,
                          std::vector<Run>* fresh) {
  std::vector<Run> runs;
  auto accept = [&](GranuleId at) {
    if (!releasable) return true;
    runs.clear();
    FreeRunsIn(at, n, &runs);
    return runs.empty() || releasable(runs);
  };
  GranuleId first = 0;
  if (!open_.TakeExtent(n, &first, accept, kStretchTries)) return false;
  // Every made id in the stretch is in a free run (no part of it is taken):
  // each goes whole, its ids past the stretch left unmade.
  runs.clear();
  FreeRunsIn(first, n, &runs);
  for (const Run& whole : runs) {
    free_parts_.erase({whole.length, whole.first});
    Release(whole);
    released->push_back(whole);
  }
  auto range = std::prev(unmade_.upper_bound(first));
  Cut(range, first, static_cast<uint32_t>(n));
  fresh->push_back({first, static_cast<uint32_t>(n)});
  return true;
}

RunPool::Run RunPool::RunOf(GranuleId id) const {
  const GranuleId start = run_start_[id];
  if (start == kUnmade) return {id, 0};
  return {start, run_length_[start]};
}

RunPool::Run RunPool::PartOf(GranuleId id) const {
  if (run_start_[id] == kUnmade) return {id, 0};
  return {part_start_[id], part_length_[part_start_[id]]};
}

void RunPool::Cut(std::map<GranuleId, uint32_t>::iterator range, GranuleId at,
                  uint32_t length) {
  const GranuleId begin = range->first;
  const GranuleId end = begin + range->second;
  assert(begin <= at && at + length <= end);
  unmade_.erase(range);
  if (begin < at) unmade_[begin] = at - begin;
  if (at + length < end) unmade_[at + length] = end - (at + length);
}

void RunPool::MakeRun(const Run& run) {
  for (uint32_t i = 0; i < run.length; ++i) run_start_[run.first + i] = run.first;
  run_length_[run.first] = run.length;
  made_ += run.length;
}

void RunPool::SetPart(GranuleId first, uint32_t length, bool taken) {
  for (uint32_t i = 0; i < length; ++i) {
    part_start_[first + i] = first;
    part_length_[first + i] = 0;
    part_taken_[first + i] = 0;
  }
  part_length_[first] = length;
  part_taken_[first] = taken ? length : 0;
}

RunPool::Run RunPool::Split(FreeParts::iterator it, uint32_t length) {
  const GranuleId first = it->second;
  const uint32_t whole = it->first;
  assert(length <= whole);
  free_parts_.erase(it);
  SetPart(first, length, /*taken=*/true);
  if (length < whole) {
    SetPart(first + length, whole - length, /*taken=*/false);
    free_parts_.insert({whole - length, first + length});
  }
  return {first, length};
}

void RunPool::Release(const Run& run) {
  made_ -= run.length;
  for (uint32_t i = 0; i < run.length; ++i) {
    run_start_[run.first + i] = kUnmade;
    part_start_[run.first + i] = kUnmade;
  }
  run_length_[run.first] = 0;
  part_length_[run.first] = 0;
  GranuleId first = run.first;
  uint32_t length = run.length;
  auto next = unmade_.lower_bound(first);
  if (next != unmade_.end() && next->first == first + length) {
    length += next->second;
    next = unmade_.erase(next);
  }
  if (next != unmade_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == first) {
      first = prev->first;
      length += prev->second;
      unmade_.erase(prev);
    }
  }
  unmade_[first] = length;
}

}  // namespace lms
