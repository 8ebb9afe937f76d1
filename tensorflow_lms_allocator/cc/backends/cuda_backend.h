// CudaBackend: the engine's backend on an NVIDIA GPU, over the CUDA virtual
// memory management (VMM) driver API, loaded at run time (cuda_driver.h).
//
// Physical memory: cuMemCreate handles (*pieces*) of one or more granules
// (Note [Device memory in runs]). Device-pool granules are located on the
// device; host-pool granules in pinned host memory
// (HOST_NUMA on the GPU's own node on CUDA 12.2+ drivers, or
// CU_MEM_LOCATION_TYPE_HOST on CUDA 13 drivers that refuse HOST_NUMA: Note
// [Where host memory is made]), which the device reads and writes over
// the bus, so an evicted allocation mapped from the host pool is still
// correct at its address for an unpinned kernel. Every granule is mapped once
// into the pool's *window* (a reserved range of its own, device read/write)
// and, while it backs an allocation, at that allocation's slot too: copies go
// window to window (cuMemcpyAsync on the backend's own non-blocking copy
// stream) and never depend on what is mapped at an allocation's address.
//
// The granule is the larger of the driver's minimum granularity for a device
// and a host allocation, and of the granule the caller asks for (both powers
// of two, so each is a multiple of the other).
//
// The context is the device's primary context, retained for the backend's
// life and shared with TensorFlow; every call makes it current for its own
// duration (ScopedCudaContext) and restores the caller's.
//
// Note [Stream protocol]. Kernels and TensorFlow's own copies run after
// their host-side call returns, so work queued on LMS memory may still run
// after the engine has let go of it: a kernel enqueued while its tensor was
// pinned that runs after the unpin (the OpKernelContext is gone, the work is
// queued); TensorFlow's copies (device-to-host for .numpy(), host-to-device
// into fresh tensors, sends), pinned by the adapter from before their
// enqueue until their done callback (Note [TensorFlow's own copies] in
// tf_adapter/tensorflow_copies.h); and work still queued on a buffer
// TensorFlow freed (it frees on the host when the last reference drops and
// relies on stream order). The streams that carry such work are *fenced
// streams*: TensorFlow's compute, host-to-device, device-to-host and
// device-to-device streams of this device, registered with AddFencedStream
// by the adapter. Every such piece of work was enqueued before a moment the
// engine sees: the unpin that ended its kernel's pins, the claim of a tensor
// written outside kernels, the free of its buffer. The engine takes a mark
// (ReleaseMark) at each of those moments, and a move or an unmap waits for
// the work before its mark only (Note [Epochs of use]), never for
// everything queued.
//   - CopiesAfterUse(mark): the copy stream waits (cuStreamWaitEvent, on the
//     GPU) for the epoch of `mark` on every fenced stream. Every copy issued
//     after it runs after the work queued before the mark, so an eviction
//     copies the bytes a kernel queued before the victim's unpin writes, and
//     a page-in copies the bytes a queued host-to-device copy writes into a
//     tensor born evicted (claimed before its pin). The mark is the latest
//     last use among the units moved; the host does not wait.
//   - HostWait (WaitForCopies): one event recorded on the copy stream and
//     synchronized on the host; skipped when nothing was issued on the copy
//     stream since the last one. It also completes every epoch the copy
//     stream waited for.
//   - A mapping goes only once the epoch of its memory's last use is
//     complete: cuMemUnmap is not stream-ordered (nor cuMemMap/cuMemSetAccess;
//     CUDA's only stream-ordered mapping call, cuMemMapArrayAsync, is for
//     CUDA arrays, not linear memory), so a mapping may go only once no
//     queued work can use it. Until then it is *retired* rather than waited
//     for (Note [Retired mappings]): freed memory (UnmapReleased, whose mark
//     is the epoch open at the free) and an eviction's old device mapping.
//     An unmap with no mark (Unmap, a Map replacing a mapping outside a
//     batch) drains: a fence of everything (CopyStreamAfter(ReleaseMark()))
//     and a HostWait. Copies between windows never need either: windows are
//     never unmapped while the backend lives.
//   - Remap batches: an eviction of a reclaim's victims (one or many) and a
//     page-in of a kernel's inputs (one or many, before the kernel is
//     enqueued) are the same sequence: CopiesAfterUse(mark); every copy of
//     the batch on the copy stream (device->host, or host->device);
//     BeginRemapBatch(mark) = a host wait for the same epoch if it is not
//     known complete (for the old mappings' users, NOT for the copies, which
//     stay in flight), and the open epoch closed if a mark of it was handed
//     out (Note [Epochs of use]); remap every address of the batch (their unmaps skip
//     their own drain); EndRemapBatch = an event on the copy stream after the
//     copies, waited on by EVERY fenced stream. When the epoch is not known
//     complete at BeginRemapBatch, an eviction's remaps are deferred (its old
//     device mappings retired, the host mappings made when they go) and a
//     page-in's Map waits on the host (its kernel touches the address next).
//     Why this is correct:
//       * the unmap of an old mapping follows every access to it (the host
//         waited for the units' last uses, or it was retired until they are
//         complete), including a kernel queued before a victim's unpin and
//         TensorFlow's copy into a tensor born evicted;
//       * the copies follow the same work, so they copy what it wrote;
//       * a copy reads and writes the pools' windows, never the addresses
//         being remapped, so remapping under it changes nothing it sees;
//       * what a copy writes or reads is next touched by work queued after
//         EndRemapBatch: a paged-in tensor by its pinning kernel (enqueued
//         after Pin returns, on its device context's compute stream, which the
//         adapter registered as fenced before it pinned: DeviceRegistry); an
//         evicted tensor's host mapping, or the device granules an eviction
//         gave back, by the next kernel or TensorFlow copy (fenced streams,
//         every one of them waiting for the copy event; TensorFlow orders
//         every other user of fresh memory after its compute stream);
//       * granules a batch frees go back to their pool at once although a
//         copy still reads them: their next user is a copy (later on the same
//         copy stream, so after it) or work on a fenced stream (enqueued
//         after EndRemapBatch, so after it); the host's own copies
//         (CopyToHost/CopyFromHost) HostWait first;
//       * a granule in a pool may still have queued users through a retired
//         mapping: a copy reading or writing it waits on the GPU for that
//         mapping's epoch (Pool::busy_until), the host's own copies on the
//         host, and work on a fenced stream through its new slot is after
//         them on the stream (TensorFlow's order for the memory it reuses:
//         its kernels enqueue on one compute stream, and its copies into
//         fresh memory wait for that stream first);
//       * a later HostWait still covers the copies (copies_in_flight_ stays
//         set), so a drain, or a free that unmaps a tensor, waits for them.
//     With no fenced stream (tests, tools) nothing waits. Before epochs, a
//     batch recorded an event on every fenced stream and waited for all of
//     them: the GPU's whole queue drained before every move, and the copies
//     waited for all of it (docs/decisions/0011-epochs-of-use.md).
// The gap the backend cannot close: work enqueued on a tensor that nobody
// holds (no pin, no unclaimed writer) is after no mark: an eviction may copy
// before it writes, or unmap under it (a write lost, or an illegal-address
// fault that ends the CUDA context). Kernels pin what they touch, and
// TensorFlow's own copies are pinned by the adapter; a kernel whose pin was
// refused (the adapter's last resort under a deadlock) reads that tensor in
// place, and the engine then treats it as used by everything queued from
// then on (Engine::UseMark) and settles its mapping first (SettleMapping).
// Strict mode reports any other touch on the emulated device; a GPU has no
// such check.
// The costs are counted (GetStatistics): fences (epochs closed), host waits,
// copies, bytes.
//
// Note [Epochs of use]. An epoch is a span of host time between two rounds
// of events on the fenced streams. ReleaseMark() is the open epoch's number:
// O(1), no driver call, so the engine takes one at every unpin. A wait for
// mark m first closes epoch m if it is still open (records an event on each
// fenced stream: everything enqueued before is before them) and then waits
// for those events: on the copy stream (CopyStreamAfter) or on the host
// (HostWaitForEpoch). Events are kept in a ring of kEpochRing slots per
// fenced stream; a wait for an epoch the ring no longer holds uses the
// oldest later one it holds (its events are recorded later on every stream,
// so they cover it), and a stream fenced after an epoch closed invalidates
// every slot (the new stream has no event in them). A stream fenced where
// none is also ends the open epoch, with no event: every mark taken before
// is complete and stays so (a mark only ever goes from not done to done).
// Known completion is
// remembered (epoch_done_, and copy_stream_after_ for the copy stream), so a
// move whose units were last used long ago costs no driver call at all. Units a reclaim
// evicts are the ones idle longest (or not needed for longest), so usually
// the only wait left is the copy stream's, on the GPU. A remap batch also
// closes the open epoch if a mark of it was handed out (BeginRemapBatch: one
// event a fenced stream, while the batch records events anyway). Otherwise
// every unit unpinned since the last wait shares one epoch, and the victim
// of a later reclaim, last used many kernels before, waits for every kernel
// queued until its eviction: where the host runs ahead of the GPU, that is a
// host wait for most of the queue: gpu-check-engine's overlap step, kernels
// of 6 ms, waited 70-103 ms a step in two waits on an H100
// (benchmarks/results/gpu-check-engine-h100-overlap.log), 34 and 57 ms on the
// timing model, and there 4.3 ms for each of 18 kernels with this close (the
// GPU's own pace); on a GPU this close has not run.
//
// Note [Retired mappings]. A mapping the engine lets go of while work queued
// before its mark may still use it is left mapped in the driver, *retired*:
// its slots are free in the slot table (or, for an eviction, map the host
// granules in the engine's view, *pending*), and its physical granules go
// back to their pool at once. A VMM handle may be mapped at several
// addresses, so the granules may back another slot meanwhile; nothing
// reaches them through the retired address but the work queued before the
// mark. Each granule remembers the latest mark of a retired mapping of it
// (Pool::busy_until): a copy that reads or writes it waits for that epoch on
// the copy stream (CopiesAfterRetired), the host's own copies wait on the
// host. Retired mappings are unmapped once their epoch is known complete
// (PollEpochs asks the events without waiting: at a remap batch, a free),
// and pending mappings made then. The unmap is the unmap thread's (Note
// [Unmaps on a thread of their own] in unmap_thread.h), unless a pending
// mapping waits for it or the caller needs the slots now; a freed mapping
// whose epoch is already done is retired too and handed to the thread at
// once, so a free makes no driver call on the caller's thread. A retired
// mapping leaves retired_ only once the thread's unmap is taken back
// (ReapUnmaps), and until then everything above holds as for any other. A
// Map or Unmap at a slot a retired mapping still occupies waits for its
// epoch first (usually long complete: the unit was evicted as the one not
// needed for longest), and drops what was pending there. A free there waits
// for nothing: it drops what was pending and leaves the retired mapping to
// its epoch. So neither a free nor an eviction makes the host wait for the
// GPU to reach the memory's last use; a page-in still may, since its kernel
// touches the address as soon as Pin returns. A pending mapping whose map
// fails stays pending, with nothing in the driver (unmade_): the unit's bytes
// are in its host granules, which the engine's copies reach through the
// pool's window, but its address reaches nothing until the map is made, at
// the next remap batch or where the address must be reached (SettleMapping).
// A Map or Unmap there drops it with no driver call.
//
// Note [Copy tickets]. Memory the engine releases (ReleaseRuns: a host run, or
// a device piece it cuts again, Note [Device pieces cut to units] in engine.h)
// leaves the pool's window, and cuMemUnmap is not stream-ordered: no copy may
// still read or write it. Rather than wait for every copy in flight, each
// granule remembers the ticket of the last copy that read or wrote it
// (Pool::copied_in). Copies issued between two events on the copy stream share
// a ticket; the event that ends it is one of a ring of kCopyRing (EndRemapBatch
// records it, and every fenced stream waits for it, as for the batch's copies
// before), and a host wait on the copy stream completes every ticket so far.
// Copies on one stream complete in order, so a ticket is done once its event,
// or a later one, has completed (CopyTicketDone asks without waiting; a ticket
// the ring no longer holds is asked through the oldest it does). A release
// waits on the host for copies only when a copy of its memory may still run.
// The engine releases memory (cuts device pieces, releases host runs) only
// where no retired mapping still in use holds it and its last copy does not
// wait on the GPU for a kernel (ReleaseWaitsOnlyForCopies; an eviction's copy
// waits for its unit's last use, and the unit may be freed before that kernel
// runs: each ring event remembers the epoch the copy stream waited for before
// it, copy_event_after_), when it has a choice: a wait for LMS's own copies is
// short (usually the eviction that freed the memory, about a millisecond for
// 64 MiB), one for kernels is not (on the timing model, waits for retired
// mappings' epochs cost ResNet-50 at 1/4 of its peak 30-40 ms a step; asking
// that the copies be done too left almost no memory to cut, as what is free
// under pressure is what was evicted moments ago).
//
// Note [Device memory in runs]. A remap costs the driver per mapping, not per
// byte (docs/design.md, "Measured on real GPUs"), so a unit should be backed
// by few mappings. cuda.h's cuMemMap maps "bytes of memory represented by
// handle starting from byte offset", offset + size within the handle and
// each a multiple of the granularity, so the device pool is made of large
// pieces (kDevicePieceBytes; under allow_growth, pieces that double from one
// granule, as TensorFlow's BFC allocator grows its regions) and a run of
// consecutive ids of one piece is one cuMemMap at its offset: a unit whose
// granules the pool handed out as one extent (GranulePool) costs one mapping,
// one cuMemSetAccess and one cuMemUnmap a move. The 2 MiB granule stays the
// unit of everything else (addresses, defragmentation, small-object pages).
// cuMemUnmap takes whole mappings only, so a mapping must never be cut: each
// lies within one unit or is wholly cached (Engine's Note [Mappings within a
// unit]); MappingAt tells the engine where a mapping starts and ends, and a
// call that would cut one fails (kInvalidArgument) rather than unmap
// anything. The same comment's parameter list says of offset "currently must
// be zero"; whether this driver maps at an offset is found out once at
// Create by mapping one (ProbeMapAtOffset), and where it does not, every
// device granule is a piece of its own, mapped whole, as host runs are
// (maps_at_offsets()). The engine turns runs off until its first eviction
// (SetDeviceRuns): without moves they buy nothing. Driver 580 refused a
// nonzero offset on an H100, device and host memory alike
// (CUDA_ERROR_NOT_SUPPORTED; driver_timing in
// benchmarks/results/gpu-check-engine-h100-overlap.log), so there every
// device granule is a piece of its own. What a part costs a driver that maps
// one is unmeasured; the fake's timing model charges what a handle of that
// size costs.
//
// Note [Access to mapped memory]. A cuMemMap mapping is reachable only by the
// devices cuMemSetAccess granted, and every new mapping starts with none; peer
// access (cuCtxEnablePeerAccess) does not cover VMM memory. So every Map of a
// slot grants read/write to this device and to each peer GPU TensorFlow named
// that can reach it (a copy between GPUs runs on the sending GPU's stream and
// touches the receiver's memory), again at every remap. TensorFlow names every
// other GPU of the process, whatever the topology, but a device can be granted
// another's memory only over a peer-to-peer path: cuMemSetAccess "is still
// subject to the constraints of cuDeviceCanAccessPeer for cross device
// mappings" (NVIDIA's cuda-samples, vectorAddMMAP) and refuses the whole call
// with CUDA_ERROR_INVALID_DEVICE otherwise (GPUs on PCIe switches of different
// sockets, P2P disabled, different models). One such peer would fail every Map.
// So Create asks cuDeviceCanAccessPeer(peer, this device) for each and grants
// only those it says yes to, as TensorFlow's GpuVirtualMemAllocator and NCCL's
// VMM allocator do (they ask in the other order, this device first; cuda.h's
// order is the accessing device first, and NCCL's maintainers expect the same
// answer both ways in practice: NVIDIA/nccl#1507). A skipped peer loses nothing
// it could have had: its kernels could not touch this device's memory anyway,
// and TensorFlow's copies between the two still work, staged by the driver
// through host memory (CUDA C++ Programming Guide, "Peer-to-Peer Memory Copy":
// with peer access a copy between two devices "no longer needs to be staged
// through the host"). Whether the driver stages a copy whose destination is VMM
// memory the sending device was not granted has not been tried on GPUs without
// P2P here; the fake driver models it so. Skipped peers are said once, on
// stderr, and kept (skipped_peers()). The grant covers host-pool mappings too,
// which any device could reach: an evicted tensor is then reachable by the same
// devices as a resident one. Pool windows are reached by this device's copy
// stream only. A fenced stream may belong to another device's context (the
// sender's streams of such a copy): its event is created in that context
// (cuEventRecord refuses an event of another context; cuStreamWaitEvent takes
// one of any).
//
// Thread-safety: Map, Unmap, copies and pools are called with the engine's
// lock held (thread-compatible, like the POSIX backend). AddFencedStream,
// RemoveFencedStream and the fence itself share the set of fenced streams
// under streams_mu_, because the adapter registers streams from TensorFlow's
// threads. Lock order: the engine's lock, then streams_mu_.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_CUDA_BACKEND_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_CUDA_BACKEND_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda_driver.h"
#include "backends/unmap_thread.h"
#include "engine/backend.h"
#include "engine/mutex.h"

