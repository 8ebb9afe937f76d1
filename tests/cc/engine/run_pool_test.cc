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

// Sum of the lengths of the backend's pieces, as the random tests model them.
size_t Granules(const std::map<GranuleId, uint32_t>& defined) {
  size_t n = 0;
  for (const auto& d : defined) n += d.second;
  return n;
}

// Gives back the ids of one Take at random, one id at a time, as the engine
// frees an evicted unit.
void GiveOneTake(RunPool* pool, std::mt19937* rng, std::vector<std::vector<GranuleId>>* held,
                 std::set<GranuleId>* taken) {
  const size_t k = (*rng)() % held->size();
  for (GranuleId id : (*held)[k]) {
    pool->Give(id);
    taken->erase(id);
  }
  held->erase(held->begin() + static_cast<std::ptrdiff_t>(k));
}

// RunPool against a model of the backend's pieces: every Take hands out
// whole parts summing to what was asked, disjoint from every taken id, each
// a whole run (runs mapped whole) or consecutive ids inside one run (with
// splits); a run it cuts overlaps no defined run; one it releases is a
// defined run with nothing taken; it fails only with fewer ids free; made
// memory never exceeds the most ever in use or what was made ahead.
TEST(RunPoolHandsOutWholePartsAndDefinesEachIdOnceUnderRandomUse) {
  std::mt19937 rng(5);
  for (int round = 0; round < 120; ++round) {
    const bool splits = round % 3 != 0;
    const size_t capacity = 1 + rng() % 64;
    RunPool pool(capacity);
    pool.set_splits(splits);
    std::map<GranuleId, uint32_t> defined;    // the backend's pieces
    std::set<GranuleId> taken;                // ids handed out
    std::vector<std::vector<GranuleId>> held;  // per Take, its ids
    if (splits && round % 3 == 2) {
      std::vector<RunPool::Run> ahead;
      pool.MakeAhead(rng() % (capacity + 8), 1 + rng() % 16, &ahead);
      for (const auto& r : ahead) defined[r.first] = r.length;
      ASSERT_TRUE(pool.made_ahead() == pool.made());
    }
    size_t reused = 0;
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
        }
        for (const auto& r : cut) {
          for (const auto& d : defined) {
            ASSERT_TRUE(r.first + r.length <= d.first || d.first + d.second <= r.first);
          }
          defined[r.first] = r.length;
        }
        // out: whole parts, each in order inside one defined run, none
        // taken before.
        for (size_t i = 0; i < n;) {
          const RunPool::Run part = pool.PartOf(out[i]);
          ASSERT_TRUE(part.first == out[i] && part.length > 0 && i + part.length <= n);
          auto d = defined.upper_bound(part.first);
          ASSERT_TRUE(d != defined.begin());
          --d;
          ASSERT_TRUE(part.first + part.length <= d->first + d->second);
          ASSERT_TRUE(splits || (part.first == d->first && part.length == d->second));
          const RunPool::Run run = pool.RunOf(out[i]);
          ASSERT_TRUE(run.first == d->first && run.length == d->second);
          for (uint32_t k = 0; k < part.length; ++k) {
            ASSERT_TRUE(out[i + k] == part.first + k);
            ASSERT_TRUE(taken.insert(out[i + k]).second);
          }
          bool is_cut = false;
          for (const auto& r : cut) is_cut = is_cut || r.first == d->first;
          if (!is_cut) ++reused;
          i += part.length;
        }
        held.push_back(std::move(out));
      } else {
        GiveOneTake(&pool, &rng, &held, &taken);
      }
      ASSERT_TRUE(pool.in_use() == taken.size());
      ASSERT_TRUE(pool.made() == Granules(defined));
      ASSERT_TRUE(pool.made() <= std::max(pool.peak_in_use(), pool.made_ahead()));
    }
    EXPECT_TRUE(reused > 0);
  }
}

