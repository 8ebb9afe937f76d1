// RunPool: the host pool, handed out in runs.
//
// A GPU driver's remap costs per piece of memory mapped, not per byte (on an
// H200 granting host memory costs about 44 us a piece plus 10.5 us a MiB;
// docs/design.md, CUDA VMM rules), so an evicted unit should be backed by few
// pieces rather than one per granule. A *run* is a range of consecutive
// granule ids that the backend makes as one piece of memory (CUDA: one
// cuMemCreate handle, always mapped whole) the first time a copy or a Map
// names it. Runs are cut here by Take, which tells the caller which (the
// caller defines them to the backend: Backend::DefineRuns), and live until
// Take releases a free one to cut another size from its ids (the caller has
// the backend release its memory: Backend::ReleaseRuns). Making memory is the
// dearest call of all (pinning its pages), so free runs are kept and reused,
// an exact size first. What runs gained on an H200:
// docs/decisions/0007-host-memory-in-runs.md.
//
// Every id is unmade, in a free run, or in a taken run. Take(n) returns whole
// runs whose lengths sum to n, in this order of preference: one free run of
// exactly n; free runs, longest first, no longer than what is still needed;
// new runs cut from unmade ids; the smallest free run longer than what is
// still needed, released and cut. New runs of one Take that adjoin are one
// run. Made memory (the runs, taken or free) never exceeds the most ever in
// use: pinned memory is one budget for every GPU of the process, and a pool
// of granules made no more than that either. A Take that would leave more
// releases free runs, longest first.
//
// A taken run belongs to one caller, which gives all of it back (one id at a
// time if it likes); it is free once its last id is back. Between calls no
// run is partly given back, so free_count() is what Take can hand out.
//
// Thread-compatible: the engine's lock guards every call.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_RUN_POOL_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_RUN_POOL_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "engine/backend.h"

namespace lms {

class RunPool {
 public:
  using Run = GranuleRun;

  explicit RunPool(size_t capacity);

  size_t capacity() const { return capacity_; }
  size_t free_count() const { return free_count_; }
  size_t in_use() const { return capacity_ - free_count_; }
  // Granules in runs, taken or free (memory made or to be made), and the
  // most ever taken at once, which bounds them.
  size_t made() const { return made_; }
  size_t peak_in_use() const { return peak_in_use_; }

  // Takes `n` granules as whole runs into out[0..n), each run's ids in order,
  // all or none; appends to *released the free runs it released (to be
  // released by the backend before anything else), then to *cut the runs it
  // cut (to be defined to it). Returns false if fewer than `n` are free.
  bool Take(size_t n, GranuleId* out, std::vector<Run>* released, std::vector<Run>* cut);
  // Gives back ids of taken runs (see above).
  void Give(const GranuleId* ids, size_t n);
  void Give(GranuleId id) { Give(&id, 1); }

  // The run holding `id`, made or cut; {id, 0} for an unmade id.
  Run RunOf(GranuleId id) const;

 private:
  static constexpr GranuleId kUnmade = ~GranuleId{0};

  // Cuts `length` unmade ids from `at` (inside the unmade range `range`).
  void Cut(std::map<GranuleId, uint32_t>::iterator range, GranuleId at, uint32_t length);
  void MarkTaken(const Run& run);
  // Turns a free run back into unmade ids, merged with unmade neighbours.
  void Release(const Run& run);

  const size_t capacity_;
  size_t free_count_;
  size_t made_ = 0;
  size_t peak_in_use_ = 0;
  // Per id: the first id of its run, or kUnmade.
  std::vector<GranuleId> run_start_;
  // Per first id of a run: its length, and how many of its ids are taken.
  std::vector<uint32_t> run_length_;
  std::vector<uint32_t> run_taken_;
  // Free runs by (length, first id).
  std::set<std::pair<uint32_t, GranuleId>> free_runs_;
  // Unmade ids: first id -> length; ranges never adjoin.
  std::map<GranuleId, uint32_t> unmade_;
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_RUN_POOL_H_
