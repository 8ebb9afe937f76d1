// GranulePool (engine/granule_pool.h): consecutive ids, all or none.
#include "engine/granule_pool.h"
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
}

}  // namespace
}  // namespace lms
