// RunPool: a pool handed out in runs: the host pool, and the device pool
// where the engine cuts its pieces (Note [Device pieces cut to units]).
//
// A GPU driver's remap costs per piece of memory mapped, not per byte (on an
// H200 granting host memory costs about 44 us a piece plus 10.5 us a MiB;
// docs/design.md, CUDA VMM rules), so an evicted unit should be backed by few
// pieces rather than one per granule. A *run* is a range of consecutive
// granule ids that the backend makes as one piece of memory (CUDA: one
// cuMemCreate handle) the first time a copy or a Map names it, or when the
// caller makes it ahead (MakeAhead). Runs are cut here by Take, which tells
// the caller which (the caller defines them to the backend:
// Backend::DefineRuns), and live until Take releases a free one to cut
// another size from its ids (the caller has the backend release its memory:
// Backend::ReleaseRuns). Making memory is the dearest call of all (pinning
// its pages), so free memory is kept and reused. What runs gained on an
// H200: docs/decisions/0007-host-memory-in-runs.md.
//
// Take hands out *parts*: consecutive ids of one run, each of which the
// backend maps with one call. Where the backend maps only whole runs
// (set_splits(false), the default), every part is a whole run. Where it maps
// part of a run at its offset (Backend::MapsPartsOfRuns), a free part
// longer than what is asked is split, its rest left free, and parts given
// back merge with the free parts beside them in their run, so memory made
// once serves any size without being made again (Note [Host memory made
// ahead] in engine.h).
//
// Every id is unmade, in a free part, or in a taken part. Take(n) returns
// whole parts whose lengths sum to n, in this order of preference: one free
// part of exactly n; with splits, the smallest free part longer than n,
// split; free parts, longest first, no longer than what is still needed;
// with splits, the smallest free part longer than what is still needed,
// split; new runs cut from unmade ids; without splits, the smallest free run
// longer than what is still needed, released and cut. New runs of one Take
// that adjoin are one run. With splits, unmade ids are cut only when no made
// memory is free. Made memory (the runs) never exceeds the most ever in use,
// or what was made ahead if that is more: pinned memory is one budget for
// every GPU of the process, and a pool of granules made no more than that
// either. A Take that would leave more releases free runs (runs with nothing
// taken), longest first.
//
// A taken part belongs to one caller, which gives all of it back (one id at
// a time if it likes); it is free once its last id is back. Between calls no
// part is partly given back, so free_count() is what Take can hand out.
//
// The device pool on a driver that maps only whole pieces (Note [Device
// pieces cut to units] in engine.h) cuts its runs otherwise (set_cutting):
//   - kGranules: every run one granule, as if the pool were not in runs;
//     the engine's device pool before its first eviction;
//   - kUnits: after a free run of exactly n, and for n of kLeastStretch or
//     more, Take looks for n consecutive ids none of which is taken (in the
//     smallest few stretches that hold them, the first whose free runs the
//     caller accepts to release: Releasable), releases the free runs among
//     them and cuts one run of n: a unit is then one piece, at the cost of
//     remaking memory; where no such stretch is found, it goes on as
//     without splits.
// Either keeps all memory made: made memory is the device's budget, taken
// once, so no free run is released for being more than was ever in use.
//
// Thread-compatible: the engine's lock guards every call.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_RUN_POOL_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_RUN_POOL_H_

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "engine/backend.h"
#include "engine/granule_pool.h"
#include "engine/node_pool.h"

namespace lms {

class RunPool {
 public:
  using Run = GranuleRun;

  // How Take cuts new runs (see above).
  enum class Cutting { kAsNeeded, kGranules, kUnits };
  // Cutting units: the fewest granules a Take releases free runs for, and
  // the most stretches it tries (see Take).
  static constexpr size_t kLeastStretch = 4;
  static constexpr size_t kStretchTries = 8;
  // Whether free runs may be released now at little cost (the backend's
  // ReleaseWaitsOnlyForCopies).
  using Releasable = std::function<bool(const std::vector<Run>& runs)>;

  explicit RunPool(size_t capacity);

  // Whether Take may hand out part of a run (see above). Set before the
  // first Take or MakeAhead.
  void set_splits(bool splits) {
    assert(cutting_ == Cutting::kAsNeeded || !splits);
    splits_ = splits;
  }
  bool splits() const { return splits_; }
  // Set before the first Take or MakeAhead, without splits; kGranules may
  // become kUnits at any time.
  void set_cutting(Cutting cutting);
  Cutting cutting() const { return cutting_; }

  size_t capacity() const { return capacity_; }
  size_t free_count() const { return free_count_; }
  size_t in_use() const { return capacity_ - free_count_; }
  // Granules in runs (memory made or to be made), and the most ever taken at
  // once, which bounds them with what was made ahead.
  size_t made() const { return made_; }
  size_t peak_in_use() const { return peak_in_use_; }
  size_t made_ahead() const { return ahead_; }