// With splits, memory made ahead serves requests of any size without being
// made again: the smallest free part that holds a request is split, parts
// given back merge into their run again, and nothing made ahead is released
// although less was ever in use.
TEST(RunsMadeAheadAreSplitForEachRequestAndMergeWhenGivenBack) {
  RunPool pool(40);
  pool.set_splits(true);
  std::vector<RunPool::Run> ahead, released, cut;
  pool.MakeAhead(24, 16, &ahead);  // runs of 16 and 8
  ASSERT_TRUE(ahead.size() == 2u);
  EXPECT_TRUE(ahead[0].first == 0u && ahead[0].length == 16u);
  EXPECT_TRUE(ahead[1].first == 16u && ahead[1].length == 8u);
  EXPECT_EQ(pool.made(), 24u);
  GranuleId a[5], b[3], c[8], d[10];
  // 5: the smallest free part that holds it is the run of 8: split.
  ASSERT_TRUE(pool.Take(5, a, &released, &cut));
  EXPECT_EQ(a[0], 16u);
  EXPECT_TRUE(pool.PartOf(16).length == 5u && pool.RunOf(16).length == 8u);
  // 3: exactly the rest of that run.
  ASSERT_TRUE(pool.Take(3, b, &released, &cut));
  EXPECT_EQ(b[0], 21u);
  // 8: split from the run of 16.
  ASSERT_TRUE(pool.Take(8, c, &released, &cut));
  EXPECT_EQ(c[0], 0u);
  EXPECT_TRUE(cut.empty() && released.empty());
  // Given back, the parts of the run of 8 merge into one free part.
  pool.Give(a, 5);
  pool.Give(b, 3);
  EXPECT_TRUE(pool.PartOf(16).length == 8u && pool.PartOf(21).first == 16u);
  // 10: no free part holds it (8 and 8): one whole (of equal lengths, the
  // lower ids), then 2 split from the other, rather than making 2.
  ASSERT_TRUE(pool.Take(10, d, &released, &cut));
  EXPECT_EQ(d[0], 8u);
  EXPECT_EQ(d[8], 16u);
  EXPECT_TRUE(cut.empty() && released.empty());
  EXPECT_EQ(pool.made(), 24u);  // what was made ahead stays made
  pool.Give(c, 8);
  pool.Give(d, 10);
  // Forgotten (the backend could not make it): both runs are unmade again.
  pool.ForgetAhead(&released);
  EXPECT_EQ(released.size(), 2u);
  EXPECT_EQ(pool.made(), 0u);
  EXPECT_EQ(pool.made_ahead(), 0u);
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

// A free run the caller's check refuses (on a GPU: its release would wait on
// the host for queued work) stays made over the peak; a later Take releases
// it once the check accepts it.
TEST(ARunOverThePeakThatCannotBeReleasedYetStaysMadeUntilItCan) {
  RunPool pool(8);
  std::vector<RunPool::Run> released, cut;
  GranuleId a[4], b[3], c[1];
  bool busy = true;
  const RunPool::Releasable releasable = [&](const std::vector<RunPool::Run>&) {
    return !busy;
  };
  ASSERT_TRUE(pool.Take(4, a, &released, &cut, releasable));
  pool.Give(a, 4);
  // 3 unmade ids cut; 7 made against a peak of 4, but the free 4 is refused.
  ASSERT_TRUE(pool.Take(3, b, &released, &cut, releasable));
  EXPECT_TRUE(released.empty());
  EXPECT_EQ(pool.made(), 7u);
  busy = false;
  pool.Give(b, 3);
  released.clear();
  ASSERT_TRUE(pool.Take(1, c, &released, &cut, releasable));  // the last unmade id
  ASSERT_TRUE(released.size() == 1u && released[0].first == 0u && released[0].length == 4u);
  EXPECT_EQ(pool.made(), 4u);
}


// Note [Device pieces cut to units] (engine.h): a device pool made a granule
// a piece at creation hands out single granules while it cuts granules, then
// one piece for a unit of RunPool::kLeastStretch granules or more, cut from
// a stretch of ids none of which is taken (the free pieces there released,
// a piece reaching past it whole, its rest left unmade); a free piece of
// exactly the size asked is reused as it is, smaller units and stretches the
// caller refuses take free pieces as they are, and nothing is released for
// being more than was ever in use.
TEST(CuttingUnitsReleasesTheFreePiecesOfAStretchAndCutsOnePiece) {
  RunPool pool(16);
  pool.set_cutting(RunPool::Cutting::kGranules);
  std::vector<RunPool::Run> ahead, released, cut;
  pool.MakeAhead(16, 1, &ahead);
  ASSERT_TRUE(ahead.size() == 16u);
  EXPECT_EQ(pool.made(), 16u);
  static_assert(RunPool::kLeastStretch == 4, "the sizes below straddle it");
  GranuleId a[4], b[4], c[2], d[5], f[4];
  ASSERT_TRUE(pool.Take(4, a, &released, &cut));
  for (GranuleId id : a) EXPECT_EQ(pool.RunOf(id).length, 1u);
  EXPECT_TRUE(released.empty() && cut.empty());
  pool.Give(a, 4);
  pool.set_cutting(RunPool::Cutting::kUnits);
  ASSERT_TRUE(pool.Take(4, b, &released, &cut));
  EXPECT_EQ(b[0], 0u);
  EXPECT_TRUE(pool.RunOf(b[0]).first == 0u && pool.RunOf(b[0]).length == 4u);
  EXPECT_EQ(pool.PartOf(b[3]).first, 0u);
  ASSERT_TRUE(released.size() == 4u);  // the four pieces of one granule
  for (const RunPool::Run& r : released) EXPECT_TRUE(r.first < 4u && r.length == 1u);
  ASSERT_TRUE(cut.size() == 1u && cut[0].first == 0u && cut[0].length == 4u);
  EXPECT_EQ(pool.made(), 16u);
  pool.Give(b, 4);
  released.clear();
  cut.clear();
  // The same size again: that piece, as it is.
  ASSERT_TRUE(pool.Take(4, b, &released, &cut));
  EXPECT_EQ(b[0], 0u);
  EXPECT_TRUE(released.empty() && cut.empty());
  // Two granules: below kLeastStretch, two free pieces as they are.
  ASSERT_TRUE(pool.Take(2, c, &released, &cut));
  EXPECT_TRUE(released.empty() && cut.empty());
  EXPECT_TRUE(pool.RunOf(c[0]).length == 1u && pool.RunOf(c[1]).length == 1u);
  // Five, with every stretch refused: five free pieces, nothing released.
  auto refuse = [](const std::vector<RunPool::Run>&) { return false; };
  ASSERT_TRUE(pool.Take(5, d, &released, &cut, refuse));
  EXPECT_TRUE(released.empty() && cut.empty());
  for (GranuleId id : d) EXPECT_EQ(pool.RunOf(id).length, 1u);
  pool.Give(d, 5);
  // Accepted (the caller is asked about the free pieces it would release).
  size_t asked = 0;
  auto accept = [&asked](const std::vector<RunPool::Run>& runs) {
    asked = runs.size();
    return true;
  };
  ASSERT_TRUE(pool.Take(5, d, &released, &cut, accept));
  EXPECT_EQ(asked, 5u);
  EXPECT_TRUE(released.size() == 5u && cut.size() == 1u && cut[0].length == 5u);
  const GranuleId five = cut[0].first;
  pool.Give(d, 5);
  released.clear();
  cut.clear();
  // Four where the smallest stretch starts at the free piece of five: that
  // piece goes whole, and the id past the stretch is left unmade.
  ASSERT_TRUE(pool.Take(4, f, &released, &cut));
  ASSERT_TRUE(released.size() == 1u && released[0].first == five && released[0].length == 5u);
  ASSERT_TRUE(cut.size() == 1u && cut[0].first == five && cut[0].length == 4u);
  EXPECT_EQ(pool.made(), 15u);
  EXPECT_EQ(pool.RunOf(five + 4).length, 0u);  // unmade
  EXPECT_EQ(pool.free_count(), 16u - 4u - 2u - 4u);
}

// Cutting granules then units, at random, against a model of the backend's
// pieces: whole parts summing to what was asked, every part a whole piece;
// while cutting granules every piece cut is one granule; a piece released
// is defined, with nothing taken; a piece cut overlaps no defined one; made
// memory never exceeds the pool.
TEST(CuttingGranulesThenUnitsHandsOutWholePiecesUnderRandomUse) {
  std::mt19937 rng(11);
  for (int round = 0; round < 80; ++round) {
    const size_t capacity = 1 + rng() % 48;
    RunPool pool(capacity);
    pool.set_cutting(RunPool::Cutting::kGranules);
    std::map<GranuleId, uint32_t> defined;
    std::set<GranuleId> taken;
    std::vector<std::vector<GranuleId>> held;
    if (round % 2 == 0) {
      std::vector<RunPool::Run> ahead;
      pool.MakeAhead(capacity, 1, &ahead);
      for (const auto& r : ahead) defined[r.first] = r.length;
    }
    const int switch_at = static_cast<int>(rng() % 200);
    size_t stretches = 0;
    for (int step = 0; step < 300; ++step) {
      const bool units = step >= switch_at;
      if (step == switch_at) pool.set_cutting(RunPool::Cutting::kUnits);
      if (held.empty() || rng() % 2 == 0) {
        const size_t n = 1 + rng() % std::max<size_t>(1, capacity / 2);
        std::vector<GranuleId> out(n);
        std::vector<RunPool::Run> gone, cut;
        const bool yes = rng() % 2 == 0;
        const bool ok = pool.Take(n, out.data(), &gone, &cut,
                                  [yes](const std::vector<RunPool::Run>&) { return yes; });
        ASSERT_TRUE(ok == (n <= capacity - taken.size()));
        if (!ok) continue;
        for (const auto& r : gone) {
          ASSERT_TRUE(defined.count(r.first) == 1u && defined[r.first] == r.length);
          for (uint32_t i = 0; i < r.length; ++i) ASSERT_TRUE(taken.count(r.first + i) == 0u);
          defined.erase(r.first);
        }
        for (const auto& r : cut) {
          ASSERT_TRUE(units || r.length == 1u);
          for (const auto& d : defined) {
            ASSERT_TRUE(r.first + r.length <= d.first || d.first + d.second <= r.first);
          }
          defined[r.first] = r.length;
          if (r.length == n) ++stretches;
        }
        for (size_t i = 0; i < n;) {
          const RunPool::Run part = pool.PartOf(out[i]);
          ASSERT_TRUE(part.first == out[i] && part.length > 0 && i + part.length <= n);
          ASSERT_TRUE(defined.count(part.first) == 1u && defined[part.first] == part.length);
          for (uint32_t k = 0; k < part.length; ++k) {
            ASSERT_TRUE(out[i + k] == part.first + k);
            ASSERT_TRUE(taken.insert(out[i + k]).second);
          }
          i += part.length;
        }
        held.push_back(std::move(out));
      } else {
        GiveOneTake(&pool, &rng, &held, &taken);
      }
      ASSERT_TRUE(pool.in_use() == taken.size());
      ASSERT_TRUE(pool.made() == Granules(defined));
      ASSERT_TRUE(pool.made() <= capacity);
    }
    if (capacity >= 8) EXPECT_TRUE(stretches > 0);
  }
}

}  // namespace
}  // namespace lms
