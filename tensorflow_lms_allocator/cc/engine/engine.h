// Engine: the address-stable swapping allocator.
//
// Every allocation keeps the same virtual address for its whole life; what
// moves is the physical memory behind it (see docs/design.md, "tensors never
// move"). The engine reserves one address range from its backend and runs
// best-fit with coalescing over its granule-sized slots (BestFitArena). Each
// slot is mapped to one device granule while resident, one host granule while
// evicted, or nothing.
//
// Note [Residency units]. What is pinned, evicted and paged in is a
// *residency unit*: a run of whole slots with one Residency record.
//   - A large allocation (one granule or more) is its own unit.
//   - Smaller objects are packed into *small-object pages*: one-granule units
//     sub-allocated in 256-byte steps (small_pages.h). Pinning any object pins
//     its page, so a page whose objects are all unpinned is inactive and is
//     evicted as a whole (copying its objects only: Note [Live bytes only]);
//     recency is per page. A page with no live object and no pin is released
//     at once, so the small-object region shrinks.
// Pin() returns the unit's id and Unpin() takes it, so a pin taken through
// an object still releases its page after the object is freed, and an unpin
// never lands on a later unit at a reused address.
//
// Note [Live bytes only]. An eviction or a page-in of a page copies its live
// objects' bytes, not the whole granule: what lies between objects is no
// tensor's (a new object's bytes are unspecified until its writer writes
// them). Neighbours less than granule / kCopyGapsPerGranule apart are copied
// as one range, so a page costs at most that many copy calls (on a GPU each
// cuMemcpyAsync costs a few microseconds, about what PCIe moves of the 64 KiB
// gap of a 2 MiB granule). Replayed DenseNet121 at 1/4 of its peak copied
// 611 MiB a step this way under the learned policy, 649 with whole pages (LRU
// 675 and 753); ResNet-50 at 1/4 1,067 and 1,080; merging close neighbours
// cost nothing measurable against copying each object alone. Note [Learned
// eviction] ranks pages by what they copy too.
// Free and a new object cannot change the ranges while they copy: a Free
// waits for the move, a new object abandons the eviction (Note [Copies
// outside the lock]), and an evicted page takes no new object.
//
// Residency and pins (Residency): Pin() makes a unit active (a kernel uses
// it) and pages it in first if it was evicted; Unpin() makes it inactive
// again when the count reaches zero. Only inactive units are evicted, least
// recently used first (reclaim_policy.h).
//
// When the device pool cannot cover a request (engine_reclaim.cc):
//   1. take free device-pool granules;
//   2. with defragmentation on, remap granules cached at free address ranges
//      elsewhere (no data moves);
//   3. with LMS on, evict inactive units: copy their bytes to host granules,
//      map those at the same address, return the device granules;
//   4. with LMS on and a request that no kernel holds (Allocate without
//      Hold::kPin), place it in host memory at its address: *born evicted*;
//      the first pin pages it in like any evicted allocation;
//   5. fail with kResourceExhausted and a message naming what was short.
// Without defragmentation, granules cached at a free address range serve
// only allocations placed on that range: that is fragmentation, which
// defragmentation removes without moving a tensor. Before either, a new unit
// whose best-fit range would need step 2 takes a free range whose slots are
// all cached instead, if there is one (PlaceAddressRange): a range costs
// nothing, a remapped granule an unmap and a map.
//
// Note [Mappings within a unit]. A backend may map a run of granules as one
// mapping (CUDA: Note [Device memory in runs]) and unmap only whole ones
// (Backend::MappingAt). Every Map the engine makes covers slots of one unit,
// so each mapping lies within one unit, or, once the unit is freed, within a
// free range whose slots are all cached. Two places could cut one, and both
// keep whole mappings instead: a new unit placed over part of a cached
// mapping first unmaps that mapping whole (TrimCachedMappings; only at the
// unit's two ends, as a mapping is contiguous), and defragmentation takes a
// cached mapping whole (StealCachedGranules). A cut costs a remap, and a
// wait on the host when the mapping's memory was freed so recently that work
// queued before the free may still use it (the new mapping at the same slots
// must wait for the old one to go: Note [Retired mappings]), so placement
// first looks for a range that cuts nothing and holds no retired mapping
// still in use (PlaceWithoutCuts: best fit's with what is in the way held, a
// few times, then, away from a step's frees of moments ago, the far end of
// the largest free range): on a GPU a new unit then never waits for
// the GPU to finish with memory freed or taken back moments ago. Runs pay
// off only in moves, and a model that fits moves nothing, while granules
// mapped one by one serve a freed range's reuse at any size; so the engine
// has the backend map a granule at a time until its first eviction
// (Backend::SetDeviceRuns) and in runs from then on. The POSIX backend maps every
// granule on its own, so neither ever does anything there.
//
// Note [Device pieces cut to units]. A driver that maps only whole pieces
// (driver 580 refused a map at an offset into a handle on an H100: Note
// [Device memory in runs] in cuda_backend.h) would map a unit's device
// memory one granule at a time: 32 cuMemMap, 32 cuMemSetAccess and 32
// cuMemUnmap a 64 MiB tensor each move, the driver's per-handle costs that
// bound a move there. So where the backend keeps mappings whole and maps no
// part of a device piece (Backend::MapsPartsOfRuns), the engine cuts the
// device's pieces itself (DevicePool over RunPool): one granule each until
// its first eviction, as memory mapped a granule at a time serves a freed
// range's reuse at any size (and a model that fits moves nothing), then
// one piece for each unit a Take serves, where consecutive ids none of which
// is taken allow it: a free piece of exactly the unit's size first, else,
// for units of RunPool::kLeastStretch granules or more, such ids in one of
// the few smallest stretches that hold them, the free pieces among them
// released and one cut (Backend::ReleaseRuns; Backend::DefineRuns; the memory
// made at once, Backend::MakeRuns, so that device memory released for a
// moment is taken back before another user of the GPU can take it; the rest
// of the process allocates through LMS, but cuDNN's, NCCL's or another
// process's cudaMalloc would not). Only stretches whose release would wait for
// nothing but LMS's own copies are cut (Backend::ReleaseWaitsOnlyForCopies):
// never one that a retired mapping still in use holds, whose release would
// wait for kernels. Where the ids are too scattered, the unit takes free
// pieces as they are, as host runs do (a longer free piece released for it
// is, of the few shortest, one whose release waits for no kernel, where
// there is one). On the timing model, cutting for
// smaller units cost ResNet-50 and DenseNet121 (many small sizes) more in
// remaking memory than it saved, and asking that the released memory's
// copies be done too left almost nothing to cut
// (docs/decisions/0015-device-pieces-cut-to-units.md). A piece is mapped
// whole, so a unit given one costs one mapping a move, and every mapping
// still lies within one unit (Note [Mappings within a unit]). The memory
// made never exceeds the device's budget: released first, then cut.
//
// Note [Host memory made ahead]. Making pinned host memory is the dearest
// call a move can pay (on an H200, cuMemCreate of 64 MiB of host memory took
// 12.5 ms against a 1.2 ms copy: pinning and zeroing every page), and the
// first evictions of a run pay it, the ones a user watches. So where the
// backend maps part of a host run at its offset (Backend::MapsPartsOfRuns),
// the engine makes EngineOptions::host_ahead_bytes of host memory when it is
// created (MakeHostAhead: runs of at most kHostAheadRunBytes, made by
// Backend::MakeRuns), and the host pool splits those runs among units of any
// size and merges the parts given back (RunPool's splits), so no eviction
// makes memory until more than that is evicted at once. It is made at
// creation, before any kernel or move, so it never competes with a remap for
// the driver (which serialises VMM calls); it stays made for the engine's
// life, counted against the process's pinned budget like any host run. A
// backend that maps whole runs only gets nothing made ahead (a run of no
// request's size would be released and cut again), and memory the backend
// cannot make then (the pinned budget, the machine) is made as evictions
// need it instead.
//
// Note [Writers outside kernels]. Not everything is written by a kernel that
// pins what it writes. tf.data fills a batch on its own threads, TensorFlow
// copies a NumPy array into a buffer it just allocated, a GPU kernel's
// outputs may be allocated on an event thread after the kernel returned:
// each allocates outside any kernel (Hold::kWriter) and writes the memory
// unpinned, for as long as it takes. Evicting such memory while it is being
// written loses every write between the eviction's copy and its remap (a
// tf.data batch came out with up to 700,000 values zero or another
// element's). So an allocation made outside a kernel is *unclaimed*: it is
// never evicted (not on the LRU list, never prefetched) until a pin claims
// it (its first kernel, or one of TensorFlow's pinned copies: the writer has
// handed it over by then) or it is freed. A page holding an unclaimed object
// is not evictable either. An unclaimed allocation evicts other memory to be
// resident (on a GPU, its writer is a copy or a kernel launched from an event
// thread, which should write device memory) only while unclaimed memory
// would then hold at most half the device; beyond that it takes free device
// memory or is born evicted (a tf.data prefetch buffer larger than the
// device must not push out everything kernels use and leave them nothing to
// evict). A small one evicts nothing at all: it goes into a page of
// writers' own, made from free device memory or born evicted (Note [Writer
// pages] in small_pages.h). Only its claiming pin pages a born-evicted one in.
//
// Note [Strict access follows holders]. Strict mode maps evicted memory
// with no access so that a touch nobody pinned is reported. Memory someone
// holds is not such a touch: a unit pinned where it is (larger than the
// device), and an unclaimed allocation placed in host memory, which its
// writer fills unpinned by design (a tf.data batch; a kernel's output the
// device could not hold, AllocateInHostMemory in the adapter). Faulting
// there reported a matmul writing its own output as an unpinned touch, and
// ran the fault handler inside the kernel's compute code (Note [Strict
// mode's own signal stack] in strict_monitor.cc). So an evicted unit that is
// not moving is inaccessible and watched exactly while it has no pin and
// nothing unclaimed (CheckInvariants checks it): MapEvicted maps a held unit
// readable, and every change of its holders ends in FollowHolders.
//
// Note [Evicted tensors unmapped]. Address-stable eviction maps an evicted
// unit's host memory at its address, so that a touch nobody pinned still
// reads its bytes. On a GPU that costs a map and a grant of host memory per
// eviction and an unmap per page-in (on an H200 55 us a piece plus 19 us
// per 2 MiB to grant: half a 64 MiB tensor's copy;
// docs/decisions/0019-perfect-predictions-on-the-gpu-model.md). With
// EngineOptions::unmap_evicted an eviction instead leaves the unit's
// address with nothing mapped (its device mapping retired until its last
// use is done, as a free's is: Backend::UnmapReleased), and its host
// granules are reached only through the pool's window, by its page-in's
// copy. An evicted unit someone touches where it is still maps its host
// memory (Note [Strict access follows holders]): a unit born evicted (its
// writer fills it unpinned, or it is larger than the device and pinned in
// place), and one whose page-in failed and whose kernel reads it in place
// (UndoFailedPin maps it back first). A pin of any other unit pages it in
// before it returns; the engine's own copies through an address
// (CopyToHost, CopyFromHost) map it back first. So a
// touch of an evicted tensor without a pin faults instead of reading host
// memory: on a GPU the CUDA context dies. Strict mode on the emulated
// device reports exactly those touches, and wins where both are asked for.
// CheckInvariants checks that an evicted unit that is not moving maps its
// host memory at its address unless the option is on and nobody may touch
// it there.
//
// Note [Optional requests]. TensorFlow marks some requests optional
// (retry_on_failure off): cuDNN's autotuning tries each algorithm's
// workspace that way, and a convolution asks for its chosen algorithm's
// workspace that way every step, falling back to an algorithm without one
// when refused. Under LMS the device is full of inactive tensors, so an
// optional request that never evicts is always refused: autotuning then
// picks, and TensorFlow caches for the life of the process, the algorithms
// that need no workspace (often several times slower). So an optional
// request evicts as any other, with three limits: it is never born evicted
// (scratch in host memory would be slower than the algorithm without it);
// it never waits for other kernels (the adapter gives it one attempt); and
// within one TensorFlow step (the asking kernel's step id; the last eight
// steps are told apart, so steps that interleave keep their own) optional
// requests evict at most a sixteenth of the device, their victims checked
// against it before any is evicted, so scratch never makes a step copy
// more than that. Victims are what the policy evicts first
// anyway: the least recently used, or the farthest predicted next use.
// Counted: bytes_evicted_for_optional.
//
// Note [Copies outside the lock]. On a backend whose copies are the calling
// thread's own (the emulated device: Backend::CopiesMayRunUnlocked), an
// eviction or a page-in releases the engine's lock while it copies, so
// kernels on other threads allocate, free and pin meanwhile instead of
// waiting for the bytes (they waited 0.6-1.0x the copies' time a step for
// the lock). The units being copied are *moving* (Residency::Move), and
// their granules in transit: the copy's destination is out of its pool and
// mapped nowhere, counted in transit_granules_. While the lock is free:
//   - an evicting unit stays mapped from its device granules, off the LRU
//     list. A pin of it, a new object in its page or a CopyFromHost into it
//     *abandons* the eviction (the device memory may be written after the
//     copy read it): the evictor gives the host granules back and the unit
//     stays resident. A Free of it waits for the move to end, so its device
//     granules go to no other unit while the copy reads them;
//   - a unit paging in is pinned by its pinner and stays mapped from its
//     host granules until the remap. Pin, PinAll, Free and CopyFromHost of
//     it wait for the move to end (moved_), so nothing writes bytes the copy
//     already read, and no second page-in starts (a prefetch takes no
//     pinned unit);
//   - the lock is released only where every record is whole: before a new
//     unit's range is placed (MakeRoomUnlocked), and once a pin is taken;
//     never inside PlaceUnit, Prefetch or the Evict tool, which copy under
//     the lock as the CUDA backend always does;
//   - fork waits for the moves in flight and lets none start (PrepareFork).
// A reclaim whose victims were abandoned or whose room other threads took
// plans again, a bounded number of rounds; one that finds too few inactive
// units while other threads' victims are moving waits for a move to end.
//
// Thread-safety: one mutex guards all state. Copies run under it or, on the
// emulated device, beside it on units marked moving (Note [Copies outside
// the lock]); on a GPU they are enqueued and waited for under it: none is in
// flight on a unit that is not moving while it is free.
// Allocate/Free/Pin/Unpin are the fast paths (engine.cc); small objects
// are in engine_small.cc; eviction and page-in in engine_reclaim.cc;
// CheckInvariants in engine_invariants.cc.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_ENGINE_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_ENGINE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/activity_observer.h"
#include "engine/backend.h"
#include "engine/backing_map.h"
#include "engine/best_fit_arena.h"
#include "engine/device_pool.h"
#include "engine/env_options.h"
#include "engine/learned_policy.h"
#include "engine/mutex.h"
#include "engine/reclaim_policy.h"
#include "engine/residency.h"
#include "engine/run_pool.h"
#include "engine/small_pages.h"
#include "engine/statistics.h"
#include "engine/status.h"
#include "engine/strict_monitor.h"
#include "engine/trace_recorder.h"

