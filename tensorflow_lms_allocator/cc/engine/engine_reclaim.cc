// The engine's out-of-memory path: finding device granules when the pool is
// empty, eviction, page-in and born-evicted placement.
//
// Invariants kept here:
//   - an evicted unit is always mapped from the host pool at its own
//     address, so an unpinned touch still reads and writes the right bytes
//     (strict mode maps it with no access and reports the touch instead);
//   - every copy is ordered after the device work queued before its units'
//     last uses (CopiesAfterUse), so no byte is lost, not even one queued
//     device work writes after the host let go of it (Note [Stream protocol]
//     and Note [Epochs of use] in backends/cuda_backend.h);
//   - an evicted or paged-in allocation is remapped before its copy
//     completes (the copy goes between the pools' windows, not through the
//     address); whatever touches its granules later is ordered after the
//     copy by EndRemapBatch, or waits for it (WaitForCopies) when that
//     fails. A reclaim or a kernel's page-in waits on the host once, however
//     many units it moves: every copy of the batch is issued before the one
//     BeginRemapBatch;
//   - a granule goes back to its pool only once nothing maps it at a slot
//     (the backend replaced or unmapped the mapping), since cuMemMap refuses
//     a mapped range and the granule may back another slot next;
//   - nothing here moves an address: only the granules behind it change.
#include <algorithm>
#include <cassert>
#include <string>

#include "engine/engine.h"
#include "engine/reclaim_policy.h"
#include "engine/scoped_nanos.h"

namespace lms {

namespace {

// Reclaims that plan again after other threads took the room an eviction
// made, or pinned its victims while they were copied without the lock.
constexpr int kMaxReclaimRounds = 8;

}  // namespace

Status Engine::ObtainDeviceGranules(uint64_t granules, bool may_evict, bool may_unlock) {
  for (int round = 0;; ++round) {
    if (device_pool_.free_count() >= granules) return Status::Ok();
    if (defrag_enabled_ && backing_.cached_count() > 0) {
      const uint64_t stolen =
          StealCachedGranules(granules - device_pool_.free_count());
      ++stats_.num_defragmentations;
      stats_.bytes_defragged += static_cast<int64_t>(stolen * granule_);
      if (device_pool_.free_count() >= granules) return Status::Ok();
    }
    if (!lms_enabled_ || !may_evict || round == kMaxReclaimRounds) break;
    Status evicted;
    if (!Reclaim(granules - device_pool_.free_count(), may_unlock, &evicted)) {
      if (may_unlock && AwaitOtherMoves()) continue;
      break;
    }
    LMS_RETURN_IF_ERROR(evicted);
  }
  return OutOfMemory(granules, "the request");
}

void Engine::MakeRoomUnlocked(uint64_t n) {
  if (!lms_enabled_ || !defrag_enabled_ || !MayCopyUnlocked()) return;
  for (int round = 0; round < kMaxReclaimRounds; ++round) {
    const uint64_t room = RoomGranules();
    if (room >= n) return;
    Status evicted;
    if (!Reclaim(n - room, /*may_unlock=*/true, &evicted)) {
      if (AwaitOtherMoves()) continue;
      return;
    }
    if (!evicted.ok()) return;
  }
}

bool Engine::AwaitOtherMoves() {
  if (moves_in_flight_ == 0) return false;
  AwaitMoveEnd();
  return true;
}

void Engine::AwaitMoveEnd() {
  // Other threads read the pools' counters and check every invariant while
  // the lock is free (as in RunCopies): a page-in just ended may have given
  // host granules back (PageInUnits, one unit at a time).
  RefreshPoolStatistics();
  ScopedNanos timed(&stats_.time_move_waiting_ns);
  ScopedActivity span(activity_observer(), Activity::kMoveWait, 0, 0);
  const uint64_t ended = moves_ended_;
  mu_.Await(moved_, [&]() LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return moves_ended_ != ended; });
}

void Engine::NoteMovesEnded() {
  ++moves_ended_;
  moved_.notify_all();
}

