// CudaBackend's memory operations: address ranges, pools and their windows,
// mapping, copies. The stream protocol is in cuda_backend_streams.cc.
//
// Invariants kept here:
//   - ranges_ records exactly the slots cuMemMap mapped and cuMemUnmap has
//     not unmapped, so Map can unmap what it replaces (cuMemMap refuses a
//     mapped range) and a failure never loses track of a mapping;
//   - a mapping at slots maps consecutive ids of one piece: where the driver
//     maps only from offset 0 a whole piece (a host run, a device granule),
//     else any run of a piece's ids at its offset (Note [Device memory in
//     runs]; a part of a host run, Note [Host memory made ahead] in
//     engine.h); the slot table records each (Slot::head, Slot::span), and a
//     slot run is unmapped only whole mappings at a time, so every cuMemUnmap
//     covers whole mappings;
//   - a piece exists (handles[first] != 0) from its first use (Map or a
//     copy; all of the device pool at CreatePool without allow_growth) until
//     ReleaseRuns or the backend's destruction, and is mapped in the pool's
//     window all that time.
#include <algorithm>
#include <cassert>
#include <string>

#include "backends/cuda_backend.h"
#include "backends/cuda_context.h"
#include "backends/pinned_host_budget.h"
#include "engine/scoped_nanos.h"

