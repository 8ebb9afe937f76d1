// Backend: the physical-memory operations the engine needs, shaped after the
// CUDA virtual memory management API so that both backends fit:
//
//   engine call           POSIX backend                CUDA VMM backend
//   ReserveAddressRange   mmap(PROT_NONE)              cuMemAddressReserve
//   CreatePool            memfd_create + ftruncate     cuMemCreate per piece
//                                                      (device: up to 1 GiB;
//                                                      host: runs, made ahead
//                                                      or on first use)
//   Map                   mmap(MAP_FIXED|MAP_SHARED)   [drain] cuMemMap per run
//                                                      of a piece + cuMemSetAccess
//   Unmap                 mmap(PROT_NONE, MAP_FIXED)   [drain] + cuMemUnmap
//                         (no drain inside a remap batch, whose host wait came first)
//   CopyGranules,         memcpy between pool windows  cuMemcpyAsync on the copy
//   CopyRanges            (without the engine's lock)  stream
//   CopiesAfterUse        nothing (synchronous)        the copy stream waits for
//                                                      the units' last uses (an
//                                                      epoch's events on the
//                                                      fenced streams)
//   WaitForCopies         nothing (synchronous)        event synchronize
//   BeginRemapBatch       nothing (synchronous)        host wait for the units'
//                                                      last uses (usually long
//                                                      done: no call), not the
//                                                      copies; the remaps up to
//                                                      EndRemapBatch skip drains
//   EndRemapBatch         nothing (synchronous)        every fenced stream waits
//                                                      for the copies' event
//
// where "drain" is a fence plus one host wait, so that no queued work still
// uses a mapping when it goes (Note [Stream protocol] in cuda_backend.h).
//
// Granules are identified by (pool, id); ids are dense from 0 to the pool's
// capacity. Every address handed to Map/Unmap is a granule-aligned slot inside
// a reserved range. Copies read and write granules through the backend's own
// view of each pool (a "window"), never through the allocation's address, so
// an eviction or a page-in remaps the address while its copy is in flight.
//
// The CUDA column runs against the fake driver of the tests (tests/fake_cuda)
// and, where a GPU is lent, on it (make gpu-check-engine).
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_BACKEND_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "engine/status.h"

namespace lms {

enum class PoolKind { kDevice = 0, kHost = 1 };
using GranuleId = uint32_t;
// Consecutive granule ids: first, first + 1, ..., first + length - 1.
struct GranuleRun {
  GranuleId first;
  uint32_t length;
};

// How a mapping may be touched. kNone serves strict mode: an evicted range
// that faults on every touch that did not go through a pin.
enum class Access { kReadWrite, kNone };

// Bytes [offset, offset + bytes) of a granule.
struct ByteRange {
  size_t offset = 0;
  size_t bytes = 0;
};

// What a backend's copies and synchronisation have cost so far.
struct BackendStatistics {
  int64_t fences = 0;      // rounds of events on the fenced streams
  int64_t host_waits = 0;  // times the host blocked on the device
  int64_t copies = 0;      // copy calls issued (one per run of granules or range)
  int64_t bytes_copied = 0;
  // Nanoseconds spent in the backend's calls, by kind (ScopedNanos); each
  // call counts in one kind only.
  int64_t copy_ns = 0;    // copying (a GPU: issuing the copies)
  int64_t wait_ns = 0;    // waiting on the host for copies and fenced work
  int64_t fence_ns = 0;   // ordering streams with events, no host wait
  int64_t create_ns = 0;  // making physical memory as granules are first used
  int64_t map_ns = 0;     // mapping granules at addresses, granting access
  int64_t unmap_ns = 0;   // unmapping granules (a GPU: its unmap thread's too)
  // Mappings made at allocation addresses (a GPU: cuMemMap calls, each one
  // driver mapping; POSIX: mmap calls) and unmapped there (a GPU: or handed
  // to its unmap thread, Note [Unmaps on a thread of their own]).
  int64_t mappings = 0;
  int64_t unmappings = 0;
};

// Every call states what it assumes and what holds after it fails, because
// the CUDA driver enforces what POSIX tolerates (docs/design.md, "CUDA VMM rules").
// A failing call never leaves a granule mapped at a slot the engine does not
// know about: that is what lets the engine give granules back to a pool
// after a failure.
class Backend {
 public:
  virtual ~Backend() = default;

  virtual const char* Name() const = 0;
  virtual size_t granule_bytes() const = 0;