bool Engine::Reclaim(uint64_t needed, bool may_unlock, Status* status) {
  // The span holds the planning and the eviction (its own span, with the
  // victims' bytes); its bytes are the shortage's.
  ScopedActivity span(activity_observer(), Activity::kReclaim, needed * granule_, 0);
  ReclaimPlan plan;
  const bool learned = learning_ && learned_order_ && learned_.trusted();
  bool planned;
  {
    ScopedNanos timed(&stats_.time_planning_ns);
    planned = learned ? learned_.Plan(residency_, small_, needed, &plan)
                      : PlanReclaim(residency_, needed, &plan);
  }
  if (!planned) return false;
  if (reclaim_cap_granules_ != kNoReclaimCap) {
    // An optional request's reclaim (Note [Optional requests]): its victims
    // are whole units, and one may be far larger than what it lacks.
    uint64_t granules = 0;
    for (ChunkId victim : plan.victims) granules += residency_.record(victim).granules;
    if (granules > reclaim_cap_granules_) return false;
    reclaim_cap_granules_ -= granules;
  }
  *status = EvictChunks(plan.victims, may_unlock);
  ++(plan.single ? stats_.num_single_reclaims : stats_.num_full_reclaims);
  if (learned) ++stats_.num_learned_reclaims;
  return true;
}

Status Engine::Foresee(uint64_t now, const void* ptr, uint64_t next_use) {
  MutexLock lock(mu_);
  if (!learning_) return FailedPrecondition("foresight needs the learned policy");
  const ChunkId c = UnitAt(ptr);
  if (c == kNoChunk) {
    return NotFound("foresee of " + FormatAddress(ptr) + ": not inside a live allocation");
  }
  learned_.SetClock(now);
  learned_.Foresee(c, next_use);
  return Status::Ok();
}

Status Engine::SetLearnedOrder(bool on) {
  MutexLock lock(mu_);
  if (!learning_) {
    return FailedPrecondition("the reclaim order can change only under the learned policy "
                              "(TF_LMS_POLICY=learned)");
  }
  learned_order_ = on;
  return Status::Ok();
}

Status Engine::SortEveryReclaimForTesting() {
  MutexLock lock(mu_);
  if (!learning_) return FailedPrecondition("sorting every reclaim needs the learned policy");
  learned_.set_sort_every_reclaim(true);
  return Status::Ok();
}

Status Engine::Prefetch(uint64_t lookahead, uint64_t* units) {
  MutexLock lock(mu_);
  *units = 0;
  if (!learning_ || !lms_enabled_ || !learned_.trusted()) return Status::Ok();
  for (ChunkId c : learned_.DueSoon(residency_, lookahead)) {
    // An unclaimed unit born evicted is being written in host memory: a
    // page-in would lose what its writer writes after the copy.
    if (residency_.record(c).unclaimed > 0) continue;
    if (RoomGranules() < residency_.record(c).granules) break;  // a prefetch never evicts
    // Under the lock: the units due are listed, not pinned.
    LMS_RETURN_IF_ERROR(PageIn(c, /*may_unlock=*/false));
    ++stats_.num_prefetches;
    ++*units;
  }
  RefreshPoolStatistics();
  return Status::Ok();
}

Status Engine::EvictAhead(size_t free_bytes, uint64_t* units) {
  MutexLock lock(mu_);
  *units = 0;
  if (!lms_enabled_) return Status::Ok();
  const uint64_t want = (free_bytes + granule_ - 1) / granule_;
  const int64_t evictions = stats_.num_evictions;
  // What the inactive units can give, if less: a plan for more fails whole.
  // One reclaim does it: under the lock nothing abandons its victims.
  const uint64_t need = std::min(want - std::min(want, RoomGranules()),
                                 residency_.inactive_resident_granules());
  Status s;
  if (need > 0) Reclaim(need, /*may_unlock=*/false, &s);
  *units = static_cast<uint64_t>(stats_.num_evictions - evictions);
  RefreshPoolStatistics();
  return s;
}

uint64_t Engine::StealCachedGranules(uint64_t granules) {
  uint64_t stolen = 0;
  while (stolen < granules && backing_.cached_count() > 0) {
    uint64_t from = 0, count = 0;
    ChooseCachedMapping(granules - stolen, &from, &count);
    if (!UncacheMapping(from, count).ok()) break;
    stolen += count;
  }
  return stolen;
}

void Engine::ChooseCachedMapping(uint64_t need, uint64_t* from, uint64_t* count) {
  if (!whole_mappings_) {  // a granule a mapping: any will do
    *from = backing_.AnyCached();
    *count = 1;
    return;
  }
  // The whole mapping of a cached slot is cached (Note [Mappings within a
  // unit]) and goes whole: the first from the top no larger than `need`,
  // else the smallest of the few looked at, so little more goes than needed.
  constexpr int kLooks = 64;
  *count = 0;
  uint64_t before = ~uint64_t{0}, slot = 0;
  for (int looks = 0; looks < kLooks && backing_.PrevCached(before, &slot); ++looks) {
    uintptr_t start = 0;
    const uint64_t n = backend_->MappingAt(SlotAddress(slot), &start);
    if (*count == 0 || n < *count) {
      *from = SlotIndex(start);
      *count = n;
    }
    if (n <= need) return;
    before = SlotIndex(start);
  }
}

