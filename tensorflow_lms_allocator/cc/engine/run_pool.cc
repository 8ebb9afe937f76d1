#include "engine/run_pool.h"

#include <algorithm>
#include <cassert>
#include <iterator>

namespace lms {

RunPool::RunPool(size_t capacity)
    : capacity_(capacity),
      free_count_(capacity),
      run_start_(capacity, kUnmade),
      run_length_(capacity, 0),
      run_taken_(capacity, 0) {
  if (capacity > 0) unmade_[0] = static_cast<uint32_t>(capacity);
}

bool RunPool::Take(size_t n, GranuleId* out, std::vector<Run>* released,
                   std::vector<Run>* cut) {
  if (n > free_count_) return false;
  std::vector<Run> runs;  // reused free runs, then new ones
  std::vector<Run> fresh;
  uint64_t need = n;
  // A free run of exactly what is needed, else the longest that fits, and
  // again. (length, kUnmade) sorts after every free run of that length.
  while (need > 0 && !free_runs_.empty()) {
    const uint32_t want = static_cast<uint32_t>(need);
    auto it = free_runs_.lower_bound({want, 0});
    if (it == free_runs_.end() || it->first != want) {
      it = free_runs_.upper_bound({want, kUnmade});
      if (it == free_runs_.begin()) break;
      --it;
    }
    runs.push_back({it->second, it->first});
    need -= it->first;
    free_runs_.erase(it);
  }
  // Then unmade ids, first fit.
  while (need > 0 && !unmade_.empty()) {
    auto range = unmade_.begin();
    const uint32_t length = static_cast<uint32_t>(std::min<uint64_t>(need, range->second));
    fresh.push_back({range->first, length});
    Cut(range, range->first, length);
    need -= length;
  }
  if (need > 0) {
    // Every free run left is longer than what is still needed (the first
    // loop took those that fit) and together they hold it: the shortest is
    // released and cut.
    auto it = free_runs_.upper_bound({static_cast<uint32_t>(need), kUnmade});
    assert(it != free_runs_.end());
    const Run longer{it->second, it->first};
    free_runs_.erase(it);
    Release(longer);
    released->push_back(longer);
    auto range = std::prev(unmade_.upper_bound(longer.first));
    fresh.push_back({longer.first, static_cast<uint32_t>(need)});
    Cut(range, longer.first, static_cast<uint32_t>(need));
  }
  // New runs that adjoin are one.
  std::sort(fresh.begin(), fresh.end(),
            [](const Run& a, const Run& b) { return a.first < b.first; });
  const size_t reused = runs.size();
  for (const Run& r : fresh) {
    if (runs.size() > reused && runs.back().first + runs.back().length == r.first) {
      runs.back().length += r.length;
    } else {
      runs.push_back(r);
    }
  }
  cut->insert(cut->end(), runs.begin() + static_cast<std::ptrdiff_t>(reused), runs.end());
  size_t k = 0;
  for (size_t r = 0; r < runs.size(); ++r) {
    MarkTaken(runs[r]);
    if (r >= reused) made_ += runs[r].length;
    for (uint32_t i = 0; i < runs[r].length; ++i) out[k++] = runs[r].first + i;
  }
  free_count_ -= n;
  peak_in_use_ = std::max(peak_in_use_, in_use());
  while (made_ > peak_in_use_) {
    // Only free runs can be what is over (taken ones are in use).
    auto longest = std::prev(free_runs_.end());
    const Run run{longest->second, longest->first};
    free_runs_.erase(longest);
    Release(run);
    released->push_back(run);
  }
  return true;
}

void RunPool::Give(const GranuleId* ids, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const GranuleId start = run_start_[ids[i]];
    assert(start != kUnmade && run_taken_[start] > 0);
    if (--run_taken_[start] == 0) free_runs_.insert({run_length_[start], start});
  }
  free_count_ += n;
}

RunPool::Run RunPool::RunOf(GranuleId id) const {
  const GranuleId start = run_start_[id];
  if (start == kUnmade) return {id, 0};
  return {start, run_length_[start]};
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

void RunPool::MarkTaken(const Run& run) {
  for (uint32_t i = 0; i < run.length; ++i) run_start_[run.first + i] = run.first;
  run_length_[run.first] = run.length;
  run_taken_[run.first] = run.length;
}

void RunPool::Release(const Run& run) {
  made_ -= run.length;
  for (uint32_t i = 0; i < run.length; ++i) run_start_[run.first + i] = kUnmade;
  run_length_[run.first] = 0;
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
