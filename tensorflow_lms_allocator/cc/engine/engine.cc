// Engine construction, the allocate/free fast paths, pin/unpin and queries.
// The out-of-memory path is in engine_reclaim.cc.
#include "engine/engine.h"

#include <algorithm>
#include <cassert>
#include <string>

#include "engine/fork_handlers.h"

namespace lms {
namespace {

bool IsPowerOfTwo(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

}  // namespace

Engine::Engine(const EngineOptions& options, std::unique_ptr<Backend> backend)
    : options_(options),
      backend_(std::move(backend)),
      granule_(backend_->granule_bytes()),
      granule_shift_(__builtin_ctzll(granule_)),
      small_threshold_(options.small_object_threshold != 0
                           ? std::min(options.small_object_threshold, granule_)
                           : granule_),
      // Every live unit fits in device plus host memory; twice that leaves
      // room for address fragmentation, which costs no memory.
      device_granules_(options.device_bytes / granule_),
      host_granules_(options.host_bytes / granule_),
      slots_(2 * (options.device_bytes / granule_ +
                  options.host_bytes / granule_) + 16),
      device_pool_(options.device_bytes / granule_),
      host_pool_(options.host_bytes / granule_),
      arena_(slots_, /*index_interior=*/true),
      backing_(slots_),
      learning_(options.policy == PolicyKind::kLearned),
      unmap_evicted_(options.unmap_evicted && !options.strict),
      small_(granule_, options.device_bytes / granule_ + options.host_bytes / granule_,
             options.tiny_object_threshold),
      lms_enabled_(options.lms_enabled),
      defrag_enabled_(options.defrag_enabled) {}

Status Engine::Create(const EngineOptions& options,
                      std::unique_ptr<Backend> backend,
                      std::unique_ptr<Engine>* out) {
  if (backend == nullptr) return InvalidArgument("no backend given");
  const size_t granule = backend->granule_bytes();
  if (!IsPowerOfTwo(granule) || granule < 4096) {
    return InvalidArgument("granule size " + std::to_string(granule) +
                           " is not a power of two of at least 4096 bytes");
  }
  if (options.device_bytes < granule) {
    return InvalidArgument("device memory of " + FormatBytes(options.device_bytes) +
                           " is smaller than one granule (" +
                           FormatBytes(granule) + ")");
  }
  if (options.strict && std::string(backend->Name()) != "posix") {
    return InvalidArgument("strict mode (TF_LMS_STRICT) needs the POSIX backend, not " +
                           std::string(backend->Name()) +
                           ": it is for the emulated device (on a GPU a no-access "
                           "mapping would kill the CUDA context)");
  }
  std::unique_ptr<Engine> engine(new Engine(options, std::move(backend)));
  LMS_RETURN_IF_ERROR(engine->Init());
  RegisterForFork(engine.get());
  *out = std::move(engine);
  return Status::Ok();
}

Status Engine::Init() {
  MutexLock lock(mu_);
  if (learning_) residency_.KeepListChanges();  // Note [A maintained reclaim order]
  LMS_RETURN_IF_ERROR(backend_->ReserveAddressRange(slots_ * granule_, &base_));
  LMS_RETURN_IF_ERROR(
      backend_->CreatePool(PoolKind::kDevice, device_pool_.capacity()));
  backend_->SetDeviceRuns(false);  // until the first eviction (Note [Mappings within a unit])
  whole_mappings_ = backend_->KeepsMappingsWhole();
  if (whole_mappings_ && !backend_->MapsPartsOfRuns(PoolKind::kDevice)) {
    // Note [Device pieces cut to units].
    std::vector<DevicePool::Run> made;
    device_pool_.CutPieces(backend_->MakesPoolAtCreation(PoolKind::kDevice), &made);
    if (!made.empty()) backend_->DefineRuns(PoolKind::kDevice, made.data(), made.size());
  }
  if (host_pool_.capacity() > 0) {
    LMS_RETURN_IF_ERROR(
        backend_->CreatePool(PoolKind::kHost, host_pool_.capacity()));
    host_pool_.set_splits(backend_->MapsPartsOfRuns(PoolKind::kHost));
    MakeHostAhead();
  }
  std::vector<const BestFitArena*> tables = {&arena_};
  for (int k = 0; k < SmallPages::kNumClasses; ++k) tables.push_back(&small_.arena(k));
  for (const BestFitArena* arena : tables) {
    if (!arena->reserved()) {
      return ResourceExhausted("cannot reserve " + FormatBytes(arena->table_bytes()) +
                               " of host address space for the allocator's tables "
                               "(mmap failed: is `ulimit -v` set?)");
    }
  }
  arena_.Grow(slots_);
  if (options_.strict) {
    LMS_RETURN_IF_ERROR(StrictMonitor::Create(base_, slots_, granule_, &strict_));
  }
  stats_.bytes_limit = static_cast<int64_t>(device_pool_.capacity() * granule_);
  stats_.bytes_reservable_limit = stats_.bytes_limit;
  return Status::Ok();
}

void Engine::MakeHostAhead() {
  if (!lms_enabled_ || !host_pool_.splits() || options_.host_ahead_bytes < granule_) return;
  std::vector<RunPool::Run> runs;
  host_pool_.MakeAhead(options_.host_ahead_bytes / granule_,
                       std::max<size_t>(1, kHostAheadRunBytes / granule_), &runs);
  backend_->DefineRuns(PoolKind::kHost, runs.data(), runs.size());
  if (!backend_->MakeRuns(PoolKind::kHost, runs.data(), runs.size()).ok()) {
    // Made as evictions need it instead (Note [Host memory made ahead]).
    runs.clear();
    host_pool_.ForgetAhead(&runs);
    backend_->ReleaseRuns(PoolKind::kHost, runs.data(), runs.size());
  }
  stats_.host_bytes_made_ahead = static_cast<int64_t>(host_pool_.made_ahead() * granule_);
}

Engine::~Engine() {
  UnregisterForFork(this);
  strict_.reset();  // stop serving faults before the range goes away
  if (base_ != 0) backend_->ReleaseAddressRange(base_, slots_ * granule_);
}

void* Engine::Allocate(size_t bytes, Hold hold, Status* status,
                       uint64_t* unit_id, size_t alignment, bool optional, int64_t step) {
  Status ignored;
  if (status == nullptr) status = &ignored;
  uint64_t unused_id;
  if (unit_id == nullptr) unit_id = &unused_id;
  if (bytes == 0) {
    *status = InvalidArgument("zero-size allocation requested");
    return nullptr;
  }
  if ((alignment & (alignment - 1)) != 0 || alignment > granule_) {
    *status = InvalidArgument("alignment " + std::to_string(alignment) +
                              " is not a power of two of at most the granule (" +
                              FormatBytes(granule_) + ")");
    return nullptr;
  }
  // Its user may touch evicted memory next (Note [Strict mode's own signal
  // stack] in strict_monitor.cc).
  if (strict_) StrictMonitor::EnsureSignalStack();
  MutexLock lock(mu_);
  int64_t reclaimed_before = 0;
  if (optional) {
    reclaimed_before = stats_.bytes_reclaimed;
    int entry = 0;
    while (entry < kOptionalSteps && optional_steps_[entry].step != step) ++entry;
    if (entry == kOptionalSteps) {  // a new step's allowance, in the oldest's place
      entry = optional_next_;
      optional_next_ = (optional_next_ + 1) % kOptionalSteps;
      optional_steps_[entry] = OptionalStep{step, 0};
    }
    optional_current_ = entry;
  }
  // A small object is 256-byte aligned; a stricter alignment takes a
  // granule-aligned unit of its own (requested size unchanged).
  void* ptr = bytes < small_threshold_ && alignment <= SmallPages::kUnit
                  ? AllocateSmall(bytes, hold, optional, status, unit_id)
                  : AllocateLarge(bytes, hold, optional, status, unit_id);
  if (optional) {
    // What this request's reclaims evicted (an optional request keeps the
    // lock throughout: PlaceOptionalUnit).
    const int64_t evicted = stats_.bytes_reclaimed - reclaimed_before;
    optional_steps_[optional_current_].evicted += evicted;
    stats_.bytes_evicted_for_optional += evicted;
    if (ptr == nullptr && status->code() == StatusCode::kResourceExhausted) {
      ++stats_.num_optional_refused;
    }
  }
  if (ptr != nullptr) {
    ++stats_.num_allocs;
    Trace(TraceEvent::kAllocate, reinterpret_cast<uintptr_t>(ptr), bytes, *unit_id,
          hold == Hold::kPin      ? TraceRecorder::kBornPinned
          : hold == Hold::kWriter ? TraceRecorder::kUnclaimed
                                  : 0);
  }
  // Even a failed request may have evicted or remapped granules.
  RefreshPoolStatistics();
  return ptr;
}

void* Engine::AllocateLarge(size_t bytes, Hold hold, bool optional, Status* status,
                            uint64_t* unit_id) {
  const uint64_t n = (bytes + granule_ - 1) >> granule_shift_;
  // Larger than the device: only host memory can hold it (born evicted,
  // used in place: Pin), and only if nobody needs it resident at birth.
  if (n > device_pool_.capacity() && (hold == Hold::kPin || !lms_enabled_)) {
    *status = ResourceExhausted(
        "a request of " + FormatBytes(bytes) + " exceeds the device memory of " +
        FormatBytes(device_pool_.capacity() * granule_) +
        (lms_enabled_ ? " (pinned at birth, it would have to be resident)"
                      : ": an allocation must fit in device memory to be used (LMS is off)"));
    return nullptr;
  }
  if (n > device_pool_.capacity() && host_pool_.free_count() < n) {
    *status = ResourceExhausted(
        "a request of " + FormatBytes(bytes) + " exceeds the device memory of " +
        FormatBytes(device_pool_.capacity() * granule_) +
        ", and host memory for evicted tensors, which could hold it, has only " +
        FormatBytes(host_pool_.free_count() * granule_) + " of " +
        FormatBytes(host_pool_.capacity() * granule_) +
        " free; raise TF_GPU_HOST_MEM_LIMIT_IN_MB");
    return nullptr;
  }
  const bool may_evict =
      optional ? OptionalMayEvict(n) : hold != Hold::kWriter || WriterMayEvict(n);
  ChunkId c;
  if (optional && may_evict) {
    c = PlaceOptionalUnit(n, hold, status);
  } else {
    if (may_evict) MakeRoomUnlocked(n);
    c = PlaceUnit(n, hold, may_evict,
                  /*may_be_born_evicted=*/!optional && hold != Hold::kPin, status);
  }
  if (c == kNoChunk) return nullptr;
  if (learning_) {
    learned_.SetKey(c, LearnedPolicy::Key(StrictMonitor::ThreadLabel(), bytes,
                                          StrictMonitor::CountLabelledAllocation(bytes)));
  }
  BestFitArena::Chunk& chunk = arena_.chunk(c);
  chunk.requested_bytes = bytes;
  *unit_id = chunk.allocation_id;
  const int64_t allocated = static_cast<int64_t>(n * granule_);
  stats_.bytes_in_use += allocated;
  (hold == Hold::kPin ? stats_.bytes_active : stats_.bytes_inactive) += allocated;
  if (hold == Hold::kWriter) stats_.bytes_unclaimed += allocated;
  stats_.largest_alloc_size = std::max(stats_.largest_alloc_size, allocated);
  return reinterpret_cast<void*>(SlotAddress(chunk.start));
}

ChunkId Engine::PlaceAddressRange(uint64_t n) {
  ChunkId c = arena_.Allocate(n);
  if (c == kNoChunk) return kNoChunk;
  c = PlaceWithoutCuts(c, n);
  // Best fit chooses among address ranges, not memory. When its range lacks
  // device granules the pool cannot give, they would be taken from cached
  // ranges elsewhere (defragmentation: an unmap there, a map here, per
  // granule); a free range whose slots are all cached needs neither.
  // The first test keeps the fast path (a pool that can give all n) free of
  // the rest.
  if (device_pool_.free_count() >= n || backing_.cached_count() < n) return c;
  const uint64_t missing = n - backing_.CountCached(arena_.chunk(c).start, n);
  uint64_t run = 0;
  if (missing <= device_pool_.free_count() || !backing_.FindCachedRun(n, &run)) return c;
  // Not where it would cut a cached mapping (Note [Mappings within a unit]).
  uint64_t from = 0, count = 0;
  if (whole_mappings_ && CutsCachedMapping(run, n, &from, &count)) return c;
  arena_.Free(c);
  const ChunkId at = arena_.AllocateAt(run, n);
  assert(at != kNoChunk);  // cached slots are free slots (BackingMap's invariant)
  ++stats_.num_cached_placements;
  return at;
}

ChunkId Engine::PlaceUnit(uint64_t n, Hold hold, bool may_evict,
                          bool may_be_born_evicted, Status* status) {
  const bool pin = hold == Hold::kPin;
  const bool unclaimed = hold == Hold::kWriter;
  const ChunkId c = PlaceAddressRange(n);
  if (c == kNoChunk) {
    *status = ResourceExhausted("no free address range of " + FormatBytes(n * granule_) +
                                " left");
    return kNoChunk;
  }
  arena_.chunk(c).allocation_id = next_allocation_id_++;
  const uint64_t first = arena_.chunk(c).start;
  // A cached mapping reaching outside the range goes whole first (Note
  // [Mappings within a unit]).
  if (Status trimmed = TrimCachedMappings(first, n); !trimmed.ok()) {
    arena_.Free(c);
    *status = trimmed;
    return kNoChunk;
  }
  // Cached slots in the range keep their granules: no mapping call. They
  // leave the cache first, so defragmentation below cannot take them.
  const uint64_t unmapped = n - backing_.TakeCachedRun(first, n);
  // The lock is held from the range's placement on: evictions here copy
  // under it (MakeRoomUnlocked ran before, where records were whole).
  Status s = unmapped > 0 ? ObtainDeviceGranules(unmapped, may_evict, /*may_unlock=*/false)
                          : Status::Ok();
  if (s.ok() && unmapped > 0) {
    // Granules for each stretch of unmapped slots apart, so that a piece the
    // pool cut lies within one mapping (Note [Device pieces cut to units]).
    for (uint64_t run = first; run < first + n && s.ok();) {
      if (backing_.at(run).mapped) { ++run; continue; }
      uint64_t end = run;
      while (end < first + n && !backing_.at(end).mapped) ++end;
      scratch_.resize(end - run);
      TakeDeviceGranules(end - run, scratch_.data());
      // MapSlots is all or nothing: granules it did not map are unmapped.
      s = MapSlots(run, end - run, PoolKind::kDevice, scratch_.data(), Access::kReadWrite);
      if (!s.ok()) device_pool_.Give(scratch_.data(), end - run);
      run = end;
    }
  } else if (!s.ok() && may_be_born_evicted && lms_enabled_ &&
             host_pool_.free_count() >= n) {
    // Born evicted: a unit is wholly resident or wholly evicted, so the
    // range's device granules (all cached: freed) go back to the pool.
    uint64_t mark = 0;
    for (uint64_t u = first; u < first + n; ++u) {
      if (backing_.at(u).mapped) mark = std::max(mark, backing_.release_mark(u));
    }
    Status unmapped_ok = backend_->UnmapReleased(SlotAddress(first), n, mark);
    if (unmapped_ok.ok()) {
      for (uint64_t u = first; u < first + n; ++u) {
        if (!backing_.at(u).mapped) continue;
        device_pool_.Give(backing_.at(u).granule);
        backing_.Clear(u);
      }
      residency_.Track(c, n, /*pinned=*/false, unclaimed);
      NoteUse(c);
      s = PlaceBornEvicted(c);
      if (s.ok()) {
        if (learning_) learned_.Born(c, /*pinned=*/false);
        return c;
      }
      residency_.Untrack(c);
    } else {
      s = unmapped_ok;
    }
  }
  if (!s.ok() && may_be_born_evicted && lms_enabled_ && host_pool_.free_count() < n) {
    s = Status(s.code(), s.message() + "; placing it in host memory instead needs " +
                             FormatBytes(n * granule_) + ", but host memory for evicted "
                             "tensors has only " +
                             FormatBytes(host_pool_.free_count() * granule_) + " of " +
                             FormatBytes(host_pool_.capacity() * granule_) +
                             " free (TF_GPU_HOST_MEM_LIMIT_IN_MB)");
  }
  if (!s.ok()) {
    // Undo: whatever is device-mapped in the range stays there, cached.
    for (uint64_t u = first; u < first + n; ++u) {
      if (backing_.at(u).mapped) backing_.AddCached(u);
    }
    arena_.Free(c);
    *status = s;
    return kNoChunk;
  }
  residency_.Track(c, n, pin, unclaimed);
  NoteUse(c);
  if (learning_) learned_.Born(c, pin);
  return c;
}

Status Engine::Free(void* ptr) {
  MutexLock lock(mu_);
  const ChunkId c = SettledUnitAt(ptr, /*or_evicting=*/true);
  Trace(TraceEvent::kFree, reinterpret_cast<uintptr_t>(ptr), 0, 0);
  if (c != kNoChunk && residency_.IsPage(c)) {
    Status s = FreeSmall(c, ptr);
    RefreshAfterRelease();
    if (s.ok()) NoteRelease();
    return s;
  }
  if (c == kNoChunk || SlotAddress(arena_.chunk(c).start) != reinterpret_cast<uintptr_t>(ptr)) {
    return NotFound("free of " + FormatAddress(ptr) +
                    ": no live allocation starts there (never allocated, "
                    "or already freed)");
  }
  Status s = FreeLarge(c);
  RefreshAfterRelease();
  NoteRelease();
  return s;
}

Status Engine::FreeLarge(ChunkId c) {
  const Residency::Record& r = residency_.record(c);
  const int64_t allocated = static_cast<int64_t>(r.granules * granule_);
  stats_.bytes_in_use -= allocated;
  (r.pin_count > 0 ? stats_.bytes_active : stats_.bytes_inactive) -= allocated;
  if (r.unclaimed > 0) stats_.bytes_unclaimed -= allocated;
  return ReleaseUnit(c);
}

Status Engine::ReleaseUnit(ChunkId c) {
  const uint64_t first = arena_.chunk(c).start;
  const Residency::Record& r = residency_.record(c);
  const uint64_t n = r.granules;
  Status status;
  if (r.evicted) {
    // Host granules go back to the host pool once nothing maps them. If the
    // unmap fails they stay out of it, stranded: a granule still mapped at
    // a free slot must never back another allocation.
    if (strict_) strict_->Unwatch(first, n);
    // The mark at the free, as for every freed range: work queued on it
    // before the free is before that mark (a backend retires the mapping
    // rather than wait for it).
    status = backend_->UnmapReleased(SlotAddress(first), n, backend_->ReleaseMark());
    for (uint64_t s = first; s < first + n; ++s) {
      if (status.ok()) host_pool_.Give(backing_.at(s).granule);
      else Strand(PoolKind::kHost, 1);
      backing_.Clear(s);
    }
    stats_.current_bytes_reclaimed -= static_cast<int64_t>(n * granule_);
  } else {
    backing_.AddCachedRun(first, n);
    backing_.SetReleaseMarks(first, n, backend_->ReleaseMark());
  }
  if (learning_) learned_.Released(c);
  residency_.Untrack(c);
  arena_.Free(c);
  return status;
}

ChunkId Engine::UnitAt(const void* ptr) const {
  const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
  if (a < base_) return kNoChunk;
  return arena_.ChunkAt((a - base_) >> granule_shift_);
}

int64_t Engine::UnitLiveBytes(ChunkId c) const {
  const Residency::Record& r = residency_.record(c);
  return r.segment != Residency::kNoSegment
             ? small_.page(r.segment).bytes
             : static_cast<int64_t>(r.granules * granule_);
}

uint32_t Engine::PinUnit(ChunkId c) {
  residency_.AbandonEviction(c);
  const uint32_t count = residency_.Pin(c);
  if (count == 1) {
    if (learning_) learned_.Activated(c);
    const int64_t bytes = UnitLiveBytes(c);
    stats_.bytes_inactive -= bytes;
    stats_.bytes_active += bytes;
  }
  return count;
}

void Engine::Claim(ChunkId c, const void* ptr) {
  // Its writer queued its work before handing it over.
  NoteUse(c);
  if (!residency_.IsPage(c)) {
    residency_.RemoveUnclaimed(c);
    stats_.bytes_unclaimed -= static_cast<int64_t>(residency_.record(c).granules * granule_);
    return;
  }
  // Only a pin at an object's first byte claims it (a kernel's input is its
  // tensor's start unless it is a slice): finding the object around an
  // interior address walks the page, which every pin of that page would pay
  // (measured: 5% of a step). A small object pinned only through slices
  // stays unclaimed, holding its page, until it is freed. An evicted page
  // holding an unclaimed object was born evicted for it and holds nothing
  // else (an evicted page takes no new object), at its start: any pin of
  // the page is a pin of that object, and claims it before its page-in.
  const Residency::Record& r = residency_.record(c);
  const ChunkId o =
      r.evicted ? small_.arena_of(r.segment).ChunkAt(r.segment * small_.units_per_page())
                : SmallObjectAt(c, ptr);
  if (o == kNoChunk) return;
  BestFitArena::Chunk& object = small_.arena_of(r.segment).chunk(o);
  if (!object.unclaimed) return;
  object.unclaimed = false;
  residency_.RemoveUnclaimed(c);
  stats_.bytes_unclaimed -= static_cast<int64_t>(object.size * SmallPages::kUnit);
}

uint32_t Engine::UnpinUnit(ChunkId c) {
  const uint32_t count = residency_.Unpin(c);
  NoteUse(c);  // the kernel queued its work on the unit before it let go
  if (count == 0) {
    FollowHolders(c);
    if (learning_) learned_.Deactivated(c);
    const int64_t bytes = UnitLiveBytes(c);
    stats_.bytes_active -= bytes;
    stats_.bytes_inactive += bytes;
  }
  return count;
}

ChunkId Engine::PinPointer(ChunkId c, const void* ptr, uint64_t* unit_id, bool* page_in,
                           Status* status) {
  *unit_id = 0;
  *page_in = false;
  if (c == kNoChunk) {
    *status = NotFound("pin of " + FormatAddress(ptr) +
                       ": not inside a live allocation of this allocator");
    return kNoChunk;
  }
  *unit_id = arena_.chunk(c).allocation_id;
  Trace(TraceEvent::kPin, reinterpret_cast<uintptr_t>(ptr), 0, *unit_id);
  PinUnit(c);
  FollowObjectPin(c, ptr, /*pinned=*/true);
  // Claimed even if the page-in fails: its writer handed it over.
  if (residency_.record(c).unclaimed > 0) Claim(c, ptr);
  // A unit larger than the device is pinned where it is, in host memory:
  // its users read and write it in place (it never moves, so that is safe).
  const Residency::Record& r = residency_.record(c);
  *page_in = r.evicted && r.granules <= device_pool_.capacity();
  if (r.evicted && !*page_in) FollowHolders(c);
  return c;
}

void Engine::UndoFailedPin(ChunkId c, const void* ptr) {
  ++stats_.num_failed_pins;
  FollowObjectPin(c, ptr, /*pinned=*/false);
  UnpinUnit(c);
  // Its kernel may read it in place (the adapter's last resort): from now
  // on every move or unmap of it waits for everything queued before, and
  // its address maps its host memory before the kernel is enqueued (an
  // eviction's remap may still be pending, Note [Retired mappings]).
  residency_.NoteReadInPlace(c);
  const Residency::Record& r = residency_.record(c);
  // On failure nothing is mapped there: the kernel's touch faults, after
  // the failed pin it was told of.
  (void)MapEvictedBack(c);
  if (r.evicted) {
    const Status settled =
        backend_->SettleMapping(SlotAddress(arena_.chunk(c).start), r.granules);
    (void)settled;  // on failure the driver is broken: the kernel's touch reports it
  }
}

void Engine::FollowObjectPin(ChunkId c, const void* ptr, bool pinned) {
  if (!learning_ || !residency_.IsPage(c)) return;
  const ChunkId o = SmallObjectAt(c, ptr);
  if (o == kNoChunk) return;
  const int size_class = small_.page(residency_.record(c).segment).size_class;
  if (pinned) {
    learned_.ObjectPinned(size_class, o);
  } else {
    learned_.ObjectUnpinned(size_class, o);
  }
}

Status Engine::Pin(const void* ptr, uint64_t* unit_id) {
  if (strict_) StrictMonitor::EnsureSignalStack();
  MutexLock lock(mu_);
  uint64_t id = 0;
  bool page_in = false;
  Status s;
  // An eviction in flight is abandoned by the pin; a page-in is waited for.
  const ChunkId c =
      PinPointer(SettledUnitAt(ptr, /*or_evicting=*/false), ptr, &id, &page_in, &s);
  if (unit_id != nullptr) *unit_id = id;
  if (page_in) {
    s = PageIn(c, /*may_unlock=*/true);
    if (!s.ok()) UndoFailedPin(c, ptr);
  }
  RefreshPoolStatistics();
  return s;
}

Status Engine::PinAll(const void* const* ptrs, size_t count, uint64_t* ids) {
  if (strict_) StrictMonitor::EnsureSignalStack();
  MutexLock lock(mu_);
  Status failure;
  const auto note = [&failure](const Status& s) {
    if (failure.ok() || (s.code() == StatusCode::kResourceExhausted &&
                         failure.code() != StatusCode::kResourceExhausted)) {
      failure = s;
    }
  };
  // Every page-in another pin started ends first: nothing is pinned while
  // waiting, so no waiter holds memory a page-in may need to evict.
  pin_units_.resize(count);
  for (size_t i = 0; i < count;) {
    pin_units_[i] = UnitAt(ptrs[i]);
    if (pin_units_[i] != kNoChunk && Moving(pin_units_[i], /*or_evicting=*/false)) {
      AwaitMoveEnd();
      i = 0;  // look again from the first
    } else {
      ++i;
    }
  }
  page_ins_.clear();
  for (size_t i = 0; i < count; ++i) {
    bool page_in = false;
    Status s;
    const ChunkId c = PinPointer(pin_units_[i], ptrs[i], &ids[i], &page_in, &s);
    if (c == kNoChunk) note(s);
    if (page_in && std::find(page_ins_.begin(), page_ins_.end(), c) == page_ins_.end()) {
      page_ins_.push_back(c);
    }
  }
  if (!page_ins_.empty()) {
    // Copies: the page-in may release the lock, and another PinAll reuse
    // the members meanwhile.
    const std::vector<ChunkId> units = pin_units_;
    const std::vector<ChunkId> page_ins = page_ins_;
    std::vector<Status> results(page_ins.size());
    PageInUnits(page_ins.data(), page_ins.size(), results.data(), /*may_unlock=*/true);
    for (size_t i = 0; i < count; ++i) {
      if (units[i] == kNoChunk) continue;
      const size_t j =
          std::find(page_ins.begin(), page_ins.end(), units[i]) - page_ins.begin();
      if (j == page_ins.size() || results[j].ok()) continue;
      note(results[j]);
      ids[i] = 0;
      UndoFailedPin(units[i], ptrs[i]);
    }
  }
  RefreshPoolStatistics();
  return failure;
}

Status Engine::Unpin(const void* ptr, uint64_t unit_id) {
  MutexLock lock(mu_);
  const ChunkId c = UnitAt(ptr);
  if (c == kNoChunk) {
    return NotFound("unpin of " + FormatAddress(ptr) +
                    ": not inside a live allocation of this allocator");
  }
  if (unit_id != 0 && arena_.chunk(c).allocation_id != unit_id) {
    return NotFound("unpin of " + FormatAddress(ptr) + ": allocation " +
                    std::to_string(unit_id) + " was freed");
  }
  if (residency_.record(c).pin_count == 0) {
    return FailedPrecondition("unpin of " + FormatAddress(ptr) +
                              " without a matching pin");
  }
  Trace(TraceEvent::kUnpin, reinterpret_cast<uintptr_t>(ptr), 0,
        arena_.chunk(c).allocation_id);
  FollowObjectPin(c, ptr, /*pinned=*/false);
  if (UnpinUnit(c) == 0) {
    const uint64_t segment = residency_.record(c).segment;
    if (segment != Residency::kNoSegment && small_.page(segment).objects == 0) {
      ReleaseSmallPage(segment);
      RefreshPoolStatistics();
    }
    NoteRelease();
  }
  DebugCheckInvariants();
  return Status::Ok();
}

Status Engine::StartTrace(const std::string& path, uint64_t max_bytes) {
  MutexLock lock(mu_);
  if (trace_ != nullptr) {
    return FailedPrecondition("a trace is already being recorded; stop it first");
  }
  LMS_RETURN_IF_ERROR(TraceRecorder::Open(path, max_bytes, &trace_));
  TraceLiveAllocations();
  return Status::Ok();
}

void Engine::TraceLiveAllocations() {
  constexpr uint8_t kLive = TraceRecorder::kLiveAtStart;
  constexpr uint8_t kUnclaimed = TraceRecorder::kUnclaimed;
  for (ChunkId c = arena_.FirstChunk(); c != kNoChunk; c = arena_.chunk(c).next) {
    const BestFitArena::Chunk& unit = arena_.chunk(c);
    if (unit.free) continue;
    const Residency::Record& r = residency_.record(arena_.ChunkAt(unit.start));
    const uintptr_t unit_address = SlotAddress(unit.start);
    // Where the unit's pins are recorded: an address inside one of its
    // allocations (a page's first object; an empty pinned page has none).
    uintptr_t pin_address = 0;
    if (r.segment == Residency::kNoSegment) {
      Trace(TraceEvent::kAllocate, unit_address, unit.requested_bytes, unit.allocation_id,
            kLive | (r.unclaimed > 0 ? kUnclaimed : 0));
      pin_address = unit_address;
    } else {
      const BestFitArena& objects = small_.arena_of(r.segment);
      const uint64_t first = r.segment * small_.units_per_page();
      const uint64_t end = first + small_.units_per_page();
      // Not SmallPages::ForEachObject: Trace needs mu_, which the analysis
      // cannot follow into a template's callback.
      for (ChunkId o = objects.SegmentHead(r.segment);
           o != kNoChunk && objects.chunk(o).start < end; o = objects.chunk(o).next) {
        const BestFitArena::Chunk& object = objects.chunk(o);
        if (object.free) continue;
        const uintptr_t address = unit_address + (object.start - first) * SmallPages::kUnit;
        Trace(TraceEvent::kAllocate, address, object.requested_bytes, unit.allocation_id,
              kLive | (object.unclaimed ? kUnclaimed : 0));
        if (pin_address == 0) pin_address = address;
      }
    }
    for (uint32_t i = 0; pin_address != 0 && i < r.pin_count; ++i) {
      Trace(TraceEvent::kPin, pin_address, 0, unit.allocation_id, kLive);
    }
  }
}

Status Engine::StopTrace(TraceSummary* summary) {
  MutexLock lock(mu_);
  if (trace_ == nullptr) return FailedPrecondition("no trace is being recorded");
  Status s = trace_->Finish(summary);
  trace_.reset();
  return s;
}

void Engine::NoteOverflowPlacement() {
  MutexLock lock(mu_);
  ++stats_.num_overflow_placements;
}

void Engine::NoteKernelWait(int64_t nanos) {
  MutexLock lock(mu_);
  ++stats_.num_kernel_waits;
  stats_.time_kernel_waiting_ns += nanos;
  stats_.time_longest_kernel_wait_ns = std::max(stats_.time_longest_kernel_wait_ns, nanos);
}

uint64_t Engine::OptionalAllowanceLeft() const {
  // Note [Optional requests]: a sixteenth of the device a step.
  const int64_t allowance = static_cast<int64_t>(device_pool_.capacity() * granule_ / 16);
  const int64_t evicted = optional_steps_[optional_current_].evicted;
  return allowance > evicted ? static_cast<uint64_t>(allowance - evicted) / granule_ : 0;
}

bool Engine::OptionalMayEvict(uint64_t granules) const {
  // What the request cannot take from free (or cached) device memory must
  // fit what is left; the victims are checked against it when planned.
  const uint64_t room =
      device_pool_.free_count() + (defrag_enabled_ ? backing_.cached_count() : 0);
  const uint64_t short_of = granules > room ? granules - room : 0;
  return lms_enabled_ && short_of <= OptionalAllowanceLeft();
}

ChunkId Engine::PlaceOptionalUnit(uint64_t n, Hold hold, Status* status) {
  // No MakeRoomUnlocked: it may release the lock, and other threads'
  // reclaims must never see the cap.
  reclaim_cap_granules_ = OptionalAllowanceLeft();
  const ChunkId c = PlaceUnit(n, hold, /*may_evict=*/true,
                              /*may_be_born_evicted=*/false, status);
  reclaim_cap_granules_ = kNoReclaimCap;
  return c;
}

Status Engine::Evict(const void* ptr) {
  MutexLock lock(mu_);
  const ChunkId c = UnitAt(ptr);
  if (c == kNoChunk) {
    return NotFound("evict of " + FormatAddress(ptr) +
                    ": not inside a live allocation of this allocator");
  }
  const Residency::Record& r = residency_.record(c);
  if (r.evicted) return FailedPrecondition("evict of " + FormatAddress(ptr) + ": already evicted");
  if (r.pin_count > 0) return FailedPrecondition("evict of " + FormatAddress(ptr) + ": it is pinned");
  if (r.move != Residency::Move::kNone) {
    return FailedPrecondition("evict of " + FormatAddress(ptr) + ": it is being moved");
  }
  if (r.unclaimed > 0) {
    return FailedPrecondition("evict of " + FormatAddress(ptr) +
                              ": it holds memory allocated outside any kernel that no "
                              "pin has claimed yet (its writer may still be writing it)");
  }
  Status s = EvictChunks({c}, /*may_unlock=*/false);
  RefreshPoolStatistics();
  return s;
}

Status Engine::WaitForCopies() {
  MutexLock lock(mu_);
  return backend_->WaitForCopies();
}

Status Engine::Inspect(const void* ptr, AllocationInfo* info) const {
  MutexLock lock(mu_);
  const ChunkId c = UnitAt(ptr);
  if (c == kNoChunk) return NotFound("no live allocation contains " + FormatAddress(ptr));
  const BestFitArena::Chunk& unit = arena_.chunk(c);
  const Residency::Record& r = residency_.record(c);
  const uintptr_t unit_address = SlotAddress(unit.start);
  if (r.segment != Residency::kNoSegment) {
    const ChunkId o = SmallObjectAt(c, ptr);
    if (o == kNoChunk) {
      return NotFound("no small-object allocation starts at " + FormatAddress(ptr));
    }
    const BestFitArena::Chunk& object = small_.arena_of(r.segment).chunk(o);
    *info = AllocationInfo{object.allocation_id, reinterpret_cast<uintptr_t>(ptr),
                           object.requested_bytes, object.size * SmallPages::kUnit,
                           true, r.evicted, r.pin_count, object.unclaimed,
                           unit.allocation_id, unit_address};
    return Status::Ok();
  }
  *info = AllocationInfo{unit.allocation_id, unit_address, unit.requested_bytes,
                         unit.size * granule_, false, r.evicted, r.pin_count,
                         r.unclaimed > 0, unit.allocation_id, unit_address};
  return Status::Ok();
}

size_t Engine::RequestedSize(const void* ptr) const {
  AllocationInfo info;
  return Inspect(ptr, &info).ok() ? info.requested_bytes : 0;
}

size_t Engine::AllocatedSize(const void* ptr) const {
  AllocationInfo info;
  return Inspect(ptr, &info).ok() ? info.allocated_bytes : 0;
}

uint64_t Engine::AllocationId(const void* ptr) const {
  AllocationInfo info;
  return Inspect(ptr, &info).ok() ? info.id : 0;
}

void Engine::NoteRelease() {
  PublishHeld();
  ++release_epoch_;
  if (release_waiters_ > 0) released_.notify_all();
}

void Engine::StartPublishingHeld() const {
  MutexLock lock(mu_);
  if (!publish_held_) {
    publish_held_ = true;
    held_bytes_.store(HeldNow(), std::memory_order_relaxed);
  }
  held_published_.store(true, std::memory_order_release);
}

void Engine::NoteReleaseOutside() {
  MutexLock lock(mu_);
  NoteRelease();
}

uint64_t Engine::ReleaseEpoch() const {
  MutexLock lock(mu_);
  return release_epoch_;
}

bool Engine::WaitForRelease(uint64_t epoch, std::chrono::milliseconds timeout) const {
  MutexLock lock(mu_);
  ++release_waiters_;
  const bool released = mu_.AwaitWithTimeout(
      released_, timeout,
      [&]() LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return release_epoch_ != epoch; });
  --release_waiters_;
  return released;
}

Statistics Engine::GetStatistics() const {
  MutexLock lock(mu_);
  Statistics s = stats_;
  const BackendStatistics b = backend_->GetStatistics();
  s.num_fences = b.fences;
  s.num_host_waits = b.host_waits;
  s.num_copies = b.copies;
  s.bytes_copied = b.bytes_copied;
  s.time_copying_ns = b.copy_ns;
  s.time_waiting_ns = b.wait_ns;
  s.time_fencing_ns = b.fence_ns;
  s.time_creating_memory_ns = b.create_ns;
  s.time_mapping_ns = b.map_ns;
  s.time_unmapping_ns = b.unmap_ns;
  s.time_lock_waiting_ns = mu_.waited_ns();
  s.num_predictions = static_cast<int64_t>(learned_.num_predictions());
  s.num_prediction_hits = static_cast<int64_t>(learned_.num_prediction_hits());
  return s;
}

Status Engine::CheckCopyRange(const void* ptr, size_t bytes) const {
  const ChunkId c = UnitAt(ptr);
  const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
  if (c == kNoChunk || bytes == 0 ||
      UnitAt(reinterpret_cast<const void*>(a + bytes - 1)) != c) {
    return NotFound("copying " + FormatBytes(bytes) + " at " + FormatAddress(ptr) +
                    ": the range is not inside one live allocation of this allocator");
  }
  return Status::Ok();
}

Status Engine::CopyToHost(const void* ptr, void* dst, size_t bytes) {
  MutexLock lock(mu_);
  // A unit paging in maps nothing at its address until its remap when its
  // eviction left it unmapped: the copy waits for it (Note [Evicted tensors
  // unmapped]).
  const ChunkId c = unmap_evicted_ ? SettledUnitAt(ptr, /*or_evicting=*/false) : UnitAt(ptr);
  LMS_RETURN_IF_ERROR(CheckCopyRange(ptr, bytes));
  LMS_RETURN_IF_ERROR(MapEvictedBack(c));
  return backend_->CopyToHost(dst, reinterpret_cast<uintptr_t>(ptr), bytes);
}

Status Engine::CopyFromHost(void* ptr, const void* src, size_t bytes) {
  MutexLock lock(mu_);
  const ChunkId c = SettledUnitAt(ptr, /*or_evicting=*/false);
  LMS_RETURN_IF_ERROR(CheckCopyRange(ptr, bytes));
  residency_.AbandonEviction(c);
  LMS_RETURN_IF_ERROR(MapEvictedBack(c));
  return backend_->CopyFromHost(reinterpret_cast<uintptr_t>(ptr), src, bytes);
}

void Engine::ResetPeaks() {
  MutexLock lock(mu_);
  stats_.peak_bytes_in_use = stats_.bytes_in_use;
  stats_.peak_bytes_reserved = stats_.bytes_reserved;
  stats_.peak_bytes_active = stats_.bytes_active;
  stats_.peak_bytes_reclaimed = stats_.current_bytes_reclaimed;
  stats_.host_peak_bytes_in_use = stats_.host_bytes_in_use;
}

void Engine::SetLmsEnabled(bool enabled) {
  MutexLock lock(mu_);
  lms_enabled_ = enabled;
}

bool Engine::lms_enabled() const {
  MutexLock lock(mu_);
  return lms_enabled_;
}

void Engine::SetDefragEnabled(bool enabled) {
  MutexLock lock(mu_);
  defrag_enabled_ = enabled;
}

bool Engine::defrag_enabled() const {
  MutexLock lock(mu_);
  return defrag_enabled_;
}

size_t Engine::device_granules_in_use() const {
  MutexLock lock(mu_);
  return device_pool_.in_use();
}

size_t Engine::small_pages() const {
  MutexLock lock(mu_);
  return small_.live_pages();
}

size_t Engine::cached_granules() const {
  MutexLock lock(mu_);
  return backing_.cached_count();
}

std::vector<UnpinnedTouch> Engine::UnpinnedTouches() const {
  return strict_ ? strict_->Report() : std::vector<UnpinnedTouch>();
}

void Engine::ClearUnpinnedTouches() {
  if (strict_) strict_->ClearReport();
}

}  // namespace lms
