// GranulePool: the free list of one pool of physical granules.
//
// The engine's device pool where the backend makes the pieces (DevicePool;
// the host pool, and device pieces the engine cuts, are RunPool's), and the
// index of ids not taken inside a RunPool that cuts pieces. The backend
// creates every granule of a pool once; the pool only decides which granule
// ids are free. A granule is either free
// here or backs exactly one address slot (an allocation, a cached free range,
// or the small-object region), so in_use() never exceeds capacity().
//
// Free ids are kept as extents (runs of consecutive ids), and Take hands out
// as few extents as it can: the smallest free extent that holds all n, else
// the largest ones first. A GPU driver remaps per mapping, not per byte, and
// the CUDA backend maps consecutive ids of one piece of device memory with
// one cuMemMap (Note [Device memory in runs] in cuda_backend.h), so a unit
// backed by one extent costs one mapping. A fresh pool hands out the lowest
// ids first.
//
// Thread-compatible: the engine's lock guards every call.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_GRANULE_POOL_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_GRANULE_POOL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "engine/backend.h"
#include "engine/node_pool.h"

namespace lms {

class GranulePool {
 public:
  GranulePool(PoolKind kind, size_t capacity);

  PoolKind kind() const { return kind_; }
  size_t capacity() const { return capacity_; }
  size_t free_count() const { return free_count_; }
  size_t in_use() const { return capacity_ - free_count_; }
  size_t peak_in_use() const { return peak_in_use_; }
  // How many extents the free ids form (1 for a fresh pool, 0 for a full one).
  size_t free_extents() const { return by_start_.size(); }

  // Takes `n` granules into out[0..n), all or none, each extent's ids in
  // ascending order. Returns false if fewer than `n` are free.
  bool Take(size_t n, GranuleId* out);
  // Gives back taken ids, in any order.
  void Give(const GranuleId* ids, size_t n);
  void Give(GranuleId id) { Give(&id, 1); }

  // The first n ids (*first the first of them) of the smallest free extent
  // that holds n and whose first n ids `accept` takes (if given), trying at
  // most `tries` extents, shortest first; false, and nothing taken, if none.
  bool TakeExtent(size_t n, GranuleId* first,
                  const std::function<bool(GranuleId first)>& accept = nullptr,
                  size_t tries = std::numeric_limits<size_t>::max());
  // Takes [first, first + length), every id of it free.
  void TakeRange(GranuleId first, uint32_t length);
  // Gives back [first, first + length), every id of it taken.
  void GiveRange(GranuleId first, uint32_t length);

 private:
  // First id -> length. The extents' nodes come from pools of their own
  // (Note [Nodes from slabs]): an extent comes and goes at every give and
  // take.
  using Extents = PooledMap<GranuleId, uint32_t>;
  using ByLength = std::pair<uint32_t, GranuleId>;
  // Takes `length` ids from the start of the free extent `it`.
  void TakeFrom(Extents::iterator it, uint32_t length, GranuleId* out);
  // Frees [first, first + length), none of it free, merged with neighbours.
  void Free(GranuleId first, uint32_t length);
  void Insert(GranuleId first, uint32_t length);
  void Erase(Extents::iterator it);

  const PoolKind kind_;
  const size_t capacity_;
  size_t free_count_ = 0;
  size_t peak_in_use_ = 0;
  // The free extents, by first id (never adjoining) and by (length, first).
  NodePool start_nodes_, length_nodes_;  // before the sets that use them
  Extents by_start_{Extents::allocator_type(&start_nodes_)};
  PooledSet<ByLength> by_length_{PoolAllocator<ByLength>(&length_nodes_)};
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_GRANULE_POOL_H_
