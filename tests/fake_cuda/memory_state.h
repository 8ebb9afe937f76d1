// The fake's physical memory (pools and handles) and device address space
// (reservations and mappings), guarded together by one mutex: a mapping
// refers to a handle, and a released handle's memory returns to its pool
// only when its last mapping goes, so the two change in the same step.
//
// Invariants (checked by fake_cuda_check_invariants, invariants.cc):
//   pool.used == sum of handle.size over the pool's handles (released or not)
//   pool.used + sum of pool.free_extents == kPoolSpan
//   handle.mappings == number of mappings of the handle
//   a released handle exists only while handle.mappings > 0
//   every mapping lies inside one reservation and mappings do not overlap.
#ifndef TENSORFLOW_LMS_ALLOCATOR_TESTS_FAKE_CUDA_MEMORY_STATE_H_
#define TENSORFLOW_LMS_ALLOCATOR_TESTS_FAKE_CUDA_MEMORY_STATE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "engine/mutex.h"
#include "knobs.h"

namespace lms {
namespace cu {
namespace fake {

// Physical memory of one kind: a sparse memfd of kPoolSpan bytes whose
// extents back handles. The capacity cap is accounting (Knobs): extents come
// from the whole span, so changing the cap never moves memory.
struct Pool {
  int fd = -1;
  size_t used = 0;
  std::map<uint64_t, uint64_t> free_extents;  // offset -> bytes, coalesced
};

// 1 TiB: a pool as large as a machine's host memory can be (a sparse file
// costs only the pages written).
constexpr uint64_t kPoolSpan = uint64_t{1} << 40;

struct Handle {
  bool host = false;  // in the host pool (location HOST or HOST_NUMA)
  uint64_t offset = 0;
  size_t size = 0;
  bool released = false;
  int mappings = 0;
  // The device device-located memory is on (CU_MEM_LOCATION_TYPE_DEVICE's
  // id); -1 for host-located memory, which every device may be granted.
  int device = -1;
};

// Reserved device addresses: PROT_NONE host address space at the device
// address (a host touch faults), and an alias of the same size where mapped
// memory is reachable read/write for stream workers and kernels.
struct Reservation {
  size_t size = 0;
  uintptr_t alias = 0;
};

// One cuMemMap. Access is per granule (cuMemSetAccess may cover part of a
// mapping): the device's CU_MEM_ACCESS_FLAGS_PROT_* and the host's.
struct Mapping {
  size_t size = 0;
  uint64_t handle = 0;
  uint64_t offset = 0;  // into the handle's memory: cuMemMap's `offset`
  std::vector<std::array<uint8_t, kMaxDevices>> device_access;
  std::vector<uint8_t> host_access;
};

struct MemoryState {
  Mutex mu;
  Pool device_pool LMS_GUARDED_BY(mu);
  Pool host_pool LMS_GUARDED_BY(mu);
  uint64_t next_handle LMS_GUARDED_BY(mu) = 0x1000;
  std::map<uint64_t, Handle> handles LMS_GUARDED_BY(mu);
  std::map<uint64_t, Reservation> reservations LMS_GUARDED_BY(mu);  // by base
  std::map<uint64_t, Mapping> mappings LMS_GUARDED_BY(mu);  // by address
};

// Never destroyed: stream workers may resolve addresses during exit.
MemoryState& Memory();

// Returns the handle's extent to its pool and forgets the handle.
void FreeHandle(MemoryState& m, uint64_t handle_id)
    LMS_EXCLUSIVE_LOCKS_REQUIRED(m.mu);

Pool& PoolOf(MemoryState& m, bool host) LMS_EXCLUSIVE_LOCKS_REQUIRED(m.mu);

}  // namespace fake
}  // namespace cu
}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_TESTS_FAKE_CUDA_MEMORY_STATE_H_
