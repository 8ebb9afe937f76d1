// RunPool (engine/run_pool.h), the pool of granules made and released in
// runs: against a model of the backend's pieces, and its order of preference.
#include <algorithm>
#include <cstddef>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "engine/run_pool.h"
#include "harness.h"

namespace lms {
namespace {

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

}  // namespace
}  // namespace lms
