// Engine construction, the allocate/free fast paths, pin/unpin and queries.
// The out-of-memory path is in engine_reclaim.cc.
#include "engine/engine.h"

#include <algorithm>
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
                           ? options.small_object_threshold
                           : granule_),
      device_pool_(PoolKind::kDevice, options.device_bytes / granule_),
      host_pool_(PoolKind::kHost, options.host_bytes / granule_),
      // Every live allocation fits in device plus host memory; twice that
      // leaves room for address fragmentation, which costs no memory.
      large_slots_(2 * (options.device_bytes / granule_ +
                        options.host_bytes / granule_) + 16),
      large_arena_(large_slots_, /*index_interior=*/true),
      backing_(large_slots_),
      small_reserved_bytes_((options.device_bytes / granule_) * granule_),
      small_arena_(small_reserved_bytes_ / kSmallUnit,
                   /*index_interior=*/false),
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
    return InvalidArgument("strict mode needs the POSIX backend, not " +
                           std::string(backend->Name()));
  }
  std::unique_ptr<Engine> engine(new Engine(options, std::move(backend)));
  LMS_RETURN_IF_ERROR(engine->Init());
  RegisterForFork(engine.get());
  *out = std::move(engine);
  return Status::Ok();
}

Status Engine::Init() {
  std::lock_guard<std::mutex> lock(mu_);
  LMS_RETURN_IF_ERROR(
      backend_->ReserveAddressRange(large_slots_ * granule_, &large_base_));
  LMS_RETURN_IF_ERROR(
      backend_->ReserveAddressRange(small_reserved_bytes_, &small_base_));
  LMS_RETURN_IF_ERROR(
      backend_->CreatePool(PoolKind::kDevice, device_pool_.capacity()));
  if (host_pool_.capacity() > 0) {
    LMS_RETURN_IF_ERROR(
        backend_->CreatePool(PoolKind::kHost, host_pool_.capacity()));
  }
  large_arena_.Grow(large_slots_);
  if (options_.strict) {
    LMS_RETURN_IF_ERROR(
        StrictMonitor::Create(large_base_, large_slots_, granule_, &strict_));
  }
  stats_.bytes_limit = static_cast<int64_t>(device_pool_.capacity() * granule_);
  stats_.bytes_reservable_limit = stats_.bytes_limit;
  return Status::Ok();
}

Engine::~Engine() {
  UnregisterForFork(this);
  strict_.reset();  // stop serving faults before the ranges go away
  if (large_base_ != 0) {
    backend_->ReleaseAddressRange(large_base_, large_slots_ * granule_);
  }
  if (small_base_ != 0) {
    backend_->ReleaseAddressRange(small_base_, small_reserved_bytes_);
  }
}