namespace lms {

class CudaBackend : public Backend {
 public:
  // Loads the driver (CudaDriver::Load), initialises it and checks that
  // device `ordinal` supports what LMS needs. kFailedPrecondition naming the
  // GPU, the driver version and the requirement if it does not.
  // `allow_growth`: create device memory as granules are first used
  // (TensorFlow's allow_growth) rather than all of it in CreatePool. Host
  // memory is always created as it is first used. `peer_ordinals`: other
  // devices whose work reads or writes this device's memory (TensorFlow's
  // peer GPUs: a copy between GPUs runs on the sender's streams); every
  // mapping grants read/write to those of them cuDeviceCanAccessPeer says
  // can access this device's memory, as it grants this device, and the
  // others are skipped (skipped_peers(); Note [Access to mapped memory]).
  // kInvalidArgument for a peer ordinal the driver does not know.
  static Status Create(int ordinal, size_t min_granule_bytes, bool allow_growth,
                       std::unique_ptr<CudaBackend>* out,
                       const std::vector<int>& peer_ordinals = {});
  // What Create checks before it takes anything (the driver, the device,
  // VMM and host-located VMM support), without creating a CUDA context: for
  // an error when the user enables LMS rather than at the first op.
  static Status CheckDeviceSupport(int ordinal);
  ~CudaBackend() override;