Status Engine::UncacheMapping(uint64_t first, uint64_t count) {
  uint64_t mark = 0;
  for (uint64_t s = first; s < first + count; ++s) {
    assert(backing_.IsCached(s));
    mark = std::max(mark, backing_.release_mark(s));
  }
  LMS_RETURN_IF_ERROR(backend_->UnmapReleased(SlotAddress(first), count, mark));
  for (uint64_t s = first; s < first + count; ++s) {
    const GranuleId g = backing_.at(s).granule;
    backing_.RemoveCached(s);
    backing_.Clear(s);
    device_pool_.Give(g);
  }
  return Status::Ok();
}

bool Engine::CutsCachedMapping(uint64_t first, uint64_t n, uint64_t* from, uint64_t* count) {
  for (const uint64_t s : {first, first + n - 1}) {
    if (!backing_.IsCached(s)) continue;
    uintptr_t start = 0;
    *count = backend_->MappingAt(SlotAddress(s), &start);
    *from = SlotIndex(start);
    if (*from < first || *from + *count > first + n) return true;
  }
  return false;
}

Status Engine::TrimCachedMappings(uint64_t first, uint64_t n) {
  if (!whole_mappings_) return Status::Ok();
  uint64_t from = 0, count = 0;
  while (CutsCachedMapping(first, n, &from, &count)) {
    LMS_RETURN_IF_ERROR(UncacheMapping(from, count));
  }
  return Status::Ok();
}

bool Engine::RangeIsClear(uint64_t first, uint64_t n, bool poll, uint64_t* from,
                          uint64_t* count, bool* waits) {
  if (CutsCachedMapping(first, n, from, count)) return false;
  if (backend_->MapsWithoutWait(SlotAddress(first), n, poll)) return true;
  *from = first;
  *count = n;
  *waits = true;
  return false;
}

ChunkId Engine::PlaceWithoutCuts(ChunkId c, uint64_t n) {
  if (!whole_mappings_) return c;
  uint64_t from = 0, count = 0;
  bool waits = false;  // a range tried would wait for a retired mapping
  // One poll of the GPU for every range tried: they are tried within
  // microseconds of each other.
  if (RangeIsClear(arena_.chunk(c).start, n, /*poll=*/true, &from, &count, &waits)) return c;
  // Best fit again with what is in the way held, a few times: a range that
  // cuts nothing keeps a cached mapping whole for a unit of its size, and
  // one without retired mappings maps without a wait.
  constexpr int kTries = 32;
  ChunkId held[kTries];
  int holds = 0;
  ChunkId placed = kNoChunk;
  arena_.Free(c);
  while (holds < kTries) {
    const ChunkId h = arena_.AllocateAt(from, count);
    if (h == kNoChunk) break;  // not free: cannot happen for free or cached slots
    held[holds++] = h;
    const ChunkId d = arena_.Allocate(n);
    if (d == kNoChunk) break;
    if (RangeIsClear(arena_.chunk(d).start, n, /*poll=*/false, &from, &count, &waits)) {
      placed = d;
      break;
    }
    arena_.Free(d);
  }
  if (placed == kNoChunk && waits) {
    // Frees moments ago fill the best fits (a step's small tensors, freed
    // while the GPU is still behind): the far end of the largest free range
    // was mapped longest ago, or never. (Ranges that would only cut cached
    // mappings cost a remap, not a wait: best fit's is taken below.)
    placed = arena_.AllocateAtEndOfLargest(n);
    if (placed != kNoChunk &&
        !RangeIsClear(arena_.chunk(placed).start, n, /*poll=*/false, &from, &count, &waits)) {
      arena_.Free(placed);
      placed = kNoChunk;
    }
  }
  for (int i = 0; i < holds; ++i) arena_.Free(held[i]);
  if (placed != kNoChunk) {
    ++stats_.num_cut_mappings_avoided;
    return placed;
  }
  // None found: best fit's range, whose placement unmaps a cut mapping and
  // whose Map waits for a retired one.
  return arena_.Allocate(n);
}

