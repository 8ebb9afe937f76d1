// GranulePool (engine/granule_pool.h): consecutive ids, few extents, all or
// none.
#include "engine/granule_pool.h"

#include <vector>

#include "harness.h"

namespace lms {
namespace {

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
  EXPECT_EQ(pool.free_extents(), 1u);  // given back, merged with the last id
}

// Holes of 5, 2 and 3 ids: a take of 3 fills the hole of 3 (best fit), not
// the first one that holds it; a take of 7 gets the largest, 5, then the
// smallest that holds the 2 still needed.
TEST(GranulePoolTakesTheSmallestExtentThatHoldsAllElseTheLargestFirst) {
  GranulePool pool(PoolKind::kDevice, 16);
  std::vector<GranuleId> all(16);
  ASSERT_TRUE(pool.Take(16, all.data()));
  EXPECT_EQ(pool.free_extents(), 0u);
  const GranuleId hole5[] = {1, 2, 3, 4, 5};
  const GranuleId hole2[] = {8, 7};  // any order
  const GranuleId hole3[] = {11, 12, 13};
  pool.Give(hole5, 5);
  pool.Give(hole2, 2);
  pool.Give(hole3, 3);
  EXPECT_EQ(pool.free_extents(), 3u);
  GranuleId ids[7];
  ASSERT_TRUE(pool.Take(3, ids));
  EXPECT_EQ(ids[0], 11u);
  EXPECT_EQ(ids[2], 13u);
  pool.Give(ids, 3);
  ASSERT_TRUE(pool.Take(7, ids));
  const std::vector<GranuleId> got(ids, ids + 7);
  EXPECT_TRUE(got == (std::vector<GranuleId>{1, 2, 3, 4, 5, 7, 8}));
  EXPECT_EQ(pool.free_count(), 3u);  // 11 to 13
  EXPECT_EQ(pool.free_extents(), 1u);
  // Giving back the ids between merges them into one extent again.
  pool.Give(ids, 7);
  const GranuleId rest[] = {0, 6, 9, 10, 14, 15};
  pool.Give(rest, 6);
  EXPECT_EQ(pool.free_extents(), 1u);
  EXPECT_EQ(pool.free_count(), 16u);
}


// TakeExtent hands out the start of the smallest extent that holds n and
// that the caller accepts, within the tries it allows; ranges taken and
// given back by id keep the extents merged.
TEST(AnExtentIsTakenWholeFromTheSmallestThatHoldsItAndTheCallerAccepts) {
  GranulePool pool(PoolKind::kDevice, 20);
  pool.TakeRange(5, 1);   // extents [0,5) [6,20)
  pool.TakeRange(8, 2);   // extents [0,5) [6,8) [10,20)
  EXPECT_EQ(pool.free_count(), 17u);
  EXPECT_EQ(pool.free_extents(), 3u);
  GranuleId first = 99;
  EXPECT_TRUE(!pool.TakeExtent(11, &first));  // none holds 11
  EXPECT_EQ(first, 99u);
  ASSERT_TRUE(pool.TakeExtent(2, &first));  // [6,8): exactly
  EXPECT_EQ(first, 6u);
  std::vector<GranuleId> asked;
  auto not_zero = [&asked](GranuleId at) {
    asked.push_back(at);
    return at != 0;
  };
  ASSERT_TRUE(pool.TakeExtent(3, &first, not_zero));  // [0,5) refused, then [10,20)
  EXPECT_EQ(first, 10u);
  EXPECT_TRUE(asked.size() == 2u && asked[0] == 0u && asked[1] == 10u);
  EXPECT_TRUE(!pool.TakeExtent(3, &first, not_zero, /*tries=*/1));  // [0,5) only
  pool.GiveRange(6, 2);
  pool.GiveRange(8, 2);
  pool.GiveRange(5, 1);
  pool.GiveRange(10, 3);
  EXPECT_EQ(pool.free_count(), 20u);
  EXPECT_EQ(pool.free_extents(), 1u);  // merged again
  EXPECT_EQ(pool.peak_in_use(), 8u);
}

}  // namespace
}  // namespace lms