  // Cuts runs of at most `most` granules from unmade ids, `n` granules in
  // all (or what is unmade, if less), free, and appends them to *cut for the
  // caller to define and make. They count as made ahead: Take keeps that much
  // made even when less was ever in use. On a pool with nothing taken, with
  // splits (a run made ahead is of no size a request asks for) or cutting
  // granules (the device pool a backend made whole at its creation).
  void MakeAhead(size_t n, size_t most, std::vector<Run>* cut);
  // Forgets what was made ahead (the backend could not make it): it goes
  // back to unmade ids, appended to *released.
  void ForgetAhead(std::vector<Run>* released);

  // Takes `n` granules as whole parts into out[0..n), each part's ids in
  // order, all or none; appends to *released the free runs it released (to
  // be released by the backend before anything else), then to *cut the runs
  // it cut (to be defined to it). Returns false if fewer than `n` are free.
  // Cutting units, a stretch whose free runs `releasable` refuses is not
  // cut (the first kStretchTries stretches that hold n are tried), and a
  // free run longer than needed is released only if none of the first few
  // that `releasable` accepts serves (the shortest then goes regardless).
  // Made memory over the most ever in use goes (cutting as needed) only as
  // free runs `releasable` accepts, longest first, among the first few.
  bool Take(size_t n, GranuleId* out, std::vector<Run>* released, std::vector<Run>* cut,
            const Releasable& releasable = nullptr);
  // Gives back ids of taken parts (see above).
  void Give(const GranuleId* ids, size_t n);
  void Give(GranuleId id) { Give(&id, 1); }

  // The run holding `id`, and the part (taken or free) holding it; {id, 0}
  // for an unmade id.
  Run RunOf(GranuleId id) const;
  Run PartOf(GranuleId id) const;

 private:
  static constexpr GranuleId kUnmade = ~GranuleId{0};
  // (length, first id); nodes from a pool (Note [Nodes from slabs]): a part
  // comes and goes at every give and take.
  using FreePart = std::pair<uint32_t, GranuleId>;
  using FreeParts = PooledSet<FreePart>;

  // Cuts `length` unmade ids from `at` (inside the unmade range `range`).
  void Cut(std::map<GranuleId, uint32_t>::iterator range, GranuleId at, uint32_t length);
  // Makes `run` (cut) one run, and one part of it.
  void MakeRun(const Run& run);
  // Sets the part [first, first + length): taken (all its ids) or free.
  void SetPart(GranuleId first, uint32_t length, bool taken);
  // Takes the first `length` ids of the free part `it`; its rest stays free.
  Run Split(FreeParts::iterator it, uint32_t length);
  // Whether the free part `part` is a whole run.
  bool IsWholeRun(const Run& part) const {
    return run_start_[part.first] == part.first && run_length_[part.first] == part.length;
  }
  // Turns a free whole run back into unmade ids, merged with unmade
  // neighbours.
  void Release(const Run& run);
  // Cutting units: takes n consecutive ids none of which is taken, releasing
  // (into *released) the free runs among them, and cuts them as one run
  // into *fresh. False, and nothing changed, if no such ids are left.
  bool TakeStretch(size_t n, const Releasable& releasable, std::vector<Run>* released,
                   std::vector<Run>* fresh);
  // The free runs among [first, first + n), ids none of which is taken.
  void FreeRunsIn(GranuleId first, size_t n, std::vector<Run>* runs) const;

  const size_t capacity_;
  bool splits_ = false;
  Cutting cutting_ = Cutting::kAsNeeded;
  // Cutting granules or units: the ids no part holds taken (unmade, or in a
  // free part), as extents.
  GranulePool open_;
  size_t free_count_;
  size_t made_ = 0;
  size_t peak_in_use_ = 0;
  size_t ahead_ = 0;
  // Per id: the first id of its run, or kUnmade; per first id of a run, its
  // length.
  std::vector<GranuleId> run_start_;
  std::vector<uint32_t> run_length_;
  // Per made id: the first id of its part; per first id of a part, its
  // length, and how many of its ids are taken (0: free). Parts tile runs.
  std::vector<GranuleId> part_start_;
  std::vector<uint32_t> part_length_;
  std::vector<uint32_t> part_taken_;
  NodePool free_part_nodes_;  // before free_parts_, which gives nodes back to it
  FreeParts free_parts_{PoolAllocator<FreePart>(&free_part_nodes_)};
  // Unmade ids: first id -> length; ranges never adjoin.
  std::map<GranuleId, uint32_t> unmade_;
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_RUN_POOL_H_
