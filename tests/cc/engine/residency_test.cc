// Residency (engine/residency.h): the LRU list of inactive resident units.
#include "engine/residency.h"

#include <random>
#include <vector>

#include "harness.h"

namespace lms {
namespace {

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

// The least recently used unit of at least n granules, found from the size
// classes' fronts (Note [Units by size]), is the first the LRU walk finds,
// over random pins, unpins, touches, frees and sizes within and past the
// exact classes (below 64).
// Twice: without list changes kept (the first ask numbers the list), and
// with them kept from midway (as a learned policy keeps them; the list
// numbered then).
TEST(TheLeastRecentlyUsedUnitOfAtLeastASizeIsTheFirstTheWalkFinds) {
  for (int keep = 0; keep < 2; ++keep) {
    std::mt19937 rng(7);
    Residency r;
    std::vector<bool> tracked(300, false);
    std::vector<ChunkId> changes;
    for (int op = 0; op < 20000; ++op) {
      if (keep == 1 && op == 250) r.KeepListChanges();
      if (keep == 1 && op % 1000 == 0) r.TakeListChanges(&changes);
      const ChunkId id = static_cast<ChunkId>(rng() % tracked.size());
      if (!tracked[id]) {
        const uint64_t granules = rng() % 4 == 0 ? 50 + rng() % 300 : 1 + rng() % 8;
        r.Track(id, granules, /*pinned=*/rng() % 2 == 0);
        tracked[id] = true;
      } else if (rng() % 5 == 0) {
        r.Untrack(id);
        tracked[id] = false;
      } else if (r.record(id).pin_count > 0) {
        r.Unpin(id);
      } else if (rng() % 3 == 0) {
        r.Touch(id);
      } else {
        r.Pin(id);
      }
      // The first ask makes the classes from a list of many units.
      if (op < 500) continue;
      const uint64_t granules = 1 + rng() % 400;
      ChunkId want = kNoChunk;
      for (ChunkId c = r.LeastRecentlyUsed(); c != kNoChunk; c = r.NextMoreRecent(c)) {
        if (r.record(c).granules >= granules) {
          want = c;
          break;
        }
      }
      EXPECT_EQ(r.LeastRecentlyUsedOfAtLeast(granules), want);
    }
  }
}

// With KeepListChanges, each unit that joined or left the LRU list since
// the last TakeListChanges is listed once, a unit freed and made again
// among them; none before it is asked for.
TEST(ListChangesNameEachUnitOnceUntilTaken) {
  Residency r;
  r.Track(0, 1, /*pinned=*/false);  // listed before changes are kept
  r.KeepListChanges();
  std::vector<ChunkId> changes;
  r.TakeListChanges(&changes);  // it is noted at once
  EXPECT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0], 0u);
  r.Track(1, 2, /*pinned=*/false);
  r.Pin(1);
  r.Unpin(1);
  r.Pin(0);
  r.Untrack(1);
  r.Track(1, 3, /*pinned=*/false);  // made again at the same id
  r.Track(2, 1, /*pinned=*/true);   // never on the list
  r.TakeListChanges(&changes);
  EXPECT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0], 1u);
  EXPECT_EQ(changes[1], 0u);
  r.TakeListChanges(&changes);
  EXPECT_EQ(changes.size(), 0u);
  r.Unpin(2);
  r.TakeListChanges(&changes);
  EXPECT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0], 2u);
}

}  // namespace
}  // namespace lms