Status Engine::OutOfMemory(uint64_t granules, const char* what) const {
  const uint64_t free = device_pool_.free_count();
  const uint64_t cached = backing_.cached_count();
  const uint64_t inactive = residency_.inactive_resident_granules();
  // Pinned units holding unclaimed allocations count as pinned below, and
  // so do units another thread's eviction has pinned or written meanwhile.
  uint64_t unclaimed = 0, evicting = 0;
  int64_t unclaimed_bytes = 0;  // the allocations' own, exactly: a page's objects
  for (ChunkId c = 0; c < residency_.size(); ++c) {
    const Residency::Record& r = residency_.record(c);
    if (Residency::HeldByWriter(r) && r.pin_count == 0) {
      unclaimed += r.granules;
      unclaimed_bytes += UnclaimedBytes(c);
    } else if (r.live && r.move == Residency::Move::kEvicting && r.pin_count == 0) {
      evicting += r.granules;
    }
  }
  std::string m = "out of device memory: " + std::string(what) + " needs " +
                  FormatBytes(granules * granule_) + ", " +
                  FormatBytes((granules - std::min(granules, uint64_t{free})) * granule_) +
                  " more than is free; device memory " +
                  FormatBytes(device_pool_.capacity() * granule_) + " has " +
                  FormatBytes(free * granule_) + " free, " +
                  FormatBytes(cached * granule_) + " cached at free address ranges";
  m += defrag_enabled_ ? "" : " (defragmentation is off)";
  m += ", " + FormatBytes(inactive * granule_) + " in inactive allocations";
  if (!lms_enabled_) {
    m += " (LMS is off, so nothing is evicted)";
  } else if (inactive < granules) {
    m += " (LMS is on: too few inactive bytes are left to evict)";
  }
  if (unclaimed > 0) {
    m += ", " + FormatBytes(static_cast<uint64_t>(unclaimed_bytes)) +
         " allocated outside kernels and not yet used by one (tf.data batches, "
         "converted NumPy arrays: never evicted while they may be being written), "
         "holding " + FormatBytes(unclaimed * granule_) + " of device memory";
  }
  if (evicting > 0) {
    m += ", " + FormatBytes(evicting * granule_) + " being evicted by other threads";
  }
  m += ", " + FormatBytes((device_pool_.in_use() - cached - inactive - unclaimed - evicting) *
                          granule_) +
       " pinned by running kernels (" +
       std::to_string(small_.resident_pages()) + " small-object pages of " +
       FormatBytes(granule_) + " resident in all)";
  return ResourceExhausted(m);
}

Status Engine::MapSlots(uint64_t first_slot, uint64_t count, PoolKind pool,
                        const GranuleId* granules, Access access) {
  LMS_RETURN_IF_ERROR(
      backend_->Map(SlotAddress(first_slot), pool, granules, count, access));
  for (uint64_t i = 0; i < count; ++i) backing_.Set(first_slot + i, pool, granules[i]);
  return Status::Ok();
}

bool Engine::RestoreMapping(uint64_t first_slot, uint64_t count, PoolKind pool,
                            const GranuleId* granules, Access access, Status* failure) {
  Status restored = MapSlots(first_slot, count, pool, granules, access);
  if (restored.ok()) return true;
  // The unit's bytes are intact in `granules`, which stay owned by it, but
  // its address maps nothing, or whatever the driver failed to unmap: a touch
  // faults or misses them.
  *failure = Internal(failure->message() + "; restoring the previous mapping at " +
                      FormatAddress(reinterpret_cast<void*>(SlotAddress(first_slot))) +
                      " also failed: " + restored.message());
  return false;
}

void Engine::StartDeviceRuns() {
  if (device_runs_) return;
  device_runs_ = true;
  backend_->SetDeviceRuns(true);
  device_pool_.CutUnits();  // Note [Device pieces cut to units]
}

RunPool::Releasable Engine::ReleaseWaitsOnlyForCopies(PoolKind pool) {
  return [this, pool](const std::vector<GranuleRun>& runs) {
    return backend_->ReleaseWaitsOnlyForCopies(pool, runs.data(), runs.size());
  };
}

void Engine::TakeDeviceGranules(uint64_t n, GranuleId* out) {
  std::vector<DevicePool::Run> released, cut;
  // A piece is cut only from memory whose release waits for no kernel.
  const bool taken = device_pool_.Take(n, out, &released, &cut,
                                       ReleaseWaitsOnlyForCopies(PoolKind::kDevice));
  assert(taken);  // the caller made room
  (void)taken;
  // Released first: a piece cut may reuse their ids.
  if (!released.empty()) {
    backend_->ReleaseRuns(PoolKind::kDevice, released.data(), released.size());
  }
  if (cut.empty()) return;
  backend_->DefineRuns(PoolKind::kDevice, cut.data(), cut.size());
  // Made at once: memory released a moment ago is taken back before other
  // users of the GPU can take it. A failure is reported by the first Map or
  // copy of the piece, which makes it again.
  if (!released.empty()) {
    (void)backend_->MakeRuns(PoolKind::kDevice, cut.data(), cut.size());
  }
}