  const char* Name() const override { return "cuda"; }
  size_t granule_bytes() const override { return granule_; }
  Status ReserveAddressRange(size_t bytes, uintptr_t* base) override;
  void ReleaseAddressRange(uintptr_t base, size_t bytes) override;
  Status CreatePool(PoolKind pool, size_t granules) override;
  void DefineRuns(PoolKind pool, const GranuleRun* runs, size_t count) override;
  void ReleaseRuns(PoolKind pool, const GranuleRun* runs, size_t count) override;
  Status Map(uintptr_t address, PoolKind pool, const GranuleId* ids, size_t count,
             Access access) override;
  Status Unmap(uintptr_t address, size_t count) override;
  // The open epoch (Note [Epochs of use]): work queued on a fenced stream
  // before this call is before the events that close it.
  uint64_t ReleaseMark() const override {
    // Every unpin takes one: written once an epoch, read otherwise.
    if (!open_epoch_marked_.load(std::memory_order_relaxed)) {
      open_epoch_marked_.store(true, std::memory_order_relaxed);
    }
    return epoch_;
  }
  Status UnmapReleased(uintptr_t address, size_t count, uint64_t mark) override;
  Status CopyGranules(PoolKind dst_pool, const GranuleId* dst, PoolKind src_pool,
                      const GranuleId* src, size_t bytes) override;
  Status CopyRanges(PoolKind dst_pool, GranuleId dst, PoolKind src_pool, GranuleId src,
                    const ByteRange* ranges, size_t count) override;
  Status CopiesAfterUse(uint64_t mark) override LMS_LOCKS_EXCLUDED(streams_mu_);
  Status WaitForCopies() override;
  Status BeginRemapBatch(uint64_t mark) override LMS_LOCKS_EXCLUDED(streams_mu_);
  Status EndRemapBatch() override LMS_LOCKS_EXCLUDED(streams_mu_);
  bool HostCanTouch() const override { return false; }
  Status CopyToHost(void* dst, uintptr_t address, size_t bytes) override;
  Status CopyFromHost(uintptr_t address, const void* src, size_t bytes) override;
  BackendStatistics GetStatistics() const override;

