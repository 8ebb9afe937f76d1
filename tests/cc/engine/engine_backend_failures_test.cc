// The engine when its backend fails (backend.h's contract for each call):
// failed maps, unmaps, copies and remap batches lose no byte, leak no
// granule, and leave the books matching the mappings.
#include <memory>

#include "engine_test_util.h"

namespace lms::engine_test {
namespace {

// The test backend, whose next *fail_next_map Maps fail after each has
// mapped part of the range, as backend.h allows: every slot of the call ends
// up unmapped; whose
// next Unmap fails with nothing changed, if asked; and whose next
// EndRemapBatch, and the WaitForCopies after it, fail, if asked (a GPU whose
// copies can be neither ordered nor waited for).
class FaultyBackend : public Backend {
 public:
  explicit FaultyBackend(int* fail_next_map, int* fail_next_unmap = nullptr,
                         int* fail_next_order = nullptr, int* fail_next_ranges = nullptr)
      : inner_(lms_test::MakeTestBackend(kGranule)),
        fail_next_map_(fail_next_map),
        fail_next_unmap_(fail_next_unmap),
        fail_next_order_(fail_next_order),
        fail_next_ranges_(fail_next_ranges) {}
  const char* Name() const override { return "faulty"; }
  size_t granule_bytes() const override { return inner_->granule_bytes(); }
  Status ReserveAddressRange(size_t bytes, uintptr_t* base) override {
    return inner_->ReserveAddressRange(bytes, base);
  }
  void ReleaseAddressRange(uintptr_t base, size_t bytes) override {
    inner_->ReleaseAddressRange(base, bytes);
  }
  Status CreatePool(PoolKind pool, size_t granules) override {
    return inner_->CreatePool(pool, granules);
  }
  void DefineRuns(PoolKind pool, const GranuleRun* runs, size_t count) override {
    inner_->DefineRuns(pool, runs, count);
  }
  void ReleaseRuns(PoolKind pool, const GranuleRun* runs, size_t count) override {
    inner_->ReleaseRuns(pool, runs, count);
  }
  Status Map(uintptr_t address, PoolKind pool, const GranuleId* ids, size_t count,
             Access access) override {
    if (*fail_next_map_ == 0) return inner_->Map(address, pool, ids, count, access);
    --*fail_next_map_;
    inner_->Map(address, pool, ids, 1, access);  // part of the range...
    inner_->Unmap(address, count);                // ...then the contract's undo
    return Internal("injected Map failure");
  }
  Status Unmap(uintptr_t address, size_t count) override {
    if (fail_next_unmap_ != nullptr && *fail_next_unmap_ != 0) {
      *fail_next_unmap_ = 0;
      return Internal("injected Unmap failure");
    }
    return inner_->Unmap(address, count);
  }
  Status CopyGranules(PoolKind dst_pool, const GranuleId* dst, PoolKind src_pool,
                      const GranuleId* src, size_t bytes) override {
    return inner_->CopyGranules(dst_pool, dst, src_pool, src, bytes);
  }
  Status CopyRanges(PoolKind dst_pool, GranuleId dst, PoolKind src_pool, GranuleId src,
                    const ByteRange* ranges, size_t count) override {
    if (fail_next_ranges_ == nullptr || *fail_next_ranges_ == 0 || count < 2) {
      return inner_->CopyRanges(dst_pool, dst, src_pool, src, ranges, count);
    }
    // Part way, as a GPU's copies fail after some were issued.
    *fail_next_ranges_ = 0;
    inner_->CopyRanges(dst_pool, dst, src_pool, src, ranges, 1);
    return Internal("injected CopyRanges failure");
  }
  uint64_t ReleaseMark() const override { return inner_->ReleaseMark(); }
  Status UnmapReleased(uintptr_t address, size_t count, uint64_t mark) override {
    if (fail_next_unmap_ != nullptr && *fail_next_unmap_ != 0) {
      *fail_next_unmap_ = 0;
      return Internal("injected Unmap failure");
    }
    return inner_->UnmapReleased(address, count, mark);
  }
  Status CopiesAfterUse(uint64_t mark) override { return inner_->CopiesAfterUse(mark); }
  Status SettleMapping(uintptr_t address, size_t count) override {
    return inner_->SettleMapping(address, count);
  }
  Status WaitForCopies() override {
    if (fail_wait_) {
      fail_wait_ = false;
      return Internal("injected WaitForCopies failure");
    }
    return inner_->WaitForCopies();
  }
  Status BeginRemapBatch(uint64_t mark) override { return inner_->BeginRemapBatch(mark); }
  Status EndRemapBatch() override {
    Status s = inner_->EndRemapBatch();
    if (fail_next_order_ == nullptr || *fail_next_order_ == 0) return s;
    // 2: and the next Map (the restore) fails as well.
    if (*fail_next_order_ == 2) *fail_next_map_ = 1;
    *fail_next_order_ = 0;
    fail_wait_ = true;
    return Internal("injected EndRemapBatch failure");
  }
  bool HostCanTouch() const override { return inner_->HostCanTouch(); }
  Status CopyToHost(void* dst, uintptr_t address, size_t bytes) override {
    return inner_->CopyToHost(dst, address, bytes);
  }
  Status CopyFromHost(uintptr_t address, const void* src, size_t bytes) override {
    return inner_->CopyFromHost(address, src, bytes);
  }

