// DevicePool (engine/device_pool.h): extents where the backend makes the
// pieces, pieces cut to units where the engine cuts them.
#include "engine/device_pool.h"

#include <vector>

#include "harness.h"

namespace lms {
namespace {

// Where the backend makes the pieces, a unit gets one extent of ids and the
// pool never releases or cuts anything.
TEST(ADevicePoolHandsOutExtentsWhereTheBackendMakesThePieces) {
  DevicePool pool(16);
  EXPECT_TRUE(!pool.cuts_pieces());
  std::vector<DevicePool::Run> released, cut;
  GranuleId a[6];
  ASSERT_TRUE(pool.Take(6, a, &released, &cut));
  for (int i = 1; i < 6; ++i) EXPECT_EQ(a[i], a[0] + static_cast<GranuleId>(i));
  EXPECT_TRUE(released.empty() && cut.empty());
  EXPECT_EQ(pool.in_use(), 6u);
  pool.Give(a, 6);
  EXPECT_EQ(pool.free_count(), 16u);
}

// Cutting pieces (Note [Device pieces cut to units] in engine.h): made a
// granule a piece at creation, single granules until CutUnits, then one
// piece for a unit of four granules.
TEST(ADevicePoolCutsPiecesToUnitsFromTheFirstEvictionOn) {
  DevicePool pool(16);
  std::vector<DevicePool::Run> made, released, cut;
  pool.CutPieces(/*made=*/true, &made);
  EXPECT_TRUE(pool.cuts_pieces());
  EXPECT_EQ(made.size(), 16u);
  GranuleId a[4], b[4];
  ASSERT_TRUE(pool.Take(4, a, &released, &cut));
  EXPECT_TRUE(released.empty() && cut.empty());  // four pieces of one granule
  pool.Give(a, 4);
  pool.CutUnits();
  ASSERT_TRUE(pool.Take(4, b, &released, &cut));
  EXPECT_EQ(released.size(), 4u);
  EXPECT_TRUE(cut.size() == 1u && cut[0].length == 4u && cut[0].first == b[0]);
  GranuleId c[13];
  EXPECT_TRUE(!pool.Take(13, c, &released, &cut));  // 12 free: all or none
  pool.Give(b, 4);
  EXPECT_EQ(pool.free_count(), 16u);
}

}  // namespace
}  // namespace lms