namespace lms {

// EngineOptions: engine/env_options.h, beside every default.

// Who holds a new allocation (Allocate).
enum class Hold : uint8_t {
  kNone,    // nobody: inactive, evictable at once (tests and tools)
  kPin,     // its kernel: pinned once, until that kernel unpins it
  kWriter,  // a writer outside any kernel: unclaimed until its first pin or
            // its free (Note [Writers outside kernels])
};

// What Inspect() tells about one live allocation.
struct AllocationInfo {
  uint64_t id = 0;
  uintptr_t address = 0;
  size_t requested_bytes = 0;
  size_t allocated_bytes = 0;
  bool small = false;      // packed in a small-object page
  bool evicted = false;    // its unit (the allocation, or its page) is evicted
  uint32_t pin_count = 0;  // of its unit
  bool unclaimed = false;  // made outside kernels, not yet pinned
  uint64_t unit_id = 0;    // the id Pin returns and Unpin takes
  uintptr_t unit_address = 0;
};

class Engine {
 public:
  // The largest run of host memory made ahead (Note [Host memory made ahead]).
  static constexpr size_t kHostAheadRunBytes = size_t{256} << 20;

  static Status Create(const EngineOptions& options,
                       std::unique_ptr<Backend> backend,
                       std::unique_ptr<Engine>* out);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Returns an address aligned to `alignment` (a power of two; 256 or less
  // for any request, up to the granule for large ones), or nullptr with
  // *status saying why. With Hold::kPin, the allocation's unit starts pinned
  // once, so nothing can evict it before its user unpins it; otherwise a
  // request that finds no device memory may be born evicted (LMS on), and
  // with Hold::kWriter it stays unevictable until its first pin (Note
  // [Writers outside kernels]). *unit_id (if given) receives the id Unpin
  // takes for it (Note [Residency units]). An `optional` request (scratch a
  // kernel can do without: TensorFlow's retry_on_failure off) is never born
  // evicted, and evicts only within its step's allowance (Note [Optional
  // requests]); `step` is the TensorFlow step of the kernel asking.
  // Refused, it counts in num_optional_refused.
  void* Allocate(size_t bytes, Hold hold, Status* status,
                 uint64_t* unit_id = nullptr, size_t alignment = 256, bool optional = false,
                 int64_t step = 0);
  // Hold::kPin or Hold::kNone.
  void* Allocate(size_t bytes, bool pin, Status* status,
                 uint64_t* unit_id = nullptr, size_t alignment = 256) {
    return Allocate(bytes, pin ? Hold::kPin : Hold::kNone, status, unit_id, alignment);
  }

  // `ptr` must be an address Allocate returned and not yet freed.
  Status Free(void* ptr);

  // Pins the unit containing `ptr` (any byte of an allocation, or of a
  // small object's page), paging it in first if it is evicted (a unit larger
  // than the device stays in host memory, pinned there: used in place), and
  // claims the allocation containing `ptr` if it was unclaimed. *unit_id (if given)
  // receives its id, for Unpin.
  Status Pin(const void* ptr, uint64_t* unit_id);
  // Pins each of ptrs[0..count) as Pin does, but pages the evicted units in
  // together (a kernel's inputs: on a GPU one fence, one host wait and one
  // stream order for all of them, and the remaps of one overlap the copies
  // of the others). ids[i] receives the unit id Pin would, or 0 where the
  // pin failed (it holds nothing). Returns kResourceExhausted if the device
  // could not take one of them, else the first other failure, else OK.
  // Pointers into one unit pin it once each.
  Status PinAll(const void* const* ptrs, size_t count, uint64_t* ids);
  // Unpins the unit containing `ptr`. A nonzero `unit_id` must match it, so
  // an unpin never lands on a later unit at a reused address (kNotFound).
  Status Unpin(const void* ptr, uint64_t unit_id);

  // A counter that moves whenever memory may have become available (an
  // unpin to zero or a free). With WaitForRelease, a caller whose request
  // failed while other users held pins can wait for one of them to finish:
  //   uint64_t epoch = engine.ReleaseEpoch();
  //   if (engine.Allocate(...) == nullptr) engine.WaitForRelease(epoch, t);
  uint64_t ReleaseEpoch() const;
  // Returns true once the epoch has moved past `epoch`, false after `timeout`.
  bool WaitForRelease(uint64_t epoch, std::chrono::milliseconds timeout) const;
  // Device bytes that no reclaim can free now: the live bytes of pinned
  // units and the granules of resident units holding an allocation not yet
  // claimed (born evicted or placed in host memory, such an allocation holds
  // no device memory). Lock-free: the value the last change under the lock
  // left, which a release (the epoch above) has always published.
  // KernelPins admits a kernel by it (Note [Kernels admitted by their last
  // set] in kernel_pins.h). Published only once something has asked for it:
  // the first call takes the lock and turns publishing on, so an engine whose
  // kernels are not admitted (the engine alone, LMS off) pays no store on
  // its pins and unpins.
  int64_t HeldBytes() const {
    if (!held_published_.load(std::memory_order_acquire)) StartPublishingHeld();
    return held_bytes_.load(std::memory_order_relaxed);
  }
  // Moves the release epoch, waking WaitForRelease: for a caller whose own
  // release (KernelPins' room for a kernel) may let a waiter go on.
  void NoteReleaseOutside();

  // With the learned policy (and LMS on): pages in, into free device memory
  // only, the evicted units predicted to be used within `lookahead` uses
  // (Note [Learned eviction]); *units receives how many. Does nothing with
  // the LRU policy or while predictions are not trusted.
  Status Prefetch(uint64_t lookahead, uint64_t* units);

  // Evicts inactive units, in the policy's order, until `free_bytes` of
  // device memory are free (or cached at freed ranges, which an allocation
  // takes without evicting), or nothing inactive is left: the moves a helper
  // thread could make ahead of the kernels' requests, so that a request finds
  // room without waiting for evictions (issue 52, item 3; what it would win
  // on a GPU: docs/decisions/0018). Under the lock, as Prefetch. *units
  // receives how many were evicted. Room short of `free_bytes` is no error:
  // the next request evicts what it still needs. Does nothing with LMS off.
  Status EvictAhead(size_t free_bytes, uint64_t* units);

  // Replay's perfect-foresight reference (LearnedPolicy::Foresee): with the
  // learned policy, it is `now` and the unit holding `ptr` is next used at
  // `next_use` (LearnedPolicy::kNever: not again) on the caller's clock.
  // kFailedPrecondition with the LRU policy, kNotFound outside a unit.
  Status Foresee(uint64_t now, const void* ptr, uint64_t next_use);

  // With the learned policy: whether reclaims take its order (on, from the
  // start) or LRU's while it goes on learning, so that one process can set
  // the two orders side by side (benchmarks/policy.py: this machine's step
  // times move by 10-30% between processes). kFailedPrecondition with LRU.
  Status SetLearnedOrder(bool on);
  // Tests only: with the learned policy, every reclaim ranks and sorts
  // every inactive unit instead of walking the order kept up as units
  // change (LearnedPolicy::set_sort_every_reclaim): the reference the kept
  // order is checked against. kFailedPrecondition with LRU.
  Status SortEveryReclaimForTesting();

  // Records every later allocate, free, pin, unpin, eviction and page-in
  // into `path` until StopTrace (Note [Access trace format] in
  // trace_recorder.h), at most `max_bytes` of it. kFailedPrecondition if a
  // trace is already being recorded.
  Status StartTrace(const std::string& path, uint64_t max_bytes);
  // Finishes the file; kFailedPrecondition if no trace is being recorded.
  Status StopTrace(TraceSummary* summary);

  // Counts a kernel's request that its user placed in host memory because
  // the device could not hold it (statistic num_overflow_placements).
  void NoteOverflowPlacement();
  // Counts a wait of `nanos` for other kernels to release memory
  // (statistics num_kernel_waits, time_kernel_waiting_ns and
  // time_longest_kernel_wait_ns).
  void NoteKernelWait(int64_t nanos);

  // Where the engine's reclaims, evictions, page-ins and waits for other
  // threads' moves go as spans (null: nowhere, the default); it must outlive
  // the engine. The TensorFlow adapter sets TensorFlow's profiler
  // (tf_adapter/profiler_events.h).
  void SetActivityObserver(ActivityObserver* observer) {
    observer_.store(observer, std::memory_order_release);
  }
  ActivityObserver* activity_observer() const {
    return observer_.load(std::memory_order_acquire);
  }

  // Evicts the inactive unit holding `ptr` now (tests and tools);
  // kFailedPrecondition if it is pinned, unclaimed or already evicted.
  Status Evict(const void* ptr);

  // Blocks until every copy of an eviction or page-in so far is complete.
  // The backend orders the work of registered queues after those copies (on
  // a GPU, the fenced streams: Note [Stream protocol] in
  // backends/cuda_backend.h); work it does not order (a stream nobody
  // registered) waits here before it touches a unit just evicted or paged
  // in, or memory just allocated (it may be an eviction's source).
  Status WaitForCopies();

  // True if `ptr` lies in the engine's address range: all of its memory,
  // every byte of which may be evicted (host-memory fallbacks lie outside).
  // Lock-free, so callers skip pinning foreign memory cheaply.
  bool Owns(const void* ptr) const {
    const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
    return a >= base_ && a < base_ + slots_ * granule_;
  }

  // Checks every accounting invariant (engine_invariants.cc): granule counts
  // per pool, the cache, the LRU, pages and the statistics. O(slots); for
  // tests and debug builds. kInternal naming the first broken equation.
  Status CheckInvariants() const;

  Status Inspect(const void* ptr, AllocationInfo* info) const;

  // Copies bytes of a live allocation (or of a small object's page) to or
  // from host memory through the backend, for tools and tests on backends
  // whose memory the host cannot touch (Backend::HostCanTouch). No pin is
  // taken: the bytes are read where they are, resident or evicted.
  // kNotFound unless [ptr, ptr + bytes) lies inside one live unit.
  Status CopyToHost(const void* ptr, void* dst, size_t bytes);
  Status CopyFromHost(void* ptr, const void* src, size_t bytes);

  size_t RequestedSize(const void* ptr) const;
  size_t AllocatedSize(const void* ptr) const;
  uint64_t AllocationId(const void* ptr) const;

  Statistics GetStatistics() const;
  void ResetPeaks();

  void SetLmsEnabled(bool enabled);
  bool lms_enabled() const;
  void SetDefragEnabled(bool enabled);
  bool defrag_enabled() const;

  size_t granule_bytes() const { return granule_; }
  size_t small_object_threshold() const { return small_threshold_; }
  size_t device_granules() const { return device_granules_; }
  size_t host_granules() const { return host_granules_; }
  // Device granules taken from the pool (never above device_granules()).
  size_t device_granules_in_use() const;
  size_t cached_granules() const;
  // Live small-object pages, resident or evicted.
  size_t small_pages() const;
  // Strict mode's report (empty unless options.strict).
  std::vector<UnpinnedTouch> UnpinnedTouches() const;
  void ClearUnpinnedTouches();
  const Backend& backend() const { return *backend_; }
  // Whether evictions leave addresses unmapped (Note [Evicted tensors
  // unmapped]): options.unmap_evicted without strict mode.
  bool unmaps_evicted() const { return unmap_evicted_; }
  // Outside the engine's lock: only for what the backend makes thread-safe
  // itself (AddFencedQueue, a CUDA backend's stream registration).
  Backend& backend() { return *backend_; }

  // The fork handlers (engine_fork.cc, Note [Fork] in fork_handlers.h):
  // PrepareFork takes the lock and keeps it across fork(); the After calls
  // carry the backend's memory over and release it, in each process.
  void PrepareFork() LMS_THREAD_ANNOTATION(acquire_capability(mu_));
  void AfterForkInParent() LMS_THREAD_ANNOTATION(release_capability(mu_));
  void AfterForkInChild() LMS_THREAD_ANNOTATION(release_capability(mu_));

 private:
  Engine(const EngineOptions& options, std::unique_ptr<Backend> backend);
  Status Init();
  // Note [Host memory made ahead]; under Init's lock.
  void MakeHostAhead() LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Fast paths (engine.cc).
  void* AllocateLarge(size_t bytes, Hold hold, bool optional, Status* status,
                      uint64_t* unit_id)
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether an optional request for `granules` may evict now (Note
  // [Optional requests]): what free device memory lacks for it is within
  // the step's allowance.
  bool OptionalMayEvict(uint64_t granules) const LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The granules of the step's allowance optional requests have not used.
  uint64_t OptionalAllowanceLeft() const LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PlaceUnit for an optional request that may evict: its reclaims evict at
  // most OptionalAllowanceLeft() granules, under the lock throughout.
  ChunkId PlaceOptionalUnit(uint64_t n, Hold hold, Status* status)
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Places a unit of `n` slots backed by device granules (mapping what the
  // cache does not cover; evicting for them if `may_evict`), tracked as
  // `hold` says (Hold::kWriter: holding one unclaimed allocation); with
  // `may_be_born_evicted`, falls back to host granules when the device has
  // none to give. kNoChunk and *status on failure, with nothing changed.
  // A free address range of n slots for a new unit: best fit's, or a fully
  // cached one when best fit's would need defragmentation.
  ChunkId PlaceAddressRange(uint64_t n) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ChunkId PlaceUnit(uint64_t n, Hold hold, bool may_evict, bool may_be_born_evicted,
                    Status* status) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Status FreeLarge(ChunkId id) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns a unit's slots to the arena: device granules stay cached at the
  // range, host granules go back to the host pool and the slots are unmapped.
  Status ReleaseUnit(ChunkId id) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The unit containing ptr, or kNoChunk.
  ChunkId UnitAt(const void* ptr) const LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pin's part for one pointer, before any page-in: pins unit `c`, the one
  // containing `ptr` (UnitAt; returned, *unit_id its id) and claims what
  // `ptr` names; *page_in says whether the unit must be paged in for the pin
  // to hold. kNoChunk (*unit_id 0, *status kNotFound) if `c` is kNoChunk.
  ChunkId PinPointer(ChunkId c, const void* ptr, uint64_t* unit_id, bool* page_in,
                     Status* status) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A pin whose page-in failed holds nothing: unpinned and counted.
  void UndoFailedPin(ChunkId c, const void* ptr) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With the learned policy, a pin (or unpin) of page `c` at `ptr` is one
  // of the object starting there (LearnedPolicy::ObjectPinned).
  void FollowObjectPin(ChunkId c, const void* ptr, bool pinned)
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Bytes that turn active when the unit is pinned (an allocation's granules,
  // a page's objects).
  int64_t UnitLiveBytes(ChunkId id) const LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t PinUnit(ChunkId id) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether an unclaimed allocation of `granules` may evict to be resident:
  // only while unclaimed memory holds at most half the device with it (Note
  // [Writers outside kernels]).
  bool WriterMayEvict(uint64_t granules) const LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return 2 * (residency_.unclaimed_resident_granules() + granules) <= device_granules_;
  }
  // Claims the unclaimed allocation of unit `id` that contains `ptr` (a
  // small object: that starts at `ptr`), if any (Note [Writers outside
  // kernels]).
  void Claim(ChunkId id, const void* ptr) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t UnpinUnit(ChunkId id) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Notes that unit `id` was used up to now (Residency::Record::last_use).
  void NoteUse(ChunkId id) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    residency_.NoteUse(id, backend_->ReleaseMark());
  }
  // The mark a move or an unmap of unit `id` waits for: its last use, or
  // everything queued so far while a holder may still be using it (a pin
  // other than the caller's own, `pinned_by_caller`, which has queued
  // nothing yet; an unclaimed writer; a kernel whose pin of it was refused
  // and that reads it in place).
  uint64_t UseMark(ChunkId id, bool pinned_by_caller = false) const
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Residency::Record& r = residency_.record(id);
    const bool held = r.unclaimed > 0 || r.read_in_place ||
                      r.pin_count > (pinned_by_caller ? 1u : 0u);
    return held ? backend_->ReleaseMark() : r.last_use;
  }
  uintptr_t SlotAddress(uint64_t slot) const { return base_ + slot * granule_; }
  uint64_t SlotIndex(uintptr_t address) const { return (address - base_) >> granule_shift_; }
  // Every state change ends here (inline: it runs on every allocate and
  // free, where a call and the peaks were a measurable part of a pair).
  void RefreshPoolStatistics() LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    RefreshPoolCounters();
    stats_.UpdatePeaks();
    DebugCheckInvariants();
  }
  // The same after a free: a release only lowers counters, so no peak can
  // move (the debug builds' invariant check verifies every peak >= its
  // counter after each call).
  void RefreshAfterRelease() LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    RefreshPoolCounters();
    DebugCheckInvariants();
  }
  void RefreshPoolCounters() LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    stats_.bytes_reserved = static_cast<int64_t>(device_pool_.in_use() << granule_shift_);
    stats_.host_bytes_in_use = static_cast<int64_t>(host_pool_.in_use() << granule_shift_);
    PublishHeld();
  }
  Status CheckInvariantsLocked() const LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // In debug builds (no NDEBUG: the sanitizer test binaries), aborts with the
  // broken equation after every operation that changes state.