 private:
  std::unique_ptr<Backend> inner_;
  int* const fail_next_map_;
  int* const fail_next_unmap_;
  int* const fail_next_order_;
  int* const fail_next_ranges_;
  bool fail_wait_ = false;
};

std::unique_ptr<Engine> MakeFaultyEngine(int* fail_next_map, int* fail_next_unmap = nullptr,
                                         int* fail_next_order = nullptr,
                                         int* fail_next_ranges = nullptr) {
  EngineOptions o;
  o.device_bytes = 4 * kGranule;
  o.host_bytes = 8 * kGranule;
  o.policy = PolicyKind::kLru;  // as written before the defaults agreed
  std::unique_ptr<Engine> e;
  if (!Engine::Create(o,
                      std::make_unique<FaultyBackend>(fail_next_map, fail_next_unmap,
                                                      fail_next_order, fail_next_ranges),
                      &e)
           .ok()) {
    std::abort();
  }
  return e;
}

// A page's copy that fails after its first range, evicting and then paging
// in: the page stays where its bytes are whole, and is counted as not moved.
TEST(APageWhoseCopyFailsPartWayKeepsEveryByte) {
  int fail_map = 0, fail_unmap = 0, fail_order = 0, fail_ranges = 0;
  auto e = MakeFaultyEngine(&fail_map, &fail_unmap, &fail_order, &fail_ranges);
  const size_t size = kGranule / 8;  // a hole of it between: two ranges
  void* a = MustAllocate(*e, size);
  void* hole = MustAllocate(*e, size);
  void* c = MustAllocate(*e, size);
  ASSERT_TRUE(a != nullptr && hole != nullptr && c != nullptr);
  Fill(*e, a, size, 41);
  Fill(*e, c, size, 43);
  EXPECT_OK(e->Free(hole));
  fail_ranges = 1;
  EXPECT_TRUE(Contains(e->Evict(a).message(), "injected CopyRanges failure"));
  AllocationInfo info;
  EXPECT_OK(e->Inspect(a, &info));
  EXPECT_TRUE(!info.evicted);
  EXPECT_EQ(e->GetStatistics().bytes_copied_out, 0);
  EXPECT_OK(e->Evict(a));
  fail_ranges = 1;
  uint64_t id = 0;
  EXPECT_TRUE(Contains(e->Pin(c, &id).message(), "injected CopyRanges failure"));
  EXPECT_OK(e->Inspect(a, &info));
  EXPECT_TRUE(info.evicted);
  EXPECT_EQ(e->GetStatistics().bytes_copied_in, 0);
  EXPECT_EQ(Verify(*e, a, size, 41), -1);
  EXPECT_EQ(Verify(*e, c, size, 43), -1);
  EXPECT_OK(e->Pin(c, &id));
  EXPECT_EQ(e->GetStatistics().bytes_copied_in, static_cast<int64_t>(2 * size));
  EXPECT_EQ(Verify(*e, a, size, 41), -1);
  EXPECT_EQ(Verify(*e, c, size, 43), -1);
  EXPECT_OK(e->Unpin(c, id));
  EXPECT_OK(e->CheckInvariants());
  for (void* p : {a, c}) EXPECT_OK(e->Free(p));
}

// An unpinned unit of two granules filled with `seed`'s pattern (null if
// the allocation failed).
void* FilledUnit(Engine& e, uint64_t seed) {
  void* p = MustAllocate(e, 2 * kGranule);
  if (p != nullptr) Fill(e, p, 2 * kGranule, seed);
  return p;
}

// backend.h, BeginRemapBatch: when a batch's copies can be neither ordered
// nor waited for, no copy may be trusted. A reclaim of two victims then
// keeps both resident (each remapped back to its device granules, which
// still hold its bytes) and hands every host granule back.
TEST(AReclaimWhoseCopiesCannotBeOrderedKeepsEveryVictimResident) {
  int fail_map = 0, fail_unmap = 0, fail_order = 0;
  auto e = MakeFaultyEngine(&fail_map, &fail_unmap, &fail_order);
  void* a = FilledUnit(*e, 31);
  void* b = FilledUnit(*e, 32);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  fail_order = 1;
  Status s;
  EXPECT_TRUE(e->Allocate(4 * kGranule, /*pin=*/true, &s) == nullptr);  // needs both
  EXPECT_TRUE(s.code() == StatusCode::kInternal);
  EXPECT_TRUE(Contains(s.message(), "injected EndRemapBatch failure") ||
              Contains(s.message(), "injected WaitForCopies failure"));
  for (void* p : {a, b}) {
    AllocationInfo info;
    EXPECT_OK(e->Inspect(p, &info));
    EXPECT_TRUE(!info.evicted);
  }
  EXPECT_EQ(Verify(*e, a, 2 * kGranule, 31), -1);
  EXPECT_EQ(Verify(*e, b, 2 * kGranule, 32), -1);
  const Statistics st = e->GetStatistics();
  EXPECT_EQ(st.host_bytes_in_use, 0);
  EXPECT_EQ(st.num_evictions, 0);
  EXPECT_OK(e->CheckInvariants());
  // With the backend well again, the same request evicts both.
  void* c = MustAllocate(*e, 4 * kGranule, /*pin=*/true);
  ASSERT_TRUE(c != nullptr);
  EXPECT_EQ(e->GetStatistics().num_evictions, 2);
  EXPECT_EQ(Verify(*e, a, 2 * kGranule, 31), -1);
  EXPECT_EQ(Verify(*e, b, 2 * kGranule, 32), -1);
  EXPECT_OK(e->CheckInvariants());
}

// When the victim cannot even go back to its device granules, it stays
// evicted, its books matching its last mapping, and the error says so; its
// device granules leave the pool (no granule returns to a pool while a slot
// may map it). The other victim goes back, bytes intact; both can be freed.
TEST(AVictimThatCannotBeRestoredEitherStaysEvictedAndIsSaidToBe) {
  int fail_map = 0, fail_unmap = 0, fail_order = 0;
  auto e = MakeFaultyEngine(&fail_map, &fail_unmap, &fail_order);
  void* a = FilledUnit(*e, 33);
  void* b = FilledUnit(*e, 34);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  fail_order = 2;
  Status s;
  EXPECT_TRUE(e->Allocate(4 * kGranule, /*pin=*/true, &s) == nullptr);
  EXPECT_TRUE(s.code() == StatusCode::kInternal);
  EXPECT_TRUE(Contains(s.message(), "back to its device memory also failed"));
  AllocationInfo ia, ib;
  EXPECT_OK(e->Inspect(a, &ia));
  EXPECT_OK(e->Inspect(b, &ib));
  EXPECT_TRUE(ia.evicted != ib.evicted);  // the first restore failed, the second worked
  void* resident = ia.evicted ? b : a;
  EXPECT_EQ(Verify(*e, resident, 2 * kGranule, resident == a ? 33 : 34), -1);
  EXPECT_EQ(e->GetStatistics().host_bytes_in_use, static_cast<int64_t>(2 * kGranule));
  EXPECT_OK(e->CheckInvariants());
  EXPECT_OK(e->Free(a));
  EXPECT_OK(e->Free(b));
  EXPECT_EQ(e->GetStatistics().host_bytes_in_use, 0);
  EXPECT_EQ(e->device_granules_in_use(), 4u);  // the other's two cached, the stranded two
  EXPECT_OK(e->CheckInvariants());
  EXPECT_TRUE(MustAllocate(*e, 2 * kGranule, /*pin=*/true) != nullptr);
  Status full;
  EXPECT_TRUE(e->Allocate(4 * kGranule, /*pin=*/true, &full) == nullptr);
}

// backend.h, Map: after a failed remap whose restore fails too, the slots
// may still map either set of granules. A page-in whose copies can be
// neither ordered nor waited for, and whose host mapping cannot be restored,
// leaves the unit evicted, its books on the host granules that hold its
// bytes, and its device granules out of the pool; the next pin pages it in.
TEST(APageInThatCannotBeOrderedNorUndoneKeepsItsBytesAndStrandsItsDeviceMemory) {
  int fail_map = 0, fail_unmap = 0, fail_order = 0;
  auto e = MakeFaultyEngine(&fail_map, &fail_unmap, &fail_order);
  void* a = FilledUnit(*e, 41);
  ASSERT_TRUE(a != nullptr);
  EXPECT_OK(e->Evict(a));
  fail_order = 2;
  uint64_t id = 0;
  Status s = e->Pin(a, &id);
  EXPECT_TRUE(s.code() == StatusCode::kInternal);
  EXPECT_TRUE(Contains(s.message(), "restoring the previous mapping"));
  AllocationInfo info;
  EXPECT_OK(e->Inspect(a, &info));
  EXPECT_TRUE(info.evicted && info.pin_count == 0);
  EXPECT_EQ(e->device_granules_in_use(), 2u);  // stranded, not free
  EXPECT_OK(e->CheckInvariants());
  EXPECT_OK(e->Pin(a, &id));  // into the two granules still free
  EXPECT_EQ(Verify(*e, a, 2 * kGranule, 41), -1);
  EXPECT_OK(e->Unpin(a, id));
  EXPECT_EQ(e->device_granules_in_use(), 4u);
  EXPECT_OK(e->CheckInvariants());
}

// The eviction's mirror: a victim whose remap and restore both fail stays
// resident on its device granules; its host granules leave the pool.
TEST(AnEvictionThatCannotBeUndoneStrandsItsHostMemory) {
  int fail_map = 0;
  auto e = MakeFaultyEngine(&fail_map);
  void* a = FilledUnit(*e, 42);
  void* b = FilledUnit(*e, 43);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  fail_map = 2;
  Status s = e->Evict(a);
  EXPECT_TRUE(s.code() == StatusCode::kInternal);
  EXPECT_TRUE(Contains(s.message(), "restoring the previous mapping"));
  AllocationInfo info;
  EXPECT_OK(e->Inspect(a, &info));
  EXPECT_TRUE(!info.evicted);
  EXPECT_EQ(e->GetStatistics().host_bytes_in_use, static_cast<int64_t>(2 * kGranule));
  EXPECT_OK(e->CheckInvariants());
  // The rest of the host pool still serves: b goes out and back intact.
  EXPECT_OK(e->Evict(b));
  EXPECT_EQ(Verify(*e, b, 2 * kGranule, 43), -1);
  EXPECT_EQ(e->GetStatistics().host_bytes_in_use, static_cast<int64_t>(4 * kGranule));
  EXPECT_OK(e->CheckInvariants());
}

TEST(AFailedRemapLosesNoByteAndLeaksNoGranule) {
  int fail = 0;
  auto e = MakeFaultyEngine(&fail);
  void* a = MustAllocate(*e, 2 * kGranule);
  Fill(*e, a, 2 * kGranule, 21);
  AllocationInfo info;
  // Eviction: the copy is made, the remap to host memory fails.
  fail = 1;
  EXPECT_TRUE(e->Evict(a).code() == StatusCode::kInternal);
  EXPECT_OK(e->Inspect(a, &info));
  EXPECT_TRUE(!info.evicted);
  EXPECT_EQ(Verify(*e, a, 2 * kGranule, 21), -1);
  EXPECT_EQ(e->GetStatistics().host_bytes_in_use, 0);
  EXPECT_OK(e->CheckInvariants());
  // Page-in: the remap to device memory fails; it stays evicted, readable.
  EXPECT_OK(e->Evict(a));
  fail = 1;
  uint64_t id = 0;
  EXPECT_TRUE(e->Pin(a, &id).code() == StatusCode::kInternal);
  EXPECT_OK(e->Inspect(a, &info));
  EXPECT_TRUE(info.evicted && info.pin_count == 0);
  EXPECT_EQ(Verify(*e, a, 2 * kGranule, 21), -1);
  EXPECT_OK(e->CheckInvariants());
  EXPECT_OK(e->Pin(a, &id));
  EXPECT_EQ(Verify(*e, a, 2 * kGranule, 21), -1);
  EXPECT_OK(e->Unpin(a, id));
  // Placement: the new range's mapping fails; its granules go back.
  const size_t before = e->device_granules_in_use();
  fail = 1;
  Status s;
  EXPECT_TRUE(e->Allocate(2 * kGranule, /*pin=*/true, &s) == nullptr);
  EXPECT_EQ(e->device_granules_in_use(), before);
  EXPECT_OK(e->CheckInvariants());
  EXPECT_TRUE(MustAllocate(*e, 2 * kGranule, /*pin=*/true) != nullptr);
  EXPECT_EQ(Verify(*e, a, 2 * kGranule, 21), -1);
  EXPECT_OK(e->CheckInvariants());
}

TEST(HostGranulesWhoseUnmapFailedAreNeverHandedOutAgain) {
  int fail_map = 0, fail_unmap = 0;
  auto e = MakeFaultyEngine(&fail_map, &fail_unmap);
  void* a = MustAllocate(*e, 2 * kGranule);
  ASSERT_TRUE(a != nullptr);
  EXPECT_OK(e->Evict(a));
  fail_unmap = 1;
  EXPECT_TRUE(e->Free(a).code() == StatusCode::kInternal);
  // Still mapped at a free slot: out of the host pool for good.
  Statistics s = e->GetStatistics();
  EXPECT_EQ(s.host_bytes_in_use, static_cast<int64_t>(2 * kGranule));
  EXPECT_EQ(s.current_bytes_reclaimed, 0);
  EXPECT_EQ(s.bytes_in_use, 0);
  EXPECT_OK(e->CheckInvariants());
  // The engine keeps working with the rest.
  void* b = MustAllocate(*e, 3 * kGranule);
  ASSERT_TRUE(b != nullptr);
  Fill(*e, b, 3 * kGranule, 13);
  EXPECT_OK(e->Evict(b));
  EXPECT_EQ(Verify(*e, b, 3 * kGranule, 13), -1);
  EXPECT_EQ(e->GetStatistics().host_bytes_in_use, static_cast<int64_t>(5 * kGranule));
  EXPECT_OK(e->CheckInvariants());
}

}  // namespace
}  // namespace lms::engine_test
