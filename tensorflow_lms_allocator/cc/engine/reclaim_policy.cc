#include "engine/reclaim_policy.h"

namespace lms {

bool PlanReclaim(const Residency& residency, uint64_t granules_needed,
                 ReclaimPlan* plan) {
  plan->victims.clear();
  plan->single = false;
  if (residency.inactive_resident_granules() < granules_needed) return false;
  for (ChunkId c = residency.LeastRecentlyUsed(); c != kNoChunk;
       c = residency.NextMoreRecent(c)) {
    if (residency.record(c).granules >= granules_needed) {
      plan->victims.push_back(c);
      plan->single = true;
      return true;
    }
  }
  uint64_t freed = 0;
  for (ChunkId c = residency.LeastRecentlyUsed();
       c != kNoChunk && freed < granules_needed; c = residency.NextMoreRecent(c)) {
    plan->victims.push_back(c);
    freed += residency.record(c).granules;
  }
  return freed >= granules_needed;
}

}  // namespace lms
