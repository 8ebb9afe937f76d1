// Reclaim policy: which inactive allocations to evict when the device pool
// cannot cover a request. This is the one place that decides.
//
// The policy is IBM TFLMS's, in LRU terms:
//   1. a single reclaim: the least recently used inactive allocation that on
//      its own frees enough granules;
//   2. otherwise a full reclaim: inactive allocations in LRU order until
//      enough granules are freed.
// If even every inactive allocation would not free enough, nothing is chosen:
// evicting then would cost copies and still fail the request.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_RECLAIM_POLICY_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_RECLAIM_POLICY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/residency.h"

namespace lms {

// Which inactive allocations a reclaim evicts first (EngineOptions::policy).
enum class PolicyKind {
  kLru,      // least recently used (this file)
  kLearned,  // farthest predicted next use (learned_policy.h)
};
// "lru" / "learned".
const char* PolicyName(PolicyKind kind);
// False if `name` is neither.
bool PolicyFromName(const std::string& name, PolicyKind* kind);

struct ReclaimPlan {
  std::vector<ChunkId> victims;  // least recently used first
  bool single = false;           // one victim suffices
};

// Fills `plan` and returns true if evicting plan->victims frees at least
// `granules_needed` device granules.
bool PlanReclaim(Residency& residency, uint64_t granules_needed,
                 ReclaimPlan* plan);

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_RECLAIM_POLICY_H_