Status Engine::EvictChunks(const std::vector<ChunkId>& victims, bool may_unlock) {
  ScopedNanos timed(&stats_.time_evicting_ns);
  StartDeviceRuns();
  struct Victim {
    ChunkId id;
    uint64_t first;
    uint64_t n;
    CopyPlan copy;
    std::vector<GranuleId> host;
    std::vector<GranuleId> device;
  };
  // Local buffers: an eviction copies at least a granule per victim, so
  // their allocation is noise next to it.
  std::vector<Victim> batch;
  batch.reserve(victims.size());
  // Host memory running out stops the batch at that victim: the ones before
  // it are still evicted, and the shortage is what the caller hears.
  Status shortage;
  for (ChunkId id : victims) {
    const BestFitArena::Chunk& chunk = arena_.chunk(id);
    Victim v{id, chunk.start, residency_.record(id).granules, PlanCopy(id), {}, {}};
    shortage = TakeHostGranules(v.n, "evicting", &v.host);
    if (!shortage.ok()) break;
    v.device.resize(v.n);
    for (uint64_t i = 0; i < v.n; ++i) v.device[i] = backing_.at(v.first + i).granule;
    batch.push_back(std::move(v));
  }
  uint64_t batch_granules = 0;
  for (const Victim& v : batch) batch_granules += v.n;
  ScopedActivity span(activity_observer(), Activity::kEviction, batch_granules * granule_,
                      batch.size());
  const bool unlocked = may_unlock && !batch.empty() && MayCopyUnlocked();
  if (unlocked) {
    for (const Victim& v : batch) {
      residency_.BeginMove(v.id, Residency::Move::kEvicting);
      transit_granules_[static_cast<int>(PoolKind::kHost)] += v.n;
    }
  }
  // The copies wait for the victims' last uses only, not for the work
  // queued since (Note [Epochs of use] in backends/cuda_backend.h).
  uint64_t mark = 0;
  for (const Victim& v : batch) mark = std::max(mark, UseMark(v.id));
  Status s = batch.empty() ? Status::Ok() : backend_->CopiesAfterUse(mark);
  if (s.ok()) {
    s = RunCopies(unlocked, [&] {
      Status copied;
      for (size_t i = 0; copied.ok() && i < batch.size(); ++i) {
        copied = CopyUnit(batch[i].copy, PoolKind::kHost, batch[i].host.data(),
                          PoolKind::kDevice, batch[i].device.data());
      }
      return copied;
    });
  }
  if (unlocked) {
    // A victim pinned, given a new object or written meanwhile stays where
    // it is (Note [Copies outside the lock]); its copy is dropped. None was
    // freed: Free waits for the move.
    size_t kept = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      Victim& v = batch[i];
      transit_granules_[static_cast<int>(PoolKind::kHost)] -= v.n;
      assert(residency_.record(v.id).move == Residency::Move::kEvicting);
      const bool abandoned = residency_.record(v.id).move_abandoned;
      residency_.EndMove(v.id);
      if (abandoned) {
        host_pool_.Give(v.host.data(), v.n);
        ++stats_.num_evictions_abandoned;
      } else {
        if (kept != i) batch[kept] = std::move(v);
        ++kept;
      }
    }
    batch.resize(kept);
    NoteMovesEnded();
  }
  // The host waits once for the work queued on the victims' mappings (their
  // last uses: usually long done), not for the copies: they read the device
  // pool's window, not the addresses, and whatever next writes a victim's
  // device granules or touches its host mapping is ordered after them
  // (EndRemapBatch).
  if (s.ok() && !batch.empty()) s = backend_->BeginRemapBatch(mark);
  size_t remapped = 0;
  bool restored = true;
  for (; s.ok() && remapped < batch.size(); ++remapped) {
    const Victim& v = batch[remapped];
    s = MapsEvictedAtAddress(v.id)
            ? MapEvicted(v.id, v.host.data(), arena_.chunk(v.id).requested_bytes)
            : UnmapEvicted(v.id, v.host.data(), mark);
    if (!s.ok()) {
      // The device granules still hold the bytes: they go back to the address.
      restored = RestoreMapping(v.first, v.n, PoolKind::kDevice, v.device.data(),
                                Access::kReadWrite, &s);
      break;
    }
  }
  Status ordered = batch.empty() ? Status::Ok() : backend_->EndRemapBatch();
  // Without that order, or before the host granules of a victim left
  // resident go back, the copies are waited for here.
  if (!ordered.ok() || remapped < batch.size()) ordered = backend_->WaitForCopies();
  for (size_t i = 0; i < batch.size(); ++i) {
    const Victim& v = batch[i];
    bool evicted = i < remapped;
    // The granules the victim does not keep, if a failed restore may have
    // left them mapped at its slots.
    bool stranded = i == remapped && !restored;
    if (evicted && !ordered.ok()) {
      // No copy can be trusted: the victim goes back to its device granules,
      // untouched since, which still hold its bytes. If even that fails it
      // stays evicted, the books matching what its slots were last mapped
      // from, and the error says its bytes may be incomplete.
      const Status back = MapSlots(v.first, v.n, PoolKind::kDevice, v.device.data(),
                                   Access::kReadWrite);
      if (back.ok()) {
        if (strict_) strict_->Unwatch(v.first, v.n);
        evicted = false;
      }
      stranded = !back.ok();
      if (s.ok()) {
        s = back.ok() ? ordered
                      : Internal(ordered.message() + "; mapping the tensor at " +
                                 FormatAddress(reinterpret_cast<void*>(SlotAddress(v.first))) +
                                 " back to its device memory also failed (" + back.message() +
                                 "): its evicted bytes may be incomplete");
      }
    }
    if (stranded) {
      Strand(evicted ? PoolKind::kDevice : PoolKind::kHost, v.n);
    } else if (evicted) {
      device_pool_.Give(v.device.data(), v.n);
    } else {
      host_pool_.Give(v.host.data(), v.n);
    }
    if (!evicted) continue;  // still resident
    NoteResidencyChange(v.id, /*resident=*/false);
    ++stats_.num_evictions;
    stats_.bytes_reclaimed += static_cast<int64_t>(v.n * granule_);
    stats_.bytes_copied_out += static_cast<int64_t>(v.copy.bytes);
    NoteEvicted(v.id);
    Trace(TraceEvent::kEvict, SlotAddress(v.first), v.n * granule_, 0);
  }
  return s.ok() ? shortage : s;
}