  // Reserves `bytes` (a multiple of the granule) of address space, granule
  // aligned, with nothing mapped. On failure nothing is reserved.
  virtual Status ReserveAddressRange(size_t bytes, uintptr_t* base) = 0;
  // Everything mapped in the range must have been unmapped, or the backend
  // unmaps it first.
  virtual void ReleaseAddressRange(uintptr_t base, size_t bytes) = 0;

  // Creates the physical memory of a pool: `granules` granules with ids
  // 0..granules-1. Called once per pool, before any Map of it. On failure
  // the pool does not exist and nothing of it is left allocated.
  virtual Status CreatePool(PoolKind pool, size_t granules) = 0;

  // Runs of a pool (RunPool: the host pool, and the device pool where the
  // engine cuts its pieces to units). From now on each of `runs` is
  // one piece of memory, made whole when a copy or a Map first names any of
  // it (or MakeRuns), and named by every Map whole, or where MapsPartsOfRuns
  // a run of its consecutive ids (a driver's remap costs per piece, not per
  // byte). An id in no run is a piece of its own. Assumes: no id of `runs`
  // is made or mapped. The defaults suit backends whose remaps cost per
  // byte.
  virtual void DefineRuns(PoolKind pool, const GranuleRun* runs, size_t count) {
    (void)pool, (void)runs, (void)count;
  }
  // Whether a Map of `pool` may name part of a run (consecutive ids of it,
  // mapped at their offset into its piece), so that the engine may split a
  // run of memory made once among units of any size (Note [Host memory
  // made ahead], engine.h). Known from creation on.
  virtual bool MapsPartsOfRuns(PoolKind pool) const {
    (void)pool;
    return true;
  }
  // Whether CreatePool made all of `pool`'s memory (CUDA: the device pool
  // without allow_growth), in pieces of one granule where MapsPartsOfRuns is
  // false. The default: memory is made as it is first used.
  virtual bool MakesPoolAtCreation(PoolKind pool) const {
    (void)pool;
    return false;
  }
  // Makes the memory of `runs` (defined, not yet made) now, before any copy
  // or Map names them. On failure some of it may be made: the caller
  // releases them all (ReleaseRuns). The default: kFailedPrecondition, for a
  // backend whose memory costs nothing to make (the POSIX backend's pools
  // are files, their pages made by the first write).
  virtual Status MakeRuns(PoolKind pool, const GranuleRun* runs, size_t count) {
    (void)pool, (void)runs, (void)count;
    return FailedPrecondition(std::string(Name()) + " backend: memory is not made ahead");
  }
  // Gives the memory of `runs` (defined, mapped at no slot) back to the
  // system once no copy issued so far can still use it; their ids are in no
  // run until defined again.
  virtual void ReleaseRuns(PoolKind pool, const GranuleRun* runs, size_t count) {
    (void)pool, (void)runs, (void)count;
  }
  // Whether ReleaseRuns of `runs` would wait on the host for nothing but
  // the backend's own copies (CUDA: no work through a retired mapping of
  // them may still run, asked of the GPU without waiting; Note [Copy
  // tickets] in cuda_backend.h). The default: it never waits.
  virtual bool ReleaseWaitsOnlyForCopies(PoolKind pool, const GranuleRun* runs,
                                         size_t count) {
    (void)pool, (void)runs, (void)count;
    return true;
  }

  // Whether a mapping may span several slots and go only whole, and a Map
  // may wait for queued work (CUDA): then the engine places units so as to
  // spare remaps and waits (Note [Mappings within a unit]); otherwise it
  // skips those checks.
  virtual bool KeepsMappingsWhole() const { return false; }

  // The mapping that holds the mapped slot at `address`: sets *first to the
  // address of its first slot and returns its length in slots. A backend
  // that maps a run of granules as one mapping (CUDA: Note [Device memory in
  // runs]) can unmap only whole mappings, so the engine keeps each within
  // one unit or wholly cached (Note [Mappings within a unit], engine.h), and
  // Map, Unmap and UnmapReleased fail (kInvalidArgument) rather than cut
  // one. The default: every slot is a mapping of its own.
  virtual size_t MappingAt(uintptr_t address, uintptr_t* first) {
    *first = address;
    return 1;
  }

  // Whether Map may make one mapping of a run of consecutive device
  // granules (CUDA: Note [Device memory in runs]) rather than one a granule.
  // On by default where the backend can; the engine keeps it off until its
  // first eviction (Note [Mappings within a unit]). Backends that map every
  // granule alone ignore it.
  virtual void SetDeviceRuns(bool on) { (void)on; }

