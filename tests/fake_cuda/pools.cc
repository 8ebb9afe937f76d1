// Physical memory: the device and host pools and the handles cuMemCreate
// hands out. A handle owns an extent of its pool's memfd; cuMemRelease frees
// the handle, but its extent returns to the pool only when its last mapping
// goes, as the real driver defers it.
#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "context.h"
#include "entry_points.h"
#include "memory_state.h"
#include "timing.h"

namespace lms {
namespace cu {
namespace fake {
namespace {

int CreatePoolFd(const char* name) {
  const int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(kPoolSpan)) != 0) {
    std::perror("fake CUDA driver: memfd for a pool");
    std::abort();
  }
  return fd;
}

// First fit; extents are granularity multiples, so offsets stay aligned.
bool TakeExtent(Pool& pool, size_t bytes, uint64_t* offset) {
  for (auto it = pool.free_extents.begin(); it != pool.free_extents.end(); ++it) {
    if (it->second < bytes) continue;
    *offset = it->first;
    const uint64_t rest = it->second - bytes;
    pool.free_extents.erase(it);
    if (rest > 0) pool.free_extents[*offset + bytes] = rest;
    return true;
  }
  return false;
}

void ReturnExtent(Pool& pool, uint64_t offset, uint64_t bytes) {
  // Give the pages back, so a long test does not grow the memfd's footprint;
  // the next handle on this extent reads zeros.
  fallocate(pool.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
            static_cast<off_t>(offset), static_cast<off_t>(bytes));
  auto next = pool.free_extents.lower_bound(offset);
  if (next != pool.free_extents.end() && offset + bytes == next->first) {
    bytes += next->second;
    next = pool.free_extents.erase(next);
  }
  if (next != pool.free_extents.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += bytes;
      return;
    }
  }
  pool.free_extents[offset] = bytes;
}

// CUDA_SUCCESS, and whether the memory is host-located, if `prop` describes
// memory this driver creates; otherwise the real driver's error.
CUresult ValidateProp(const CUmemAllocationProp* prop, bool* host) {
  if (prop == nullptr || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->win32HandleMetaData != nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE) {
    return CUDA_ERROR_NOT_SUPPORTED;  // no export mechanism is faked
  }
  if (prop->allocFlags.compressionType != 0 ||
      prop->allocFlags.gpuDirectRDMACapable != 0 || prop->allocFlags.usage != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (unsigned char b : prop->allocFlags.reserved) {
    if (b != 0) return CUDA_ERROR_INVALID_VALUE;
  }
  const Knobs& k = GetKnobs();
  switch (prop->location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      if (prop->location.id < 0 || prop->location.id >= k.device_count) {
        return CUDA_ERROR_INVALID_DEVICE;
      }
      *host = false;
      return CUDA_SUCCESS;
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
      // Drivers before 12.2 do not know HOST_NUMA as a cuMemCreate location.
      if (k.driver_version < 12020) return CUDA_ERROR_INVALID_VALUE;
      if (!k.host_vmm_supported) return CUDA_ERROR_NOT_SUPPORTED;
      if (prop->location.id != 0) return CUDA_ERROR_INVALID_VALUE;  // one node
      *host = true;
      return CUDA_SUCCESS;
    case CU_MEM_LOCATION_TYPE_HOST:
      // Drivers before 13.0 do not know HOST as a cuMemCreate location.
      if (k.driver_version < 13000) return CUDA_ERROR_INVALID_VALUE;
      if (!k.host_vmm_supported) return CUDA_ERROR_NOT_SUPPORTED;
      *host = true;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

}  // namespace

MemoryState& Memory() {
  static MemoryState* m = [] {
    MemoryState* s = new MemoryState;
    MutexLock lock(s->mu);
    s->device_pool.fd = CreatePoolFd("fake_cuda_device_pool");
    s->device_pool.free_extents[0] = kPoolSpan;
    s->host_pool.fd = CreatePoolFd("fake_cuda_host_pool");
    s->host_pool.free_extents[0] = kPoolSpan;
    return s;
  }();
  return *m;
}

Pool& PoolOf(MemoryState& m, bool host) {
  return host ? m.host_pool : m.device_pool;
}

void FreeHandle(MemoryState& m, uint64_t handle_id) {
  auto it = m.handles.find(handle_id);
  if (it == m.handles.end()) return;
  Pool& pool = PoolOf(m, it->second.host);
  ReturnExtent(pool, it->second.offset, it->second.size);
  pool.used -= it->second.size;
  m.handles.erase(it);
}

CUresult cuMemGetAllocationGranularity(size_t* granularity,
                                       const CUmemAllocationProp* prop,
                                       int option) noexcept {
  if (CUresult r = RequireInitialized()) return r;
  if (granularity == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
      option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  bool host = false;
  if (CUresult r = ValidateProp(prop, &host)) return r;
  *granularity = GetKnobs().granularity;
  return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                     const CUmemAllocationProp* prop, unsigned long long flags) noexcept {
  Context* context = nullptr;
  if (CUresult r = RequireContext(&context)) return r;
  const Knobs& k = GetKnobs();
  if (handle == nullptr || flags != 0 || size == 0 || size % k.granularity != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  bool host = false;
  if (CUresult r = ValidateProp(prop, &host)) return r;
  // fake_cuda_refuse_host_create: only creation fails, as in a container
  // without NUMA support (the granularity query still answers).
  const int refused_type = prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ? 1
                           : prop->location.type == CU_MEM_LOCATION_TYPE_HOST    ? 2
                                                                                  : 0;
  if ((k.refuse_host_create & refused_type) != 0) return CUDA_ERROR_NOT_SUPPORTED;
  if (ConsumeCountdown(GetKnobs().fail_create_countdown)) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  MemoryState& m = Memory();
  MutexLock lock(m.mu);
  Pool& pool = PoolOf(m, host);
  const size_t capacity = host ? k.host_capacity : k.device_capacity;
  uint64_t offset = 0;
  if (pool.used + size > capacity || !TakeExtent(pool, size, &offset)) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  pool.used += size;
  const uint64_t id = m.next_handle++;
  m.handles[id] = Handle{host, offset, size, false, 0, host ? -1 : prop->location.id};
  *handle = id;
  timing::Charge(timing::Call::kCreate, host, size);
  return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) noexcept {
  Context* context = nullptr;
  if (CUresult r = RequireContext(&context)) return r;
  MemoryState& m = Memory();
  MutexLock lock(m.mu);
  auto it = m.handles.find(handle);
  if (it == m.handles.end() || it->second.released) return CUDA_ERROR_INVALID_VALUE;
  it->second.released = true;
  timing::Charge(timing::Call::kRelease, it->second.host, it->second.size);
  if (it->second.mappings == 0) FreeHandle(m, handle);
  return CUDA_SUCCESS;
}

}  // namespace fake
}  // namespace cu
}  // namespace lms
