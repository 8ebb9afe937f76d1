// NodePool and PoolAllocator (engine/node_pool.h, Note [Nodes from slabs]):
// containers over a pool hold what the same containers over the standard
// allocator hold, their nodes come from the pool's slabs and are reused, and
// a hash table's buckets do not.
#include "engine/node_pool.h"

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <unordered_map>

#include "harness.h"

namespace lms {
namespace {

TEST(APooledSetHoldsWhatAStandardSetHoldsUnderRandomChanges) {
  NodePool pool;
  PooledSet<uint64_t> pooled{PoolAllocator<uint64_t>(&pool)};
  std::set<uint64_t> model;
  std::mt19937_64 rng(20261206);
  for (int step = 0; step < 50000; ++step) {
    const uint64_t v = rng() % 3000;
    if (rng() % 3 == 0) {
      EXPECT_EQ(pooled.erase(v), model.erase(v));
    } else {
      EXPECT_EQ(pooled.insert(v).second, model.insert(v).second);
    }
  }
  ASSERT_TRUE(pooled.size() == model.size());
  auto it = pooled.begin();
  for (uint64_t v : model) EXPECT_EQ(*it++, v);
  // At most 3000 values at once: a few slabs, not one node per insertion.
  EXPECT_TRUE(pool.slab_bytes() > 0);
  EXPECT_TRUE(pool.slab_bytes() <= 3 * NodePool::kSlabNodes * 64);
}

TEST(AFreedNodeIsTheNextOneGivenAndNewOnesComeFromTheSlabInOrder) {
  NodePool pool;
  PoolAllocator<uint64_t> a(&pool);
  uint64_t* first = a.allocate(1);
  uint64_t* second = a.allocate(1);
  uint64_t* third = a.allocate(1);
  // One slab, nodes one after another (8 bytes: a node holds the free link).
  EXPECT_TRUE(second == first + 1);
  EXPECT_TRUE(third == second + 1);
  a.deallocate(second, 1);
  EXPECT_TRUE(a.allocate(1) == second);  // last freed, first given
  EXPECT_TRUE(a.allocate(1) == third + 1);
  EXPECT_EQ(pool.slab_bytes(), NodePool::kSlabNodes * sizeof(uint64_t));
}

TEST(ASlabFullStartsAnotherAndNodesStayAligned) {
  struct alignas(16) Wide {
    uint64_t a, b, c;  // 24 bytes, a node of 32
  };
  NodePool pool;
  PoolAllocator<Wide> a(&pool);
  for (size_t i = 0; i < NodePool::kSlabNodes + 1; ++i) {
    Wide* w = a.allocate(1);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(w) % 16, uintptr_t{0});
    w->a = i;
  }
  EXPECT_EQ(pool.slab_bytes(), 2 * NodePool::kSlabNodes * 32);
}

TEST(AHashTablesBucketsComeFromOperatorNewAndItsNodesFromThePool) {
  using Pooled = std::unordered_map<uint64_t, uint64_t, std::hash<uint64_t>,
                                    std::equal_to<uint64_t>,
                                    PoolAllocator<std::pair<const uint64_t, uint64_t>>>;
  NodePool pool;
  Pooled map(16, std::hash<uint64_t>(), std::equal_to<uint64_t>(),
             PoolAllocator<std::pair<const uint64_t, uint64_t>>(&pool));
  std::map<uint64_t, uint64_t> model;
  std::mt19937_64 rng(7);
  for (int step = 0; step < 20000; ++step) {  // rehashes as it grows
    const uint64_t k = rng() % 5000;
    if (rng() % 4 == 0) {
      EXPECT_EQ(map.erase(k), model.erase(k));
    } else {
      map[k] = step;
      model[k] = step;
    }
  }
  ASSERT_TRUE(map.size() == model.size());
  for (const auto& [k, v] : model) EXPECT_EQ(map.at(k), v);
  // Nodes only: at most 5000 at once, every one of one size.
  EXPECT_TRUE(pool.slab_bytes() <= 5 * NodePool::kSlabNodes * 64);
}

TEST(AllocatorsCompareEqualExactlyWhenTheyShareAPool) {
  NodePool one, other;
  PoolAllocator<uint64_t> a(&one), b(&one), c(&other);
  PoolAllocator<uint32_t> rebound(a);
  EXPECT_TRUE(a == b);
  EXPECT_TRUE(a != c);
  EXPECT_TRUE(rebound == a);
  EXPECT_TRUE(rebound.pool() == &one);
}

}  // namespace
}  // namespace lms
