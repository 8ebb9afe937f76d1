// PlanReclaim (engine/reclaim_policy.h): LRU's choice of victims.
#include "engine/reclaim_policy.h"
#include "engine/residency.h"
#include "harness.h"

namespace lms {
namespace {

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

}  // namespace
}  // namespace lms
