#include "engine/reclaim_policy.h"

namespace lms {

const char* PolicyName(PolicyKind kind) {
  return kind == PolicyKind::kLearned ? "learned" : "lru";
}

bool PolicyFromName(const std::string& name, PolicyKind* kind) {
  if (name == "lru") *kind = PolicyKind::kLru;
  else if (name == "learned") *kind = PolicyKind::kLearned;
  else return false;
  return true;
}

bool PlanReclaim(Residency& residency, uint64_t granules_needed,
                 ReclaimPlan* plan) {
  plan->victims.clear();
  plan->single = false;
  if (residency.inactive_resident_granules() < granules_needed) return false;
  const ChunkId single = residency.LeastRecentlyUsedOfAtLeast(granules_needed);
  if (single != kNoChunk) {
    plan->victims.push_back(single);
    plan->single = true;
    return true;
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