void* Engine::Allocate(size_t bytes, bool pin, Status* status,
                       uint64_t* allocation_id) {
  Status ignored;
  if (status == nullptr) status = &ignored;
  uint64_t unused_id;
  if (allocation_id == nullptr) allocation_id = &unused_id;
  if (bytes == 0) {
    *status = InvalidArgument("zero-size allocation requested");
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(mu_);
  void* ptr = bytes < small_threshold_
                  ? AllocateSmall(bytes, status, allocation_id)
                  : AllocateLarge(bytes, pin, status, allocation_id);
  if (ptr != nullptr) ++stats_.num_allocs;
  // Even a failed request may have evicted or remapped granules.
  RefreshPoolStatistics();
  return ptr;
}

void* Engine::AllocateSmall(size_t bytes, Status* status,
                            uint64_t* allocation_id) {
  const uint64_t units = (bytes + kSmallUnit - 1) / kSmallUnit;
  ChunkId c = small_arena_.Allocate(units);
  if (c == kNoChunk) {
    const uint64_t granules = (units * kSmallUnit + granule_ - 1) >> granule_shift_;
    *status = GrowSmallRegion(granules);
    if (!status->ok()) return nullptr;
    c = small_arena_.Allocate(units);
    if (c == kNoChunk) {
      *status = Internal("small-object region grew but still cannot place " +
                         FormatBytes(bytes));
      return nullptr;
    }
  }
  BestFitArena::Chunk& chunk = small_arena_.chunk(c);
  chunk.requested_bytes = bytes;
  chunk.allocation_id = next_allocation_id_++;
  *allocation_id = chunk.allocation_id;
  const int64_t allocated = static_cast<int64_t>(units * kSmallUnit);
  stats_.bytes_in_use += allocated;
  stats_.bytes_active += allocated;
  stats_.largest_alloc_size = std::max(stats_.largest_alloc_size, allocated);
  return reinterpret_cast<void*>(small_base_ + chunk.start * kSmallUnit);
}

void* Engine::AllocateLarge(size_t bytes, bool pin, Status* status,
                            uint64_t* allocation_id) {
  const uint64_t n = (bytes + granule_ - 1) >> granule_shift_;
  if (n > device_pool_.capacity()) {
    *status = ResourceExhausted(
        "a request of " + FormatBytes(bytes) + " exceeds the device memory of " +
        FormatBytes(device_pool_.capacity() * granule_) +
        ": an allocation must fit in device memory to be used");
    return nullptr;
  }
  const ChunkId c = large_arena_.Allocate(n);
  if (c == kNoChunk) {
    *status = ResourceExhausted("no free address range of " + FormatBytes(n * granule_) +
                                " left for a request of " + FormatBytes(bytes));
    return nullptr;
  }
  const uint64_t first = large_arena_.chunk(c).start;
  // Cached slots in the range keep their granules: no mapping call.
  uint64_t unmapped = 0;
  for (uint64_t s = first; s < first + n; ++s) {
    if (backing_.IsCached(s)) backing_.RemoveCached(s);
    else ++unmapped;
  }
  if (unmapped > 0) {
    Status s = ObtainDeviceGranules(unmapped);
    if (s.ok()) {
      scratch_.resize(unmapped);
      device_pool_.Take(unmapped, scratch_.data());
      size_t next = 0;
      for (uint64_t run = first; run < first + n && s.ok();) {
        if (backing_.at(run).mapped) { ++run; continue; }
        uint64_t end = run;
        while (end < first + n && !backing_.at(end).mapped) ++end;
        s = MapSlots(run, end - run, PoolKind::kDevice, &scratch_[next],
                     Access::kReadWrite);
        if (s.ok()) next += end - run;
        run = end;
      }
      if (!s.ok()) device_pool_.Give(&scratch_[next], unmapped - next);
    }
    if (!s.ok()) {
      // Undo: whatever is device-mapped in the range goes back to the cache.
      for (uint64_t u = first; u < first + n; ++u) {
        if (backing_.at(u).mapped) backing_.AddCached(u);
      }
      large_arena_.Free(c);
      *status = s;
      return nullptr;
    }
  }
  BestFitArena::Chunk& chunk = large_arena_.chunk(c);
  chunk.requested_bytes = bytes;
  chunk.allocation_id = next_allocation_id_++;
  *allocation_id = chunk.allocation_id;
  residency_.Track(c, n, pin);
  const int64_t allocated = static_cast<int64_t>(n * granule_);
  stats_.bytes_in_use += allocated;
  (pin ? stats_.bytes_active : stats_.bytes_inactive) += allocated;
  stats_.largest_alloc_size = std::max(stats_.largest_alloc_size, allocated);
  return reinterpret_cast<void*>(SlotAddress(first));
}

Status Engine::Free(void* ptr) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mu_);
  if (InSmallRegion(ptr)) {
    const ChunkId c = (a - small_base_) % kSmallUnit == 0
                          ? small_arena_.ChunkAt((a - small_base_) / kSmallUnit)
                          : kNoChunk;
    if (c == kNoChunk) {
      return NotFound("free of " + FormatAddress(ptr) +
                      ": no live allocation starts there (never allocated, "
                      "or already freed)");
    }
    const int64_t allocated =
        static_cast<int64_t>(small_arena_.chunk(c).size * kSmallUnit);
    stats_.bytes_in_use -= allocated;
    stats_.bytes_active -= allocated;
    small_arena_.Free(c);
    NoteRelease();
    return Status::Ok();
  }
  const ChunkId c = LargeChunkAt(ptr);
  if (c == kNoChunk || SlotAddress(large_arena_.chunk(c).start) != a) {
    return NotFound("free of " + FormatAddress(ptr) +
                    ": no live allocation starts there (never allocated, "
                    "or already freed)");
  }
  Status s = FreeLarge(c);
  RefreshPoolStatistics();
  NoteRelease();
  return s;
}