Status Engine::TakeHostGranules(uint64_t n, const char* what,
                                std::vector<GranuleId>* host) {
  host->resize(n);
  std::vector<RunPool::Run> released, cut;
  // A free run whose release waits for no kernel goes first (a freed
  // evicted tensor's run may still be mapped under queued work).
  if (host_pool_.Take(n, host->data(), &released, &cut,
                      ReleaseWaitsOnlyForCopies(PoolKind::kHost))) {
    // Released first: a run cut may reuse their ids.
    if (!released.empty()) {
      backend_->ReleaseRuns(PoolKind::kHost, released.data(), released.size());
    }
    if (!cut.empty()) backend_->DefineRuns(PoolKind::kHost, cut.data(), cut.size());
    return Status::Ok();
  }
  return ResourceExhausted(
      "host memory for evicted tensors is exhausted: " + std::string(what) + " " +
      FormatBytes(n * granule_) + " needs host memory, but only " +
      FormatBytes(host_pool_.free_count() * granule_) + " of " +
      FormatBytes(host_pool_.capacity() * granule_) +
      " is free; raise TF_GPU_HOST_MEM_LIMIT_IN_MB");
}

Status Engine::MapEvicted(ChunkId id, const GranuleId* host, uint64_t watched_bytes) {
  const BestFitArena::Chunk& chunk = arena_.chunk(id);
  const Residency::Record& r = residency_.record(id);
  const uint64_t n = r.granules;
  if (!strict_ || Residency::Held(r)) {
    return MapSlots(chunk.start, n, PoolKind::kHost, host, Access::kReadWrite);
  }
  // Watched before the no-access mapping exists: a touch the moment it does
  // must find its slot watched, or strict mode would pass it on as a crash.
  strict_->Watch(chunk.start, n, chunk.allocation_id, SlotAddress(chunk.start),
                 watched_bytes);
  Status s = MapSlots(chunk.start, n, PoolKind::kHost, host, Access::kNone);
  if (!s.ok()) strict_->Unwatch(chunk.start, n);
  return s;
}

Status Engine::UnmapEvicted(ChunkId id, const GranuleId* host, uint64_t mark) {
  const uint64_t first = arena_.chunk(id).start;
  const uint64_t n = residency_.record(id).granules;
  // Nothing is queued on the unit after its last use (`mark`): no pin
  // holds it. Its device mapping goes once that work is done (retired
  // until then), as a freed range's does.
  LMS_RETURN_IF_ERROR(backend_->UnmapReleased(SlotAddress(first), n, mark));
  for (uint64_t i = 0; i < n; ++i) backing_.SetUnmapped(first + i, PoolKind::kHost, host[i]);
  return Status::Ok();
}

