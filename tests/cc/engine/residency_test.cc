// Residency (engine/residency.h): the LRU list of inactive resident units.
#include "engine/residency.h"
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

}  // namespace
}  // namespace lms