Status Engine::FreeLarge(ChunkId c) {
  const uint64_t first = large_arena_.chunk(c).start;
  const Residency::Record& r = residency_.record(c);
  const uint64_t n = r.granules;
  const int64_t allocated = static_cast<int64_t>(n * granule_);
  Status status;
  if (r.evicted) {
    // Host granules go back to the host pool; the slots end up unmapped.
    for (uint64_t s = first; s < first + n; ++s) {
      host_pool_.Give(backing_.at(s).granule);
      backing_.Clear(s);
    }
    if (strict_) strict_->Unwatch(first, n);
    status = backend_->Unmap(SlotAddress(first), n);
    stats_.current_bytes_reclaimed -= allocated;
  } else {
    for (uint64_t s = first; s < first + n; ++s) backing_.AddCached(s);
  }
  stats_.bytes_in_use -= allocated;
  (r.pin_count > 0 ? stats_.bytes_active : stats_.bytes_inactive) -= allocated;
  residency_.Untrack(c);
  large_arena_.Free(c);
  return status;
}

ChunkId Engine::LargeChunkAt(const void* ptr) const {
  const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
  if (a < large_base_) return kNoChunk;
  return large_arena_.ChunkAt((a - large_base_) >> granule_shift_);
}

Status Engine::Pin(const void* ptr, uint64_t* allocation_id) {
  std::lock_guard<std::mutex> lock(mu_);
  const ChunkId c = LargeChunkAt(ptr);
  if (c == kNoChunk) {
    if (allocation_id != nullptr) *allocation_id = 0;
    if (InSmallRegion(ptr)) return Status::Ok();  // never evicted
    return NotFound("pin of " + FormatAddress(ptr) +
                    ": not inside a live allocation of this allocator");
  }
  if (allocation_id != nullptr) *allocation_id = large_arena_.chunk(c).allocation_id;
  const int64_t allocated = static_cast<int64_t>(residency_.record(c).granules * granule_);
  if (residency_.Pin(c) == 1) {
    stats_.bytes_inactive -= allocated;
    stats_.bytes_active += allocated;
  }
  // Peaks only count what is resident: bytes_active stays within the device.
  Status s = residency_.record(c).evicted ? PageIn(c) : Status::Ok();
  if (!s.ok()) {
    ++stats_.num_failed_pins;
    if (residency_.Unpin(c) == 0) {
      stats_.bytes_active -= allocated;
      stats_.bytes_inactive += allocated;
    }
  }
  RefreshPoolStatistics();
  return s;
}

Status Engine::Unpin(const void* ptr, uint64_t allocation_id) {
  std::lock_guard<std::mutex> lock(mu_);
  const ChunkId c = LargeChunkAt(ptr);
  if (c == kNoChunk) {
    if (InSmallRegion(ptr)) return Status::Ok();
    return NotFound("unpin of " + FormatAddress(ptr) +
                    ": not inside a live allocation of this allocator");
  }
  if (allocation_id != 0 && large_arena_.chunk(c).allocation_id != allocation_id) {
    return NotFound("unpin of " + FormatAddress(ptr) + ": allocation " +
                    std::to_string(allocation_id) + " was freed");
  }
  if (residency_.record(c).pin_count == 0) {
    return FailedPrecondition("unpin of " + FormatAddress(ptr) +
                              " without a matching pin");
  }
  if (residency_.Unpin(c) == 0) {
    const int64_t allocated = static_cast<int64_t>(residency_.record(c).granules * granule_);
    stats_.bytes_active -= allocated;
    stats_.bytes_inactive += allocated;
    NoteRelease();
  }
  return Status::Ok();
}

