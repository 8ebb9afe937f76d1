// The backing map's cache of device-mapped free slots and its release marks
// (engine/backing_map.h), against a std::set under random runs.
#include <algorithm>
#include <random>
#include <set>

#include "engine/backing_map.h"
#include "harness.h"

namespace lms {
namespace {

TEST(BackingMapCacheMatchesASetUnderRandomRunsAcrossWordBoundaries) {
  // The cache is a bitmap with a summary level; a std::set is the model.
  // Runs start anywhere and span up to three 64-slot words.
  const uint64_t kSlots = 64 * 64 * 3 + 17;  // more than one summary word
  BackingMap map(kSlots);
  std::set<uint64_t> model;
  std::mt19937_64 rng(20261126);
  for (int step = 0; step < 20000; ++step) {
    const uint64_t first = rng() % kSlots;
    const uint64_t n = 1 + rng() % std::min<uint64_t>(150, kSlots - first);
    if (rng() % 2 == 0) {
      // Add only an uncached run (AddCachedRun's precondition).
      bool clear = true;
      for (uint64_t s = first; s < first + n && clear; ++s) clear = !model.count(s);
      if (!clear) continue;
      map.AddCachedRun(first, n);
      for (uint64_t s = first; s < first + n; ++s) model.insert(s);
    } else {
      uint64_t want = 0;
      for (uint64_t s = first; s < first + n; ++s) want += model.erase(s);
      EXPECT_EQ(map.TakeCachedRun(first, n), want);
    }
    EXPECT_EQ(map.cached_count(), model.size());
    if (!model.empty()) EXPECT_EQ(map.AnyCached(), *model.rbegin());
    const uint64_t probe = rng() % kSlots;
    EXPECT_EQ(map.IsCached(probe), model.count(probe) == 1);
    const uint64_t span = std::min<uint64_t>(1 + rng() % 200, kSlots - probe);
    uint64_t in_span = 0;
    for (uint64_t s = probe; s < probe + span; ++s) in_span += model.count(s);
    EXPECT_EQ(map.CountCached(probe, span), in_span);
    // The lowest run of `want` consecutive cached slots, by brute force.
    const uint64_t want = 1 + rng() % 130;
    uint64_t run = 0, start = 0, found = ~uint64_t{0};
    for (uint64_t s : model) {
      run = run > 0 && s == start + run ? run + 1 : 1;
      if (run == 1) start = s;
      if (run == want) { found = start; break; }
    }
    uint64_t got = ~uint64_t{0};
    EXPECT_EQ(map.FindCachedRun(want, &got), found != ~uint64_t{0});
    if (found != ~uint64_t{0}) EXPECT_EQ(got, found);
  }
  // One at a time, as defragmentation takes them, down to empty.
  while (!model.empty()) {
    const uint64_t slot = map.AnyCached();
    EXPECT_TRUE(model.count(slot) == 1);
    map.RemoveCached(slot);
    model.erase(slot);
    EXPECT_EQ(map.cached_count(), model.size());
  }
}

TEST(TheHighestCachedSlotIsFoundWhenTheTopSummaryWordsEmptyAtOnce) {
  // A summary word covers 4,096 slots. Cached runs in words 1, 2 and 3;
  // taking one run that spans words 2 and 3 empties both: AnyCached must
  // then answer from word 1, not read an empty word.
  const uint64_t kWord = 64 * 64;
  BackingMap map(4 * kWord);
  map.AddCachedRun(kWord + 5, 3);
  map.AddCachedRun(3 * kWord - 2, 4);  // slots 2 of word 2, 2 of word 3
  EXPECT_EQ(map.AnyCached(), 3 * kWord + 1);
  EXPECT_EQ(map.TakeCachedRun(3 * kWord - 2, 4), 4u);
  EXPECT_EQ(map.AnyCached(), kWord + 7);
  map.AddCachedRun(4 * kWord - 1, 1);  // the last slot of all
  EXPECT_EQ(map.AnyCached(), 4 * kWord - 1);
  map.RemoveCached(4 * kWord - 1);
  map.RemoveCached(kWord + 7);
  EXPECT_EQ(map.AnyCached(), kWord + 6);
}

TEST(ReleaseMarksCoverTheRunAndSurviveLeavingTheCache) {
  BackingMap map(200);
  map.SetReleaseMarks(60, 10, 7);
  map.AddCachedRun(60, 10);
  EXPECT_EQ(map.TakeCachedRun(55, 20), 10u);
  EXPECT_EQ(map.release_mark(59), 0u);
  EXPECT_EQ(map.release_mark(60), 7u);
  EXPECT_EQ(map.release_mark(69), 7u);
  EXPECT_EQ(map.release_mark(70), 0u);
}

}  // namespace
}  // namespace lms
