// Reservations are PROT_NONE host address space at the device address, so a
// host touch of device memory faults as on a GPU; host-located memory with
// host access is mapped at its address for real. Each reservation has an
// alias of the same size where every mapping is visible read/write to stream
// workers and kernels, whatever its access: access is checked before work
// touches memory (ResolveForDevice), not by the MMU.
//
// A range unmapped while in-flight work references it (a violation) has its
// alias replaced by anonymous scratch memory rather than PROT_NONE, so the
// racing work corrupts nothing real and does not crash the test that is
// about to report the violation; a reservation freed in that state keeps its
// alias mapped for the same reason (a bounded leak, only after a violation).
#include "address_space.h"
#include "timing.h"

#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "checker.h"
#include "context.h"
#include "entry_points.h"
#include "fake_cuda.h"
#include "memory_state.h"

namespace lms {
namespace cu {
namespace fake {
namespace {

constexpr int kNoAccess = CU_MEM_ACCESS_FLAGS_PROT_NONE;
constexpr int kReadWrite = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

bool ValidAccessFlags(int flags) {
  return flags == CU_MEM_ACCESS_FLAGS_PROT_NONE ||
         flags == CU_MEM_ACCESS_FLAGS_PROT_READ || flags == kReadWrite;
}

void* MapAt(uintptr_t at, size_t bytes, int prot, int flags, int fd, uint64_t offset) {
  return mmap(reinterpret_cast<void*>(at), bytes, prot, flags | MAP_FIXED, fd,
              static_cast<off_t>(offset));
}

// For remaps inside our own reservations after the driver state changed:
// they fail only when the process runs out of mappings (vm.max_map_count),
// which no CUresult describes, so the test stops with the reason.
void MapAtOrDie(uintptr_t at, size_t bytes, int prot, int flags, int fd, uint64_t offset) {
  if (MapAt(at, bytes, prot, flags, fd, offset) == MAP_FAILED) {
    std::perror("fake CUDA driver: mmap inside a reservation");
    std::abort();
  }
}

// Host address space nobody may touch (a reservation's initial state).
void MapInaccessible(uintptr_t at, size_t bytes) {
  MapAtOrDie(at, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
}

const Reservation* FindReservation(MemoryState& m, uint64_t address, size_t bytes)
    LMS_EXCLUSIVE_LOCKS_REQUIRED(m.mu) {
  auto it = m.reservations.upper_bound(address);
  if (it == m.reservations.begin()) return nullptr;
  --it;
  if (address + bytes > it->first + it->second.size || address + bytes < address) {
    return nullptr;
  }
  return &it->second;
}

// The part of one mapping a range covers, in granules of the mapping.
struct Piece {
  uint64_t address;  // of the mapping
  Mapping* mapping;
  size_t first;
  size_t count;
};

// The pieces of the mappings covering [address, address + bytes), in address
// order; false if a byte of the range is not mapped.
bool MappedPieces(MemoryState& m, uint64_t address, size_t bytes,
                  std::vector<Piece>* pieces) LMS_EXCLUSIVE_LOCKS_REQUIRED(m.mu) {
  pieces->clear();
  const size_t g = GetKnobs().granularity;
  auto it = m.mappings.upper_bound(address);
  if (it == m.mappings.begin()) return false;
  --it;
  uint64_t at = address;
  const uint64_t end = address + bytes;
  while (at < end) {
    if (it == m.mappings.end() || it->first > at ||
        it->first + it->second.size <= at) {
      return false;
    }
    const uint64_t piece_end = std::min<uint64_t>(end, it->first + it->second.size);
    const size_t first = (at - it->first) / g;
    const size_t last = (piece_end - 1 - it->first) / g;
    pieces->push_back({it->first, &it->second, first, last - first + 1});
    at = piece_end;
    ++it;
  }
  return true;
}

bool Aligned(uint64_t value) { return value % GetKnobs().granularity == 0; }

}  // namespace

void* ResolveForDevice(int device, uint64_t address, size_t bytes, bool writes,
                       std::string* why) {
  MemoryState& m = Memory();
  MutexLock lock(m.mu);
  const Reservation* r = FindReservation(m, address, bytes);
  if (r == nullptr) {
    *why = "not inside one reservation";
    return nullptr;
  }
  std::vector<Piece> pieces;
  const bool mapped = MappedPieces(m, address, bytes, &pieces);
  bool accessible = true;
  for (const Piece& p : pieces) {
    for (size_t i = p.first; i < p.first + p.count; ++i) {
      const int flags = p.mapping->device_access[i][device];
      if (flags == kNoAccess || (writes && flags != kReadWrite)) accessible = false;
    }
  }
  if (!mapped || !accessible) {
    *why = !mapped ? "not mapped" : writes ? "not mapped read/write for the device"
                                           : "not mapped with device access";
    return nullptr;
  }
  auto base = m.reservations.upper_bound(address);
  --base;
  return reinterpret_cast<void*>(r->alias + (address - base->first));
}

int DeviceHolding(uint64_t address, size_t bytes) {
  MemoryState& m = Memory();
  MutexLock lock(m.mu);
  std::vector<Piece> pieces;
  if (FindReservation(m, address, bytes) == nullptr ||
      !MappedPieces(m, address, bytes, &pieces)) {
    return -1;
  }
  int device = -1;
  for (const Piece& p : pieces) {
    const int owner = m.handles[p.mapping->handle].device;
    if (owner < 0 || (device >= 0 && owner != device)) return -1;
    device = owner;
  }
  return device;
}

std::shared_mutex& AliasMutex() {
  static std::shared_mutex* mu = new std::shared_mutex;  // used until exit
  return *mu;
}

bool InsideOneReservation(uint64_t address, size_t bytes) {
  MemoryState& m = Memory();
  MutexLock lock(m.mu);
  return FindReservation(m, address, bytes) != nullptr;
}

size_t DestroyAllMemory() {
  MemoryState& m = Memory();
  MutexLock lock(m.mu);
  const size_t count = m.mappings.size() + m.reservations.size() + m.handles.size();
  for (const auto& [base, r] : m.reservations) {
    munmap(reinterpret_cast<void*>(base), r.size);
    munmap(reinterpret_cast<void*>(r.alias), r.size);
  }
  for (const auto& [address, mapping] : m.mappings) --m.handles[mapping.handle].mappings;
  m.mappings.clear();
  m.reservations.clear();
  while (!m.handles.empty()) FreeHandle(m, m.handles.begin()->first);
  return count;
}

CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                             CUdeviceptr addr, unsigned long long flags) noexcept {
  Context* context = nullptr;
  if (CUresult r = RequireContext(&context)) return r;
  const size_t g = GetKnobs().granularity;
  if (alignment == 0) alignment = g;
  if (ptr == nullptr || size == 0 || !Aligned(size) || flags != 0 ||
      (alignment & (alignment - 1)) != 0 || alignment % g != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // `addr` is a hint, as in the real driver: taken if the kernel gives it.
  void* raw = mmap(reinterpret_cast<void*>(addr), size + alignment, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t base = (start + alignment - 1) / alignment * alignment;
  if (base > start) munmap(raw, base - start);
  munmap(reinterpret_cast<void*>(base + size), start + alignment - base);
  void* alias = mmap(nullptr, size, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (alias == MAP_FAILED) {
    munmap(reinterpret_cast<void*>(base), size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  MemoryState& m = Memory();
  MutexLock lock(m.mu);
  m.reservations[base] = Reservation{size, reinterpret_cast<uintptr_t>(alias)};
  *ptr = base;
  return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) noexcept {
  Context* context = nullptr;
  if (CUresult r = RequireContext(&context)) return r;
  MemoryState& m = Memory();
  MutexLock lock(m.mu);
  auto it = m.reservations.find(ptr);
  if (it == m.reservations.end() || it->second.size != size) {
    return CUDA_ERROR_INVALID_VALUE;  // only a whole reservation
  }
  auto mapped = m.mappings.lower_bound(ptr);
  if (mapped != m.mappings.end() && mapped->first < ptr + size) {
    return CUDA_ERROR_INVALID_VALUE;  // still mapped inside
  }
  const bool raced = CheckNoWorkInFlight("cuMemAddressFree", ptr, size);
  if (!raced) munmap(reinterpret_cast<void*>(it->second.alias), size);
  munmap(reinterpret_cast<void*>(ptr), size);
  m.reservations.erase(it);
  return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                  CUmemGenericAllocationHandle handle, unsigned long long flags) noexcept {
  Context* context = nullptr;
  if (CUresult r = RequireContext(&context)) return r;
  // cuda.h: "offset + size must be less than the size of the memory
  // allocation. Both ptr, size, and offset must be a multiple of" the minimum
  // granularity (read as "not more than": a whole handle maps from offset 0).
  // The same comment's parameter list still says of offset "currently must
  // be zero"; a driver that keeps to that is modeled by
  // fake_cuda_set_map_offset_zero_only, with the answer driver 580 gave on an
  // H100 (benchmarks/results/gpu-check-engine-h100-overlap.log, driver_timing).
  if (size == 0 || !Aligned(size) || !Aligned(ptr) || !Aligned(offset) || flags != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (offset != 0 && GetKnobs().map_offset_zero_only) return CUDA_ERROR_NOT_SUPPORTED;
  MemoryState& m = Memory();
  MutexLock lock(m.mu);
  auto h = m.handles.find(handle);
  if (h == m.handles.end() || h->second.released) return CUDA_ERROR_INVALID_VALUE;
  if (offset > h->second.size || size > h->second.size - offset) return CUDA_ERROR_INVALID_VALUE;
  const Reservation* r = FindReservation(m, ptr, size);
  if (r == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Only onto an unmapped part of the reservation.
  auto next = m.mappings.lower_bound(ptr);
  if (next != m.mappings.end() && next->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
  if (next != m.mappings.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size > ptr) return CUDA_ERROR_INVALID_VALUE;
  }
  if (ConsumeCountdown(GetKnobs().fail_map_countdown)) {
    return GetKnobs().fail_map_error.load();
  }
  const int fd = PoolOf(m, h->second.host).fd;
  auto base = m.reservations.upper_bound(ptr);
  --base;
  if (MapAt(r->alias + (ptr - base->first), size, PROT_READ | PROT_WRITE, MAP_SHARED,
            fd, h->second.offset + offset) == MAP_FAILED) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const size_t granules = size / GetKnobs().granularity;
  Mapping& mapping = m.mappings[ptr];
  mapping.size = size;
  mapping.handle = handle;
  mapping.offset = offset;
  mapping.device_access.assign(granules, {});
  mapping.host_access.assign(granules, kNoAccess);
  ++h->second.mappings;
  timing::Charge(timing::Call::kMap, h->second.host, size);
  return CUDA_SUCCESS;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) noexcept {
  WaitWhileUnmapsHeld();  // a test's gate (fake_cuda_hold_unmaps)
  Context* context = nullptr;
  if (CUresult r = RequireContext(&context)) return r;
  if (size == 0) return CUDA_ERROR_INVALID_VALUE;
  MemoryState& m = Memory();
  MutexLock lock(m.mu);
  // Whole mappings only: the range starts where one cuMemMap started and
  // ends where one ended, with no gap between.
  auto first = m.mappings.find(ptr);
  if (first == m.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
  auto last = first;
  uint64_t at = ptr;
  while (last != m.mappings.end() && last->first == at && at < ptr + size) {
    at += last->second.size;
    ++last;
  }
  if (at != ptr + size) return CUDA_ERROR_INVALID_VALUE;
  const bool raced = CheckNoWorkInFlight("cuMemUnmap", ptr, size);
  auto base = m.reservations.upper_bound(ptr);
  --base;
  const uintptr_t alias = base->second.alias + (ptr - base->first);
  if (raced) {
    std::unique_lock<std::shared_mutex> no_copy_moving(AliasMutex());
    MapAtOrDie(alias, size, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  } else {
    MapInaccessible(alias, size);
  }
  MapInaccessible(ptr, size);
  for (auto it = first; it != last;) {
    auto h = m.handles.find(it->second.handle);
    timing::Charge(timing::Call::kUnmap, h->second.host, it->second.size);
    if (--h->second.mappings == 0 && h->second.released) FreeHandle(m, h->first);
    it = m.mappings.erase(it);
  }
  return CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                        size_t count) noexcept {
  Context* context = nullptr;
  if (CUresult r = RequireContext(&context)) return r;
  if (desc == nullptr || count == 0 || size == 0 || !Aligned(ptr) || !Aligned(size)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  MemoryState& m = Memory();
  MutexLock lock(m.mu);
  std::vector<Piece> pieces;
  if (!MappedPieces(m, ptr, size, &pieces)) {
    return CUDA_ERROR_INVALID_VALUE;  // the whole range must be mapped
  }
  bool all_host = true;
  for (const Piece& p : pieces) all_host = all_host && m.handles[p.mapping->handle].host;
  for (size_t i = 0; i < count; ++i) {
    const CUmemLocation& loc = desc[i].location;
    if (!ValidAccessFlags(desc[i].flags)) return CUDA_ERROR_INVALID_VALUE;
    if (loc.type == CU_MEM_LOCATION_TYPE_DEVICE) {
      if (loc.id < 0 || loc.id >= GetKnobs().device_count) return CUDA_ERROR_INVALID_DEVICE;
      // A device is granted another device's memory only over a peer path:
      // "cuMemSetAccess is still subject to the constraints of
      // cuDeviceCanAccessPeer for cross device mappings" (NVIDIA's
      // cuda-samples, vectorAddMMAP.cpp). Host-located memory has no such
      // constraint.
      for (const Piece& p : pieces) {
        const int owner = m.handles[p.mapping->handle].device;
        if (owner >= 0 && owner != loc.id && !CanAccessPeer(loc.id, owner)) {
          return CUDA_ERROR_INVALID_DEVICE;
        }
      }
    } else if (loc.type == CU_MEM_LOCATION_TYPE_HOST ||
               loc.type == CU_MEM_LOCATION_TYPE_HOST_NUMA) {
      // Device memory is never accessible from the host.
      if (!all_host) return CUDA_ERROR_INVALID_VALUE;
    } else {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  CheckNoWorkInFlight("cuMemSetAccess", ptr, size);
  const size_t g = GetKnobs().granularity;
  // The driver's cost is per handle the range covers, whatever the part.
  for (const Piece& p : pieces) {
    timing::Charge(timing::Call::kAccess, m.handles[p.mapping->handle].host,
                   p.mapping->size);
  }
  for (size_t i = 0; i < count; ++i) {
    const CUmemLocation loc = desc[i].location;
    const int flags = desc[i].flags;
    const bool device = loc.type == CU_MEM_LOCATION_TYPE_DEVICE;
    for (const Piece& p : pieces) {
      for (size_t k = p.first; k < p.first + p.count; ++k) {
        if (device) {
          p.mapping->device_access[k][loc.id] = static_cast<uint8_t>(flags);
        } else {
          p.mapping->host_access[k] = static_cast<uint8_t>(flags);
        }
      }
      if (device) continue;
      // The host view at the address follows the host access.
      const uintptr_t at = p.address + p.first * g;
      if (flags == kNoAccess) {
        MapInaccessible(at, p.count * g);
        continue;
      }
      const int prot = flags == kReadWrite ? PROT_READ | PROT_WRITE : PROT_READ;
      MapAtOrDie(at, p.count * g, prot, MAP_SHARED, PoolOf(m, true).fd,
                 m.handles[p.mapping->handle].offset + p.mapping->offset + p.first * g);
    }
  }
  return CUDA_SUCCESS;
}

}  // namespace fake
}  // namespace cu
}  // namespace lms

using lms::cu::fake::Context;

FAKE_CUDA_EXPORT void* fake_cuda_device_alias(unsigned long long address,
                                              size_t bytes) noexcept {
  Context* context = lms::cu::fake::ExecutingContext();
  if (context == nullptr) context = lms::cu::fake::CurrentContextOrNull();
  const int device = context == nullptr ? 0 : context->device;
  std::string why;
  void* alias =
      lms::cu::fake::ResolveForDevice(device, address, bytes, /*writes=*/false, &why);
  if (alias == nullptr) {
    lms::cu::fake::RecordViolation("fake_cuda_device_alias of " +
                                   lms::cu::fake::DescribeRange(address, bytes) +
                                   ": " + why);
  }
  return alias;
}