Status Engine::MapEvictedBack(ChunkId id) {
  const uint64_t first = arena_.chunk(id).start;
  const Residency::Record& r = residency_.record(id);
  if (!r.evicted || r.move != Residency::Move::kNone || backing_.at(first).mapped) {
    return Status::Ok();
  }
  std::vector<GranuleId> host(r.granules);
  for (uint64_t g = 0; g < r.granules; ++g) host[g] = backing_.at(first + g).granule;
  return MapSlots(first, r.granules, PoolKind::kHost, host.data(), Access::kReadWrite);
}

void Engine::FollowHolders(ChunkId id) {
  if (!strict_) return;
  const Residency::Record& r = residency_.record(id);
  // A moving unit's access is its move's (BeginPageIn makes touches wait).
  if (!r.live || !r.evicted || r.move != Residency::Move::kNone) return;
  const bool held = Residency::Held(r);
  const BestFitArena::Chunk& chunk = arena_.chunk(id);
  if (held != strict_->Watched(chunk.start)) return;  // already as it should be
  // Should mprotect fail, a holder's touch is reported, or an unpinned one
  // is not: a report less exact, never a wrong byte.
  if (held) {
    strict_->Open(chunk.start, r.granules);
  } else {
    strict_->Close(chunk.start, r.granules, chunk.allocation_id, SlotAddress(chunk.start),
                   chunk.requested_bytes);
  }
}

void Engine::NoteEvicted(ChunkId id) {
  const uint64_t n = residency_.record(id).granules;
  residency_.MarkEvicted(id);
  stats_.current_bytes_reclaimed += static_cast<int64_t>(n * granule_);
  stats_.host_bytes_in_use = static_cast<int64_t>(host_pool_.in_use() * granule_);
  stats_.UpdatePeaks();
}

Status Engine::PageIn(ChunkId id, bool may_unlock) {
  Status s;
  PageInUnits(&id, 1, &s, may_unlock);
  return s;
}