  // Registers a stream whose queued work may touch LMS memory (Note [Stream
  // protocol]); registering it twice is harmless. The stream must belong to
  // this device's primary context and stay alive until RemoveFencedStream.
  Status AddFencedStream(cu::CUstream stream) LMS_LOCKS_EXCLUDED(streams_mu_);
  Status AddFencedQueue(void* queue) override {
    return AddFencedStream(static_cast<cu::CUstream>(queue));
  }
  // Unregisters it, after waiting on the host for the work queued on it
  // (the marks taken while it was fenced stay true). Work queued on it
  // during or after the call is not ordered with LMS's moves.
  void RemoveFencedStream(cu::CUstream stream) LMS_LOCKS_EXCLUDED(streams_mu_);
  // Unmaps the retired mappings whose epoch the fenced streams' events say
  // is complete, without waiting (Note [Retired mappings]), as every remap
  // batch and free does. With the engine's lock held, as every other call.
  Status UnmapCompletedRetired();
  Status SettleMapping(uintptr_t address, size_t count) override;
  bool KeepsMappingsWhole() const override { return true; }
  size_t MappingAt(uintptr_t address, uintptr_t* first) override;
  bool MapsWithoutWait(uintptr_t address, size_t count, bool poll) override;
  void SetDeviceRuns(bool on) override { device_runs_ = on; }
  // Whether device memory is mapped in runs at offsets into large pieces
  // (Note [Device memory in runs]): the driver accepted a nonzero offset.
  bool maps_at_offsets() const { return map_at_offset_; }
  // Whether a host run is mapped in parts at their offsets (the driver
  // accepted a nonzero offset into host-located memory too), so that host
  // memory made ahead serves any size (Note [Host memory made ahead] in
  // engine.h).
  bool MapsPartsOfRuns(PoolKind pool) const override { return MapsAtOffsets(pool); }
  Status MakeRuns(PoolKind pool, const GranuleRun* runs, size_t count) override;
  bool ReleaseWaitsOnlyForCopies(PoolKind pool, const GranuleRun* runs, size_t count) override;
  bool MakesPoolAtCreation(PoolKind pool) const override {
    return pool == PoolKind::kDevice && !allow_growth_;
  }
  // The unmap thread ends its calls before fork() and has none in the child
  // (Note [Unmaps on a thread of their own] in unmap_thread.h).
  void PrepareFork() override LMS_NO_THREAD_SAFETY_ANALYSIS;
  void AfterForkInParent() override LMS_NO_THREAD_SAFETY_ANALYSIS;
  void AfterForkInChild() override LMS_NO_THREAD_SAFETY_ANALYSIS;
  // The largest piece of device memory made by one cuMemCreate.
  static constexpr size_t kDevicePieceBytes = size_t{1} << 30;

