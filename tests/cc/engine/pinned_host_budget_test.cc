// The process's budget of pinned host memory (backends/pinned_host_budget.h).
#include "backends/pinned_host_budget.h"

#include <cstddef>

#include "harness.h"

namespace lms {
namespace {

constexpr size_t kGiB = size_t{1} << 30;

// Each GPU's host pool holds its share of TF_GPU_HOST_MEM_LIMIT_IN_MB; the
// budget is their sum, so one GPU's pool filling up takes nothing from
// another's, and the process never pins more than the shares.
TEST(PinnedHostBudgetIsTheSumOfTheLivePoolsLimits) {
  PinnedHostBudget budget;
  EXPECT_EQ(budget.limit(), 0u);
  EXPECT_TRUE(!budget.TryTake(1));
  budget.AddPool(2 * kGiB);
  budget.AddPool(6 * kGiB);
  EXPECT_EQ(budget.limit(), 8 * kGiB);
  // The first pool fills its share, the second all of its own.
  EXPECT_TRUE(budget.TryTake(2 * kGiB));
  EXPECT_TRUE(budget.TryTake(6 * kGiB));
  EXPECT_EQ(budget.used(), 8 * kGiB);
  EXPECT_TRUE(!budget.TryTake(1));  // no more than the shares together
  budget.Give(6 * kGiB);
  // A pool gone takes its limit with it.
  budget.RemovePool(6 * kGiB);
  EXPECT_EQ(budget.limit(), 2 * kGiB);
  EXPECT_TRUE(!budget.TryTake(1));
  budget.Give(2 * kGiB);
  budget.RemovePool(2 * kGiB);
  EXPECT_EQ(budget.limit(), 0u);
  EXPECT_EQ(budget.used(), 0u);
}

}  // namespace
}  // namespace lms
