// The address arena (engine/best_fit_arena.h): best fit, coalescing, growth,
// against a per-unit model under random use.
#include <algorithm>
#include <iterator>
#include <map>
#include <random>
#include <vector>

#include "engine/best_fit_arena.h"
#include "harness.h"

namespace lms {
namespace {

TEST(ArenaTilesItsRangeAndCoalescesUnderRandomUse) {
  BestFitArena arena(1 << 16, /*index_interior=*/true);
  ASSERT_TRUE(arena.Grow(1 << 12));
  std::mt19937_64 rng(7);
  std::map<ChunkId, std::pair<uint64_t, uint64_t>> live;  // id -> start, size
  std::vector<bool> used(1 << 12, false);                  // the model, per unit
  auto mark = [&](uint64_t start, uint64_t size, bool value) {
    for (uint64_t u = start; u < start + size; ++u) used[u] = value;
  };
  for (int step = 0; step < 20000; ++step) {
    if (rng() % 11 == 0) {
      // AllocateAtEndOfLargest: the end of a longest free run of the model.
      const uint64_t units = 1 + rng() % 40;
      uint64_t longest = 0, run = 0;
      for (uint64_t u = 0; u < used.size(); ++u) {
        run = used[u] ? 0 : run + 1;
        longest = std::max(longest, run);
      }
      const ChunkId c = arena.AllocateAtEndOfLargest(units);
      EXPECT_EQ(c != kNoChunk, units <= longest);
      if (c == kNoChunk) continue;
      const uint64_t start = arena.chunk(c).start, end = start + units;
      EXPECT_EQ(arena.chunk(c).size, units);
      EXPECT_TRUE(end == used.size() || used[end]);
      uint64_t free_before = 0;
      while (free_before < end && !used[end - 1 - free_before]) ++free_before;
      EXPECT_EQ(free_before, longest);
      live[c] = {start, units};
      mark(start, units, true);
    } else if (rng() % 5 == 0) {
      // AllocateAt: exactly the range asked for when all of it is free.
      const uint64_t units = 1 + rng() % 40;
      const uint64_t start = rng() % ((1 << 12) - units);
      bool free = true;
      for (uint64_t u = start; u < start + units && free; ++u) free = !used[u];
      const ChunkId c = arena.AllocateAt(start, units);
      EXPECT_EQ(c != kNoChunk, free);
      if (c == kNoChunk) continue;
      EXPECT_EQ(arena.chunk(c).start, start);
      EXPECT_EQ(arena.chunk(c).size, units);
      live[c] = {start, units};
      mark(start, units, true);
    } else if (live.empty() || rng() % 3 != 0) {
      const uint64_t units = 1 + rng() % (rng() % 4 == 0 ? 300 : 20);
      const ChunkId c = arena.Allocate(units);
      if (c == kNoChunk) {
        EXPECT_TRUE(arena.LargestFreeChunk() < units);
        continue;
      }
      EXPECT_EQ(arena.chunk(c).size, units);
      live[c] = {arena.chunk(c).start, units};
      mark(arena.chunk(c).start, units, true);
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      arena.Free(it->first);
      mark(it->second.first, it->second.second, false);
      live.erase(it);
    }
  }
  // Tiling, no adjacent free chunks, interior lookups, free-unit count.
  uint64_t expect_start = 0, free_units = 0;
  bool prev_free = false;
  arena.ForEachChunk([&](const BestFitArena::Chunk& c) {
    EXPECT_EQ(c.start, expect_start);
    expect_start += c.size;
    EXPECT_TRUE(!(c.free && prev_free));
    prev_free = c.free;
    if (c.free) free_units += c.size;
  });
  EXPECT_EQ(expect_start, arena.num_units());
  EXPECT_EQ(free_units, arena.free_units());
  for (const auto& [id, range] : live) {
    EXPECT_EQ(arena.ChunkAt(range.first), id);
    EXPECT_EQ(arena.ChunkAt(range.first + range.second - 1), id);
  }
}

TEST(ArenaPrefersTheBestFittingFreeChunk) {
  BestFitArena arena(1024, false);
  arena.Grow(1024);
  const ChunkId a = arena.Allocate(100);
  const ChunkId sep1 = arena.Allocate(1);
  const ChunkId b = arena.Allocate(40);
  const ChunkId sep2 = arena.Allocate(1);
  (void)sep1;
  (void)sep2;
  const uint64_t b_start = arena.chunk(b).start;
  arena.Free(a);
  arena.Free(b);
  const ChunkId c = arena.Allocate(40);  // exact fit in b's hole, not a's
  EXPECT_EQ(arena.chunk(c).start, b_start);
}

// The end of the largest free chunk, whatever best fit would choose, and
// nothing when it is too small.
TEST(ArenaAllocatesAtTheEndOfTheLargestFreeChunk) {
  BestFitArena arena(1024, /*index_interior=*/true);
  arena.Grow(1024);
  const ChunkId a = arena.Allocate(100);
  const ChunkId sep = arena.Allocate(1);
  const ChunkId b = arena.Allocate(3);
  const ChunkId rest = arena.Allocate(1024 - 104);
  arena.Free(a);                                   // [0, 100) free
  arena.Free(b);                                   // [101, 104) free: best fit for 3
  EXPECT_EQ(arena.chunk(arena.Allocate(3)).start, 101u);
  const ChunkId c = arena.AllocateAtEndOfLargest(3);
  ASSERT_TRUE(c != kNoChunk);
  EXPECT_EQ(arena.chunk(c).start, 97u);
  EXPECT_EQ(arena.chunk(c).size, 3u);
  EXPECT_EQ(arena.ChunkAt(99), c);
  EXPECT_EQ(arena.LargestFreeChunk(), 97u);       // the front stays free
  EXPECT_EQ(arena.free_units(), 97u);
  EXPECT_TRUE(arena.AllocateAtEndOfLargest(98) == kNoChunk);
  arena.Free(c);                                   // merges back
  EXPECT_EQ(arena.LargestFreeChunk(), 100u);
  (void)sep;
  (void)rest;
}

TEST(ArenaGrowMergesWithAFreeTail) {
  BestFitArena arena(100, false);
  arena.Grow(10);
  arena.Grow(20);
  EXPECT_EQ(arena.LargestFreeChunk(), 30u);
  EXPECT_TRUE(!arena.Grow(71));
  EXPECT_TRUE(arena.Allocate(31) == kNoChunk);
}

TEST(ArenaWhoseTableCannotBeReservedFailsToGrowInsteadOfAborting) {
  // 2^46 units need a 256 TiB table, more than x86-64's 128 TiB of user
  // address space: mmap fails, as it does for any size under `ulimit -v`.
  BestFitArena arena(uint64_t{1} << 46, /*index_interior=*/true);
  EXPECT_TRUE(!arena.reserved());
  EXPECT_EQ(arena.table_bytes(), (size_t{1} << 46) * sizeof(ChunkId));
  EXPECT_TRUE(!arena.Grow(1));
  EXPECT_EQ(arena.num_units(), 0u);
  BestFitArena small(16, /*index_interior=*/false);
  EXPECT_TRUE(small.reserved());
}

}  // namespace
}  // namespace lms