  const CudaDriver& driver() const { return *driver_; }
  cu::CUcontext context() const { return context_; }
  // "NVIDIA A100-SXM4-40GB (GPU 0), driver 12.2".
  const std::string& description() const { return description_; }
  // Where host memory is made: "HOST_NUMA node 0" or "HOST".
  std::string host_location() const { return LocationName(host_location_); }
  // The peer ordinals Create was given that cannot access this device's
  // memory (cuDeviceCanAccessPeer), in the order given: never granted
  // access (Note [Access to mapped memory]). Empty on a fully connected
  // machine.
  const std::vector<int>& skipped_peers() const { return skipped_peers_; }
  // The devices every mapping of a slot grants read/write: this device
  // first, then the peers that can access its memory.
  std::vector<cu::CUdevice> granted_devices() const {
    std::vector<cu::CUdevice> devices;
    for (const cu::CUmemAccessDesc& a : access_) devices.push_back(a.location.id);
    return devices;
  }
  // Why skipped_peers() are not granted access ("GPU 2 cannot access the
  // memory of ..."), "" if none are: the line Create prints once.
  std::string SkippedPeersMessage() const;

 private:
  // Which location host-pool granules are created at.
  struct HostLocation {
    int type = cu::CU_MEM_LOCATION_TYPE_HOST;
    int id = 0;
  };
  // A pool's memory is in pieces: a granule, or a run of them (the device
  // pool's pieces of up to kDevicePieceBytes; the runs the engine defines
  // for the host pool, DefineRuns), made by one cuMemCreate and mapped whole
  // into the window. At a slot a piece is mapped whole where the driver maps
  // only from offset 0, else in runs of its ids at their offset
  // (MapsAtOffsets; a remap costs the driver per mapping, not per byte).
  struct Pool {
    // Per granule id: the handle of the piece that starts there, 0 until
    // made (and at every other id of a run).
    std::vector<cu::CUmemGenericAllocationHandle> handles;
    // Per granule id: the first id of its piece; at a first id, the piece's
    // length in granules.
    std::vector<GranuleId> piece_start;
    std::vector<uint32_t> piece_length;
    // Per granule id: the latest mark of a retired mapping of it (Note
    // [Retired mappings]): a copy touching it waits for that epoch.
    std::vector<uint64_t> busy_until;
    // Per granule id: the ticket of the last copy that read or wrote it
    // (Note [Copy tickets]); 0 if none.
    std::vector<uint64_t> copied_in;
    cu::CUdeviceptr window = 0;  // the piece at id i is mapped at window + i * granule
  };
  // What backs one slot of a reserved range: the engine's view (mapped,
  // pool, id), whether the driver still maps a retired piece there
  // (`retired`), and whether the engine's mapping waits for that piece to go
  // (`pending`: then `mapped` and `retired` are set; Note [Retired
  // mappings]).
  struct Slot {
    bool mapped = false;
    PoolKind pool = PoolKind::kDevice;
    GranuleId id = 0;
    bool retired = false;
    // Mapped in the engine's view, not yet in the driver: an eviction's new
    // mapping, made once the retired one in its place goes.
    bool pending = false;
    // The mapping (the engine's view: made, or pending) this slot is part
    // of: `head` slots after its first, which records its length in `span`
    // (0 at every other slot). Its ids are consecutive, from the first's.
    uint32_t head = 0;
    uint32_t span = 0;
  };
  // A mapping left in place until the epoch `mark` is complete.
  struct Retired {
    uintptr_t address = 0;
    size_t granules = 0;
    uint64_t mark = 0;
    PoolKind pool = PoolKind::kDevice;  // the piece it maps, from granule `first`
    GranuleId first = 0;
    // Its epoch is done and the unmap thread has its cuMemUnmap (nonzero:
    // the request's ticket; Note [Unmaps on a thread of their own]); `mark`
    // is then 0, done whatever streams are fenced later.
    uint64_t unmap_ticket = 0;
  };

  CudaBackend(std::unique_ptr<CudaDriver> driver, int ordinal);
  // cuInit, the device, its support for VMM and host-located VMM memory, the
  // primary context, the granule, the copy stream (cuda_backend_setup.cc).
  Status Init(size_t min_granule_bytes);
  // cuInit, the device by ordinal and CheckSupport: no context.
  Status InitDevice();
  Status CheckSupport();
  // Sets access_: this device and each of `peer_ordinals` that can access
  // its memory; the others go to skipped_peers_.
  Status GrantPeers(const std::vector<int>& peer_ordinals);
  cu::CUmemAllocationProp AllocationProp(PoolKind pool) const;
  // Note [Where host memory is made]. The device attributes can say host
  // VMM is supported while cuMemCreate at that location still fails (a
  // container without NUMA support; NCCL probes for exactly this). So Init
  // always creates one host granule at each candidate location, in order of
  // preference, and keeps the first the driver accepts: HOST_NUMA on the
  // GPU's own node (CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID; pinned memory near the
  // GPU), then HOST (CUDA 13). None accepted is a clear error at creation,
  // never a failure at the first eviction. A 12.2-12.8 driver cannot report
  // support at all (no attribute 141): the probe is what decides there.
  // Sets host_location_ and granule_ (the largest of `device_granule` and
  // the location's granularity).
  Status ChooseHostLocation(size_t device_granule);
  // Raises *granule to the driver's minimum granularity for `pool`.
  Status Granularity(PoolKind pool, size_t* granule) const;
  static std::string LocationName(const HostLocation& location);
  // kFailedPrecondition naming the GPU, the driver, the requirement and the
  // failed call, for a driver that could not report support.
  Status HostPoolUnsupported(const char* call, cu::CUresult r) const;