  // Whether a Map at the `count` slots from `address` would map without a
  // host wait for queued work still using what was mapped there (CUDA: a
  // retired mapping whose epoch is not complete, Note [Retired mappings]).
  // Not for a driver call still to end there (CUDA: an unmap on the unmap
  // thread, Note [Unmaps on a thread of their own]): that would make where a
  // unit goes depend on another thread's timing.
  // The engine places new units elsewhere when it can. With `poll`, the
  // backend first asks the GPU what completed since it last asked (CUDA: a
  // cuEventQuery per fenced stream); a caller asking about many ranges in a
  // row polls for the first only. The default: always.
  virtual bool MapsWithoutWait(uintptr_t address, size_t count, bool poll) {
    (void)address, (void)count, (void)poll;
    return true;
  }

  // Maps ids[0..count) of `pool` at the consecutive slots starting at
  // `address`, replacing whatever mapped those slots.
  // Assumes: the slots lie in a reserved range; each id backs no other slot.
  // A remap is not stream-ordered: a backend with streams waits for queued
  // work on its fenced streams before it replaces a mapping.
  // All or nothing: on failure every one of the `count` slots is left
  // unmapped (reserved, no access), whatever mapped it before; the granules
  // and their bytes are untouched, so the caller may map them again. Unless
  // the driver fails to unmap (the CUDA backend, when its drain or a
  // cuMemUnmap fails): a slot may then still map what mapped it before, or
  // one of ids. A caller that cannot map the previous granules back either
  // gives neither set back to a pool (Engine::RestoreMapping).
  virtual Status Map(uintptr_t address, PoolKind pool, const GranuleId* ids,
                     size_t count, Access access) = 0;

  // Leaves `count` slots from `address` reserved with nothing mapped.
  // Assumes what Map assumes. On failure nothing changed.
  virtual Status Unmap(uintptr_t address, size_t count) = 0;

  // A mark of the device work queued so far: work that may touch LMS memory
  // and was queued before the call is ordered before the mark; a later
  // call's mark is never smaller. The engine takes one at a unit's last use
  // (its last unpin, its claim, its birth) and at a free: what a move or an
  // unmap of that memory must wait for, and no more (Note [Epochs of use]
  // in cuda_backend.h).
  //
  // Unmap of slots whose allocation was freed when ReleaseMark() returned
  // `mark`. Nothing is queued on freed memory after its free (its owner
  // enqueued all its work before letting go of it), so a backend whose
  // unmaps wait for queued work waits only for the work before the mark.
  // The defaults suit backends without streams.
  virtual uint64_t ReleaseMark() const { return 0; }
  virtual Status UnmapReleased(uintptr_t address, size_t count, uint64_t mark) {
    (void)mark;
    return Unmap(address, count);
  }

  // Copies the first `bytes` of the granule sequence src[] (in order, each
  // granule contributing up to granule_bytes()) into dst[]. Asynchronous on
  // backends with streams: see CopiesAfterUse and WaitForCopies.
  // Assumes: nothing writes src[] or touches dst[] until WaitForCopies, or,
  // for work on the fenced queues, until it is ordered after EndRemapBatch.
  // On failure dst[]'s bytes are unspecified and src[]'s are untouched.
  virtual Status CopyGranules(PoolKind dst_pool, const GranuleId* dst,
                              PoolKind src_pool, const GranuleId* src,
                              size_t bytes) = 0;
  // Copies the given byte ranges of granule `src` (each inside it, in
  // increasing order, not overlapping) into the same bytes of granule `dst`:
  // a small-object page's live objects (Note [Live bytes only] in engine.h).
  // As CopyGranules otherwise; bytes outside the ranges are unspecified in
  // `dst`.
  virtual Status CopyRanges(PoolKind dst_pool, GranuleId dst, PoolKind src_pool,
                            GranuleId src, const ByteRange* ranges, size_t count) = 0;

  // Orders the copies issued after this call behind the device work that
  // may touch LMS memory queued before ReleaseMark() returned `mark` (on a
  // GPU: on the fenced streams, Note [Stream protocol] in cuda_backend.h),
  // so an eviction never reads a tensor a kernel still writes, nor a page-in
  // one a queued copy still fills, when `mark` was taken at the last use of
  // what the copies read and write. ReleaseMark() now orders them behind
  // everything queued so far.
  virtual Status CopiesAfterUse(uint64_t mark) = 0;

  // Blocks until every copy issued so far is complete, so the source granules
  // may be unmapped and reused. On failure no copy since the last successful
  // wait may be trusted.
  virtual Status WaitForCopies() = 0;