namespace lms {
namespace {

const char* PoolName(PoolKind pool) {
  return pool == PoolKind::kDevice ? "device" : "host";
}

std::string Hex(uintptr_t address) {
  return FormatAddress(reinterpret_cast<const void*>(address));
}

}  // namespace

Status CudaBackend::ReserveAddressRange(size_t bytes, uintptr_t* base) {
  LMS_CUDA_SCOPE(*driver_, context_);
  cu::CUdeviceptr ptr = 0;
  const cu::CUresult r = driver_->cuMemAddressReserve(&ptr, bytes, granule_, 0, 0);
  if (r != cu::CUDA_SUCCESS) {
    return ResourceExhausted("reserving " + FormatBytes(bytes) + " of GPU address space on " +
                             description_ + " failed: " + driver_->ErrorName(r));
  }
  ranges_[static_cast<uintptr_t>(ptr)].resize(bytes / granule_);
  *base = static_cast<uintptr_t>(ptr);
  return Status::Ok();
}

void CudaBackend::ReleaseAddressRange(uintptr_t base, size_t bytes) {
  ScopedCudaContext scope(*driver_, context_);
  if (!scope.status().ok()) return;
  auto it = ranges_.find(base);
  if (it == ranges_.end()) return;
  // A range whose unmap fails cannot be freed; it stays reserved.
  if (UnmapRetired(/*wait=*/true, base, it->second.size()).ok() &&
      UnmapSlots(base, it->second.size()).ok()) {
    driver_->cuMemAddressFree(base, bytes);
    ranges_.erase(it);
  }
}

CudaBackend::Slot* CudaBackend::SlotAt(uintptr_t address) {
  auto it = ranges_.upper_bound(address);
  if (it == ranges_.begin()) return nullptr;
  --it;
  const uintptr_t index = (address - it->first) / granule_;
  return index < it->second.size() ? &it->second[index] : nullptr;
}

Status CudaBackend::CreatePool(PoolKind pool, size_t granules) {
  LMS_CUDA_SCOPE(*driver_, context_);
  Pool& p = pools_[static_cast<int>(pool)];
  if (!p.handles.empty() || p.window != 0) {
    return Internal(std::string(PoolName(pool)) + " pool created twice");
  }
  // The host pool is pinned memory taken from the machine (64 GiB by
  // default): created piece by piece as evictions need it. So is the
  // device pool under allow_growth; otherwise all of it now, as TensorFlow's
  // BFC allocator takes its whole budget.
  const bool eager = pool == PoolKind::kDevice && !allow_growth_;
  LMS_RETURN_IF_ERROR(CreateWindow(pool, granules, eager, &p));
  if (pool == PoolKind::kHost) PinnedHostBudget::Process().AddPool(granules * granule_);
  return Status::Ok();
}

Status CudaBackend::CreateWindow(PoolKind pool, size_t granules, bool eager, Pool* out) {
  const CudaDriver& d = *driver_;
  Pool p;
  p.handles.assign(granules, 0);
  p.piece_start.resize(granules);
  for (size_t i = 0; i < granules; ++i) p.piece_start[i] = static_cast<GranuleId>(i);
  p.piece_length.assign(granules, 1);
  p.busy_until.assign(granules, 0);
  p.copied_in.assign(granules, 0);
  if (pool == PoolKind::kDevice) DefineDevicePieces(granules, &p);
  Status s = d.Check(d.cuMemAddressReserve(&p.window, granules * granule_, granule_, 0, 0),
                     "cuMemAddressReserve of the " + std::string(PoolName(pool)) +
                         " pool window");
  if (!s.ok()) return s;
  for (size_t i = 0; eager && i < granules && s.ok(); i += p.piece_length[i]) {
    s = CreatePiece(pool, static_cast<GranuleId>(i), &p);
  }
  // One grant for the whole window: cuMemSetAccess is synchronous, and one
  // call per granule was a third of an 80 GiB device's 122,880 calls. Only
  // this device's copy stream reaches a window (access_[0]).
  if (s.ok() && eager && granules > 0) {
    s = d.Check(d.cuMemSetAccess(p.window, granules * granule_, &access_[0], 1),
                "cuMemSetAccess on the " + std::string(PoolName(pool)) + " pool window");
  }
  if (!s.ok()) {
    DestroyWindow(pool, &p);  // all or nothing: the pool does not exist
    return s;
  }
  *out = std::move(p);
  return Status::Ok();
}

Status CudaBackend::CreatePiece(PoolKind pool, GranuleId first, Pool* p) {
  const CudaDriver& d = *driver_;
  const size_t bytes = size_t{p->piece_length[first]} * granule_;
  PinnedHostBudget& budget = PinnedHostBudget::Process();
  if (pool == PoolKind::kHost && !budget.TryTake(bytes)) {
    return ResourceExhausted(
        "no pinned host memory is left for evicted tensors of " + description_ + ": " +
        FormatBytes(budget.used()) + " of the process's " + FormatBytes(budget.limit()) +
        " are made; TF_GPU_HOST_MEM_LIMIT_IN_MB is one budget for every GPU of the "
        "process, split among them (raise it if the machine has the memory)");
  }
  const cu::CUmemAllocationProp prop = AllocationProp(pool);
  cu::CUmemGenericAllocationHandle h = 0;
  Status created = d.Check(d.cuMemCreate(&h, bytes, &prop, 0),
                           "cuMemCreate of " + std::string(PoolName(pool)) + " granule " +
                               std::to_string(first) +
                               (bytes > granule_ ? " and the " +
                                                       std::to_string(bytes / granule_ - 1) +
                                                       " after it (one piece)"
                                                 : "") +
                               " of " + std::to_string(p->handles.size()) + " (" +
                               FormatBytes(granule_) + " each) on " + description_);
  if (!created.ok()) {
    if (pool == PoolKind::kHost) budget.Give(bytes);
    return created;
  }
  const cu::CUdeviceptr at = p->window + size_t{first} * granule_;
  const Status s = d.Check(d.cuMemMap(at, bytes, 0, h, 0),
                           "cuMemMap into the " + std::string(PoolName(pool)) + " pool window");
  if (!s.ok()) {
    d.cuMemRelease(h);
    if (pool == PoolKind::kHost) budget.Give(bytes);
    return s;
  }
  p->handles[first] = h;
  return Status::Ok();
}

Status CudaBackend::EnsureGranules(PoolKind pool, const GranuleId* ids, size_t count) {
  Pool& p = pools_[static_cast<int>(pool)];
  for (size_t i = 0; i < count; ++i) {
    if (ids[i] >= p.handles.size()) {
      return InvalidArgument(std::string(PoolName(pool)) + " granule " +
                             std::to_string(ids[i]) + " does not exist");
    }
  }
  // New pieces that adjoin in the window are granted in one cuMemSetAccess
  // (it is synchronous; a large eviction's first use of host memory took one
  // a granule). A piece exists only once granted.
  ScopedNanos timed(&stats_.create_ns);
  const CudaDriver& d = *driver_;
  for (size_t i = 0; i < count;) {
    std::vector<GranuleId> made;
    GranuleId end = 0;  // one past the last made piece
    Status s;
    for (; i < count; ++i) {
      const GranuleId first = p.piece_start[ids[i]];
      if (!made.empty() && first == made.back()) continue;  // the rest of a piece just made
      if (p.handles[first] != 0) {
        if (made.empty()) continue;
        break;
      }
      if (!made.empty() && first != end) break;
      s = CreatePiece(pool, first, &p);
      if (!s.ok()) break;
      made.push_back(first);
      end = first + p.piece_length[first];
    }
    if (!made.empty()) {
      const size_t bytes = size_t{end - made[0]} * granule_;
      const Status granted = d.Check(
          d.cuMemSetAccess(p.window + size_t{made[0]} * granule_, bytes, &access_[0], 1),
          "cuMemSetAccess on the " + std::string(PoolName(pool)) + " pool window");
      if (!granted.ok()) {
        for (GranuleId first : made) ReleasePiece(pool, &p, first);
        s = granted;
      }
    }
    LMS_RETURN_IF_ERROR(s);
  }
  return Status::Ok();
}

void CudaBackend::ReleasePiece(PoolKind kind, Pool* pool, GranuleId first) {
  const size_t bytes = size_t{pool->piece_length[first]} * granule_;
  driver_->cuMemUnmap(pool->window + size_t{first} * granule_, bytes);
  driver_->cuMemRelease(pool->handles[first]);
  pool->handles[first] = 0;
  if (kind == PoolKind::kHost) PinnedHostBudget::Process().Give(bytes);
}

void CudaBackend::DestroyWindow(PoolKind kind, Pool* pool) {
  for (size_t i = 0; i < pool->handles.size(); ++i) {
    if (pool->handles[i] != 0) ReleasePiece(kind, pool, static_cast<GranuleId>(i));
  }
  if (pool->window != 0) {
    driver_->cuMemAddressFree(pool->window, pool->handles.size() * granule_);
  }
  pool->handles.clear();
  pool->window = 0;
}

void CudaBackend::DefineDevicePieces(size_t granules, Pool* p) const {
  if (!map_at_offset_) return;  // a granule a piece, each mapped whole
  const size_t most = std::max<size_t>(1, kDevicePieceBytes / granule_);
  size_t length = allow_growth_ ? 1 : most;
  for (size_t first = 0; first < granules; first += p->piece_length[first]) {
    const size_t n = std::min({length, most, granules - first});
    for (size_t k = 0; k < n; ++k) p->piece_start[first + k] = static_cast<GranuleId>(first);
    p->piece_length[first] = static_cast<uint32_t>(n);
    if (allow_growth_) length *= 2;  // made at most twice what was used
  }
}

size_t CudaBackend::NextMapping(PoolKind pool, const GranuleId* ids, size_t count) const {
  const Pool& p = pools_[static_cast<int>(pool)];
  if (!MapsAtOffsets(pool)) return p.piece_length[ids[0]];
  if (pool == PoolKind::kDevice && !device_runs_) return 1;
  const GranuleId piece = p.piece_start[ids[0]];
  size_t n = 1;
  while (n < count && ids[n] == ids[0] + n && p.piece_start[ids[n]] == piece) ++n;
  return n;
}

void CudaBackend::SetMapping(uintptr_t address, size_t length, PoolKind pool,
                             GranuleId first_id, bool pending) {
  for (size_t k = 0; k < length; ++k) {
    Slot& slot = *SlotAt(address + k * granule_);
    slot.mapped = true;
    slot.pool = pool;
    slot.id = static_cast<GranuleId>(first_id + k);
    slot.pending = pending;
    slot.head = static_cast<uint32_t>(k);
    slot.span = k == 0 ? static_cast<uint32_t>(length) : 0;
  }
}

cu::CUresult CudaBackend::MapRun(uintptr_t at, size_t length, PoolKind pool,
                                 GranuleId first_id) {
  const Pool& p = pools_[static_cast<int>(pool)];
  const GranuleId piece = p.piece_start[first_id];
  const cu::CUresult r = driver_->cuMemMap(at, length * granule_,
                                           size_t{first_id - piece} * granule_,
                                           p.handles[piece], 0);
  if (r == cu::CUDA_SUCCESS) ++stats_.mappings;
  return r;
}

Status CudaBackend::CheckWholeMappings(uintptr_t address, size_t count, const char* what) {
  const uintptr_t end = address + count * granule_;
  for (size_t i = 0; i < count;) {
    const uintptr_t at = address + i * granule_;
    const Slot* slot = SlotAt(at);
    if (slot == nullptr || !slot->mapped) {
      ++i;
      continue;
    }
    const uintptr_t first = at - size_t{slot->head} * granule_;
    const size_t span = SlotAt(first)->span;
    if (first < address || first + span * granule_ > end) {
      return InvalidArgument(std::string(what) + " " + std::to_string(count) + " slots at " +
                             Hex(address) + " would cut the mapping of " +
                             std::to_string(span) + " slots at " + Hex(first) +
                             ": cuMemUnmap takes whole mappings only");
    }
    i += span - slot->head;
  }
  return Status::Ok();
}

size_t CudaBackend::MappingAt(uintptr_t address, uintptr_t* first) {
  const Slot* slot = SlotAt(address);
  if (slot == nullptr || !slot->mapped) {
    *first = address;
    return 1;
  }
  *first = address - size_t{slot->head} * granule_;
  return SlotAt(*first)->span;
}

void CudaBackend::DefineRuns(PoolKind pool, const GranuleRun* runs, size_t count) {
  Pool& p = pools_[static_cast<int>(pool)];
  for (size_t r = 0; r < count; ++r) {
    // A piece still made there (a ReleaseRuns that could not wait, on a
    // broken context) keeps its shape: a Map of the run then fails naming it,
    // rather than map a handle at a length it does not have.
    bool made = false;
    for (uint32_t i = 0; i < runs[r].length && !made; ++i) {
      made = p.handles[p.piece_start[runs[r].first + i]] != 0;
    }
    if (made) continue;
    for (uint32_t i = 0; i < runs[r].length; ++i) {
      p.piece_start[runs[r].first + i] = runs[r].first;
    }
    p.piece_length[runs[r].first] = runs[r].length;
  }
}

Status CudaBackend::MakeRuns(PoolKind pool, const GranuleRun* runs, size_t count) {
  LMS_CUDA_SCOPE(*driver_, context_);
  PauseUnmaps();
  std::vector<GranuleId> firsts(count);
  for (size_t r = 0; r < count; ++r) firsts[r] = runs[r].first;
  return EnsureGranules(pool, firsts.data(), firsts.size());
}

bool CudaBackend::MapsRetired(PoolKind pool, const GranuleRun* runs, size_t count,
                              const Retired& r) const {
  for (size_t i = 0; i < count; ++i) {
    if (r.pool == pool && r.first < runs[i].first + runs[i].length &&
        runs[i].first < r.first + r.granules) {
      return true;
    }
  }
  return false;
}

bool CudaBackend::ReleaseWaitsOnlyForCopies(PoolKind pool, const GranuleRun* runs, size_t count) {
  ScopedCudaContext scope(*driver_, context_);
  if (!scope.status().ok()) return false;
  // Not if the last copy of the runs still waits on the GPU for a kernel
  // (an eviction's copy after its unit's last use, the unit freed before
  // that kernel ran), or a retired mapping of them is still in use.
  bool polled = false;
  const uint64_t after = CopyTicketAfter(LastCopyTicket(pool, runs, count));
  if (after != 0) {
    if (!EpochDoneAfterPoll(after, polled)) return false;
    polled = true;
  }
  for (const Retired& r : retired_) {
    if (!MapsRetired(pool, runs, count, r)) continue;
    if (!EpochDoneAfterPoll(r.mark, polled)) return false;
    polled = true;
  }
  return true;
}

void CudaBackend::ReleaseRuns(PoolKind pool, const GranuleRun* runs, size_t count) {
  ScopedCudaContext scope(*driver_, context_);
  PauseUnmaps();
  // A free run's last copy (a page-in's, which leaves it in flight) may
  // still read it through the window (Note [Copy tickets]), and a retired
  // mapping may still map it at a freed address (Note [Retired mappings]);
  // nothing else can touch it. Without those waits nothing is released: a
  // copy may be reading it, and the CUDA context is broken anyway.
  if (!scope.status().ok()) return;
  if (!WaitForCopyTicket(LastCopyTicket(pool, runs, count)).ok()) return;
  for (const Retired& r : retired_) {
    if (MapsRetired(pool, runs, count, r) && !EpochDone(r.mark) &&
        !HostWaitForEpoch(r.mark).ok()) {
      return;
    }
  }
  if (!UnmapRetired().ok()) return;
  // A handle goes only once the unmap thread has unmapped it everywhere.
  uint64_t ticket = 0;
  for (const Retired& r : retired_) {
    if (MapsRetired(pool, runs, count, r)) ticket = std::max(ticket, r.unmap_ticket);
  }
  if (!WaitForUnmap(ticket).ok()) return;
  Pool& p = pools_[static_cast<int>(pool)];
  for (size_t r = 0; r < count; ++r) {
    const GranuleId first = runs[r].first;
    if (p.handles[first] != 0) ReleasePiece(pool, &p, first);
    for (uint32_t i = 0; i < runs[r].length; ++i) {
      p.piece_start[first + i] = first + i;
      p.piece_length[first + i] = 1;
    }
  }
}

Status CudaBackend::Map(uintptr_t address, PoolKind pool, const GranuleId* ids,
                        size_t count, Access access) {
  // The unmap thread starts no unmap while this thread maps (a map would
  // wait behind it in the driver); once the maps are made, the unmaps handed
  // over meanwhile run while this thread launches kernels (Note [Unmaps on a
  // thread of their own]).
  PauseUnmaps();
  const Status s = MapNow(address, pool, ids, count, access);
  if (unmapper_ != nullptr) unmapper_->Release();
  return s;
}

Status CudaBackend::MapNow(uintptr_t address, PoolKind pool, const GranuleId* ids,
                           size_t count, Access access) {
  if (access == Access::kNone) {
    return FailedPrecondition(
        "no-access mappings are not possible on a GPU (a kernel touching one "
        "would kill the CUDA context): TF_LMS_STRICT is for the emulated device only");
  }
  LMS_CUDA_SCOPE(*driver_, context_);
  const CudaDriver& d = *driver_;
  const Pool& p = pools_[static_cast<int>(pool)];
  for (size_t i = 0; i < count; ++i) {
    if (SlotAt(address + i * granule_) == nullptr || ids[i] >= p.handles.size()) {
      return InvalidArgument("mapping " + std::string(PoolName(pool)) + " granule " +
                             std::to_string(ids[i]) + " at " +
                             Hex(address + i * granule_) +
                             ": not a slot of a reserved range, or no such granule");
    }
  }
  // Pieces are mapped whole where the pool does not map at offsets (Pool):
  // ids name each from its first granule on.
  for (size_t i = 0; !MapsAtOffsets(pool) && i < count;) {
    const GranuleId first = p.piece_start[ids[i]];
    const size_t length = p.piece_length[first];
    bool whole = ids[i] == first && i + length <= count;
    for (size_t k = 1; whole && k < length; ++k) whole = ids[i + k] == first + k;
    if (!whole) {
      return InvalidArgument("mapping " + std::string(PoolName(pool)) + " granule " +
                             std::to_string(ids[i]) + " at " + Hex(address + i * granule_) +
                             ": part of a piece of " + std::to_string(length) +
                             " granules from granule " + std::to_string(first) +
                             ", which is mapped whole or not at all");
    }
    i += length;
  }
  // Physical memory first (created on first use: CreatePool): a failure
  // here leaves the slots as they were.
  LMS_RETURN_IF_ERROR(EnsureGranules(pool, ids, count));
  if (batch_wait_left_) {
    // A remap batch whose units' last uses are not all done: an eviction's
    // new mappings wait for them (Note [Retired mappings]); anything else
    // (a page-in, whose kernel touches the address next) waits here.
    if (pool == PoolKind::kHost && MapDeferred(address, pool, ids, count)) return Status::Ok();
    LMS_RETURN_IF_ERROR(HostWaitForEpoch(batch_mark_));
    batch_wait_left_ = false;
  }
  // cuMemMap refuses a mapped range: what the slots held goes first.
  Status s = UnmapSlots(address, count);
  ScopedNanos timed(&stats_.map_ns);
  size_t mapped = 0;  // granules
  while (s.ok() && mapped < count) {
    const uintptr_t at = address + mapped * granule_;
    const GranuleId first = ids[mapped];
    const size_t length = NextMapping(pool, ids + mapped, count - mapped);
    s = d.Check(MapRun(at, length, pool, first),
                "cuMemMap of " + std::string(PoolName(pool)) + " granule " +
                    std::to_string(first) +
                    (length > 1 ? " and the " + std::to_string(length - 1) + " after it" : "") +
                    " at " + Hex(at));
    if (!s.ok()) break;
    SetMapping(at, length, pool, first, /*pending=*/false);
    mapped += length;
  }
  if (s.ok()) {
    // New memory has no access, whatever the old mapping of the slot had:
    // this device and every peer are granted again.
    s = d.Check(d.cuMemSetAccess(address, count * granule_, access_.data(), access_.size()),
                "cuMemSetAccess at " + Hex(address));
  }
  if (!s.ok()) {
    // All or nothing (backend.h). The new mappings have no access yet or
    // were never visible to a kernel (the engine had not returned them), so
    // they go without a drain.
    for (size_t i = 0; i < mapped;) {
      const uintptr_t at = address + i * granule_;
      const size_t length = SpanAt(at);
      if (d.cuMemUnmap(at, length * granule_) == cu::CUDA_SUCCESS) {
        for (size_t k = 0; k < length; ++k) *SlotAt(at + k * granule_) = Slot();
      }
      i += length;
    }
  }
  return s;
}

Status CudaBackend::Unmap(uintptr_t address, size_t count) {
  LMS_CUDA_SCOPE(*driver_, context_);
  return UnmapSlots(address, count);
}

Status CudaBackend::UnmapReleased(uintptr_t address, size_t count, uint64_t mark) {
  LMS_CUDA_SCOPE(*driver_, context_);
  // Nothing is queued on freed memory after its free: once the epoch open
  // at the free is complete, nothing queued can still touch the slots.
  // Until then they stay mapped, retired (Note [Retired mappings]).
  //
  // A retired mapping already there (the unit's eviction's, its last use
  // still queued) stays as it is, until its own epoch is done: the free
  // waits for nothing. What was pending there (the eviction's host
  // mapping) is never made: no kernel reached those host granules through
  // this address, and the copy that wrote them is on the copy stream, before
  // any later copy of them. Whole mappings only, pending ones too: a free
  // never cuts one.
  if (AnyMapped(address, count)) {
    LMS_RETURN_IF_ERROR(CheckWholeMappings(address, count, "unmapping"));
  }
  for (size_t i = 0; i < count; ++i) {
    Slot* slot = SlotAt(address + i * granule_);
    if (slot != nullptr && slot->pending) {
      const bool retired = slot->retired;
      *slot = Slot();
      slot->retired = retired;
    }
  }
  // Those whose epoch is done go: one call, one poll of the GPU (if any is
  // retired), enough for `mark` below too.
  const bool polled = !retired_.empty();
  LMS_RETURN_IF_ERROR(UnmapRetired());
  if (!AnyMapped(address, count)) return Status::Ok();
  const bool done = EpochDoneAfterPoll(mark, polled);
  // Done, the unmaps go to the unmap thread (Note [Unmaps on a thread of
  // their own]); they are retired meanwhile, as until the epoch is done.
  if (done && unmapper_ == nullptr) return UnmapSlots(address, count, /*drain=*/false);
  const size_t first_retired = retired_.size();
  for (size_t i = 0; i < count;) {
    const uintptr_t at = address + i * granule_;
    if (!IsMapped(at)) {
      ++i;
      continue;
    }
    const size_t length = SpanAt(at);
    // Done, it is retired with no mark: nothing queued can use it, and
    // later checks read 0 as done without asking the GPU.
    LMS_RETURN_IF_ERROR(Retire(at, length, done ? 0 : mark));
    i += length;
  }
  if (done) QueueUnmaps(first_retired);
  return Status::Ok();
}

Status CudaBackend::UnmapSlots(uintptr_t address, size_t count, bool drain) {
  // A retired mapping still in the way goes first, once its epoch is done;
  // a pending one there is dropped.
  if (AnyRetired(address, count)) {
    LMS_RETURN_IF_ERROR(UnmapRetired(/*wait=*/true, address, count));
  }
  if (!AnyMapped(address, count)) return Status::Ok();
  LMS_RETURN_IF_ERROR(CheckWholeMappings(address, count, "unmapping"));
  // A pending mapping with no retired one in the way was never made (its
  // map failed: MapPending): nothing in the driver to unmap.
  for (size_t i = 0; i < count; ++i) {
    Slot* slot = SlotAt(address + i * granule_);
    if (slot != nullptr && slot->pending && !slot->retired) *slot = Slot();
  }
  if (!AnyMapped(address, count)) return Status::Ok();
  if (drain && !remap_batch_drained_) LMS_RETURN_IF_ERROR(Drain());
  ScopedNanos timed(&stats_.unmap_ns);
  Status status;
  for (size_t i = 0; i < count;) {
    if (!IsMapped(address + i * granule_)) {
      ++i;
      continue;
    }
    size_t run = 1;
    while (i + run < count && IsMapped(address + (i + run) * granule_)) ++run;
    // One cuMemUnmap may cover several whole mappings that adjoin (the CUDA
    // samples' multidevicealloc_memmap unmaps its stripes in one call): one
    // call a run of mapped slots. Fewer calls, not less time: a real driver
    // spends its time per mapping torn down (about 20 us a device granule,
    // 40 a host one on an H200), however the calls group them.
    const uintptr_t at = address + i * granule_;
    size_t mappings = 0;
    for (size_t j = 0; j < run; j += SpanAt(at + j * granule_)) ++mappings;
    if (driver_->cuMemUnmap(at, run * granule_) == cu::CUDA_SUCCESS) {
      for (size_t j = 0; j < run; ++j) *SlotAt(at + j * granule_) = Slot();
      stats_.unmappings += static_cast<int64_t>(mappings);
    } else {
      // Mapping by mapping, so that each slot says whether it is still mapped.
      for (size_t j = 0; j < run;) {
        const uintptr_t g = at + j * granule_;
        const size_t length = SpanAt(g);
        Status s = driver_->Check(driver_->cuMemUnmap(g, length * granule_),
                                  "cuMemUnmap at " + Hex(g));
        if (s.ok()) ++stats_.unmappings;
        for (size_t k = 0; s.ok() && k < length; ++k) *SlotAt(g + k * granule_) = Slot();
        if (!s.ok() && status.ok()) status = s;
        j += length;
      }
    }
    i += run;
  }
  return status;
}

Status CudaBackend::CopyGranules(PoolKind dst_pool, const GranuleId* dst,
                                 PoolKind src_pool, const GranuleId* src, size_t bytes) {
  LMS_CUDA_SCOPE(*driver_, context_);
  PauseUnmaps();  // EnsureGranules may make memory
  const size_t granules = (bytes + granule_ - 1) / granule_;
  LMS_RETURN_IF_ERROR(EnsureGranules(dst_pool, dst, granules));
  LMS_RETURN_IF_ERROR(EnsureGranules(src_pool, src, granules));
  LMS_RETURN_IF_ERROR(CopiesAfterRetired(dst_pool, dst, granules));
  LMS_RETURN_IF_ERROR(CopiesAfterRetired(src_pool, src, granules));
  Stamp(dst_pool, dst, granules);
  Stamp(src_pool, src, granules);
  ScopedNanos timed(&stats_.copy_ns);
  const cu::CUdeviceptr dst_window = pools_[static_cast<int>(dst_pool)].window;
  const cu::CUdeviceptr src_window = pools_[static_cast<int>(src_pool)].window;
  // Consecutive ids on both sides are one copy: windows map ids in order.
  for (size_t i = 0; bytes > 0;) {
    size_t run = 1;
    while (run * granule_ < bytes && dst[i + run] == dst[i] + run &&
           src[i + run] == src[i] + run) {
      ++run;
    }
    const size_t n = std::min(bytes, run * granule_);
    LMS_RETURN_IF_ERROR(IssueCopy(dst_pool, dst_window + size_t{dst[i]} * granule_, src_pool,
                                  src_window + size_t{src[i]} * granule_, n));
    bytes -= n;
    i += run;
  }
  return Status::Ok();
}

Status CudaBackend::CopyRanges(PoolKind dst_pool, GranuleId dst, PoolKind src_pool,
                               GranuleId src, const ByteRange* ranges, size_t count) {
  LMS_CUDA_SCOPE(*driver_, context_);
  PauseUnmaps();  // EnsureGranules may make memory
  LMS_RETURN_IF_ERROR(EnsureGranules(dst_pool, &dst, 1));
  LMS_RETURN_IF_ERROR(EnsureGranules(src_pool, &src, 1));
  LMS_RETURN_IF_ERROR(CopiesAfterRetired(dst_pool, &dst, 1));
  LMS_RETURN_IF_ERROR(CopiesAfterRetired(src_pool, &src, 1));
  Stamp(dst_pool, &dst, 1);
  Stamp(src_pool, &src, 1);
  ScopedNanos timed(&stats_.copy_ns);
  const cu::CUdeviceptr to = pools_[static_cast<int>(dst_pool)].window + size_t{dst} * granule_;
  const cu::CUdeviceptr from =
      pools_[static_cast<int>(src_pool)].window + size_t{src} * granule_;
  for (size_t i = 0; i < count; ++i) {
    assert(ranges[i].offset + ranges[i].bytes <= granule_);
    LMS_RETURN_IF_ERROR(IssueCopy(dst_pool, to + ranges[i].offset, src_pool,
                                  from + ranges[i].offset, ranges[i].bytes));
  }
  return Status::Ok();
}

Status CudaBackend::IssueCopy(PoolKind dst_pool, cu::CUdeviceptr to, PoolKind src_pool,
                              cu::CUdeviceptr from, size_t bytes) {
  LMS_RETURN_IF_ERROR(driver_->Check(
      driver_->cuMemcpyAsync(to, from, bytes, copy_stream_),
      "cuMemcpyAsync of " + FormatBytes(bytes) + " from the " + PoolName(src_pool) +
          " pool to the " + PoolName(dst_pool) + " pool"));
  copies_in_flight_ = true;
  ++stats_.copies;
  stats_.bytes_copied += static_cast<int64_t>(bytes);
  return Status::Ok();
}

Status CudaBackend::CopyToHost(void* dst, uintptr_t address, size_t bytes) {
  return CopyHost(address, bytes, dst, nullptr);
}

Status CudaBackend::CopyFromHost(uintptr_t address, const void* src, size_t bytes) {
  return CopyHost(address, bytes, nullptr, src);
}

Status CudaBackend::CopyHost(uintptr_t address, size_t bytes, void* to_host,
                             const void* from_host) {
  LMS_CUDA_SCOPE(*driver_, context_);
  // An eviction's or a page-in's copies may still be in flight (EndRemapBatch).
  LMS_RETURN_IF_ERROR(HostWait());
  size_t done = 0;
  while (done < bytes) {
    const uintptr_t at = address + done;
    const Slot* slot = SlotAt(at);
    if (slot == nullptr || !slot->mapped) {
      return FailedPrecondition("copying " + FormatBytes(bytes) + " at " + Hex(address) +
                                ": nothing is mapped at " + Hex(at));
    }
    // Work queued on a retired mapping of the granule comes first.
    const uint64_t busy = pools_[static_cast<int>(slot->pool)].busy_until[slot->id];
    if (!EpochDone(busy)) LMS_RETURN_IF_ERROR(HostWaitForEpoch(busy));
    const size_t offset = at % granule_;
    const size_t n = std::min(bytes - done, granule_ - offset);
    const cu::CUdeviceptr window =
        pools_[static_cast<int>(slot->pool)].window + size_t{slot->id} * granule_ + offset;
    const cu::CUresult r =
        to_host != nullptr
            ? driver_->cuMemcpyDtoH(static_cast<char*>(to_host) + done, window, n)
            : driver_->cuMemcpyHtoD(window, static_cast<const char*>(from_host) + done, n);
    LMS_RETURN_IF_ERROR(driver_->Check(
        r, std::string(to_host != nullptr ? "cuMemcpyDtoH" : "cuMemcpyHtoD") + " at " +
               Hex(at)));
    done += n;
  }
  return Status::Ok();
}

BackendStatistics CudaBackend::GetStatistics() const {
  BackendStatistics s = stats_;
  if (unmapper_ != nullptr) s.unmap_ns += unmapper_->busy_ns();  // the unmap thread's calls
  return s;
}

void CudaBackend::PrepareFork() {
  if (unmapper_ != nullptr) unmapper_->PrepareFork();
}

void CudaBackend::AfterForkInParent() {
  if (unmapper_ != nullptr) unmapper_->AfterForkInParent();
}

void CudaBackend::AfterForkInChild() {
  if (unmapper_ != nullptr) unmapper_->AfterForkInChild();
}

}  // namespace lms