  // The slot table entry for `address`, or nullptr outside every range.
  Slot* SlotAt(uintptr_t address);
  bool IsMapped(uintptr_t address) {
    const Slot* slot = SlotAt(address);
    return slot != nullptr && slot->mapped;
  }
  // Reserves a new window for `granules` granules of `pool`, and with
  // `eager` creates them all; all or nothing.
  Status CreateWindow(PoolKind pool, size_t granules, bool eager, Pool* out);
  // Creates the piece starting at `first` (cuMemCreate) and maps it into
  // the window, with no access yet: the caller grants a run of them at once.
  // On failure nothing of it is left.
  Status CreatePiece(PoolKind pool, GranuleId first, Pool* p);
  // Creates the pieces of whichever of ids[0..count) do not exist yet.
  Status EnsureGranules(PoolKind pool, const GranuleId* ids, size_t count);
  // One cuMemcpyAsync on the copy stream, between pool windows, counted.
  Status IssueCopy(PoolKind dst_pool, cu::CUdeviceptr to, PoolKind src_pool,
                   cu::CUdeviceptr from, size_t bytes);
  // Unmaps the piece starting at `first` from the window and releases it
  // (and a host piece's share of the PinnedHostBudget).
  void ReleasePiece(PoolKind kind, Pool* pool, GranuleId first);
  // The slots of the mapping whose first slot is at `address`.
  // (1 if the table says none starts there: a loop over mappings always
  // moves on).
  size_t SpanAt(uintptr_t address) { return std::max<size_t>(SlotAt(address)->span, 1); }
  // How many of ids[0..count) the next mapping of `pool` covers: the rest
  // of a run of consecutive ids of one piece where the pool maps at offsets
  // (one id with device runs off), else the whole piece ids[0] starts (Map
  // checked it is whole).
  size_t NextMapping(PoolKind pool, const GranuleId* ids, size_t count) const;
  bool MapsAtOffsets(PoolKind pool) const {
    return pool == PoolKind::kDevice ? map_at_offset_ : host_map_at_offset_;
  }
  // Records the `length` slots from `address` as one mapping of ids from
  // `first_id` of `pool` (made, or pending).
  void SetMapping(uintptr_t address, size_t length, PoolKind pool, GranuleId first_id,
                  bool pending);
  // kInvalidArgument if a mapping (made or pending) holding one of the
  // `count` slots from `address` extends outside them: cuMemUnmap takes
  // whole mappings only (Note [Device memory in runs]).
  Status CheckWholeMappings(uintptr_t address, size_t count, const char* what);
  // Maps the `length` ids from `first_id` of `pool` at `at`, one cuMemMap
  // (at the ids' offset into their piece), counted.
  cu::CUresult MapRun(uintptr_t at, size_t length, PoolKind pool, GranuleId first_id);
  // Defines the device pool's pieces for `granules` (Note [Device memory in
  // runs]).
  void DefineDevicePieces(size_t granules, Pool* p) const;
  // Whether cuMemMap accepts a nonzero offset into memory of `pool`.
  bool ProbeMapAtOffset(PoolKind pool);
  // Unmaps and releases a window's granules and frees its range.
  // A host window gives its granules back to the process's PinnedHostBudget.
  void DestroyWindow(PoolKind kind, Pool* pool);
  // cuMemUnmap of every mapped slot among `count` from `address`, after a
  // drain unless `drain` is false. Slots it could not unmap stay mapped (and
  // recorded as such).
  Status UnmapSlots(uintptr_t address, size_t count, bool drain = true);
  // Copies between host memory and mapped slots through the windows.
  Status CopyHost(uintptr_t address, size_t bytes, void* to_host, const void* from_host);

