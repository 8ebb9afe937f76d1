// Unit tests of the engine's parts and of the engine over its backends:
// POSIX, or CUDA over the fake driver with LMS_TEST_BACKEND=cuda
// (test_backend.h). Built plain and under ASan/UBSan (make test-asan).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backends/posix_backend.h"
#include "backends/streaming_copy.h"
#include "engine/backing_map.h"
#include "engine/best_fit_arena.h"
#include "engine/engine.h"
#include "engine/env_options.h"
#include "engine/granule_pool.h"
#include "engine/reclaim_policy.h"
#include "engine/residency.h"
#include "engine/run_pool.h"
#include "harness.h"
#include "test_backend.h"
#include "testing/engine_pattern.h"

namespace lms {
namespace {

const size_t kGranule = lms_test::TestGranule();

struct Setup {
  size_t device_granules = 16;
  size_t host_granules = 64;
  bool lms = true;
  bool defrag = false;
  bool strict = false;
  size_t threshold = 0;
  PolicyKind policy = PolicyKind::kLru;
};

std::unique_ptr<Engine> MakeEngine(const Setup& s) {
  std::unique_ptr<Backend> backend = lms_test::MakeTestBackend(kGranule);
  EngineOptions o;
  o.device_bytes = s.device_granules * kGranule;
  o.host_bytes = s.host_granules * kGranule;
  o.lms_enabled = s.lms;
  o.defrag_enabled = s.defrag;
  o.strict = s.strict;
  o.small_object_threshold = s.threshold;
  o.policy = s.policy;
  std::unique_ptr<Engine> e;
  Status st = Engine::Create(o, std::move(backend), &e);
  if (!st.ok()) {
    std::printf("Engine::Create: %s\n", st.ToString().c_str());
    std::abort();
  }
  return e;
}

void* MustAllocate(Engine& e, size_t bytes, bool pin = false) {
  Status s;
  void* p = e.Allocate(bytes, pin, &s);
  if (p == nullptr) std::printf("  allocate %zu: %s\n", bytes, s.ToString().c_str());
  return p;
}

// The pattern at an allocation, through the engine's copies when the host
// cannot touch the backend's memory (engine_pattern.h).
void Fill(Engine& e, void* p, size_t bytes, uint64_t seed) {
  Status s = FillAllocation(e, p, bytes, seed);
  if (!s.ok()) std::printf("  fill: %s\n", s.ToString().c_str());
}

int64_t Verify(const Engine& e, const void* p, size_t bytes, uint64_t seed) {
  Status s;
  const int64_t bad = VerifyAllocation(e, p, bytes, seed, &s);
  if (!s.ok()) std::printf("  verify: %s\n", s.ToString().c_str());
  return bad;
}

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// ---------------------------------------------------------------- arena

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
    if (rng() % 5 == 0) {
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

TEST(StatusIsCopiedAndMovedWithItsMessage) {
  const Status ok;
  EXPECT_TRUE(ok.ok());
  EXPECT_TRUE(ok.code() == StatusCode::kOk);
  EXPECT_TRUE(ok.message() == std::string());
  EXPECT_TRUE(ok.ToString() == std::string("OK"));
  Status error = ResourceExhausted("no room");
  Status copy = error;
  EXPECT_TRUE(copy.ToString() == std::string("RESOURCE_EXHAUSTED: no room"));
  EXPECT_TRUE(error.message() == std::string("no room"));  // the copy is deep
  Status moved = std::move(copy);
  EXPECT_TRUE(moved.code() == StatusCode::kResourceExhausted);
  copy = moved;
  EXPECT_TRUE(copy.message() == std::string("no room"));
  copy = ok;
  EXPECT_TRUE(copy.ok());
  const Status& same = error;
  error = same;  // self-assignment keeps the message
  EXPECT_TRUE(error.message() == std::string("no room"));
}

// Every size around the streamed blocks (16 KiB), with aligned and unaligned
// ends: the streamed part, the tail memcpy and the fallback each copy every
// byte and nothing beyond.
TEST(StreamingCopyCopiesEveryByteAndNothingBeyondAtAnySizeAndAlignment) {
  constexpr size_t kMost = 3 * 16384 + 100;
  constexpr size_t kGuard = 64;
  std::vector<unsigned char> source(kMost + 32), target(kMost + 32 + kGuard);
  const size_t sizes[] = {0, 1, 15, 16, 4096, 16383, 16384, 16385, 2 * 16384 + 48, kMost};
  const size_t offsets[] = {0, 1, 8};  // from a 16-byte aligned start
  uint64_t seed = 1;
  for (const size_t bytes : sizes) {
    for (const size_t dst_offset : offsets) {
      for (const size_t src_offset : offsets) {
        unsigned char* src = source.data() + (16 - reinterpret_cast<uintptr_t>(
                                                      source.data()) % 16) % 16 + src_offset;
        unsigned char* dst = target.data() + (16 - reinterpret_cast<uintptr_t>(
                                                      target.data()) % 16) % 16 + dst_offset;
        FillPattern(src, bytes, ++seed);
        std::fill(dst, dst + bytes + kGuard, 0xA5);
        StreamingCopy(dst, src, bytes);
        EXPECT_EQ(VerifyPattern(dst, bytes, seed), -1);
        EXPECT_TRUE(std::count(dst + bytes, dst + bytes + kGuard, 0xA5) == kGuard);
      }
    }
  }
}

// The engine's lock counts what a thread waited while another held it
// (time_lock_waiting_ns), and nothing for a lock nobody held.
TEST(AMutexCountsOnlyTheTimeAThreadWaitedForAnotherHolder) {
  Mutex mu;
  {
    MutexLock lock(mu);
    EXPECT_EQ(mu.waited_ns(), 0);
  }
  std::atomic<bool> about_to_wait{false};
  std::thread waiter;
  {
    MutexLock lock(mu);
    waiter = std::thread([&] {
      about_to_wait = true;
      MutexLock waiting(mu);
    });
    while (!about_to_wait) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  waiter.join();
  MutexLock lock(mu);
  EXPECT_TRUE(mu.waited_ns() >= 20 * 1000 * 1000);
  EXPECT_TRUE(mu.waited_ns() < 10ll * 1000 * 1000 * 1000);
}

// ------------------------------------------------------- pools, residency

TEST(GranulePoolHandsOutConsecutiveIdsAndNeverMoreThanCapacity) {
  GranulePool pool(PoolKind::kDevice, 4);
  GranuleId ids[5];
  ASSERT_TRUE(pool.Take(3, ids));
  EXPECT_EQ(ids[0], 0u);
  EXPECT_EQ(ids[2], 2u);
  EXPECT_TRUE(!pool.Take(2, ids + 3));  // all or none
  EXPECT_EQ(pool.free_count(), 1u);
  pool.Give(ids, 3);
  EXPECT_EQ(pool.in_use(), 0u);
  EXPECT_EQ(pool.peak_in_use(), 3u);
}

// RunPool against a model of the backend's pieces: every Take hands out
// whole runs summing to what was asked, disjoint from every taken id; a run
// it cuts overlaps no defined run; one it reuses is a defined free run; one
// it releases is a defined free run; it fails only with fewer ids free.
TEST(RunPoolHandsOutWholeRunsAndDefinesEachIdOnceUnderRandomUse) {
  std::mt19937 rng(5);
  for (int round = 0; round < 40; ++round) {
    const size_t capacity = 1 + rng() % 64;
    RunPool pool(capacity);
    std::map<GranuleId, uint32_t> defined;    // the backend's pieces
    std::set<GranuleId> taken;                // ids handed out
    std::vector<std::vector<GranuleId>> held;  // per Take, its ids
    size_t reused = 0, released = 0;
    for (int step = 0; step < 400; ++step) {
      if (held.empty() || rng() % 2 == 0) {
        const size_t n = 1 + rng() % std::max<size_t>(1, capacity / 3);
        std::vector<GranuleId> out(n);
        std::vector<RunPool::Run> gone, cut;
        const bool ok = pool.Take(n, out.data(), &gone, &cut);
        ASSERT_TRUE(ok == (n <= capacity - taken.size()));
        if (!ok) continue;
        for (const auto& r : gone) {
          ASSERT_TRUE(defined.count(r.first) == 1u);
          ASSERT_TRUE(defined[r.first] == r.length);
          for (uint32_t i = 0; i < r.length; ++i) ASSERT_TRUE(taken.count(r.first + i) == 0u);
          defined.erase(r.first);
          ++released;
        }
        for (const auto& r : cut) {
          for (const auto& d : defined) {
            ASSERT_TRUE(r.first + r.length <= d.first || d.first + d.second <= r.first);
          }
          defined[r.first] = r.length;
        }
        // out: whole defined runs, each in order, none taken before.
        for (size_t i = 0; i < n;) {
          auto d = defined.find(out[i]);
          ASSERT_TRUE(d != defined.end());
          ASSERT_TRUE(i + d->second <= n);
          for (uint32_t k = 0; k < d->second; ++k) {
            ASSERT_TRUE(out[i + k] == d->first + k);
            ASSERT_TRUE(taken.insert(out[i + k]).second);
          }
          const RunPool::Run of = pool.RunOf(out[i]);
          ASSERT_TRUE(of.first == d->first);
          ASSERT_TRUE(of.length == d->second);
          bool is_cut = false;
          for (const auto& r : cut) is_cut = is_cut || r.first == d->first;
          if (!is_cut) ++reused;
          i += d->second;
        }
        held.push_back(std::move(out));
      } else {
        const size_t k = rng() % held.size();
        // One id at a time, as the engine frees an evicted unit.
        for (GranuleId id : held[k]) {
          pool.Give(id);
          taken.erase(id);
        }
        held.erase(held.begin() + static_cast<std::ptrdiff_t>(k));
      }
      ASSERT_TRUE(pool.in_use() == taken.size());
      size_t defined_granules = 0;
      for (const auto& d : defined) defined_granules += d.second;
      ASSERT_TRUE(pool.made() == defined_granules);
      ASSERT_TRUE(pool.made() <= pool.peak_in_use());  // no more made than ever used
    }
    EXPECT_TRUE(reused > 0);
    (void)released;
  }
}

// RunPool's order of preference (run_pool.h): made memory is reused before
// any is made, an exact size first; a free run is released only when no
// free run fits and no unmade id is left.
TEST(ARunPoolReusesFreeRunsExactSizeFirstAndReleasesOnlyWhenNothingElseFits) {
  RunPool pool(16);
  std::vector<RunPool::Run> released, cut;
  GranuleId a[4], b[6], c[2], d[4], e[8], f[7], g[3];
  ASSERT_TRUE(pool.Take(4, a, &released, &cut));
  ASSERT_TRUE(cut.size() == 1u && cut[0].first == 0u && cut[0].length == 4u);  // one piece
  pool.Give(a, 4);
  cut.clear();
  // 6: the free run of 4 (no making) and a new run of 2.
  ASSERT_TRUE(pool.Take(6, b, &released, &cut));
  EXPECT_EQ(b[0], 0u);
  ASSERT_TRUE(cut.size() == 1u && cut[0].first == 4u && cut[0].length == 2u);
  pool.Give(b, 6);
  cut.clear();
  // Free runs of 4 and 2: each size gets its own.
  ASSERT_TRUE(pool.Take(2, c, &released, &cut));
  EXPECT_EQ(c[0], 4u);
  ASSERT_TRUE(pool.Take(4, d, &released, &cut));
  EXPECT_EQ(d[0], 0u);
  EXPECT_TRUE(cut.empty());
  ASSERT_TRUE(pool.Take(8, e, &released, &cut));  // unmade 6..13: one run
  ASSERT_TRUE(cut.size() == 1u && cut[0].first == 6u && cut[0].length == 8u);
  pool.Give(c, 2);
  pool.Give(d, 4);
  cut.clear();
  // 7: the free 4, then the free 2, then one unmade id.
  ASSERT_TRUE(pool.Take(7, f, &released, &cut));
  EXPECT_EQ(f[0], 0u);
  EXPECT_EQ(f[4], 4u);
  EXPECT_EQ(f[6], 14u);
  ASSERT_TRUE(cut.size() == 1u && cut[0].first == 14u && cut[0].length == 1u);
  EXPECT_TRUE(released.empty());
  pool.Give(e, 8);
  cut.clear();
  // 3 with one unmade id and a free run of 8: the 8 is released and cut.
  ASSERT_TRUE(pool.Take(3, g, &released, &cut));
  ASSERT_TRUE(released.size() == 1u && released[0].first == 6u && released[0].length == 8u);
  ASSERT_TRUE(cut.size() == 2u);
  EXPECT_EQ(g[0], 6u);
  EXPECT_EQ(g[2], 15u);
  EXPECT_EQ(pool.free_count(), 6u);
  GranuleId h[7];
  EXPECT_TRUE(!pool.Take(7, h, &released, &cut));  // all or none
  EXPECT_EQ(pool.free_count(), 6u);
}

// Pinned host memory is one budget for every GPU of the process: a RunPool
// keeps no more made than was ever in use, as a pool of granules did.
TEST(ARunPoolMakesNoMoreMemoryThanWasEverInUse) {
  RunPool pool(8);
  std::vector<RunPool::Run> released, cut;
  GranuleId a[4], b[3];
  ASSERT_TRUE(pool.Take(4, a, &released, &cut));
  pool.Give(a, 4);
  cut.clear();
  // 3: the free 4 does not fit, so 3 unmade ids are cut; 7 made against a
  // peak of 4 in use: the free run of 4 goes.
  ASSERT_TRUE(pool.Take(3, b, &released, &cut));
  ASSERT_TRUE(cut.size() == 1u && cut[0].first == 4u && cut[0].length == 3u);
  ASSERT_TRUE(released.size() == 1u && released[0].first == 0u && released[0].length == 4u);
  EXPECT_EQ(pool.made(), 3u);
  EXPECT_EQ(pool.peak_in_use(), 4u);
}

TEST(ResidencyKeepsOnlyInactiveResidentAllocationsOnTheLru) {
  Residency r;
  r.Track(0, 2, /*pinned=*/false);
  r.Track(1, 3, /*pinned=*/true);
  r.Track(2, 1, /*pinned=*/false);
  EXPECT_EQ(r.inactive_resident_granules(), 3u);
  EXPECT_EQ(r.LeastRecentlyUsed(), 0u);
  r.Pin(0);
  EXPECT_EQ(r.LeastRecentlyUsed(), 2u);
  r.Unpin(0);  // now most recent
  r.Unpin(1);
  EXPECT_EQ(r.LeastRecentlyUsed(), 2u);
  EXPECT_EQ(r.NextMoreRecent(2), 0u);
  EXPECT_EQ(r.NextMoreRecent(0), 1u);
  r.MarkEvicted(2);
  EXPECT_EQ(r.inactive_resident_granules(), 5u);
  r.Pin(2);
  r.MarkResident(2);  // pinned: stays off the list
  EXPECT_EQ(r.inactive_resident_granules(), 5u);
}

TEST(ReclaimPolicyPrefersOneOldVictimThatFreesEnough) {
  Residency r;
  r.Track(0, 1, false);
  r.Track(1, 4, false);
  r.Track(2, 8, false);
  ReclaimPlan plan;
  ASSERT_TRUE(PlanReclaim(r, 3, &plan));
  EXPECT_TRUE(plan.single);
  EXPECT_EQ(plan.victims.size(), 1u);
  EXPECT_EQ(plan.victims[0], 1u);
  ASSERT_TRUE(PlanReclaim(r, 10, &plan));  // nobody alone: LRU order
  EXPECT_TRUE(!plan.single);
  EXPECT_EQ(plan.victims.size(), 3u);
  EXPECT_TRUE(!PlanReclaim(r, 14, &plan));
  EXPECT_TRUE(plan.victims.empty());
}

// ----------------------------------------------------------------- engine

TEST(TheEngineRunsOverTheBackendTheTestsAskFor) {
  auto e = MakeEngine({});
  EXPECT_EQ(std::string(e->backend().Name()) == "cuda", lms_test::UsingCuda());
  EXPECT_EQ(e->backend().HostCanTouch(), !lms_test::UsingCuda());
  EXPECT_EQ(e->granule_bytes(), kGranule);
}

TEST(LargeAllocationIsGranuleAlignedAndCountsWholeGranules) {
  auto e = MakeEngine({});
  void* p = MustAllocate(*e, kGranule + 1);
  ASSERT_TRUE(p != nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kGranule, 0u);
  EXPECT_EQ(e->AllocatedSize(p), 2 * kGranule);
  EXPECT_EQ(e->RequestedSize(p), kGranule + 1);
  Statistics s = e->GetStatistics();
  EXPECT_EQ(s.bytes_in_use, static_cast<int64_t>(2 * kGranule));
  EXPECT_EQ(s.bytes_inactive, s.bytes_in_use);
  EXPECT_OK(e->Free(p));
  EXPECT_EQ(e->GetStatistics().bytes_in_use, 0);
  EXPECT_EQ(e->cached_granules(), 2u);  // the granules stay mapped as a cache
}

TEST(EvictionKeepsTheAddressAndEveryByte) {
  auto e = MakeEngine({/*device=*/8, /*host=*/16});
  const size_t size = 3 * kGranule + 123;
  void* a = MustAllocate(*e, size);
  ASSERT_TRUE(a != nullptr);
  Fill(*e, a, size, 11);
  EXPECT_OK(e->Evict(a));
  AllocationInfo info;
  EXPECT_OK(e->Inspect(a, &info));
  EXPECT_TRUE(info.evicted);
  EXPECT_EQ(info.address, reinterpret_cast<uintptr_t>(a));
  // Unpinned read of an evicted allocation: served from the host pool.
  EXPECT_EQ(Verify(*e, a, size, 11), -1);
  Statistics s = e->GetStatistics();
  EXPECT_EQ(s.current_bytes_reclaimed, static_cast<int64_t>(4 * kGranule));
  EXPECT_EQ(s.host_bytes_in_use, static_cast<int64_t>(4 * kGranule));
  uint64_t id = 0;
  EXPECT_OK(e->Pin(static_cast<char*>(a) + 5, &id));  // interior pointer
  EXPECT_OK(e->Inspect(a, &info));
  EXPECT_TRUE(!info.evicted);
  EXPECT_EQ(Verify(*e, a, size, 11), -1);
  s = e->GetStatistics();
  EXPECT_EQ(s.num_page_ins, 1);
  EXPECT_EQ(s.current_bytes_reclaimed, 0);
  EXPECT_EQ(s.host_bytes_in_use, 0);
  EXPECT_OK(e->Unpin(a, id));
  EXPECT_OK(e->Free(a));
}

// How many of the 4 KiB pages of [p, p + bytes) have a page table entry in
// this process (/proc/self/pagemap, bit 63: present), or -1 if unreadable.
int64_t PresentPages(const void* p, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  std::vector<uint64_t> entries(bytes / page);
  const off_t at = static_cast<off_t>(reinterpret_cast<uintptr_t>(p) / page * 8);
  const ssize_t n = pread(fd, entries.data(), entries.size() * 8, at);
  close(fd);
  if (n != static_cast<ssize_t>(entries.size() * 8)) return -1;
  int64_t present = 0;
  for (uint64_t e : entries) present += (e >> 63) & 1;
  return present;
}

// On the emulated device a fresh mapping has no page table entries, and a
// kernel's first write to each page would fault (PosixBackend's comment has
// the measurements): device memory comes mapped populated, at allocation and
// at page-in. The host memory of an evicted allocation is not populated.
TEST(EmulatedDeviceMemoryIsPopulatedWhenMappedSoKernelsTakeNoFirstTouchFaults) {
  auto e = MakeEngine({/*device=*/8, /*host=*/16});
  if (!e->backend().HostCanTouch()) {
    std::printf("  skipped on this backend: no host page tables back device memory\n");
    return;
  }
  const size_t size = 3 * kGranule;
  const int64_t pages = static_cast<int64_t>(size / static_cast<size_t>(sysconf(_SC_PAGESIZE)));
  void* a = MustAllocate(*e, size);
  ASSERT_TRUE(a != nullptr);
  EXPECT_EQ(PresentPages(a, size), pages);
  Fill(*e, a, size, 5);
  EXPECT_OK(e->Evict(a));
  EXPECT_EQ(PresentPages(a, size), 0);
  uint64_t id = 0;
  EXPECT_OK(e->Pin(a, &id));
  EXPECT_EQ(PresentPages(a, size), pages);
  EXPECT_EQ(Verify(*e, a, size, 5), -1);
  EXPECT_OK(e->Unpin(a, id));
  EXPECT_OK(e->Free(a));
}

// Kilobytes of the mappings that start in [p, p + bytes) mapped by page
// middle directory entries (huge pages), from /proc/self/smaps; -1 if no
// mapping starts there.
int64_t PmdMappedKb(const void* p, size_t bytes) {
  FILE* smaps = std::fopen("/proc/self/smaps", "r");
  if (smaps == nullptr) return -1;
  const uintptr_t first = reinterpret_cast<uintptr_t>(p);
  char line[512];
  int64_t kb = -1;
  bool in_range = false;
  while (std::fgets(line, sizeof line, smaps) != nullptr) {
    unsigned long start = 0, end = 0;
    if (std::sscanf(line, "%lx-%lx ", &start, &end) == 2) {
      in_range = start >= first && start < first + bytes;
      if (in_range && kb < 0) kb = 0;
      continue;
    }
    long value = 0;
    if (in_range && (std::sscanf(line, "ShmemPmdMapped: %ld kB", &value) == 1 ||
                     std::sscanf(line, "FilePmdMapped: %ld kB", &value) == 1)) {
      kb += value;
    }
  }
  std::fclose(smaps);
  return kb;
}

// Two 2 MiB granules of a POSIX backend with huge pages `mode`: mapped,
// written, evicted to host granules, paged back into other device granules,
// every word checked each time; *pmd_kb gets the kilobytes of the granules'
// mappings in huge pages after each of the three mappings.
void MapEvictAndPageInGranules(HugePages mode, std::vector<int64_t>* pmd_kb) {
  const size_t granule = size_t{2} << 20;
  std::unique_ptr<Backend> made;
  ASSERT_TRUE((PosixBackend::Create(granule, &made, mode)).ok());
  auto* backend = static_cast<PosixBackend*>(made.get());
  uintptr_t base = 0;
  ASSERT_TRUE((backend->ReserveAddressRange(2 * granule, &base)).ok());
  ASSERT_TRUE((backend->CreatePool(PoolKind::kDevice, 2)).ok());
  ASSERT_TRUE((backend->CreatePool(PoolKind::kHost, 2)).ok());
  auto* bytes = reinterpret_cast<uint32_t*>(base);
  const size_t words = 2 * granule / sizeof(uint32_t);
  auto wrong_words = [&] {
    size_t wrong = 0;
    for (size_t i = 0; i < words; ++i) wrong += bytes[i] != static_cast<uint32_t>(i * 2654435761u);
    return wrong;
  };
  const GranuleId device[] = {0, 1}, host[] = {1, 0}, paged_in[] = {1, 0};
  ASSERT_TRUE((backend->Map(base, PoolKind::kDevice, device, 2, Access::kReadWrite)).ok());
  pmd_kb->push_back(PmdMappedKb(bytes, 2 * granule));
  for (size_t i = 0; i < words; ++i) bytes[i] = static_cast<uint32_t>(i * 2654435761u);
  // An eviction and a page-in, as the engine makes them.
  ASSERT_TRUE((backend->CopyGranules(PoolKind::kHost, host, PoolKind::kDevice, device,
                                     2 * granule)).ok());
  ASSERT_TRUE((backend->Map(base, PoolKind::kHost, host, 2, Access::kReadWrite)).ok());
  EXPECT_EQ(wrong_words(), 0u);
  pmd_kb->push_back(PmdMappedKb(bytes, 2 * granule));
  ASSERT_TRUE((backend->CopyGranules(PoolKind::kDevice, paged_in, PoolKind::kHost, host,
                                     2 * granule)).ok());
  ASSERT_TRUE((backend->Map(base, PoolKind::kDevice, paged_in, 2, Access::kReadWrite)).ok());
  pmd_kb->push_back(PmdMappedKb(bytes, 2 * granule));
  EXPECT_EQ(wrong_words(), 0u);
  ASSERT_TRUE((backend->Unmap(base, 2)).ok());
  backend->ReleaseAddressRange(base, 2 * granule);
}

// The emulated device's pool memory in transparent huge pages where the
// machine gives them (PosixBackend's comment: populating a 2 MiB granule
// costs one entry, not 512), by advice or by collapse, and bytes kept across
// an eviction and a page-in on each path whether or not the machine gives
// huge pages.
TEST(EmulatedDeviceMemoryUsesHugePagesWhereTheMachineAllows) {
  if (lms_test::UsingCuda()) {
    std::printf("  skipped on the CUDA backend: a POSIX backend's memory\n");
    return;
  }
  const HugePages machine = MachineAllowsSharedHugePages()     ? HugePages::kAdvise
                            : MachineCollapsesSharedHugePages() ? HugePages::kCollapse
                                                                : HugePages::kOff;
  std::printf("  this machine: %s\n", HugePagesName(machine));
  for (HugePages mode : {HugePages::kAuto, HugePages::kAdvise, HugePages::kCollapse}) {
    std::unique_ptr<Backend> made;
    ASSERT_TRUE((PosixBackend::Create(size_t{2} << 20, &made, mode)).ok());
    EXPECT_EQ(static_cast<PosixBackend*>(made.get())->huge_pages(),
              mode == HugePages::kAuto ? machine : mode);
    // Huge where the machine gives this path: advice where shmem_enabled
    // allows it, collapse where the kernel collapses shared memory (which
    // shmem_enabled's advise does not forbid).
    const bool huge = mode == HugePages::kAdvise ? MachineAllowsSharedHugePages()
                      : mode == HugePages::kCollapse ? MachineCollapsesSharedHugePages()
                                                     : machine != HugePages::kOff;
    const int64_t kb = huge ? 4096 : 0;
    const std::vector<int64_t> expected = {kb, kb, kb};
    std::vector<int64_t> pmd_kb;
    MapEvictAndPageInGranules(mode, &pmd_kb);
    if (pmd_kb != expected) {
      // The kernel gives a huge page only if it finds 2 MiB free and
      // contiguous, or makes it: once more, on the rare chance it did not.
      std::printf("  %s: %" PRId64 ", %" PRId64 ", %" PRId64 " kB in huge pages; again\n",
                  HugePagesName(mode), pmd_kb[0], pmd_kb[1], pmd_kb[2]);
      pmd_kb.clear();
      MapEvictAndPageInGranules(mode, &pmd_kb);
    }
    EXPECT_TRUE(pmd_kb == expected);
    std::printf("  %s: %" PRId64 " kB of 4096 in huge pages after each mapping (%s)\n",
                HugePagesName(mode), pmd_kb.empty() ? -1 : pmd_kb.back(),
                huge ? "huge expected" : "small expected");
  }
}

// A kernel's evicted inputs, paged in by one PinAll: every byte back,
// duplicates and interior pointers pinned once each, a pointer to nothing
// refused alone. (One host wait for all of them on a GPU:
// cuda_backend_test.)
TEST(PinAllPagesInAKernelsEvictedInputsTogether) {
  auto e = MakeEngine({/*device=*/8, /*host=*/16});
  const size_t size = kGranule + 100;
  std::vector<void*> inputs;
  for (int i = 0; i < 3; ++i) {
    inputs.push_back(MustAllocate(*e, size));
    ASSERT_TRUE(inputs.back() != nullptr);
    Fill(*e, inputs.back(), size, 40 + i);
    EXPECT_OK(e->Evict(inputs.back()));
  }
  int unmapped = 0;
  const void* ptrs[] = {inputs[0], static_cast<char*>(inputs[1]) + 7, inputs[2], inputs[0],
                        &unmapped};
  uint64_t ids[5];
  EXPECT_EQ(e->PinAll(ptrs, 5, ids).code(), StatusCode::kNotFound);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(ids[i] != 0);
  EXPECT_EQ(ids[4], 0u);
  EXPECT_EQ(ids[0], ids[3]);
  const Statistics s = e->GetStatistics();
  EXPECT_EQ(s.num_page_ins, 3);
  EXPECT_EQ(s.current_bytes_reclaimed, 0);
  EXPECT_EQ(s.num_failed_pins, 0);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Verify(*e, inputs[i], size, 40 + i), -1);
  for (int i = 0; i < 4; ++i) EXPECT_OK(e->Unpin(ptrs[i], ids[i]));
  EXPECT_EQ(e->GetStatistics().bytes_active, 0);
  EXPECT_OK(e->CheckInvariants());
}

// When the device cannot hold every input at once, PinAll pages them in one
// by one as far as it can: the input that does not fit fails alone, holds
// nothing, and loses no byte.
TEST(PinAllPagesInWhatFitsWhenNotEveryInputDoes) {
  auto e = MakeEngine({/*device=*/4, /*host=*/16});
  const size_t size = 2 * kGranule;
  std::vector<void*> inputs;
  for (int i = 0; i < 3; ++i) {
    inputs.push_back(MustAllocate(*e, size));
    ASSERT_TRUE(inputs.back() != nullptr);
    Fill(*e, inputs.back(), size, 60 + i);
    EXPECT_OK(e->Evict(inputs.back()));
  }
  const void* ptrs[] = {inputs[0], inputs[1], inputs[2]};
  uint64_t ids[3];
  const Status failed = e->PinAll(ptrs, 3, ids);
  EXPECT_EQ(failed.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(failed.message(), "cannot page in"));
  EXPECT_TRUE(ids[0] != 0 && ids[1] != 0);
  EXPECT_EQ(ids[2], 0u);
  const Statistics s = e->GetStatistics();
  EXPECT_EQ(s.num_failed_pins, 1);
  EXPECT_EQ(s.bytes_active, static_cast<int64_t>(2 * size));
  AllocationInfo info;
  EXPECT_OK(e->Inspect(inputs[2], &info));
  EXPECT_TRUE(info.evicted);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Verify(*e, inputs[i], size, 60 + i), -1);
  EXPECT_OK(e->Unpin(ptrs[0], ids[0]));
  EXPECT_OK(e->Unpin(ptrs[1], ids[1]));
  EXPECT_OK(e->CheckInvariants());
}

TEST(PressureEvictsTheLeastRecentlyUsedInactiveAllocation) {
  auto e = MakeEngine({/*device=*/8, /*host=*/16});
  const size_t size = 4 * kGranule;
  void* a = MustAllocate(*e, size);
  void* b = MustAllocate(*e, size);
  ASSERT_TRUE(a && b);
  Fill(*e, a, size, 1);
  Fill(*e, b, size, 2);
  uint64_t id;
  EXPECT_OK(e->Pin(a, &id));  // a becomes most recently used
  EXPECT_OK(e->Unpin(a, id));
  void* c = MustAllocate(*e, size, /*pin=*/true);
  ASSERT_TRUE(c != nullptr);
  AllocationInfo ia, ib;
  EXPECT_OK(e->Inspect(a, &ia));
  EXPECT_OK(e->Inspect(b, &ib));
  EXPECT_TRUE(!ia.evicted);
  EXPECT_TRUE(ib.evicted);
  Statistics s = e->GetStatistics();
  EXPECT_EQ(s.num_single_reclaims, 1);
  EXPECT_EQ(s.bytes_reclaimed, static_cast<int64_t>(size));
  EXPECT_EQ(e->device_granules_in_use(), 8u);
  // Paging b in needs a's granules: a is inactive, so it goes.
  EXPECT_OK(e->Pin(b, &id));
  EXPECT_EQ(Verify(*e, b, size, 2), -1);
  EXPECT_EQ(Verify(*e, a, size, 1), -1);
  EXPECT_OK(e->Inspect(a, &ia));
  EXPECT_TRUE(ia.evicted);
  EXPECT_OK(e->Unpin(b, id));
}

// Unpins the unit `p` lies in, by the id Inspect gives: a kernel that made
// `p` (allocated pinned) ends.
void UnpinAt(Engine& e, void* p) {
  AllocationInfo info;
  EXPECT_OK(e.Inspect(p, &info));
  EXPECT_OK(e.Unpin(p, info.unit_id));
}

// A kernel labelled `op` (nullptr: none) that reads `p`: pins and unpins it.
void UseIn(Engine& e, const char* op, void* p) {
  StrictMonitor::SetThreadLabel(op);
  uint64_t id = 0;
  EXPECT_OK(e.Pin(p, &id));
  EXPECT_OK(e.Unpin(p, id));
}

// `count` one-granule tensors, each allocated pinned by its own "kernel"
// (thread label op<i>, so the learned policy keys them apart), filled with
// pattern seed_base + i and unpinned.
std::vector<void*> KernelTensors(Engine& e, int count, uint64_t seed_base) {
  static const char* const kOps[] = {"op0", "op1", "op2", "op3", "op4", "op5", "op6", "op7"};
  std::vector<void*> tensors;
  for (int i = 0; i < count; ++i) {
    StrictMonitor::SetThreadLabel(kOps[i]);
    void* p = MustAllocate(e, kGranule, /*pin=*/true);
    if (p == nullptr) std::abort();
    Fill(e, p, kGranule, seed_base + i);
    UnpinAt(e, p);
    tensors.push_back(p);
  }
  StrictMonitor::SetThreadLabel(nullptr);
  return tensors;
}

// Eight tensors used round and round on a device that holds seven: LRU
// evicts exactly the one needed next, every time; the learned policy (Note
// [Learned eviction]) evicts the one used farthest ahead once it has seen a
// round. Every byte survives under both.
int64_t LoopPageIns(PolicyKind policy, int64_t* learned_reclaims) {
  Setup setup{/*device=*/7, /*host=*/16};
  setup.policy = policy;
  auto e = MakeEngine(setup);
  const std::vector<void*> tensors = KernelTensors(*e, 8, 100);
  for (int round = 0; round < 6; ++round) {
    for (void* p : tensors) {
      uint64_t id;
      EXPECT_OK(e->Pin(p, &id));
      EXPECT_OK(e->Unpin(p, id));
    }
  }
  for (int i = 0; i < 8; ++i) EXPECT_EQ(Verify(*e, tensors[i], kGranule, 100 + i), -1);
  EXPECT_OK(e->CheckInvariants());
  const Statistics s = e->GetStatistics();
  *learned_reclaims = s.num_learned_reclaims;
  return s.num_page_ins;
}

TEST(TheLearnedPolicyEvictsWhatALoopNeedsLast) {
  int64_t lru_learned = 0, learned = 0;
  const int64_t lru = LoopPageIns(PolicyKind::kLru, &lru_learned);
  const int64_t ours = LoopPageIns(PolicyKind::kLearned, &learned);
  EXPECT_EQ(lru, 48);  // every use of every round misses
  EXPECT_EQ(lru_learned, 0);
  EXPECT_TRUE(learned > 0);
  EXPECT_TRUE(ours * 3 <= lru);
}

// One kernel ("split") makes two outputs of one size each step: the first is
// used by the next kernel, the second ten kernels later. Keyed by op and
// size alone they would share what was learned, and the first's prediction
// would miss every step; keyed by their occurrence too, every prediction
// hits once a step has been seen. (The eight kernels between make a
// temporary each, of one size: their occurrences key them apart too.)
// Runs five such steps on `e` and checks the last three's predictions.
void RunStepsOfASplitKernel(Engine& e) {
  Statistics before;
  for (int step = 0; step < 5; ++step) {
    if (step == 2) before = e.GetStatistics();
    StrictMonitor::SetThreadLabel("split");
    void* first = MustAllocate(e, kGranule, /*pin=*/true);
    void* second = MustAllocate(e, kGranule, /*pin=*/true);
    ASSERT_TRUE(first && second);
    Fill(e, second, kGranule, step);
    UnpinAt(e, first);
    UnpinAt(e, second);
    UseIn(e, "use_first", first);
    StrictMonitor::SetThreadLabel("temporaries");
    for (int i = 0; i < 8; ++i) {
      void* t = MustAllocate(e, 2 * kGranule, /*pin=*/true);
      ASSERT_TRUE(t != nullptr);
      UnpinAt(e, t);
      EXPECT_OK(e.Free(t));
    }
    UseIn(e, "use_second", second);
    EXPECT_EQ(Verify(e, second, kGranule, step), -1);
    StrictMonitor::SetThreadLabel(nullptr);
    EXPECT_OK(e.Free(first));
    EXPECT_OK(e.Free(second));
  }
  const Statistics after = e.GetStatistics();
  const int64_t predictions = after.num_predictions - before.num_predictions;
  EXPECT_EQ(predictions, 3 * (2 * 2 + 8));  // three steps: two periods of each output, 8 temporaries
  EXPECT_EQ(after.num_prediction_hits - before.num_prediction_hits, predictions);
}

TEST(TheLearnedPolicyTellsApartTwoSameSizedOutputsOfOneKernel) {
  Setup setup{/*device=*/16, /*host=*/16};
  setup.policy = PolicyKind::kLearned;
  RunStepsOfASplitKernel(*MakeEngine(setup));
}

// A run whose shapes changed every step for a while (here: 196,608 kernels,
// each allocating a tensor under a label never seen again, three times the
// keys the table holds) still learns the steps that follow (Note [Forgetting keys]);
// a table that kept every key would be full and learn nothing more. A
// tensor that stays live meanwhile holds its key's entry, which is never
// forgotten (under ASan, a forgotten one would be used after its free when
// the tensor is freed).
TEST(TheLearnedPolicyForgetsKeysThatNeverComeBack) {
  Setup setup{/*device=*/16, /*host=*/16};
  setup.policy = PolicyKind::kLearned;
  auto e = MakeEngine(setup);
  StrictMonitor::SetThreadLabel("kept");
  void* kept = MustAllocate(*e, 1000);
  ASSERT_TRUE(kept != nullptr);
  Fill(*e, kept, 1000, 3);
  const size_t kShapes = 3 * LearnedPolicy::kMaxKeys;  // the hand goes round twice
  for (size_t i = 0; i < kShapes; ++i) {
    const std::string label = "shapes_" + std::to_string(i);
    StrictMonitor::SetThreadLabel(label.c_str());
    void* t = MustAllocate(*e, 1000, /*pin=*/true);
    ASSERT_TRUE(t != nullptr);
    UnpinAt(*e, t);
    EXPECT_OK(e->Free(t));
  }
  StrictMonitor::SetThreadLabel(nullptr);
  RunStepsOfASplitKernel(*e);
  EXPECT_EQ(Verify(*e, kept, 1000, 3), -1);
  EXPECT_OK(e->Free(kept));
  EXPECT_OK(e->CheckInvariants());
}

// `granules` granules allocated by the kernel `op`, pinned, then unpinned.
void* MadeBy(Engine& e, const char* op, size_t granules) {
  StrictMonitor::SetThreadLabel(op);
  void* p = MustAllocate(e, granules * kGranule, /*pin=*/true);
  if (p == nullptr) std::abort();
  UnpinAt(e, p);
  return p;
}

// A device of 8 granules under the learned policy, defragmented: freed
// memory serves the next step wherever it lies.
std::unique_ptr<Engine> EightGranulesLearnedDefrag() {
  Setup setup{/*device=*/8, /*host=*/16};
  setup.policy = PolicyKind::kLearned;
  setup.defrag = true;
  return MakeEngine(setup);
}

// Each step a kernel needs 2 granules while B (1 granule, used last), C (3,
// used next-to-last) and A (2, used first) are inactive. Farthest first
// would evict B and C (4 granules, paged in again later); C alone frees
// enough, so the learned policy evicts it alone: 3 granules move each way.
TEST(TheLearnedPolicyEvictsOneUnitThatFreesEnoughInsteadOfSeveral) {
  auto e = EightGranulesLearnedDefrag();
  Statistics before;
  for (int step = 0; step < 5; ++step) {
    if (step == 2) before = e->GetStatistics();
    void* b = MadeBy(*e, "make_b", 1);
    void* c = MadeBy(*e, "make_c", 3);
    void* a = MadeBy(*e, "make_a", 2);
    Fill(*e, a, 2 * kGranule, step);
    void* scratch = MadeBy(*e, "kernel", 4);  // needs 2 granules more than are free
    AllocationInfo info;
    EXPECT_OK(e->Inspect(b, &info));
    EXPECT_TRUE(!info.evicted);
    EXPECT_OK(e->Free(scratch));
    UseIn(*e, "use_a", a);
    UseIn(*e, "use_c", c);
    UseIn(*e, "use_b", b);
    EXPECT_EQ(Verify(*e, a, 2 * kGranule, step), -1);
    StrictMonitor::SetThreadLabel(nullptr);
    for (void* p : {a, b, c}) EXPECT_OK(e->Free(p));
  }
  const Statistics after = e->GetStatistics();
  EXPECT_TRUE(after.num_learned_reclaims > before.num_learned_reclaims);
  // Three steps: C out and in, 3 granules each way, every step.
  EXPECT_EQ(after.bytes_reclaimed - before.bytes_reclaimed,
            static_cast<int64_t>(3 * 3 * kGranule));
  EXPECT_EQ(after.bytes_paged_in - before.bytes_paged_in,
            static_cast<int64_t>(3 * 3 * kGranule));
}

// Each step a kernel needs 1 granule more than is free while X (4 granules,
// used last), Y (1) and A (2, used `before` times before Y and `between`
// times between Y and X) are inactive. Farthest first would evict X,
// freeing 3 granules more than needed; Y frees enough, and goes instead if
// it is needed nearly as late: at least 3/4 of X's distance (Note [Learned
// eviction]). Returns the granules evicted over the last three steps (each
// comes back in).
int64_t GranulesEvictedWithXYA(int before_y, int between) {
  auto e = EightGranulesLearnedDefrag();
  Statistics before;
  for (int step = 0; step < 5; ++step) {
    if (step == 2) before = e->GetStatistics();
    void* y = MadeBy(*e, "make_y", 1);
    void* x = MadeBy(*e, "make_x", 4);
    void* a = MadeBy(*e, "make_a", 2);
    Fill(*e, x, 4 * kGranule, step);
    Fill(*e, y, kGranule, step + 10);
    void* scratch = MadeBy(*e, "kernel", 2);  // needs 1 granule more than is free
    EXPECT_OK(e->Free(scratch));
    for (int use = 0; use < before_y; ++use) UseIn(*e, "use_a", a);
    UseIn(*e, "use_y", y);
    for (int use = 0; use < between; ++use) UseIn(*e, "use_a_again", a);
    UseIn(*e, "use_x", x);
    EXPECT_EQ(Verify(*e, x, 4 * kGranule, step), -1);
    EXPECT_EQ(Verify(*e, y, kGranule, step + 10), -1);
    StrictMonitor::SetThreadLabel(nullptr);
    for (void* p : {a, x, y}) EXPECT_OK(e->Free(p));
  }
  const Statistics after = e->GetStatistics();
  EXPECT_TRUE(after.num_learned_reclaims > before.num_learned_reclaims);
  EXPECT_EQ(after.bytes_paged_in - before.bytes_paged_in,
            after.bytes_reclaimed - before.bytes_reclaimed);
  return (after.bytes_reclaimed - before.bytes_reclaimed) / static_cast<int64_t>(kGranule);
}

TEST(TheLearnedPolicyEvictsTheUnitThatFitsAmongThoseNeededNearlyAsLate) {
  // Y needed one use before X, 3 uses of A ahead of both: Y goes, 1
  // granule a step.
  EXPECT_EQ(GranulesEvictedWithXYA(/*before_y=*/3, /*between=*/0), 3);
  // Y needed about half as far ahead as X: X goes, 4 a step.
  EXPECT_EQ(GranulesEvictedWithXYA(/*before_y=*/1, /*between=*/2), 12);
}

// A unit used round and round expects its last inactive period again: a
// large allocation does, and so does a small object; a small-object page,
// whose objects come and go with the kernels, does not (Note [Learned
// eviction]): pinning an object makes the object's prediction only.
int64_t PredictionsForATensorUsedRoundAndRound(size_t bytes) {
  Setup setup{/*device=*/8, /*host=*/16};
  setup.policy = PolicyKind::kLearned;
  auto e = MakeEngine(setup);
  void* p = MustAllocate(*e, bytes);
  if (p == nullptr) std::abort();
  AllocationInfo info;
  EXPECT_OK(e->Inspect(p, &info));
  EXPECT_EQ(info.small, bytes < kGranule);
  for (int round = 0; round < 6; ++round) UseIn(*e, nullptr, p);
  EXPECT_OK(e->Free(p));
  return e->GetStatistics().num_predictions;
}

TEST(ASmallObjectPageDoesNotExpectItsLastPeriodAgain) {
  EXPECT_EQ(PredictionsForATensorUsedRoundAndRound(kGranule), 6);  // 5 pins, the free
  EXPECT_EQ(PredictionsForATensorUsedRoundAndRound(1000), 6);  // the object's, none of its page
}

// A weight, made outside any kernel (so without a key), is used three times
// a step with 3, 12 and 30 other kernels between (its forward use, its
// gradient's, the optimizer's update): its inactive periods run 4, 13 and 31
// ticks in turn. Expecting its last period again misses every time; its
// periods repeat at a lag of three (Note [Periodic units]), so once two
// steps are in its history every prediction hits, the other tensor's too.
TEST(AUnitUsedSeveralTimesAStepPredictsEachOfItsPeriods) {
  Setup setup{/*device=*/8, /*host=*/16};
  setup.policy = PolicyKind::kLearned;
  auto e = MakeEngine(setup);
  void* weight = MustAllocate(*e, kGranule);
  ASSERT_TRUE(weight != nullptr);
  Fill(*e, weight, kGranule, 7);
  const std::vector<void*> other = KernelTensors(*e, 1, 8);
  const int kGaps[] = {3, 12, 30};
  Statistics before;
  for (int step = 0; step < 8; ++step) {
    if (step == 4) before = e->GetStatistics();
    for (int gap : kGaps) {
      UseIn(*e, "use_weight", weight);
      for (int i = 0; i < gap; ++i) UseIn(*e, "use_other", other[0]);
    }
  }
  StrictMonitor::SetThreadLabel(nullptr);
  const Statistics after = e->GetStatistics();
  const int64_t predictions = after.num_predictions - before.num_predictions;
  EXPECT_EQ(predictions, 4 * (3 + 45));  // four steps: the weight's 3 periods, the other's 45
  EXPECT_EQ(after.num_prediction_hits - before.num_prediction_hits, predictions);
  EXPECT_EQ(Verify(*e, weight, kGranule, 7), -1);
  EXPECT_OK(e->CheckInvariants());
}

// Each step a page holds `cold` (freed unused) and `hot` (used right after
// the shortfall), and L (one granule, used last) is more recently used than
// the page, which has been inactive longer than L will be. When a kernel
// needs a granule, LRU evicts the page, and so would the learned policy if
// it ranked the page by its age (longer than L's predicted distance) or by
// its farthest object (`cold`: never); ranked by its soonest object, `hot`,
// the page stays and L goes. Unless the page is mostly empty: a page whose
// objects fill a quarter of it copies a quarter of L's bytes, and ranks as
// if `hot` were used four times later than it is, after L.
// `count` one-granule temporaries, each pinned at birth and freed: kernels
// that tick the learned policy's clock.
void Churn(Engine& e, int count) {
  StrictMonitor::SetThreadLabel("temporary");
  for (int i = 0; i < count; ++i) {
    void* t = MustAllocate(e, kGranule, /*pin=*/true);
    if (t == nullptr) std::abort();
    UnpinAt(e, t);
    EXPECT_OK(e.Free(t));
  }
}

// A kernel ("kernel") needing one granule while another ("held") holds one,
// both pinned: on a full device, the reclaim a test looks at. End() unpins
// and frees them.
class Shortfall {
 public:
  explicit Shortfall(Engine& e) : e_(e) {
    StrictMonitor::SetThreadLabel("held");
    held_ = MustAllocate(e, kGranule, /*pin=*/true);
    StrictMonitor::SetThreadLabel("kernel");
    needs_ = MustAllocate(e, kGranule, /*pin=*/true);
    if (held_ == nullptr || needs_ == nullptr) std::abort();
  }
  void End() const {
    for (void* p : {needs_, held_}) {
      UnpinAt(e_, p);
      EXPECT_OK(e_.Free(p));
    }
  }