void Engine::PageInUnits(const ChunkId* ids, size_t count, Status* out, bool may_unlock) {
  uint64_t total = 0;
  for (size_t i = 0; i < count; ++i) total += residency_.record(ids[i]).granules;
  // Moving before the reclaim below can release the lock: a pin of these
  // units meanwhile waits for this page-in instead of starting its own.
  const bool unlocked = may_unlock && MayCopyUnlocked();
  const auto end_moves = [&]() LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!unlocked) return;
    for (size_t i = 0; i < count; ++i) residency_.EndMove(ids[i]);
    NoteMovesEnded();
  };
  if (unlocked) {
    for (size_t i = 0; i < count; ++i) residency_.BeginMove(ids[i], Residency::Move::kPagingIn);
  }
  Status room = ObtainDeviceGranules(total, /*may_evict=*/true, unlocked);
  if (!room.ok() && count > 1) {
    // Not all at once: each as far as the device allows, in order. While
    // one copies without the lock, another pin of a later one may page it
    // in: that one is waited for, and then needs nothing.
    end_moves();
    for (size_t i = 0; i < count; ++i) {
      while (Moving(ids[i], /*or_evicting=*/false)) AwaitMoveEnd();
      out[i] = Status::Ok();
      if (residency_.record(ids[i]).evicted) PageInUnits(&ids[i], 1, &out[i], may_unlock);
    }
    return;
  }
  if (!room.ok()) {
    end_moves();
    out[0] = ResourceExhausted("cannot page in " + FormatBytes(total * granule_) + ": " +
                               room.message());
    return;
  }
  // Timed from here: the evictions that made room count as evictions.
  ScopedNanos timed(&stats_.time_paging_in_ns);
  ScopedActivity span(activity_observer(), Activity::kPageIn, total * granule_, count);
  struct Arrival {
    uint64_t first;
    uint64_t n;
    CopyPlan copy;
    std::vector<GranuleId> device;
    std::vector<GranuleId> host;
    // A restore failed: the device granules may still be mapped at the slots.
    bool stranded = false;
  };
  std::vector<Arrival> moves(count);
  for (size_t i = 0; i < count; ++i) {
    Arrival& m = moves[i];
    m.first = arena_.chunk(ids[i]).start;
    m.copy = PlanCopy(ids[i]);
    m.n = residency_.record(ids[i]).granules;
    m.device.resize(m.n);
    m.host.resize(m.n);
    TakeDeviceGranules(m.n, m.device.data());
    for (uint64_t g = 0; g < m.n; ++g) m.host[g] = backing_.at(m.first + g).granule;
    // Until the remap, strict mode makes an unpinned touch wait for it (it
    // is reported; the pinning caller itself touches nothing before Pin
    // returns): access granted to the host mapping now could let a write
    // land after the copy, and be lost.
    if (strict_) strict_->BeginPageIn(m.first, m.n);
  }
  // The copies follow the units' last uses: the work that wrote their host
  // mappings (a kernel that held one evicted, over the bus; TensorFlow's own
  // copy into a born-evicted one, before the claim that noted its use).
  uint64_t mark = 0;
  for (size_t i = 0; i < count; ++i) {
    mark = std::max(mark, UseMark(ids[i], /*pinned_by_caller=*/true));
  }
  Status batch = backend_->CopiesAfterUse(mark);
  if (unlocked) transit_granules_[static_cast<int>(PoolKind::kDevice)] += total;
  if (batch.ok()) {
    batch = RunCopies(unlocked, [&] {
      Status copied;
      for (size_t i = 0; copied.ok() && i < count; ++i) {
        copied = CopyUnit(moves[i].copy, PoolKind::kDevice, moves[i].device.data(),
                          PoolKind::kHost, moves[i].host.data());
      }
      return copied;
    });
  }
  if (unlocked) transit_granules_[static_cast<int>(PoolKind::kDevice)] -= total;
  // The host waits once for every access queued on the host mappings (the
  // same last uses), not for the copies; the pinning kernel's stream (every
  // fenced stream) waits for the copies instead (Note [Stream protocol]).
  if (batch.ok()) batch = backend_->BeginRemapBatch(mark);
  bool all_mapped = batch.ok();
  const Access evicted_access = strict_ ? Access::kNone : Access::kReadWrite;
  for (size_t i = 0; i < count; ++i) {
    Arrival& m = moves[i];
    out[i] = batch;
    if (!batch.ok()) continue;
    out[i] = MapSlots(m.first, m.n, PoolKind::kDevice, m.device.data(), Access::kReadWrite);
    if (out[i].ok() && strict_) strict_->Unwatch(m.first, m.n);
    if (!out[i].ok()) {
      all_mapped = false;
      m.stranded = !RestoreMapping(m.first, m.n, PoolKind::kHost, m.host.data(),
                                   evicted_access, &out[i]);
    }
  }
  Status ordered = backend_->EndRemapBatch();
  // Without that order (or on failure, before device granules go back to
  // the pool) the copies are waited for here.
  if (!ordered.ok() || !all_mapped) ordered = backend_->WaitForCopies();
  for (size_t i = 0; i < count; ++i) {
    Arrival& m = moves[i];
    const ChunkId id = ids[i];
    if (out[i].ok() && !ordered.ok()) {
      out[i] = ordered;
      m.stranded = !RestoreMapping(m.first, m.n, PoolKind::kHost, m.host.data(),
                                   evicted_access, &out[i]);
      // The unit stays evicted: its trusted bytes are in its host granules.
      for (uint64_t g = 0; m.stranded && g < m.n; ++g) {
        backing_.Set(m.first + g, PoolKind::kHost, m.host[g]);
      }
    }
    if (!out[i].ok()) {
      if (m.stranded) {
        Strand(PoolKind::kDevice, m.n);
      } else {
        device_pool_.Give(m.device.data(), m.n);
      }
      if (strict_) {
        const BestFitArena::Chunk& chunk = arena_.chunk(id);
        strict_->Watch(m.first, m.n, chunk.allocation_id, SlotAddress(m.first),
                       chunk.requested_bytes);
      }
      continue;
    }
    host_pool_.Give(m.host.data(), m.n);
    residency_.MarkResident(id);
    NoteResidencyChange(id, /*resident=*/true);
    const int64_t bytes = static_cast<int64_t>(m.n * granule_);
    ++stats_.num_page_ins;
    stats_.bytes_paged_in += bytes;
    stats_.bytes_copied_in += static_cast<int64_t>(m.copy.bytes);
    stats_.current_bytes_reclaimed -= bytes;
    Trace(TraceEvent::kPageIn, SlotAddress(m.first), static_cast<uint64_t>(bytes), 0);
  }
  end_moves();
}

Status Engine::PlaceBornEvicted(ChunkId id) {
  StartDeviceRuns();
  const uint64_t n = residency_.record(id).granules;
  std::vector<GranuleId> host;
  LMS_RETURN_IF_ERROR(TakeHostGranules(n, "placing", &host));
  Status s = MapEvicted(id, host.data(), n * granule_);
  if (!s.ok()) {
    host_pool_.Give(host.data(), n);
    return s;
  }
  ++stats_.num_born_evicted;
  NoteEvicted(id);
  return Status::Ok();
}

}  // namespace lms