  // Stream protocol (cuda_backend_streams.cc).
  // The copy stream waits for every epoch up to `mark` (closing the open
  // one if `mark` is it): what CopiesAfterUse does, and a fence of
  // everything queued so far with ReleaseMark().
  Status CopyStreamAfter(uint64_t mark) LMS_LOCKS_EXCLUDED(streams_mu_);
  Status Fence() LMS_LOCKS_EXCLUDED(streams_mu_) { return CopyStreamAfter(epoch_); }
  // Blocks until every epoch up to `mark` is complete on the fenced streams.
  Status HostWaitForEpoch(uint64_t mark) LMS_LOCKS_EXCLUDED(streams_mu_);
  // The ring slot whose events cover epoch `mark`: closes epochs until
  // `mark` is closed; if the ring no longer holds it, the oldest epoch it
  // holds after it (recorded later on every stream, so it covers `mark`,
  // and of those it waits for the least), or a new one if it holds none.
  // Sets *covered to the epoch the slot holds.
  Status SlotFor(uint64_t mark, size_t* slot, uint64_t* covered)
      LMS_EXCLUSIVE_LOCKS_REQUIRED(streams_mu_);
  // The slot of the oldest epoch at or after `from` the ring holds;
  // kEpochRing if none.
  size_t OldestHeldFrom(uint64_t from) const LMS_EXCLUSIVE_LOCKS_REQUIRED(streams_mu_);
  // Records the open epoch's events on every fenced stream and opens the
  // next.
  Status CloseEpoch() LMS_EXCLUSIVE_LOCKS_REQUIRED(streams_mu_);
  // epoch_done_ takes in done_before_fence_ (called with the engine's lock).
  void LearnDoneBeforeFence() LMS_EXCLUSIVE_LOCKS_REQUIRED(streams_mu_);
  Status HostWait();
  Status Drain();
  // Note [Copy tickets]: whether every copy of ticket `ticket` is known
  // complete, after asking the GPU without waiting; a host wait until it is
  // (its own event where the ring holds it); the ticket whose event the
  // ring holds for `ticket` (it, or the oldest held); the latest ticket of
  // a copy of any granule of `runs`.
  bool CopyTicketDone(uint64_t ticket);
  Status WaitForCopyTicket(uint64_t ticket);
  uint64_t HeldTicket(uint64_t ticket) const;
  // The epoch a wait for ticket `ticket` also waits for: the copy stream
  // waited for it before the ticket's end (0: the ticket is done).
  uint64_t CopyTicketAfter(uint64_t ticket);
  uint64_t LastCopyTicket(PoolKind pool, const GranuleRun* runs, size_t count) const;
  // Notes that a copy of the open ticket reads or writes ids[0..count).
  void Stamp(PoolKind pool, const GranuleId* ids, size_t count) {
    Pool& p = pools_[static_cast<int>(pool)];
    for (size_t i = 0; i < count; ++i) p.copied_in[ids[i]] = copy_ticket_;
  }
  // Whether the retired mapping `r` maps any granule of `runs`.
  bool MapsRetired(PoolKind pool, const GranuleRun* runs, size_t count,
                   const Retired& r) const;
  // Note [Retired mappings] (cuda_backend_streams.cc).
  // Completes epoch_done_ as far as the fenced streams' events already
  // say, without waiting (cuEventQuery), a few epochs at a time.
  void PollEpochs() LMS_LOCKS_EXCLUDED(streams_mu_);
  // Whether every epoch up to `mark` is known complete (PollEpochs learns
  // more); true without fenced streams, where nothing LMS orders can be
  // queued.
  bool EpochDone(uint64_t mark) LMS_LOCKS_EXCLUDED(streams_mu_);
  // EpochDone after one poll of the GPU, unless `polled`: the caller's
  // UnmapRetired just polled (it does whenever a mapping is retired).
  bool EpochDoneAfterPoll(uint64_t mark, bool polled) LMS_LOCKS_EXCLUDED(streams_mu_);
  // Leaves the piece mapped at `address` in place, free in the slot table,
  // until epoch `mark` is complete.
  Status Retire(uintptr_t address, size_t granules, uint64_t mark)
      LMS_LOCKS_EXCLUDED(streams_mu_);
  // Unmaps the retired mappings whose epoch is complete, and makes the
  // pending mappings they were in the way of; with `wait`, also those
  // overlapping [address, address + count slots), after waiting for their
  // epochs, and the pending mappings there are dropped instead (the caller
  // replaces or unmaps those slots) unless `drop_pending` is false. Polls
  // the GPU first (PollEpochs) if any mapping is retired.
  Status UnmapRetired(bool wait = false, uintptr_t address = 0, size_t count = 0,
                      bool drop_pending = true);
  // Map's work; Map then releases the unmaps handed over meanwhile.
  Status MapNow(uintptr_t address, PoolKind pool, const GranuleId* ids, size_t count,
                Access access);
  // Note [Unmaps on a thread of their own]: this thread is about to make VMM
  // calls of its own (memory made or released, a map), which the driver
  // would make wait behind the unmap thread's; it starts none until the next
  // Map ends.
  void PauseUnmaps() {
    if (unmapper_ != nullptr) unmapper_->Pause();
  }
  // Unmaps held for the next Map at most: past this many they go at once.
  static constexpr size_t kMostHeldUnmaps = 256;
  // Note [Unmaps on a thread of their own] (unmap_thread.h): the thread's
  // call, cuMemUnmap in this backend's context.
  Status UnmapOnThread(uintptr_t address, size_t bytes) const;
  // Hands the unmap thread the retired mappings from retired_[from] on whose
  // epoch is done and where nothing is pending (a pending mapping is made
  // once the unmap is: that stays on this thread).
  void QueueUnmaps(size_t from);
  // Takes the unmap thread's finished requests: a retired mapping unmapped
  // leaves retired_ and its slots are free; one whose unmap failed stays,
  // to be unmapped again, and the first failure goes to *status.
  void ReapUnmaps(Status* status);
  // Waits for the unmap thread's request `ticket` (0: none) and reaps.
  Status WaitForUnmap(uint64_t ticket);
  bool AnyPending(uintptr_t address, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      const Slot* slot = SlotAt(address + i * granule_);
      if (slot != nullptr && slot->pending) return true;
    }
    return false;
  }
  // Maps the pending pieces whose slots no retired mapping occupies any
  // more, among the `count` slots from `address`. One whose map fails stays
  // pending, listed in unmade_; the first failure is returned.
  Status MapPending(uintptr_t address, size_t count);
  // MapPending of each mapping in unmade_ still pending; those made or
  // dropped leave the list.
  void RetryUnmadeMappings();
  // Map within a remap batch whose epoch is not complete: the slots'
  // mappings are retired and the new ones left pending (Note [Retired
  // mappings]). False, and nothing done, where that does not apply.
  bool MapDeferred(uintptr_t address, PoolKind pool, const GranuleId* ids, size_t count);
  // Whether a mapping (made or pending) holds one of the `count` slots.
  bool AnyMapped(uintptr_t address, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      if (IsMapped(address + i * granule_)) return true;
    }
    return false;
  }
  bool AnyRetired(uintptr_t address, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      const Slot* slot = SlotAt(address + i * granule_);
      if (slot != nullptr && slot->retired) return true;
    }
    return false;
  }
  // Whether retired mapping `r` holds one of the `count` slots from `address`.
  bool Overlaps(const Retired& r, uintptr_t address, size_t count) const {
    return r.address < address + count * granule_ && address < r.address + r.granules * granule_;
  }
  // Orders the copy stream after the retired mappings of the `count`
  // granules of `pool` from ids (Pool::busy_until).
  Status CopiesAfterRetired(PoolKind pool, const GranuleId* ids, size_t count);

  // Immutable after Create: read without a lock.
  const std::unique_ptr<CudaDriver> driver_;
  const int ordinal_;
  bool allow_growth_ = false;
  cu::CUdevice device_ = 0;
  // This device's and the reachable peers' read/write access, granted to
  // every mapping of a slot (Map); set by GrantPeers. access_[0] is this
  // device.
  std::vector<cu::CUmemAccessDesc> access_;
  // Peers cuDeviceCanAccessPeer refused: never in access_.
  std::vector<int> skipped_peers_;
  cu::CUcontext context_ = nullptr;  // retained primary context
  bool context_retained_ = false;
  size_t granule_ = 0;
  HostLocation host_location_;
  // Where host memory may be made, best first (CheckSupport).
  std::vector<HostLocation> host_candidates_;
  // The driver does not know attribute 141 (before 12.9): host-located VMM
  // support is found out by ChooseHostLocation.
  bool host_support_unreported_ = false;
  // The driver maps part of a device (host) handle at an offset
  // (ProbeMapAtOffset).
  bool map_at_offset_ = false;
  bool host_map_at_offset_ = false;
  // A run of consecutive device ids is one mapping (SetDeviceRuns); else
  // one a granule, each at its offset.
  bool device_runs_ = true;
  cu::CUstream copy_stream_ = nullptr;
  cu::CUevent copies_done_ = nullptr;
  // Note [Copy tickets]: the ring of events that end tickets, the open
  // ticket, the last one whose event was recorded, and every ticket up to
  // copies_done_through_ is complete.
  static constexpr size_t kCopyRing = 16;
  cu::CUevent copy_events_[kCopyRing] = {};
  // The epoch the copy stream waited for (copy_stream_after_) when each
  // ring event was recorded: a wait for that event waits for those kernels.
  uint64_t copy_event_after_[kCopyRing] = {};
  uint64_t copy_ticket_ = 1;
  uint64_t copy_recorded_ = 0;
  uint64_t copies_done_through_ = 0;
  std::string description_;

  // Thread-compatible (the engine's lock serialises these calls).
  Pool pools_[2];
  std::map<uintptr_t, std::vector<Slot>> ranges_;  // reserved base -> slots
  std::vector<Retired> retired_;
  // Note [Unmaps on a thread of their own]: the thread (null before Create
  // ends), and how many of retired_ it has requests for.
  std::unique_ptr<UnmapThread> unmapper_;
  size_t unmaps_queued_ = 0;
  // The first slots of pending mappings whose map failed (MapPending); an
  // entry whose slot is no longer such is dropped at the next try.
  std::vector<uintptr_t> unmade_;
  bool copies_in_flight_ = false;  // a copy was issued since the last wait
  // Between BeginRemapBatch's host wait and EndRemapBatch: unmaps skip their
  // own drain, because that wait followed every access to the batch's
  // addresses (their units' last uses).
  bool remap_batch_drained_ = false;
  // Between BeginRemapBatch and EndRemapBatch: the batch's mark, and whether
  // its host wait is still to come (the epoch was not complete at its
  // start: an eviction's remaps are deferred instead, a page-in's wait).
  uint64_t batch_mark_ = 0;
  bool batch_wait_left_ = false;
  // Epochs (Note [Epochs of use]): the open one, every one up to
  // epoch_done_ is complete, and the copy stream waits for every one up to
  // copy_stream_after_ (so a host wait on the copy stream completes them).
  // Written under streams_mu_ (and, but for AddFencedStream, the engine's
  // lock); ReleaseMark reads it under the engine's lock only.
  std::atomic<uint64_t> epoch_{1};
  // A mark of the open epoch was handed out (ReleaseMark) since it opened:
  // a remap batch closes it (BeginRemapBatch). Set and cleared under the
  // engine's lock; atomic because ReleaseMark is const.
  mutable std::atomic<bool> open_epoch_marked_{false};
  uint64_t epoch_done_ = 0;
  uint64_t copy_stream_after_ = 0;
  BackendStatistics stats_;

  // Closed epochs kept: a move waits for an older one through a later one.
  static constexpr size_t kEpochRing = 64;
  // A fenced stream and its events: one per ring slot.
  struct FencedStream {
    cu::CUstream stream = nullptr;
    std::vector<cu::CUevent> epochs;
  };
  mutable Mutex streams_mu_;
  std::vector<FencedStream> fenced_ LMS_GUARDED_BY(streams_mu_);
  // The epoch each ring slot's events close; 0: none (never recorded, or
  // recorded before a fenced stream joined, so not on every stream).
  uint64_t ring_epoch_[kEpochRing] LMS_GUARDED_BY(streams_mu_) = {};
  // Every epoch up to it was complete when a stream was fenced with none
  // fenced before (AddFencedStream, which has no engine lock to write
  // epoch_done_ under): EpochDone reads it, and the calls that hold both
  // locks fold it into epoch_done_ (LearnDoneBeforeFence).
  uint64_t done_before_fence_ LMS_GUARDED_BY(streams_mu_) = 0;
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_CUDA_BACKEND_H_