 private:
  Engine& e_;
  void* held_ = nullptr;
  void* needs_ = nullptr;
};

// Fills `page_evicted` with whether the page was evicted (else L), per step
// after the first (LRU: always the page).
void PageOrLargeEvicted(PolicyKind policy, size_t object_bytes,
                        std::vector<bool>* page_evicted) {
  Setup setup{/*device=*/3, /*host=*/16};
  setup.policy = policy;
  auto e = MakeEngine(setup);
  for (int step = 0; step < 4; ++step) {
    StrictMonitor::SetThreadLabel("make_objects");
    void* cold = MustAllocate(*e, object_bytes);
    void* hot = MustAllocate(*e, object_bytes);
    Churn(*e, 6);
    StrictMonitor::SetThreadLabel("make_l");
    void* l = MustAllocate(*e, kGranule, /*pin=*/true);
    ASSERT_TRUE(cold && hot && l);
    Fill(*e, hot, object_bytes, step);
    Fill(*e, l, kGranule, 10 + step);
    UnpinAt(*e, l);
    const Shortfall shortfall(*e);
    AllocationInfo page, large;
    EXPECT_OK(e->Inspect(hot, &page));
    EXPECT_OK(e->Inspect(l, &large));
    EXPECT_TRUE(page.evicted != large.evicted);
    if (step == 0) {
      EXPECT_TRUE(page.evicted);  // nothing learned yet: LRU's choice
    } else {
      page_evicted->push_back(page.evicted);
    }
    shortfall.End();
    UseIn(*e, "use_hot", hot);
    Churn(*e, 2);
    UseIn(*e, "use_l", l);
    EXPECT_EQ(Verify(*e, hot, object_bytes, step), -1);
    EXPECT_EQ(Verify(*e, l, kGranule, 10 + step), -1);
    StrictMonitor::SetThreadLabel(nullptr);
    for (void* p : {cold, hot, l}) EXPECT_OK(e->Free(p));
  }
  EXPECT_OK(e->CheckInvariants());
}

TEST(TheLearnedPolicyRanksAPageByTheSoonestUseOfItsObjects) {
  // Objects filling 7/8 of the page: ranked by `hot`, it stays.
  std::vector<bool> lru, learned;
  PageOrLargeEvicted(PolicyKind::kLru, kGranule * 7 / 16, &lru);
  PageOrLargeEvicted(PolicyKind::kLearned, kGranule * 7 / 16, &learned);
  EXPECT_TRUE(lru == std::vector<bool>(3, true));
  EXPECT_TRUE(learned == std::vector<bool>(3, false));
}

TEST(TheLearnedPolicyEvictsAMostlyEmptyPageBeforeAFullUnitNeededLater) {
  // A quarter full: the page copies a quarter of L's bytes, and goes.
  std::vector<bool> learned;
  PageOrLargeEvicted(PolicyKind::kLearned, kGranule / 8, &learned);
  EXPECT_TRUE(learned == std::vector<bool>(3, true));
}

// Each step B (keyed "make_b") is used right after a shortfall, and A (a
// new key every step, as a loop's tensors have no period of their own in
// the table) is read by three kernels in a row and then waits 8 kernels
// more: its history predicts 1 tick, and by the shortfall that prediction
// has missed (Note [Overdue predictions]). Counted as due, A would stay
// and B, needed next, would go (as under LRU, B being older); counted by
// its age, A goes, and it is not prefetched back. Every byte survives.
TEST(AUnitPastItsPredictionRanksByItsAge) {
  Setup setup{/*device=*/3, /*host=*/16};
  setup.policy = PolicyKind::kLearned;
  setup.defrag = true;  // freed granules are free for a prefetch
  auto e = MakeEngine(setup);
  static const char* const kMakeA[] = {"make_a0", "make_a1", "make_a2", "make_a3"};
  for (int step = 0; step < 4; ++step) {
    StrictMonitor::SetThreadLabel("make_b");
    void* b = MustAllocate(*e, kGranule, /*pin=*/true);
    StrictMonitor::SetThreadLabel(kMakeA[step]);
    void* a = MustAllocate(*e, kGranule, /*pin=*/true);
    ASSERT_TRUE(a && b);
    Fill(*e, a, kGranule, step);
    Fill(*e, b, kGranule, 10 + step);
    UnpinAt(*e, b);
    UnpinAt(*e, a);
    for (const char* op : {"read_a1", "read_a2", "read_a3"}) UseIn(*e, op, a);
    Churn(*e, 8);
    const Shortfall shortfall(*e);
    AllocationInfo info_a, info_b;
    EXPECT_OK(e->Inspect(a, &info_a));
    EXPECT_OK(e->Inspect(b, &info_b));
    // Step 0 has learned nothing of B: its age, the older, sends it.
    EXPECT_EQ(info_b.evicted, step == 0);
    EXPECT_EQ(info_a.evicted, step > 0);
    shortfall.End();
    uint64_t prefetched = 0;
    EXPECT_OK(e->Prefetch(/*lookahead=*/4, &prefetched));
    if (step > 0) EXPECT_EQ(prefetched, 0u);
    UseIn(*e, "use_b", b);
    Churn(*e, 2);
    UseIn(*e, "use_a", a);
    EXPECT_EQ(Verify(*e, a, kGranule, step), -1);
    EXPECT_EQ(Verify(*e, b, kGranule, 10 + step), -1);
    StrictMonitor::SetThreadLabel(nullptr);
    for (void* p : {a, b}) EXPECT_OK(e->Free(p));
  }
  EXPECT_OK(e->CheckInvariants());
}

// Seven tensors used round and round while each use also needs a 2-granule
// temporary, on 8 granules: the temporary evicts a tensor; once it is freed,
// the prefetch pages in the tensor predicted next into its granules, so its
// pin finds it resident. Every byte survives.
TEST(PrefetchPagesInThePredictedNextTensorIntoFreeMemory) {
  Setup setup{/*device=*/8, /*host=*/32};
  setup.policy = PolicyKind::kLearned;
  setup.defrag = true;  // the freed temporary's granules stay cached at its range
  auto e = MakeEngine(setup);
  const std::vector<void*> tensors = KernelTensors(*e, 7, 200);
  StrictMonitor::SetThreadLabel("temporary");
  uint64_t prefetched = 0;
  for (int round = 0; round < 6; ++round) {
    for (void* p : tensors) {
      uint64_t id;
      EXPECT_OK(e->Pin(p, &id));
      void* temp = MustAllocate(*e, 2 * kGranule, /*pin=*/true);
      if (temp == nullptr) std::abort();
      EXPECT_OK(e->Unpin(p, id));
      AllocationInfo info;
      EXPECT_OK(e->Inspect(temp, &info));
      EXPECT_OK(e->Unpin(temp, info.unit_id));
      EXPECT_OK(e->Free(temp));
      uint64_t units = 0;
      EXPECT_OK(e->Prefetch(/*lookahead=*/4, &units));
      prefetched += units;
    }
  }
  StrictMonitor::SetThreadLabel(nullptr);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(Verify(*e, tensors[i], kGranule, 200 + i), -1);
  EXPECT_OK(e->CheckInvariants());
  const Statistics s = e->GetStatistics();
  EXPECT_TRUE(prefetched > 0);
  EXPECT_TRUE(s.num_page_ins <= 20);  // LRU: 41 (every use of a round misses)
  EXPECT_EQ(s.num_prefetches, static_cast<int64_t>(prefetched));
  e.reset();  // one engine at a time (the fake driver counts what each leaves)
  // With the LRU policy the same call does nothing.
  auto lru = MakeEngine({/*device=*/8, /*host=*/32});
  void* p = MustAllocate(*lru, kGranule);
  EXPECT_OK(lru->Evict(p));
  uint64_t units = 1;
  EXPECT_OK(lru->Prefetch(4, &units));
  EXPECT_EQ(units, 0u);
}

TEST(SeveralSmallVictimsMakeAFullReclaim) {
  auto e = MakeEngine({/*device=*/8, /*host=*/16});
  std::vector<void*> v;
  for (int i = 0; i < 4; ++i) {
    v.push_back(MustAllocate(*e, 2 * kGranule));
    Fill(*e, v.back(), 2 * kGranule, 100 + i);
  }
  void* big = MustAllocate(*e, 5 * kGranule);
  ASSERT_TRUE(big != nullptr);
  Statistics s = e->GetStatistics();
  EXPECT_EQ(s.num_full_reclaims, 1);
  EXPECT_EQ(s.num_evictions, 3);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(Verify(*e, v[i], 2 * kGranule, 100 + i), -1);
}

TEST(PinnedAllocationsAreNeverEvicted) {
  auto e = MakeEngine({/*device=*/4, /*host=*/16});
  void* a = MustAllocate(*e, 3 * kGranule, /*pin=*/true);
  ASSERT_TRUE(a != nullptr);
  Status s;
  EXPECT_TRUE(e->Allocate(2 * kGranule, /*pin=*/true, &s) == nullptr);
  EXPECT_EQ(static_cast<int>(s.code()), static_cast<int>(StatusCode::kResourceExhausted));
  EXPECT_TRUE(Contains(s.message(), "out of device memory"));
  EXPECT_TRUE(Contains(e->Evict(a).message(), "pinned"));
}

TEST(WithLmsOffTheEngineIsAPlainCappedAllocator) {
  Setup setup;
  setup.device_granules = 4;
  setup.lms = false;
  auto e = MakeEngine(setup);
  void* a = MustAllocate(*e, 3 * kGranule);
  ASSERT_TRUE(a != nullptr);
  Status s;
  EXPECT_TRUE(e->Allocate(2 * kGranule, false, &s) == nullptr);
  EXPECT_TRUE(Contains(s.message(), "LMS is off"));
  EXPECT_EQ(e->GetStatistics().num_evictions, 0);
}

TEST(DefragmentationRemapsCachedGranulesInsteadOfEvicting) {
  for (bool defrag : {false, true}) {
    Setup setup;
    setup.device_granules = 8;
    setup.defrag = defrag;
    auto e = MakeEngine(setup);
    // a b c d, 2 granules each; free a and c: 4 free granules in two holes.
    void* p[4];
    for (void*& x : p) x = MustAllocate(*e, 2 * kGranule, /*pin=*/true);
    Fill(*e, p[1], 2 * kGranule, 5);
    EXPECT_OK(e->Free(p[0]));
    EXPECT_OK(e->Free(p[2]));
    EXPECT_EQ(e->cached_granules(), 4u);
    Status s;
    void* big = e->Allocate(4 * kGranule, /*pin=*/true, &s);
    Statistics st = e->GetStatistics();
    if (defrag) {
      EXPECT_TRUE(big != nullptr);
      EXPECT_EQ(st.num_defragmentations, 1);
      EXPECT_EQ(st.bytes_defragged, static_cast<int64_t>(4 * kGranule));
      EXPECT_EQ(st.num_evictions, 0);
    } else {
      // Everything live is pinned: without remapping, the holes are useless.
      EXPECT_TRUE(big == nullptr);
      EXPECT_TRUE(Contains(s.message(), "defragmentation is off"));
    }
    EXPECT_EQ(Verify(*e, p[1], 2 * kGranule, 5), -1);
  }
}

TEST(AFullyCachedFreeRangeIsTakenInsteadOfRemappingGranules) {
  Setup setup;
  setup.device_granules = 8;
  setup.defrag = true;
  auto e = MakeEngine(setup);
  void* a = MustAllocate(*e, 4 * kGranule);  // unpinned: the one to evict
  void* b = MustAllocate(*e, 4 * kGranule, /*pin=*/true);
  void* c = MustAllocate(*e, 4 * kGranule, /*pin=*/true);
  Fill(*e, c, 4 * kGranule, 9);
  EXPECT_EQ(e->GetStatistics().num_evictions, 1);
  EXPECT_OK(e->Free(a));  // evicted: its range is free and maps nothing
  EXPECT_OK(e->Free(b));  // resident: its range is free and cached
  EXPECT_EQ(e->cached_granules(), 4u);
  // Best fit alone takes a's range (the front of the merged free range),
  // then takes b's granules from behind it: an unmap and a map of each.
  void* d = MustAllocate(*e, 4 * kGranule, /*pin=*/true);
  const Statistics st = e->GetStatistics();
  EXPECT_TRUE(d == b);
  EXPECT_EQ(st.num_cached_placements, 1);
  EXPECT_EQ(st.num_defragmentations, 0);
  EXPECT_EQ(st.bytes_defragged, 0);
  EXPECT_EQ(e->cached_granules(), 0u);
  EXPECT_EQ(Verify(*e, c, 4 * kGranule, 9), -1);
  EXPECT_OK(e->CheckInvariants());
}

// Note [Live bytes only]: an eviction and a page-in of a page copy its live
// objects, one copy per run of them, none of the room between them; every
// byte of the objects survives, and the room takes new objects after.
TEST(APageCopiesOnlyItsLiveObjects) {
  auto e = MakeEngine({/*device=*/4, /*host=*/16});
  const size_t size = kGranule / 8;  // gaps this wide are skipped: a call per object
  std::vector<void*> objects;
  for (int i = 0; i < 8; ++i) {
    objects.push_back(MustAllocate(*e, size));
    ASSERT_TRUE(objects.back() != nullptr);
    Fill(*e, objects.back(), size, i);
  }
  EXPECT_EQ(e->small_pages(), 1u);
  for (int i = 1; i < 8; i += 2) EXPECT_OK(e->Free(objects[i]));
  const Statistics before = e->GetStatistics();
  EXPECT_OK(e->Evict(objects[0]));
  const Statistics out = e->GetStatistics();
  EXPECT_EQ(out.bytes_reclaimed - before.bytes_reclaimed, static_cast<int64_t>(kGranule));
  EXPECT_EQ(out.bytes_copied_out - before.bytes_copied_out, static_cast<int64_t>(4 * size));
  EXPECT_EQ(out.bytes_copied - before.bytes_copied, static_cast<int64_t>(4 * size));
  EXPECT_EQ(out.num_copies - before.num_copies, 4);
  uint64_t id = 0;
  EXPECT_OK(e->Pin(objects[2], &id));
  const Statistics in = e->GetStatistics();
  EXPECT_EQ(in.bytes_copied_in - out.bytes_copied_in, static_cast<int64_t>(4 * size));
  EXPECT_EQ(in.num_copies - out.num_copies, 4);
  for (int i = 0; i < 8; i += 2) EXPECT_EQ(Verify(*e, objects[i], size, i), -1);
  for (int i = 1; i < 8; i += 2) {
    objects[i] = MustAllocate(*e, size);
    ASSERT_TRUE(objects[i] != nullptr);
    Fill(*e, objects[i], size, 100 + i);
  }
  EXPECT_EQ(e->small_pages(), 1u);
  EXPECT_OK(e->Unpin(objects[2], id));
  EXPECT_OK(e->Evict(objects[0]));
  EXPECT_EQ(e->GetStatistics().bytes_copied_out - in.bytes_copied_out,
            static_cast<int64_t>(kGranule));  // full now: one copy of all of it
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(Verify(*e, objects[i], size, i % 2 == 0 ? i : 100 + i), -1);
  }
  for (void* p : objects) EXPECT_OK(e->Free(p));
  EXPECT_OK(e->CheckInvariants());
}

// Neighbours less than a 32nd of a granule apart (Engine::kCopyGapsPerGranule)
// are copied in one call, the gap with them; a gap that wide is skipped.
TEST(ObjectsOfAPageLessThanAGapApartAreCopiedInOneCall) {
  const size_t gap = kGranule / 32;
  for (size_t hole : {gap - 256, gap}) {
    auto e = MakeEngine({/*device=*/4, /*host=*/16});
    // One size class for all three at any granule: A, the hole B, C in a row.
    char* a = static_cast<char*>(MustAllocate(*e, gap));
    char* b = static_cast<char*>(MustAllocate(*e, hole));
    char* c = static_cast<char*>(MustAllocate(*e, gap));
    ASSERT_TRUE(a != nullptr && b == a + gap && c == b + hole);
    Fill(*e, a, gap, 1);
    Fill(*e, c, gap, 3);
    EXPECT_OK(e->Free(b));
    const Statistics before = e->GetStatistics();
    EXPECT_OK(e->Evict(a));
    const Statistics out = e->GetStatistics();
    const bool merged = hole < gap;
    EXPECT_EQ(out.bytes_copied_out - before.bytes_copied_out,
              static_cast<int64_t>(2 * gap + (merged ? hole : 0)));
    EXPECT_EQ(out.num_copies - before.num_copies, merged ? 1 : 2);
    EXPECT_EQ(Verify(*e, a, gap, 1), -1);
    EXPECT_EQ(Verify(*e, c, gap, 3), -1);
    EXPECT_OK(e->Free(a));
    EXPECT_OK(e->Free(c));
    EXPECT_OK(e->CheckInvariants());
  }
}

TEST(SmallObjectsArePackedInPagesThatAreEvictedAndPagedInWhole) {
  auto e = MakeEngine({/*device=*/4, /*host=*/16});
  // 1024 bytes each: a page and a half of them.
  const int per_page = static_cast<int>(kGranule / 1024);
  const int count = per_page * 3 / 2;
  std::vector<void*> small;
  for (int i = 0; i < count; ++i) {
    small.push_back(MustAllocate(*e, 1000));
    ASSERT_TRUE(small.back() != nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(small.back()) % 256, 0u);
    Fill(*e, small.back(), 1000, i);
  }
  EXPECT_EQ(e->small_pages(), 2u);
  EXPECT_EQ(e->device_granules_in_use(), 2u);
  EXPECT_OK(e->CheckInvariants());
  AllocationInfo a, b;
  EXPECT_OK(e->Inspect(small[0], &a));
  EXPECT_OK(e->Inspect(small[count - 1], &b));
  EXPECT_TRUE(a.small && b.small && a.unit_address != b.unit_address);
  EXPECT_EQ(a.unit_address % kGranule, 0u);
  // Evicting through one object evicts its whole page.
  EXPECT_OK(e->Evict(small[0]));
  EXPECT_OK(e->Inspect(small[per_page - 1], &a));
  EXPECT_TRUE(a.evicted);
  EXPECT_EQ(e->device_granules_in_use(), 1u);
  for (int i = 0; i < count; ++i) EXPECT_EQ(Verify(*e, small[i], 1000, i), -1);
  EXPECT_OK(e->CheckInvariants());
  // Pinning any object of it pages the page in; the unit id unpins it.
  uint64_t id = 0;
  EXPECT_OK(e->Pin(small[3], &id));
  EXPECT_EQ(id, a.unit_id);
  EXPECT_OK(e->Inspect(small[0], &a));
  EXPECT_TRUE(!a.evicted && a.pin_count == 1);
  EXPECT_EQ(e->GetStatistics().num_page_ins, 1);
  // 3 granules need the other page's granule: it is evicted, the pinned one not.
  void* big = MustAllocate(*e, 3 * kGranule, /*pin=*/true);
  ASSERT_TRUE(big != nullptr);
  EXPECT_OK(e->Inspect(small[count - 1], &b));
  EXPECT_TRUE(b.evicted);
  for (int i = 0; i < count; ++i) EXPECT_EQ(Verify(*e, small[i], 1000, i), -1);
  EXPECT_OK(e->CheckInvariants());
  EXPECT_OK(e->Unpin(small[3], id));
  EXPECT_OK(e->Free(big));
  for (void* p : small) EXPECT_OK(e->Free(p));
  EXPECT_EQ(e->GetStatistics().bytes_in_use, 0);
  EXPECT_EQ(e->small_pages(), 0u);
  EXPECT_EQ(e->GetStatistics().host_bytes_in_use, 0);
  EXPECT_OK(e->CheckInvariants());
}

TEST(TinyObjectsShareNoPageWithLargerOnesSoPinningACounterPinsNoActivation) {
  // Note [Size classes] in small_pages.h: a loop counter, activations made
  // after it, a shape vector.
  auto e = MakeEngine({/*device=*/4, /*host=*/16});
  const size_t activation = std::max<size_t>(4096, kGranule / 32);
  void* counter = MustAllocate(*e, 8);
  std::vector<void*> activations;
  for (int i = 0; i < 8; ++i) {
    activations.push_back(MustAllocate(*e, activation));
    Fill(*e, activations.back(), activation, i);
  }
  void* shape = MustAllocate(*e, 16);
  AllocationInfo c, a, s;
  EXPECT_OK(e->Inspect(counter, &c));
  EXPECT_OK(e->Inspect(activations[0], &a));
  EXPECT_OK(e->Inspect(shape, &s));
  EXPECT_TRUE(c.unit_address == s.unit_address && c.unit_address != a.unit_address);
  EXPECT_EQ(e->small_pages(), 2u);
  // A kernel reading the counter pins the counter's page only.
  uint64_t id = 0;
  EXPECT_OK(e->Pin(counter, &id));
  EXPECT_OK(e->Evict(activations[0]));
  EXPECT_OK(e->Inspect(activations[7], &a));
  EXPECT_TRUE(a.evicted && a.pin_count == 0);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(Verify(*e, activations[i], activation, i), -1);
  EXPECT_OK(e->Unpin(counter, id));
  // 4 KiB is not tiny: a new page, though the counter's has room; 4095 is.
  void* larger = MustAllocate(*e, 4096, /*pin=*/true);
  void* tiny = MustAllocate(*e, 4095, /*pin=*/true);
  AllocationInfo l, t;
  EXPECT_OK(e->Inspect(larger, &l));
  EXPECT_OK(e->Inspect(tiny, &t));
  EXPECT_TRUE(l.unit_address != c.unit_address && t.unit_address == c.unit_address);
  EXPECT_EQ(e->small_pages(), 3u);
  EXPECT_OK(e->CheckInvariants());
  EXPECT_OK(e->Unpin(larger, l.unit_id));
  EXPECT_OK(e->Unpin(tiny, t.unit_id));
  for (void* p : activations) EXPECT_OK(e->Free(p));
  for (void* p : {counter, shape, larger, tiny}) EXPECT_OK(e->Free(p));
  EXPECT_EQ(e->small_pages(), 0u);
  EXPECT_EQ(e->GetStatistics().bytes_in_use, 0);
  EXPECT_OK(e->CheckInvariants());
}

TEST(OnADeviceOfOneGranuleAKernelHoldsTinyAndLargerObjectsInOnePage) {
  // The classes never cost a kernel its device (Note [Size classes]).
  auto e = MakeEngine({/*device=*/1, /*host=*/4});
  void* shape = MustAllocate(*e, 16, /*pin=*/true);
  void* output = MustAllocate(*e, std::max<size_t>(4096, kGranule / 4), /*pin=*/true);
  ASSERT_TRUE(shape != nullptr && output != nullptr);
  AllocationInfo s, o;
  EXPECT_OK(e->Inspect(shape, &s));
  EXPECT_OK(e->Inspect(output, &o));
  EXPECT_EQ(s.unit_address, o.unit_address);
  EXPECT_OK(e->CheckInvariants());
  EXPECT_OK(e->Unpin(shape, s.unit_id));
  EXPECT_OK(e->Unpin(output, o.unit_id));
  EXPECT_OK(e->Free(output));
  EXPECT_OK(e->Free(shape));
  EXPECT_EQ(e->small_pages(), 0u);
  EXPECT_OK(e->CheckInvariants());
}

TEST(FreedSmallObjectsGiveTheirPagesBackSoLargeRequestsFit) {
  // The case, scaled: half-granule objects created and freed, then a
  // request of most of the device, with LMS off.
  auto e = MakeEngine({/*device=*/32, /*host=*/0, /*lms=*/false, /*defrag=*/true});
  std::vector<void*> small;
  for (int i = 0; i < 50; ++i) small.push_back(MustAllocate(*e, kGranule / 2 - 100));
  EXPECT_EQ(e->small_pages(), 25u);
  for (void* p : small) EXPECT_OK(e->Free(p));
  EXPECT_EQ(e->small_pages(), 0u);
  EXPECT_OK(e->CheckInvariants());
  void* big = MustAllocate(*e, 30 * kGranule);
  EXPECT_TRUE(big != nullptr);
  EXPECT_OK(e->Free(big));
  EXPECT_OK(e->CheckInvariants());
}

TEST(APinnedPageOutlivesItsLastObjectUntilUnpinned) {
  auto e = MakeEngine({/*device=*/4, /*host=*/4});
  void* p = MustAllocate(*e, 100);
  uint64_t id = 0;
  EXPECT_OK(e->Pin(p, &id));
  EXPECT_OK(e->Free(p));  // a kernel's input freed while it runs
  EXPECT_EQ(e->small_pages(), 1u);
  EXPECT_OK(e->CheckInvariants());
  EXPECT_OK(e->Unpin(p, id));  // the kernel ends: the page goes
  EXPECT_EQ(e->small_pages(), 0u);
  EXPECT_TRUE(e->Unpin(p, id).code() == StatusCode::kNotFound);
  EXPECT_OK(e->CheckInvariants());
}

TEST(NewSmallObjectsGoToResidentPagesOnly) {
  auto e = MakeEngine({/*device=*/4, /*host=*/4});
  void* a = MustAllocate(*e, 100);
  Fill(*e, a, 100, 7);
  EXPECT_OK(e->Evict(a));
  void* b = MustAllocate(*e, 100);
  AllocationInfo ia, ib;
  EXPECT_OK(e->Inspect(a, &ia));
  EXPECT_OK(e->Inspect(b, &ib));
  EXPECT_TRUE(ia.evicted && !ib.evicted && ia.unit_address != ib.unit_address);
  EXPECT_EQ(e->small_pages(), 2u);
  EXPECT_EQ(Verify(*e, a, 100, 7), -1);
  EXPECT_OK(e->CheckInvariants());
}

TEST(ANewObjectMakesItsPageTheMostRecentlyUsed) {
  auto e = MakeEngine({/*device=*/3, /*host=*/8});
  void* a = MustAllocate(*e, kGranule * 5 / 8);  // page P
  void* b = MustAllocate(*e, kGranule / 2);  // does not fit in P: page Q, newer
  void* c = MustAllocate(*e, kGranule / 4);  // best fit is P's rest: P is now newest
  AllocationInfo ia, ib, ic;
  EXPECT_OK(e->Inspect(a, &ia));
  EXPECT_OK(e->Inspect(b, &ib));
  EXPECT_OK(e->Inspect(c, &ic));
  ASSERT_TRUE(ia.unit_address == ic.unit_address && ia.unit_address != ib.unit_address);
  // Two granules: one is free, the other comes from the least recently used.
  ASSERT_TRUE(MustAllocate(*e, 2 * kGranule, /*pin=*/true) != nullptr);
  EXPECT_OK(e->Inspect(a, &ia));
  EXPECT_OK(e->Inspect(b, &ib));
  EXPECT_TRUE(!ia.evicted && ib.evicted);
  EXPECT_OK(e->CheckInvariants());
}

TEST(UnheldAllocationsAreBornEvictedWhenTheDeviceIsFull) {
  auto e = MakeEngine({/*device=*/4, /*host=*/8, /*lms=*/true, /*defrag=*/true});
  void* held = MustAllocate(*e, 4 * kGranule, /*pin=*/true);  // a running kernel's
  ASSERT_TRUE(held != nullptr);
  Status s;
  // A kernel's own request cannot be served from host memory...
  EXPECT_TRUE(e->Allocate(kGranule, /*pin=*/true, &s) == nullptr);
  EXPECT_TRUE(s.code() == StatusCode::kResourceExhausted);
  // ...but one nobody holds yet (a tensor made from host data) can.
  void* born = MustAllocate(*e, 2 * kGranule);
  void* small = MustAllocate(*e, 300);
  ASSERT_TRUE(born != nullptr && small != nullptr);
  AllocationInfo info;
  EXPECT_OK(e->Inspect(born, &info));
  EXPECT_TRUE(info.evicted);
  EXPECT_OK(e->Inspect(small, &info));
  EXPECT_TRUE(info.evicted);
  EXPECT_EQ(e->GetStatistics().num_born_evicted, 2);
  Fill(*e, born, 2 * kGranule, 11);
  Fill(*e, small, 300, 12);
  EXPECT_OK(e->CheckInvariants());
  // Its first pin pages it in once the device has room.
  uint64_t id = 0;
  EXPECT_TRUE(e->Pin(born, &id).code() == StatusCode::kResourceExhausted);
  EXPECT_OK(e->Free(held));
  EXPECT_OK(e->Pin(born, &id));
  EXPECT_OK(e->Inspect(born, &info));
  EXPECT_TRUE(!info.evicted);
  EXPECT_EQ(Verify(*e, born, 2 * kGranule, 11), -1);
  EXPECT_EQ(Verify(*e, small, 300, 12), -1);
  EXPECT_OK(e->Unpin(born, id));
  EXPECT_OK(e->CheckInvariants());
}

TEST(NothingIsBornEvictedWithLmsOff) {
  auto e = MakeEngine({/*device=*/4, /*host=*/8, /*lms=*/false});
  ASSERT_TRUE(MustAllocate(*e, 4 * kGranule) != nullptr);
  Status s;
  EXPECT_TRUE(e->Allocate(kGranule, false, &s) == nullptr);
  EXPECT_TRUE(Contains(s.message(), "LMS is off"));
  EXPECT_EQ(e->GetStatistics().num_born_evicted, 0);
}

TEST(StrictAlignmentKeepsTheRequestedSize) {
  auto e = MakeEngine({/*device=*/4, /*host=*/4});
  Status s;
  void* p = e->Allocate(1000, false, &s, nullptr, /*alignment=*/4096);
  ASSERT_TRUE(p != nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
  EXPECT_EQ(e->RequestedSize(p), 1000u);
  EXPECT_TRUE(e->Allocate(1000, false, &s, nullptr, 3) == nullptr);
  EXPECT_TRUE(s.code() == StatusCode::kInvalidArgument);
  EXPECT_OK(e->CheckInvariants());
}

TEST(BadInputFailsCleanlyAndNamesTheCause) {
  auto e = MakeEngine({/*device=*/4, /*host=*/4});
  Status s;
  EXPECT_TRUE(e->Allocate(0, false, &s) == nullptr);
  EXPECT_TRUE(Contains(s.message(), "zero-size"));
  EXPECT_TRUE(e->Allocate(9 * kGranule, false, &s) == nullptr);
  EXPECT_TRUE(Contains(s.message(), "exceeds the device memory"));
  void* a = MustAllocate(*e, kGranule);
  Fill(*e, a, kGranule, 3);
  int stack_value = 0;
  EXPECT_TRUE(Contains(e->Free(&stack_value).message(), "no live allocation"));
  EXPECT_TRUE(Contains(e->Free(static_cast<char*>(a) + 64).message(), "no live allocation"));
  uint64_t id;
  EXPECT_TRUE(Contains(e->Unpin(a, 0).message(), "without a matching pin"));
  EXPECT_OK(e->Pin(a, &id));
  EXPECT_TRUE(Contains(e->Unpin(a, id + 1).message(), "was freed"));
  EXPECT_OK(e->Unpin(a, id));
  EXPECT_EQ(Verify(*e, a, kGranule, 3), -1);
  EXPECT_OK(e->Free(a));
  EXPECT_TRUE(Contains(e->Free(a).message(), "already freed"));
  void* small = MustAllocate(*e, 100);
  EXPECT_OK(e->Free(small));
  EXPECT_TRUE(Contains(e->Free(small).message(), "already freed"));
}

TEST(HostPoolExhaustedWhileEvictingIsAnErrorNamingTheSetting) {
  auto e = MakeEngine({/*device=*/4, /*host=*/2});
  void* a = MustAllocate(*e, 4 * kGranule);
  ASSERT_TRUE(a != nullptr);
  Fill(*e, a, 4 * kGranule, 9);
  Status s;
  EXPECT_TRUE(e->Allocate(kGranule, /*pin=*/true, &s) == nullptr);
  EXPECT_TRUE(Contains(s.message(), "TF_GPU_HOST_MEM_LIMIT_IN_MB"));
  // Nothing was lost and the engine still works.
  AllocationInfo info;
  EXPECT_OK(e->Inspect(a, &info));
  EXPECT_TRUE(!info.evicted);
  EXPECT_EQ(Verify(*e, a, 4 * kGranule, 9), -1);
  EXPECT_OK(e->Free(a));
  EXPECT_TRUE(MustAllocate(*e, kGranule) != nullptr);
}

TEST(StrictModeReportsUnpinnedTouchesOfEvictedMemory) {
  Setup setup;
  setup.strict = true;
  if (lms_test::UsingCuda()) {
    // A no-access mapping would kill a CUDA context: strict mode is refused.
    EngineOptions o;
    o.device_bytes = 4 * kGranule;
    o.strict = true;
    std::unique_ptr<Engine> refused;
    Status s = Engine::Create(o, lms_test::MakeTestBackend(kGranule), &refused);
    EXPECT_TRUE(s.code() == StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(s.message(), "TF_LMS_STRICT"));
    EXPECT_TRUE(Contains(s.message(), "emulated device"));
    return;
  }
  auto e = MakeEngine(setup);
  const size_t size = 2 * kGranule;
  char* a = static_cast<char*>(MustAllocate(*e, size));
  ASSERT_TRUE(a != nullptr);
  Fill(*e, a, size, 4);
  EXPECT_OK(e->Evict(a));
  StrictMonitor::SetThreadLabel("MatMul/test");
  volatile char touched = a[kGranule + 7];  // unpinned: faults, is reported
  (void)touched;
  StrictMonitor::SetThreadLabel(nullptr);
  std::vector<UnpinnedTouch> report = e->UnpinnedTouches();
  ASSERT_TRUE(report.size() == 1);
  EXPECT_EQ(report[0].address, reinterpret_cast<uintptr_t>(a + kGranule + 7));
  EXPECT_EQ(report[0].allocation_id, e->AllocationId(a));
  EXPECT_EQ(report[0].allocation_bytes, size);
  EXPECT_TRUE(report[0].label == "MatMul/test");
  uint64_t id;
  EXPECT_OK(e->Pin(a, &id));  // a pinned touch is not reported
  EXPECT_EQ(Verify(*e, a, size, 4), -1);
  EXPECT_EQ(e->UnpinnedTouches().size(), 1u);
}

#if defined(__x86_64__)
// Writes a marker into the 1,024 words below the x86-64 red zone (code that
// keeps data below its stack pointer, as oneDNN's JIT gemm kernels do),
// reads *touch, and returns how many of those words still hold the marker.
int WordsKeptBelowStackAcross(const volatile char* touch) {
  const uint64_t marker = 0x5a17ab1e5eedf00dull;
  int64_t kept;
  asm volatile(
      "lea -136(%%rsp), %%rdi\n\t"
      "mov $1024, %%rcx\n\t"
      "1:\n\t"
      "mov %[marker], (%%rdi)\n\t"
      "sub $8, %%rdi\n\t"
      "dec %%rcx\n\t"
      "jnz 1b\n\t"
      "movzbl (%[touch]), %%eax\n\t"
      "lea -136(%%rsp), %%rdi\n\t"
      "mov $1024, %%rcx\n\t"
      "xor %[kept], %[kept]\n\t"
      "2:\n\t"
      "cmp %[marker], (%%rdi)\n\t"
      "jne 3f\n\t"
      "inc %[kept]\n\t"
      "3:\n\t"
      "sub $8, %%rdi\n\t"
      "dec %%rcx\n\t"
      "jnz 2b\n\t"
      : [kept] "=&r"(kept)
      : [marker] "r"(marker), [touch] "r"(touch)
      : "rax", "rcx", "rdi", "memory", "cc");
  return static_cast<int>(kept);
}
#endif

// Note [Strict mode's own signal stack]: the fault handler of an unpinned
// touch runs on a stack of strict mode's own, never below the touching
// code's stack pointer, on a thread that has used the engine.
TEST(StrictModesFaultHandlerLeavesTheTouchingThreadsStackAlone) {
#if defined(__x86_64__)
  if (lms_test::UsingCuda()) return;  // strict mode is the emulated device's
  Setup setup;
  setup.strict = true;
  auto e = MakeEngine(setup);
  char* a = static_cast<char*>(MustAllocate(*e, kGranule));
  void* b = MustAllocate(*e, kGranule);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  EXPECT_OK(e->Evict(a));
  int kept = -1;
  std::thread kernel([&] {  // a new thread, as TensorFlow's are: no signal stack
    uint64_t id;
    EXPECT_OK(e->Pin(b, &id));
    kept = WordsKeptBelowStackAcross(a + 5);  // unpinned: faults, is reported
    EXPECT_OK(e->Unpin(b, id));
  });
  kernel.join();
  EXPECT_EQ(kept, 1024);
  EXPECT_EQ(e->UnpinnedTouches().size(), 1u);
#endif
}

TEST(AFailedRequestCanWaitForAnotherUserToRelease) {
  auto e = MakeEngine({/*device=*/4, /*host=*/16});
  void* held = MustAllocate(*e, 3 * kGranule, /*pin=*/true);
  ASSERT_TRUE(held != nullptr);
  const uint64_t epoch = e->ReleaseEpoch();
  Status s;
  EXPECT_TRUE(e->Allocate(2 * kGranule, /*pin=*/true, &s) == nullptr);  // held is pinned
  EXPECT_TRUE(!e->WaitForRelease(epoch, std::chrono::milliseconds(20)));
  std::thread other([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_OK(e->Unpin(held, 0));  // the other kernel finishes
  });
  EXPECT_TRUE(e->WaitForRelease(epoch, std::chrono::seconds(10)));
  other.join();
  EXPECT_TRUE(MustAllocate(*e, 2 * kGranule) != nullptr);  // evicts held now
  EXPECT_EQ(e->GetStatistics().num_evictions, 1);
}

// The test backend, whose next *fail_next_map Maps fail after each has
// mapped part of the range, as backend.h allows: every slot of the call ends
// up unmapped; whose
// next Unmap fails with nothing changed, if asked; and whose next
// EndRemapBatch, and the WaitForCopies after it, fail, if asked (a GPU whose
// copies can be neither ordered nor waited for).
class FaultyBackend : public Backend {
 public:
  explicit FaultyBackend(int* fail_next_map, int* fail_next_unmap = nullptr,
                         int* fail_next_order = nullptr, int* fail_next_ranges = nullptr)
      : inner_(lms_test::MakeTestBackend(kGranule)),
        fail_next_map_(fail_next_map),
        fail_next_unmap_(fail_next_unmap),
        fail_next_order_(fail_next_order),
        fail_next_ranges_(fail_next_ranges) {}
  const char* Name() const override { return "faulty"; }
  size_t granule_bytes() const override { return inner_->granule_bytes(); }
  Status ReserveAddressRange(size_t bytes, uintptr_t* base) override {
    return inner_->ReserveAddressRange(bytes, base);
  }
  void ReleaseAddressRange(uintptr_t base, size_t bytes) override {
    inner_->ReleaseAddressRange(base, bytes);
  }
  Status CreatePool(PoolKind pool, size_t granules) override {
    return inner_->CreatePool(pool, granules);
  }
  void DefineRuns(PoolKind pool, const GranuleRun* runs, size_t count) override {
    inner_->DefineRuns(pool, runs, count);
  }
  void ReleaseRuns(PoolKind pool, const GranuleRun* runs, size_t count) override {
    inner_->ReleaseRuns(pool, runs, count);
  }
  Status Map(uintptr_t address, PoolKind pool, const GranuleId* ids, size_t count,
             Access access) override {
    if (*fail_next_map_ == 0) return inner_->Map(address, pool, ids, count, access);
    --*fail_next_map_;
    inner_->Map(address, pool, ids, 1, access);  // part of the range...
    inner_->Unmap(address, count);                // ...then the contract's undo
    return Internal("injected Map failure");
  }
  Status Unmap(uintptr_t address, size_t count) override {
    if (fail_next_unmap_ != nullptr && *fail_next_unmap_ != 0) {
      *fail_next_unmap_ = 0;
      return Internal("injected Unmap failure");
    }
    return inner_->Unmap(address, count);
  }
  Status CopyGranules(PoolKind dst_pool, const GranuleId* dst, PoolKind src_pool,
                      const GranuleId* src, size_t bytes) override {
    return inner_->CopyGranules(dst_pool, dst, src_pool, src, bytes);
  }
  Status CopyRanges(PoolKind dst_pool, GranuleId dst, PoolKind src_pool, GranuleId src,
                    const ByteRange* ranges, size_t count) override {
    if (fail_next_ranges_ == nullptr || *fail_next_ranges_ == 0 || count < 2) {
      return inner_->CopyRanges(dst_pool, dst, src_pool, src, ranges, count);
    }
    // Part way, as a GPU's copies fail after some were issued.
    *fail_next_ranges_ = 0;
    inner_->CopyRanges(dst_pool, dst, src_pool, src, ranges, 1);
    return Internal("injected CopyRanges failure");
  }
  Status CopiesAfterCompute() override { return inner_->CopiesAfterCompute(); }
  Status WaitForCopies() override {
    if (fail_wait_) {
      fail_wait_ = false;
      return Internal("injected WaitForCopies failure");
    }
    return inner_->WaitForCopies();
  }
  Status BeginRemapBatch() override { return inner_->BeginRemapBatch(); }
  Status EndRemapBatch() override {
    Status s = inner_->EndRemapBatch();
    if (fail_next_order_ == nullptr || *fail_next_order_ == 0) return s;
    // 2: and the next Map (the restore) fails as well.
    if (*fail_next_order_ == 2) *fail_next_map_ = 1;
    *fail_next_order_ = 0;
    fail_wait_ = true;
    return Internal("injected EndRemapBatch failure");
  }
  bool HostCanTouch() const override { return inner_->HostCanTouch(); }
  Status CopyToHost(void* dst, uintptr_t address, size_t bytes) override {
    return inner_->CopyToHost(dst, address, bytes);
  }
  Status CopyFromHost(uintptr_t address, const void* src, size_t bytes) override {
    return inner_->CopyFromHost(address, src, bytes);
  }

 private:
  std::unique_ptr<Backend> inner_;
  int* const fail_next_map_;
  int* const fail_next_unmap_;
  int* const fail_next_order_;
  int* const fail_next_ranges_;
  bool fail_wait_ = false;
};

std::unique_ptr<Engine> MakeFaultyEngine(int* fail_next_map, int* fail_next_unmap = nullptr,
                                         int* fail_next_order = nullptr,
                                         int* fail_next_ranges = nullptr) {
  EngineOptions o;
  o.device_bytes = 4 * kGranule;
  o.host_bytes = 8 * kGranule;
  std::unique_ptr<Engine> e;
  if (!Engine::Create(o,
                      std::make_unique<FaultyBackend>(fail_next_map, fail_next_unmap,
                                                      fail_next_order, fail_next_ranges),
                      &e)
           .ok()) {
    std::abort();
  }
  return e;
}

// A page's copy that fails after its first range, evicting and then paging
// in: the page stays where its bytes are whole, and is counted as not moved.
TEST(APageWhoseCopyFailsPartWayKeepsEveryByte) {
  int fail_map = 0, fail_unmap = 0, fail_order = 0, fail_ranges = 0;
  auto e = MakeFaultyEngine(&fail_map, &fail_unmap, &fail_order, &fail_ranges);
  const size_t size = kGranule / 8;  // a hole of it between: two ranges
  void* a = MustAllocate(*e, size);
  void* hole = MustAllocate(*e, size);
  void* c = MustAllocate(*e, size);
  ASSERT_TRUE(a != nullptr && hole != nullptr && c != nullptr);
  Fill(*e, a, size, 41);
  Fill(*e, c, size, 43);
  EXPECT_OK(e->Free(hole));
  fail_ranges = 1;
  EXPECT_TRUE(Contains(e->Evict(a).message(), "injected CopyRanges failure"));
  AllocationInfo info;
  EXPECT_OK(e->Inspect(a, &info));
  EXPECT_TRUE(!info.evicted);
  EXPECT_EQ(e->GetStatistics().bytes_copied_out, 0);
  EXPECT_OK(e->Evict(a));
  fail_ranges = 1;
  uint64_t id = 0;
  EXPECT_TRUE(Contains(e->Pin(c, &id).message(), "injected CopyRanges failure"));
  EXPECT_OK(e->Inspect(a, &info));
  EXPECT_TRUE(info.evicted);
  EXPECT_EQ(e->GetStatistics().bytes_copied_in, 0);
  EXPECT_EQ(Verify(*e, a, size, 41), -1);
  EXPECT_EQ(Verify(*e, c, size, 43), -1);
  EXPECT_OK(e->Pin(c, &id));
  EXPECT_EQ(e->GetStatistics().bytes_copied_in, static_cast<int64_t>(2 * size));
  EXPECT_EQ(Verify(*e, a, size, 41), -1);
  EXPECT_EQ(Verify(*e, c, size, 43), -1);
  EXPECT_OK(e->Unpin(c, id));
  EXPECT_OK(e->CheckInvariants());
  for (void* p : {a, c}) EXPECT_OK(e->Free(p));
}

// An unpinned unit of two granules filled with `seed`'s pattern (null if
// the allocation failed).
void* FilledUnit(Engine& e, uint64_t seed) {
  void* p = MustAllocate(e, 2 * kGranule);
  if (p != nullptr) Fill(e, p, 2 * kGranule, seed);
  return p;
}

// backend.h, BeginRemapBatch: when a batch's copies can be neither ordered
// nor waited for, no copy may be trusted. A reclaim of two victims then
// keeps both resident (each remapped back to its device granules, which
// still hold its bytes) and hands every host granule back.
TEST(AReclaimWhoseCopiesCannotBeOrderedKeepsEveryVictimResident) {
  int fail_map = 0, fail_unmap = 0, fail_order = 0;
  auto e = MakeFaultyEngine(&fail_map, &fail_unmap, &fail_order);
  void* a = FilledUnit(*e, 31);
  void* b = FilledUnit(*e, 32);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  fail_order = 1;
  Status s;
  EXPECT_TRUE(e->Allocate(4 * kGranule, /*pin=*/true, &s) == nullptr);  // needs both
  EXPECT_TRUE(s.code() == StatusCode::kInternal);
  EXPECT_TRUE(Contains(s.message(), "injected EndRemapBatch failure") ||
              Contains(s.message(), "injected WaitForCopies failure"));
  for (void* p : {a, b}) {
    AllocationInfo info;
    EXPECT_OK(e->Inspect(p, &info));
    EXPECT_TRUE(!info.evicted);
  }
  EXPECT_EQ(Verify(*e, a, 2 * kGranule, 31), -1);
  EXPECT_EQ(Verify(*e, b, 2 * kGranule, 32), -1);
  const Statistics st = e->GetStatistics();
  EXPECT_EQ(st.host_bytes_in_use, 0);
  EXPECT_EQ(st.num_evictions, 0);
  EXPECT_OK(e->CheckInvariants());
  // With the backend well again, the same request evicts both.
  void* c = MustAllocate(*e, 4 * kGranule, /*pin=*/true);
  ASSERT_TRUE(c != nullptr);
  EXPECT_EQ(e->GetStatistics().num_evictions, 2);
  EXPECT_EQ(Verify(*e, a, 2 * kGranule, 31), -1);
  EXPECT_EQ(Verify(*e, b, 2 * kGranule, 32), -1);
  EXPECT_OK(e->CheckInvariants());
}

// When the victim cannot even go back to its device granules, it stays
// evicted, its books matching its last mapping, and the error says so; its
// device granules leave the pool (no granule returns to a pool while a slot
// may map it). The other victim goes back, bytes intact; both can be freed.
TEST(AVictimThatCannotBeRestoredEitherStaysEvictedAndIsSaidToBe) {
  int fail_map = 0, fail_unmap = 0, fail_order = 0;
  auto e = MakeFaultyEngine(&fail_map, &fail_unmap, &fail_order);
  void* a = FilledUnit(*e, 33);
  void* b = FilledUnit(*e, 34);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  fail_order = 2;
  Status s;
  EXPECT_TRUE(e->Allocate(4 * kGranule, /*pin=*/true, &s) == nullptr);
  EXPECT_TRUE(s.code() == StatusCode::kInternal);
  EXPECT_TRUE(Contains(s.message(), "back to its device memory also failed"));
  AllocationInfo ia, ib;
  EXPECT_OK(e->Inspect(a, &ia));
  EXPECT_OK(e->Inspect(b, &ib));
  EXPECT_TRUE(ia.evicted != ib.evicted);  // the first restore failed, the second worked
  void* resident = ia.evicted ? b : a;
  EXPECT_EQ(Verify(*e, resident, 2 * kGranule, resident == a ? 33 : 34), -1);
  EXPECT_EQ(e->GetStatistics().host_bytes_in_use, static_cast<int64_t>(2 * kGranule));
  EXPECT_OK(e->CheckInvariants());
  EXPECT_OK(e->Free(a));
  EXPECT_OK(e->Free(b));
  EXPECT_EQ(e->GetStatistics().host_bytes_in_use, 0);
  EXPECT_EQ(e->device_granules_in_use(), 4u);  // the other's two cached, the stranded two
  EXPECT_OK(e->CheckInvariants());
  EXPECT_TRUE(MustAllocate(*e, 2 * kGranule, /*pin=*/true) != nullptr);
  Status full;
  EXPECT_TRUE(e->Allocate(4 * kGranule, /*pin=*/true, &full) == nullptr);
}

// backend.h, Map: after a failed remap whose restore fails too, the slots
// may still map either set of granules. A page-in whose copies can be
// neither ordered nor waited for, and whose host mapping cannot be restored,
// leaves the unit evicted, its books on the host granules that hold its
// bytes, and its device granules out of the pool; the next pin pages it in.
TEST(APageInThatCannotBeOrderedNorUndoneKeepsItsBytesAndStrandsItsDeviceMemory) {
  int fail_map = 0, fail_unmap = 0, fail_order = 0;
  auto e = MakeFaultyEngine(&fail_map, &fail_unmap, &fail_order);
  void* a = FilledUnit(*e, 41);
  ASSERT_TRUE(a != nullptr);
  EXPECT_OK(e->Evict(a));
  fail_order = 2;
  uint64_t id = 0;
  Status s = e->Pin(a, &id);
  EXPECT_TRUE(s.code() == StatusCode::kInternal);
  EXPECT_TRUE(Contains(s.message(), "restoring the previous mapping"));
  AllocationInfo info;
  EXPECT_OK(e->Inspect(a, &info));
  EXPECT_TRUE(info.evicted && info.pin_count == 0);
  EXPECT_EQ(e->device_granules_in_use(), 2u);  // stranded, not free
  EXPECT_OK(e->CheckInvariants());
  EXPECT_OK(e->Pin(a, &id));  // into the two granules still free
  EXPECT_EQ(Verify(*e, a, 2 * kGranule, 41), -1);
  EXPECT_OK(e->Unpin(a, id));
  EXPECT_EQ(e->device_granules_in_use(), 4u);
  EXPECT_OK(e->CheckInvariants());
}

// The eviction's mirror: a victim whose remap and restore both fail stays
// resident on its device granules; its host granules leave the pool.
TEST(AnEvictionThatCannotBeUndoneStrandsItsHostMemory) {
  int fail_map = 0;
  auto e = MakeFaultyEngine(&fail_map);
  void* a = FilledUnit(*e, 42);
  void* b = FilledUnit(*e, 43);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  fail_map = 2;
  Status s = e->Evict(a);
  EXPECT_TRUE(s.code() == StatusCode::kInternal);
  EXPECT_TRUE(Contains(s.message(), "restoring the previous mapping"));
  AllocationInfo info;
  EXPECT_OK(e->Inspect(a, &info));
  EXPECT_TRUE(!info.evicted);
  EXPECT_EQ(e->GetStatistics().host_bytes_in_use, static_cast<int64_t>(2 * kGranule));
  EXPECT_OK(e->CheckInvariants());
  // The rest of the host pool still serves: b goes out and back intact.
  EXPECT_OK(e->Evict(b));
  EXPECT_EQ(Verify(*e, b, 2 * kGranule, 43), -1);
  EXPECT_EQ(e->GetStatistics().host_bytes_in_use, static_cast<int64_t>(4 * kGranule));
  EXPECT_OK(e->CheckInvariants());
}

TEST(AFailedRemapLosesNoByteAndLeaksNoGranule) {
  int fail = 0;
  auto e = MakeFaultyEngine(&fail);
  void* a = MustAllocate(*e, 2 * kGranule);
  Fill(*e, a, 2 * kGranule, 21);
  AllocationInfo info;
  // Eviction: the copy is made, the remap to host memory fails.
  fail = 1;
  EXPECT_TRUE(e->Evict(a).code() == StatusCode::kInternal);
  EXPECT_OK(e->Inspect(a, &info));
  EXPECT_TRUE(!info.evicted);
  EXPECT_EQ(Verify(*e, a, 2 * kGranule, 21), -1);
  EXPECT_EQ(e->GetStatistics().host_bytes_in_use, 0);
  EXPECT_OK(e->CheckInvariants());
  // Page-in: the remap to device memory fails; it stays evicted, readable.
  EXPECT_OK(e->Evict(a));
  fail = 1;
  uint64_t id = 0;
  EXPECT_TRUE(e->Pin(a, &id).code() == StatusCode::kInternal);
  EXPECT_OK(e->Inspect(a, &info));
  EXPECT_TRUE(info.evicted && info.pin_count == 0);
  EXPECT_EQ(Verify(*e, a, 2 * kGranule, 21), -1);
  EXPECT_OK(e->CheckInvariants());
  EXPECT_OK(e->Pin(a, &id));
  EXPECT_EQ(Verify(*e, a, 2 * kGranule, 21), -1);
  EXPECT_OK(e->Unpin(a, id));
  // Placement: the new range's mapping fails; its granules go back.
  const size_t before = e->device_granules_in_use();
  fail = 1;
  Status s;
  EXPECT_TRUE(e->Allocate(2 * kGranule, /*pin=*/true, &s) == nullptr);
  EXPECT_EQ(e->device_granules_in_use(), before);
  EXPECT_OK(e->CheckInvariants());
  EXPECT_TRUE(MustAllocate(*e, 2 * kGranule, /*pin=*/true) != nullptr);
  EXPECT_EQ(Verify(*e, a, 2 * kGranule, 21), -1);
  EXPECT_OK(e->CheckInvariants());
}

TEST(HostGranulesWhoseUnmapFailedAreNeverHandedOutAgain) {
  int fail_map = 0, fail_unmap = 0;
  auto e = MakeFaultyEngine(&fail_map, &fail_unmap);
  void* a = MustAllocate(*e, 2 * kGranule);
  ASSERT_TRUE(a != nullptr);
  EXPECT_OK(e->Evict(a));
  fail_unmap = 1;
  EXPECT_TRUE(e->Free(a).code() == StatusCode::kInternal);
  // Still mapped at a free slot: out of the host pool for good.
  Statistics s = e->GetStatistics();
  EXPECT_EQ(s.host_bytes_in_use, static_cast<int64_t>(2 * kGranule));
  EXPECT_EQ(s.current_bytes_reclaimed, 0);
  EXPECT_EQ(s.bytes_in_use, 0);
  EXPECT_OK(e->CheckInvariants());
  // The engine keeps working with the rest.
  void* b = MustAllocate(*e, 3 * kGranule);
  ASSERT_TRUE(b != nullptr);
  Fill(*e, b, 3 * kGranule, 13);
  EXPECT_OK(e->Evict(b));
  EXPECT_EQ(Verify(*e, b, 3 * kGranule, 13), -1);
  EXPECT_EQ(e->GetStatistics().host_bytes_in_use, static_cast<int64_t>(5 * kGranule));
  EXPECT_OK(e->CheckInvariants());
}

TEST(APinThatCannotPageInFailsCleanlyAndIsCounted) {
  Setup setup;
  setup.device_granules = 4;
  auto e = MakeEngine(setup);
  void* a = MustAllocate(*e, 3 * kGranule);
  Fill(*e, a, 3 * kGranule, 8);
  EXPECT_OK(e->Evict(a));
  void* b = MustAllocate(*e, 2 * kGranule, /*pin=*/true);  // leaves 2 free
  ASSERT_TRUE(b != nullptr);
  uint64_t id;
  Status s = e->Pin(a, &id);
  EXPECT_EQ(static_cast<int>(s.code()), static_cast<int>(StatusCode::kResourceExhausted));
  EXPECT_TRUE(Contains(s.message(), "cannot page in"));
  Statistics st = e->GetStatistics();
  EXPECT_EQ(st.num_failed_pins, 1);
  EXPECT_TRUE(st.peak_bytes_active <= static_cast<int64_t>(4 * kGranule));
  AllocationInfo info;
  EXPECT_OK(e->Inspect(a, &info));
  EXPECT_EQ(info.pin_count, 0u);
  EXPECT_EQ(Verify(*e, a, 3 * kGranule, 8), -1);  // still readable in place
}

TEST(EnvironmentValuesAreCheckedAndNamed) {
  size_t bytes = 0;
  bool present = false;
  setenv("TF_GPU_HOST_MEM_LIMIT_IN_MB", "12x", 1);
  Status s = HostLimitFromEnv(&bytes);
  EXPECT_TRUE(Contains(s.message(), "TF_GPU_HOST_MEM_LIMIT_IN_MB='12x'"));
  setenv("TF_GPU_HOST_MEM_LIMIT_IN_MB", "0", 1);
  EXPECT_TRUE(!HostLimitFromEnv(&bytes).ok());
  setenv("TF_GPU_HOST_MEM_LIMIT_IN_MB", "-2", 1);
  EXPECT_TRUE(Contains(HostLimitFromEnv(&bytes).message(), "is negative"));
  // Zero, one and an odd number of MiB against 2 MiB granules.
  std::string rounded;
  bytes = 0;
  EXPECT_TRUE(Contains(CheckMemorySetting("X", &bytes, 2 << 20, size_t{1} << 30, &rounded)
                           .message(), "less than one granule"));
  bytes = size_t{1} << 20;
  EXPECT_TRUE(!CheckMemorySetting("X", &bytes, 2 << 20, size_t{1} << 30, &rounded).ok());
  bytes = size_t{533} << 20;
  EXPECT_OK(CheckMemorySetting("X", &bytes, 2 << 20, size_t{1} << 30, &rounded));
  EXPECT_EQ(bytes, size_t{532} << 20);
  EXPECT_TRUE(Contains(rounded, "X=533 is not a whole number of 2 MiB granules: using 532"));
  setenv("TF_GPU_HOST_MEM_LIMIT_IN_MB", "3", 1);
  EXPECT_OK(HostLimitFromEnv(&bytes));
  EXPECT_EQ(bytes, size_t{3} << 20);
  unsetenv("TF_GPU_HOST_MEM_LIMIT_IN_MB");
  EXPECT_OK(HostLimitFromEnv(&bytes));
  EXPECT_EQ(bytes, kDefaultHostLimitBytes);
  bool flag = false;
  setenv("TF_LMS_STRICT", "maybe", 1);
  EXPECT_TRUE(Contains(FlagFromEnv("TF_LMS_STRICT", &present, &flag).message(),
                       "TF_LMS_STRICT='maybe'"));
  unsetenv("TF_LMS_STRICT");
}

}  // namespace
}  // namespace lms

int main(int argc, char** argv) { return lms_test::RunAll(argc, argv); }
