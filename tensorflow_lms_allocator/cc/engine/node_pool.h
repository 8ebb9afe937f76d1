// NodePool: the nodes of the engine's node-based containers (std::set,
// std::map, std::unordered_map) from slabs of their own, instead of one
// malloc and free each.
//
// Note [Nodes from slabs]
// =======================
// The reclaim order's sets (reclaim_order.h) change at every unpin, pin,
// birth and free, and the device and host pools' free lists (granule_pool.h,
// run_pool.h) at every give and take. With malloc, each change is a malloc or
// a free, and a node lands wherever malloc has room: among 100,000 units that
// is anywhere in the heap, and a reclaim's walk of a set misses the cache at
// every node. A pool hands out nodes of one size from slabs of kSlabNodes and
// takes them back onto a free list, last freed first out: a change costs a
// few instructions, and nodes made one after another (a step's units, as they
// turn inactive) sit next to each other. `make bench-scale`: the learned
// policy's planning grew 1.58-1.72x from 1,000 to 100,000 units with malloc
// (and the order's erases searching their sets), 1.44-1.45x with pools (and
// erases by iterator): docs/decisions/0021-nodes-from-slabs.md.
//
// A pool serves one node size, fixed by its first request (a container's
// allocator rebinds to its node type; every node of one container has one
// size). Requests of more than one object, or of another size (a hash
// table's buckets), go to operator new. Memory goes back only when the pool
// is destroyed, so a pool keeps the most nodes its containers ever held at
// once: their own peak, which malloc would mostly keep too.
//
// PoolAllocator<T> is the standard allocator over a pool; copies and rebinds
// share the pool, and two compare equal iff they share it. The pool must
// outlive every container using it: declare it before them.
//
// Example:
//   NodePool pool;
//   PooledSet<int> s{PoolAllocator<int>(&pool)};
//   s.insert(1);  // its node comes from the pool's slab
//
// Thread-compatible: the engine's lock guards every call.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_NODE_POOL_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_NODE_POOL_H_

#include <cassert>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <set>
#include <utility>
#include <vector>

namespace lms {

class NodePool {
 public:
  static constexpr size_t kSlabNodes = 1024;

  NodePool() = default;
  NodePool(const NodePool&) = delete;
  NodePool& operator=(const NodePool&) = delete;

  // Whether the pool serves objects of `bytes` aligned to `alignment`: the
  // size of its first request (any, before the first).
  bool Serves(size_t bytes, size_t alignment) const {
    return alignment <= alignof(std::max_align_t) &&
           (node_bytes_ == 0 || NodeBytes(bytes, alignment) == node_bytes_);
  }

  // A node of `bytes` aligned to `alignment`, which the pool serves.
  void* Allocate(size_t bytes, size_t alignment) {
    assert(Serves(bytes, alignment));
    if (node_bytes_ == 0) node_bytes_ = NodeBytes(bytes, alignment);  // the first
    if (free_ != nullptr) {
      Free* node = free_;
      free_ = node->next;
      return node;
    }
    if (slab_left_ == 0) {
      slabs_.emplace_back(new unsigned char[node_bytes_ * kSlabNodes]);
      next_ = slabs_.back().get();
      slab_left_ = kSlabNodes;
    }
    void* node = next_;
    next_ += node_bytes_;
    --slab_left_;
    return node;
  }

  // Takes back a node Allocate gave.
  void Deallocate(void* node) {
    Free* f = static_cast<Free*>(node);
    f->next = free_;
    free_ = f;
  }

  // Bytes of slabs made so far.
  size_t slab_bytes() const { return slabs_.size() * node_bytes_ * kSlabNodes; }

 private:
  struct Free {
    Free* next;
  };
  // Room for the free list's link; a multiple of the alignment, so every node
  // of a slab is aligned as its first.
  static size_t NodeBytes(size_t bytes, size_t alignment) {
    const size_t a = alignment < alignof(Free) ? alignof(Free) : alignment;
    const size_t b = bytes < sizeof(Free) ? sizeof(Free) : bytes;
    return (b + a - 1) / a * a;
  }
  size_t node_bytes_ = 0;
  Free* free_ = nullptr;
  unsigned char* next_ = nullptr;  // in the last slab
  size_t slab_left_ = 0;           // nodes at next_ and after it
  // new[] of unsigned char is aligned for any fundamental type.
  std::vector<std::unique_ptr<unsigned char[]>> slabs_;
};

template <typename T>
class PoolAllocator {
 public:
  using value_type = T;

  explicit PoolAllocator(NodePool* pool) : pool_(pool) {}
  template <typename U>
  PoolAllocator(const PoolAllocator<U>& other) : pool_(other.pool()) {}  // NOLINT: rebinds

  T* allocate(size_t n) {
    if (n == 1 && pool_->Serves(sizeof(T), alignof(T))) {
      return static_cast<T*>(pool_->Allocate(sizeof(T), alignof(T)));
    }
    return std::allocator<T>().allocate(n);
  }
  // The same choice as allocate's: the pool's size is fixed by then.
  void deallocate(T* p, size_t n) {
    if (n == 1 && pool_->Serves(sizeof(T), alignof(T))) {
      pool_->Deallocate(p);
    } else {
      std::allocator<T>().deallocate(p, n);
    }
  }

  NodePool* pool() const { return pool_; }

  template <typename U>
  bool operator==(const PoolAllocator<U>& other) const {
    return pool_ == other.pool();
  }
  template <typename U>
  bool operator!=(const PoolAllocator<U>& other) const {
    return pool_ != other.pool();
  }

 private:
  NodePool* pool_;
};

// The engine's ordered containers over a pool, made with the pool's
// allocator: PooledSet<T> s{PoolAllocator<T>(&pool)}.
template <typename T>
using PooledSet = std::set<T, std::less<T>, PoolAllocator<T>>;
template <typename K, typename V>
using PooledMap = std::map<K, V, std::less<K>, PoolAllocator<std::pair<const K, V>>>;

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_NODE_POOL_H_