#ifdef NDEBUG
  void DebugCheckInvariants() const LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_) {}
#else
  void DebugCheckInvariants() const LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
#endif
  // Moves the release epoch and wakes waiters, if any.
  void NoteRelease() LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores HeldBytes(): at the end of every state change
  // (RefreshPoolCounters) and at every release (NoteRelease, which an unpin
  // to zero calls without a refresh), once a call on the hot paths.
  void PublishHeld() LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (publish_held_) held_bytes_.store(HeldNow(), std::memory_order_relaxed);
  }
  // HeldBytes' first call: publishing on from now.
  void StartPublishingHeld() const LMS_LOCKS_EXCLUDED(mu_);
  int64_t HeldNow() const LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stats_.bytes_active +
           static_cast<int64_t>(residency_.unclaimed_resident_granules() * granule_);
  }

  // Small objects (engine_small.cc).
  void* AllocateSmall(size_t bytes, Hold hold, bool optional, Status* status,
                      uint64_t* unit_id)
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Status FreeSmall(ChunkId page, const void* ptr) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An object of `units` in a resident page of `size_class` with room that
  // Note [Writer pages] lets a `writer`'s (or a kernel's) object take, or
  // kNoChunk. With `anywhere` (no page of its own could be had), any page
  // with room, a writer's within the bound on unclaimed memory.
  ChunkId PlaceObject(int size_class, uint64_t units, bool writer, bool anywhere)
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static constexpr size_t kCopyGapsPerGranule = 32;
  // The byte ranges (from the page's start) of `page`'s live objects, in
  // order, neighbours closer than granule / kCopyGapsPerGranule merged (Note
  // [Live bytes only]).
  std::vector<ByteRange> LiveRanges(ChunkId page) const LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The bytes of unit `id`'s unclaimed allocations (a page's unclaimed
  // objects, not the page). Walks the page: for the out-of-memory message.
  int64_t UnclaimedBytes(ChunkId id) const LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What moving unit `id` copies: its requested bytes, or a page's ranges.
  struct CopyPlan {
    size_t bytes = 0;
    bool ranges_only = false;
    std::vector<ByteRange> ranges;
  };
  CopyPlan PlanCopy(ChunkId id) const LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies unit `id`'s bytes per `plan` from granules src[] into dst[].
  Status CopyUnit(const CopyPlan& plan, PoolKind dst_pool, const GranuleId* dst,
                  PoolKind src_pool, const GranuleId* src);
  // The object starting at ptr in `page`, or kNoChunk.
  ChunkId SmallObjectAt(ChunkId page, const void* ptr) const
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Creates an empty page for objects of `size_class` (resident, or born
  // evicted if allowed and the device is full) and returns its segment. A
  // page for `hold` kWriter evicts nothing to be resident; one for an
  // optional request evicts within its step's allowance and is never born
  // evicted (Note [Optional requests]).
  Status NewSmallPage(Hold hold, int size_class, uint64_t* segment, bool optional = false)
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases a page with no object and no pin.
  void ReleaseSmallPage(uint64_t segment) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Called when a unit changes residency: a page's free space is offered to
  // new objects only while it is resident.
  void NoteResidencyChange(ChunkId id, bool resident) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Out-of-memory path, eviction and page-in (engine_reclaim.cc).
  // Ensures the device pool holds at least `granules` free granules, by
  // defragmentation and, if `may_evict`, eviction. With `may_unlock` (only
  // where every record is whole) evictions may copy without the lock (Note
  // [Copies outside the lock]).
  Status ObtainDeviceGranules(uint64_t granules, bool may_evict, bool may_unlock)
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Before a new unit of `n` granules is placed: evicts, copying without the
  // lock, until free and cached device granules could cover it, so that
  // PlaceUnit, which holds the lock throughout, rarely evicts itself.
  // Best effort: PlaceUnit's own path reports what is short.
  void MakeRoomUnlocked(uint64_t n) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Device granules a new unit can take without evicting: the free ones,
  // and with defragmentation the cached ones (PlaceUnit takes them at the
  // new range or, defragmenting, from another).
  uint64_t RoomGranules() const LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return device_pool_.free_count() + (defrag_enabled_ ? backing_.cached_count() : 0);
  }
  // Plans a reclaim of `needed` granules by the policy and evicts its
  // victims. False (with *status OK) if the policy found too few inactive
  // granules; *status is the eviction's outcome otherwise.
  bool Reclaim(uint64_t needed, bool may_unlock, Status* status)
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a move may release the lock now: the backend's copies allow it
  // and no fork is waiting for the moves in flight.
  bool MayCopyUnlocked() const LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return backend_->CopiesMayRunUnlocked() && !fork_waiting_;
  }
  // Runs `copies` (which touches no guarded state), without the lock if
  // `unlocked`; the caller calls NoteMovesEnded once the move's units are
  // settled.
  template <typename Copies>
  Status RunCopies(bool unlocked, const Copies& copies) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!unlocked) return copies();
    // Other threads read the pools' counters and check every invariant
    // while the lock is free.
    RefreshPoolStatistics();
    ++moves_in_flight_;
    mu_.Unlock();
    Status s = copies();
    mu_.Lock();
    --moves_in_flight_;
    return s;
  }
  // While other threads' evictions copy, their victims are off the LRU list:
  // a reclaim that found too few waits for one of those moves to end (true)
  // rather than fail; false if none is in flight.
  bool AwaitOtherMoves() LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteMovesEnded() LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until some move ends.
  void AwaitMoveEnd() LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether unit `c` is paging in (with `or_evicting`, or evicting).
  bool Moving(ChunkId c, bool or_evicting) const LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Residency::Move move = residency_.record(c).move;
    return move == Residency::Move::kPagingIn ||
           (or_evicting && move == Residency::Move::kEvicting);
  }
  // UnitAt(ptr), once it is not moving as Moving says (waiting for that):
  // one lookup on the fast paths, which find nothing moving.
  ChunkId SettledUnitAt(const void* ptr, bool or_evicting) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ChunkId c = UnitAt(ptr);
    while (c != kNoChunk && Moving(c, or_evicting)) {
      AwaitMoveEnd();
      c = UnitAt(ptr);
    }
    return c;
  }
  // Takes cached granules back into the device pool, whole mappings at a
  // time, until `granules` are taken or none are cached; returns how many.
  uint64_t StealCachedGranules(uint64_t granules)
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The cached mapping defragmentation takes next, when `need` granules are
  // still wanted (the cache must not be empty).
  void ChooseCachedMapping(uint64_t need, uint64_t* from, uint64_t* count)
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unmaps the cached mappings that hold a slot of the free range
  // [first, first + n) and one outside it, and gives their granules back
  // (Note [Mappings within a unit]).
  Status TrimCachedMappings(uint64_t first, uint64_t n) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a cached mapping holds a slot of [first, first + n) and one
  // outside it; if so, sets *from and *count to one such mapping's slots.
  bool CutsCachedMapping(uint64_t first, uint64_t n, uint64_t* from, uint64_t* count)
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // From the first eviction on, device memory is mapped in runs (Note
  // [Mappings within a unit]).
  void StartDeviceRuns() LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a unit at [first, first + n) would neither cut a cached mapping
  // nor wait to map (Backend::MapsWithoutWait, which polls the GPU first
  // with `poll`); if not, sets *from and *count to the slots in the way, and
  // *waits to true if it was a wait.
  bool RangeIsClear(uint64_t first, uint64_t n, bool poll, uint64_t* from, uint64_t* count,
                    bool* waits) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `c` (n slots, just placed by best fit), or another free range of n slots
  // that is clear (RangeIsClear): best fit's with what is in the way held, a
  // few times, then, if a retired mapping was in the way, the far end of the
  // largest free range (Note [Mappings within a unit]).
  ChunkId PlaceWithoutCuts(ChunkId c, uint64_t n) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unmaps the cached mapping of `count` slots from `first` (every one
  // cached) and gives its granules back to the device pool.
  Status UncacheMapping(uint64_t first, uint64_t count) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts `victims` as one batch: one fence, every copy, one host wait for
  // queued work (not the copies), every remap while the copies run, then
  // the order of later work after them (Note [Stream protocol] in
  // backends/cuda_backend.h). When a remap fails the victims before it are
  // evicted and the rest keep their device granules; when the copies can be
  // neither ordered nor waited for, every victim goes back to its device
  // granules. No granule is lost.
  // With `may_unlock` the copies may run without the lock, and a victim
  // reached meanwhile stays resident (Note [Copies outside the lock]).
  Status EvictChunks(const std::vector<ChunkId>& victims, bool may_unlock)
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Status PageIn(ChunkId id, bool may_unlock) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pages in ids[0..count) (distinct evicted units, each no larger than the
  // device) as one batch: one fence before the copies, one host wait before
  // the remaps and one order of the fenced streams after the copies, not one
  // of each per unit (Note [Stream protocol]). out[i] is ids[i]'s outcome; a
  // unit that failed stays evicted with every byte. If the device cannot
  // hold them all at once, each is paged in alone, in order. With
  // `may_unlock` (the units pinned by the caller) the copies may run without
  // the lock; the units are moving from the start, so no other pin pages
  // them in too.
  void PageInUnits(const ChunkId* ids, size_t count, Status* out, bool may_unlock)
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The snapshot a trace starts with (Note [Access trace format]): every
  // live allocation, then its unit's pins.
  void TraceLiveAllocations() LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One event of the trace being recorded, if any (a null check when none).
  void Trace(TraceEvent event, uintptr_t address, uint64_t bytes, uint64_t unit_id,
             uint8_t flags = 0) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (trace_ != nullptr) {
      trace_->Record(event, address, bytes, unit_id, StrictMonitor::ThreadLabel(), flags);
    }
  }
  // Takes n host granules into *host, or kResourceExhausted naming
  // TF_GPU_HOST_MEM_LIMIT_IN_MB (`what` is the action that needed them).
  Status TakeHostGranules(uint64_t n, const char* what, std::vector<GranuleId>* host)
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes n device granules into out[0..n), which the caller made sure are
  // free, releasing and defining the pieces the pool cut (Note [Device
  // pieces cut to units]).
  void TakeDeviceGranules(uint64_t n, GranuleId* out) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The release check both pools take: runs of `pool` whose release waits
  // for no kernel (Backend::ReleaseWaitsOnlyForCopies).
  RunPool::Releasable ReleaseWaitsOnlyForCopies(PoolKind pool)
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Maps `host` granules at unit `id`'s slots (replacing its device mapping,
  // or onto unmapped slots), in strict mode with no access unless the unit
  // is held (Note [Strict access follows holders]), watching `watched_bytes`
  // of it from before the mapping exists. All or nothing.
  Status MapEvicted(ChunkId id, const GranuleId* host, uint64_t watched_bytes)
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Leaves nothing mapped at evicted unit `id`'s slots (its device mapping
  // retired until the work before `mark` is done) and records `host` as
  // where its bytes are (Note [Evicted tensors unmapped]). All or nothing.
  Status UnmapEvicted(ChunkId id, const GranuleId* host, uint64_t mark)
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Maps evicted unit `id`'s host memory back at its address if its
  // eviction left nothing there, for a touch without a pin the engine knows
  // of (a copy through the address; a kernel reading it in place). Nothing
  // for a unit resident, moving or mapped. All or nothing.
  Status MapEvictedBack(ChunkId id) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether evicted unit `id` must map its host memory at its address:
  // always, unless unmap_evicted_ and nobody may touch it there (Note
  // [Evicted tensors unmapped]). A pin of a unit the device can hold pages
  // it in before it returns: until then it may map nothing.
  bool MapsEvictedAtAddress(ChunkId id) const LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Residency::Record& r = residency_.record(id);
    return !unmap_evicted_ || r.unclaimed > 0 || r.read_in_place ||
           r.granules > device_pool_.capacity();
  }
  // In strict mode, makes evicted unit `id`'s access follow its holders
  // (Note [Strict access follows holders]); nothing for other units.
  void FollowHolders(ChunkId id) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records a unit just mapped from host granules: evicted, counted in the
  // host statistics.
  void NoteEvicted(ChunkId id) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Maps host granules at a new unit's unmapped slots and marks it evicted.
  Status PlaceBornEvicted(ChunkId id) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Maps granules[0..count) at the consecutive slots from `first_slot` and
  // records them in the backing map. All or nothing (backend.h).
  Status MapSlots(uint64_t first_slot, uint64_t count, PoolKind pool,
                  const GranuleId* granules, Access access)
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a failed remap: maps the slots' previous granules back. Returns
  // whether it did; if not, *failure becomes kInternal, and the granules of
  // both remaps may still be mapped at the slots (a driver that failed to
  // unmap them), so the caller gives neither set back to a pool.
  bool RestoreMapping(uint64_t first_slot, uint64_t count, PoolKind pool,
                      const GranuleId* granules, Access access, Status* failure)
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps `n` granules of `pool` out of it for good (stranded_granules_).
  void Strand(PoolKind pool, uint64_t n) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    stranded_granules_[static_cast<int>(pool)] += n;
  }
  Status OutOfMemory(uint64_t granules, const char* what) const
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Status CheckCopyRange(const void* ptr, size_t bytes) const
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Set at any time (SetActivityObserver), read without the lock.
  std::atomic<ActivityObserver*> observer_{nullptr};
  // Immutable after Create: read without the lock.
  const EngineOptions options_;
  const std::unique_ptr<Backend> backend_;
  const size_t granule_;
  const int granule_shift_;
  const size_t small_threshold_;
  const size_t device_granules_;  // the pools' capacities
  const size_t host_granules_;
  uintptr_t base_ = 0;   // set by Init, before the engine is shared
  const uint64_t slots_;
  std::unique_ptr<StrictMonitor> strict_;

  // Mutable, guarded by mu_.
  mutable Mutex mu_;
  mutable std::condition_variable_any released_;
  // Notified when moves end (Note [Copies outside the lock]).
  std::condition_variable_any moved_;
  int moves_in_flight_ LMS_GUARDED_BY(mu_) = 0;
  uint64_t moves_ended_ LMS_GUARDED_BY(mu_) = 0;
  bool fork_waiting_ LMS_GUARDED_BY(mu_) = false;
  // Granules out of their pool as the destination of a copy in flight, by
  // PoolKind (host for evictions, device for page-ins).
  uint64_t transit_granules_[2] LMS_GUARDED_BY(mu_) = {0, 0};
  uint64_t release_epoch_ LMS_GUARDED_BY(mu_) = 0;
  mutable int release_waiters_ LMS_GUARDED_BY(mu_) = 0;
  DevicePool device_pool_ LMS_GUARDED_BY(mu_);
  bool device_runs_ LMS_GUARDED_BY(mu_) = false;  // StartDeviceRuns
  // Backend::KeepsMappingsWhole, asked once.
  bool whole_mappings_ = false;
  RunPool host_pool_ LMS_GUARDED_BY(mu_);  // in runs: few pieces a unit
  BestFitArena arena_ LMS_GUARDED_BY(mu_);
  BackingMap backing_ LMS_GUARDED_BY(mu_);
  Residency residency_ LMS_GUARDED_BY(mu_);
  // Fed only with options_.policy == kLearned.
  LearnedPolicy learned_ LMS_GUARDED_BY(mu_);
  const bool learning_;
  // options_.unmap_evicted, unless strict mode watches evicted memory.
  const bool unmap_evicted_;
  bool learned_order_ LMS_GUARDED_BY(mu_) = true;  // SetLearnedOrder
  SmallPages small_ LMS_GUARDED_BY(mu_);
  bool lms_enabled_ LMS_GUARDED_BY(mu_);
  bool defrag_enabled_ LMS_GUARDED_BY(mu_);
  uint64_t next_allocation_id_ LMS_GUARDED_BY(mu_) = 1;
  Statistics stats_ LMS_GUARDED_BY(mu_);
  // The bytes optional requests evicted in each of the last kOptionalSteps
  // steps that made one (Note [Optional requests]): steps that interleave
  // (two functions at once, eager ops beside one) keep their own counts; the
  // oldest step is forgotten first. optional_current_ is the entry of the
  // request being served.
  static constexpr int kOptionalSteps = 8;
  struct OptionalStep {
    int64_t step = 0;
    int64_t evicted = 0;
  };
  OptionalStep optional_steps_[kOptionalSteps] LMS_GUARDED_BY(mu_);
  int optional_next_ LMS_GUARDED_BY(mu_) = 0;
  int optional_current_ LMS_GUARDED_BY(mu_) = 0;
  // While an optional request places its unit (the lock held throughout,
  // so no other thread's reclaim sees it): the granules its reclaims may
  // still evict. A plan whose victims exceed it evicts nothing.
  static constexpr uint64_t kNoReclaimCap = ~uint64_t{0};
  uint64_t reclaim_cap_granules_ LMS_GUARDED_BY(mu_) = kNoReclaimCap;
  // Granules out of their pool for good, by PoolKind, since they may still
  // be mapped at a slot: host granules whose unmap failed when their unit was
  // freed, and those of a remap whose restore failed (RestoreMapping).
  uint64_t stranded_granules_[2] LMS_GUARDED_BY(mu_) = {0, 0};
  // Granule ids for PlaceUnit, kept to avoid allocating on every call.
  std::vector<GranuleId> scratch_ LMS_GUARDED_BY(mu_);
  // PinAll's unit per pointer and the units it pages in, kept for the same
  // reason (copied before a page-in that may release the lock).
  std::vector<ChunkId> pin_units_ LMS_GUARDED_BY(mu_);
  std::vector<ChunkId> page_ins_ LMS_GUARDED_BY(mu_);
  std::unique_ptr<TraceRecorder> trace_ LMS_GUARDED_BY(mu_);
  // HeldBytes(), stored by PublishHeld under mu_ once publish_held_ is set
  // (held_published_ says so without the lock).
  mutable std::atomic<int64_t> held_bytes_{0};
  mutable bool publish_held_ LMS_GUARDED_BY(mu_) = false;
  mutable std::atomic<bool> held_published_{false};
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_ENGINE_H_