Status Engine::Evict(const void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  const ChunkId c = LargeChunkAt(ptr);
  if (c == kNoChunk) {
    return InSmallRegion(ptr)
               ? FailedPrecondition("evict of " + FormatAddress(ptr) +
                                    ": small-object allocations are never evicted")
               : NotFound("evict of " + FormatAddress(ptr) +
                          ": not inside a live allocation of this allocator");
  }
  const Residency::Record& r = residency_.record(c);
  if (r.evicted) return FailedPrecondition("evict of " + FormatAddress(ptr) + ": already evicted");
  if (r.pin_count > 0) return FailedPrecondition("evict of " + FormatAddress(ptr) + ": it is pinned");
  Status s = EvictChunk(c);
  RefreshPoolStatistics();
  return s;
}

Status Engine::Inspect(const void* ptr, AllocationInfo* info) const {
  std::lock_guard<std::mutex> lock(mu_);
  const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
  if (InSmallRegion(ptr)) {
    const ChunkId c = (a - small_base_) % kSmallUnit == 0
                          ? small_arena_.ChunkAt((a - small_base_) / kSmallUnit)
                          : kNoChunk;
    if (c == kNoChunk) return NotFound("no small-object allocation starts at " + FormatAddress(ptr));
    const BestFitArena::Chunk& chunk = small_arena_.chunk(c);
    *info = AllocationInfo{chunk.allocation_id, a, chunk.requested_bytes,
                           chunk.size * kSmallUnit, true, false, 0};
    return Status::Ok();
  }
  const ChunkId c = LargeChunkAt(ptr);
  if (c == kNoChunk) return NotFound("no live allocation contains " + FormatAddress(ptr));
  const BestFitArena::Chunk& chunk = large_arena_.chunk(c);
  const Residency::Record& r = residency_.record(c);
  *info = AllocationInfo{chunk.allocation_id, SlotAddress(chunk.start),
                         chunk.requested_bytes, chunk.size * granule_,
                         false, r.evicted, r.pin_count};
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

void Engine::RefreshPoolStatistics() {
  stats_.bytes_reserved = static_cast<int64_t>(device_pool_.in_use() * granule_);
  stats_.host_bytes_in_use = static_cast<int64_t>(host_pool_.in_use() * granule_);
  stats_.UpdatePeaks();
}

void Engine::NoteRelease() {
  ++release_epoch_;
  if (release_waiters_ > 0) released_.notify_all();
}

uint64_t Engine::ReleaseEpoch() const {
  std::lock_guard<std::mutex> lock(mu_);
  return release_epoch_;
}

bool Engine::WaitForRelease(uint64_t epoch, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  ++release_waiters_;
  const bool released =
      released_.wait_for(lock, timeout, [&] { return release_epoch_ != epoch; });
  --release_waiters_;
  return released;
}

Statistics Engine::GetStatistics() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Engine::ResetPeaks() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_bytes_in_use = stats_.bytes_in_use;
  stats_.peak_bytes_reserved = stats_.bytes_reserved;
  stats_.peak_bytes_active = stats_.bytes_active;
  stats_.peak_bytes_reclaimed = stats_.current_bytes_reclaimed;
  stats_.host_peak_bytes_in_use = stats_.host_bytes_in_use;
}

void Engine::SetLmsEnabled(bool enabled) {
  std::lock_guard<std::mutex> lock(mu_);
  lms_enabled_ = enabled;
}

bool Engine::lms_enabled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lms_enabled_;
}

void Engine::SetDefragEnabled(bool enabled) {
  std::lock_guard<std::mutex> lock(mu_);
  defrag_enabled_ = enabled;
}

bool Engine::defrag_enabled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return defrag_enabled_;
}

size_t Engine::device_granules_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return device_pool_.in_use();
}

size_t Engine::cached_granules() const {
  std::lock_guard<std::mutex> lock(mu_);
  return backing_.cached_count();
}

std::vector<UnpinnedTouch> Engine::UnpinnedTouches() const {
  return strict_ ? strict_->Report() : std::vector<UnpinnedTouch>();
}

void Engine::ClearUnpinnedTouches() {
  if (strict_) strict_->ClearReport();
}

}  // namespace lms