  // Opens a batch of remaps that follows a batch of copies (an eviction of a
  // reclaim's victims, a page-in of a kernel's inputs) and leaves the copies
  // in flight: blocks until the work queued before `mark` that may touch LMS
  // memory is complete (the old mappings' users, when `mark` was taken at
  // the last use of every address the batch remaps; one host wait for the
  // batch, none when that work is known done), not the copies, which go
  // between the pools' windows and never through an address (a backend may
  // instead defer the remaps that wait, Note [Retired mappings] in
  // cuda_backend.h). The Map and Unmap calls up to EndRemapBatch need no
  // drain of their own. EndRemapBatch then orders every later piece of work on the
  // fenced queues (a pinning kernel, a kernel writing granules an eviction
  // gave back) after the batch's copies, so nothing queued after it reads or
  // writes a granule before its copy is done.
  // Assumes: no copy is issued and no fence taken until EndRemapBatch; nothing
  // the host itself does touches the copies' granules before WaitForCopies.
  // After either call fails, the caller waits for the copies (WaitForCopies)
  // before a granule of the batch is reused or read; when that fails too, no
  // copy of the batch may be trusted.
  virtual Status BeginRemapBatch(uint64_t mark) {
    (void)mark;
    return WaitForCopies();
  }
  virtual Status EndRemapBatch() { return Status::Ok(); }

  // Makes `count` slots from `address` map what the engine last mapped there
  // before anything touches them unpinned: a backend that defers remaps
  // (Note [Retired mappings] in cuda_backend.h) completes them, waiting for
  // what they wait for. The default suits backends that never defer.
  virtual Status SettleMapping(uintptr_t address, size_t count) {
    (void)address;
    (void)count;
    return Status::Ok();
  }

  // Whether CopyGranules and CopyRanges are synchronous copies on the
  // calling thread that may run beside any other call of this backend on
  // granules they do not name: the engine then copies without its lock (Note
  // [Copies outside the lock] in engine.h). False where copies are issued to
  // a stream, whose order with the fences and remap batches the engine's
  // lock keeps.
  virtual bool CopiesMayRunUnlocked() const { return false; }

  // Whether the host may read and write an allocation at its own address.
  // False on a GPU (device memory is never CPU-accessible): tools then go
  // through CopyToHost / CopyFromHost.
  virtual bool HostCanTouch() const { return true; }

  // Copies `bytes` between host memory and the mapped slots from `address`
  // (any byte offset), through the backend's own view of the granules behind
  // them, synchronously. For tools and tests, not for TensorFlow's data path.
  // Assumes: every slot the range touches is mapped. A backend whose copies
  // may still be in flight (a page-in's) waits for them first.
  // kFailedPrecondition naming the slot if one is not mapped.
  virtual Status CopyToHost(void* dst, uintptr_t address, size_t bytes);
  virtual Status CopyFromHost(uintptr_t address, const void* src, size_t bytes);

  // Costs so far. The engine calls it with its lock held.
  virtual BackendStatistics GetStatistics() const { return BackendStatistics(); }

  // A device work queue (a CUstream, as void*) whose queued work may touch
  // this backend's memory: TensorFlow's compute and copy streams. The
  // backend fences every such queue before it copies out of or unmaps
  // memory that queued work may still use. Backends whose memory is touched
  // only synchronously ignore it (the default).
  virtual Status AddFencedQueue(void* /*queue*/) { return Status::Ok(); }

  // fork() (Note [Fork] in engine/fork_handlers.h). The engine calls these
  // from its atfork handlers with its lock held, so no other call runs from
  // PrepareFork (in the parent, before fork) to the After call in each
  // process. fork() cannot fail on their account: PrepareFork keeps any
  // failure to itself, and AfterForkInChild must then leave the child unable
  // to reach the parent's memory (never sharing it). The defaults do
  // nothing, for backends whose memory is private to the process.
  virtual void PrepareFork() {}
  virtual void AfterForkInParent() {}
  virtual void AfterForkInChild() {}
};

inline Status Backend::CopyToHost(void* dst, uintptr_t address, size_t bytes) {
  std::memcpy(dst, reinterpret_cast<const void*>(address), bytes);
  return Status::Ok();
}

inline Status Backend::CopyFromHost(uintptr_t address, const void* src, size_t bytes) {
  std::memcpy(reinterpret_cast<void*>(address), src, bytes);
  return Status::Ok();
}

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_BACKEND_H_
