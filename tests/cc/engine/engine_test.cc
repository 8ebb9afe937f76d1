// The engine's own behaviour over its backends (POSIX, or CUDA over the fake
// driver with LMS_TEST_BACKEND=cuda: test_backend.h): placement, eviction and
// page-in, pressure, pins, defragmentation, born-evicted allocations, bad
// input. Its parts have tests of their own beside it (best_fit_arena_test.cc,
// run_pool_test.cc, learned_policy_test.cc, ...), and engine_fuzz_test.cc
// drives it with random operations; this file's main() runs every test
// linked into the binary (the Makefile's ENGINE_UNIT_TESTS), plain and under
// ASan/UBSan (make test-asan).
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "engine_test_util.h"

namespace lms::engine_test {
namespace {

TEST(TheEngineRunsOverTheBackendTheTestsAskFor) {
  auto e = MakeEngine({});
  EXPECT_EQ(std::string(e->backend().Name()) == "cuda", lms_test::UsingCuda());
  EXPECT_EQ(e->backend().HostCanTouch(), !lms_test::UsingCuda());
  EXPECT_EQ(e->granule_bytes(), kGranule);
}

TEST(LargeAllocationIsGranuleAlignedAndCountsWholeGranules) {
  auto e = MakeEngine({});
  void* p = MustAllocate(*e, kGranule + 1);
  ASSERT_TRUE(p != nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kGranule, 0u);
  EXPECT_EQ(e->AllocatedSize(p), 2 * kGranule);
  EXPECT_EQ(e->RequestedSize(p), kGranule + 1);
  Statistics s = e->GetStatistics();
  EXPECT_EQ(s.bytes_in_use, static_cast<int64_t>(2 * kGranule));
  EXPECT_EQ(s.bytes_inactive, s.bytes_in_use);
  EXPECT_OK(e->Free(p));
  EXPECT_EQ(e->GetStatistics().bytes_in_use, 0);
  EXPECT_EQ(e->cached_granules(), 2u);  // the granules stay mapped as a cache
}

TEST(EvictionKeepsTheAddressAndEveryByte) {
  auto e = MakeEngine({/*device=*/8, /*host=*/16});
  const size_t size = 3 * kGranule + 123;
  void* a = MustAllocate(*e, size);
  ASSERT_TRUE(a != nullptr);
  Fill(*e, a, size, 11);
  EXPECT_OK(e->Evict(a));
  AllocationInfo info;
  EXPECT_OK(e->Inspect(a, &info));
  EXPECT_TRUE(info.evicted);
  EXPECT_EQ(info.address, reinterpret_cast<uintptr_t>(a));
  // Unpinned read of an evicted allocation: served from the host pool.
  EXPECT_EQ(Verify(*e, a, size, 11), -1);
  Statistics s = e->GetStatistics();
  EXPECT_EQ(s.current_bytes_reclaimed, static_cast<int64_t>(4 * kGranule));
  EXPECT_EQ(s.host_bytes_in_use, static_cast<int64_t>(4 * kGranule));
  uint64_t id = 0;
  EXPECT_OK(e->Pin(static_cast<char*>(a) + 5, &id));  // interior pointer
  EXPECT_OK(e->Inspect(a, &info));
  EXPECT_TRUE(!info.evicted);
  EXPECT_EQ(Verify(*e, a, size, 11), -1);
  s = e->GetStatistics();
  EXPECT_EQ(s.num_page_ins, 1);
  EXPECT_EQ(s.current_bytes_reclaimed, 0);
  EXPECT_EQ(s.host_bytes_in_use, 0);
  EXPECT_OK(e->Unpin(a, id));
  EXPECT_OK(e->Free(a));
}

// A kernel's evicted inputs, paged in by one PinAll: every byte back,
// duplicates and interior pointers pinned once each, a pointer to nothing
// refused alone. (One host wait for all of them on a GPU:
// cuda_backend_test.)
TEST(PinAllPagesInAKernelsEvictedInputsTogether) {
  auto e = MakeEngine({/*device=*/8, /*host=*/16});
  const size_t size = kGranule + 100;
  std::vector<void*> inputs;
  for (int i = 0; i < 3; ++i) {
    inputs.push_back(MustAllocate(*e, size));
    ASSERT_TRUE(inputs.back() != nullptr);
    Fill(*e, inputs.back(), size, 40 + i);
    EXPECT_OK(e->Evict(inputs.back()));
  }
  int unmapped = 0;
  const void* ptrs[] = {inputs[0], static_cast<char*>(inputs[1]) + 7, inputs[2], inputs[0],
                        &unmapped};
  uint64_t ids[5];
  EXPECT_EQ(e->PinAll(ptrs, 5, ids).code(), StatusCode::kNotFound);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(ids[i] != 0);
  EXPECT_EQ(ids[4], 0u);
  EXPECT_EQ(ids[0], ids[3]);
  const Statistics s = e->GetStatistics();
  EXPECT_EQ(s.num_page_ins, 3);
  EXPECT_EQ(s.current_bytes_reclaimed, 0);
  EXPECT_EQ(s.num_failed_pins, 0);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Verify(*e, inputs[i], size, 40 + i), -1);
  for (int i = 0; i < 4; ++i) EXPECT_OK(e->Unpin(ptrs[i], ids[i]));
  EXPECT_EQ(e->GetStatistics().bytes_active, 0);
  EXPECT_OK(e->CheckInvariants());
}

// When the device cannot hold every input at once, PinAll pages them in one
// by one as far as it can: the input that does not fit fails alone, holds
// nothing, and loses no byte.
TEST(PinAllPagesInWhatFitsWhenNotEveryInputDoes) {
  auto e = MakeEngine({/*device=*/4, /*host=*/16});
  const size_t size = 2 * kGranule;
  std::vector<void*> inputs;
  for (int i = 0; i < 3; ++i) {
    inputs.push_back(MustAllocate(*e, size));
    ASSERT_TRUE(inputs.back() != nullptr);
    Fill(*e, inputs.back(), size, 60 + i);
    EXPECT_OK(e->Evict(inputs.back()));
  }
  const void* ptrs[] = {inputs[0], inputs[1], inputs[2]};
  uint64_t ids[3];
  const Status failed = e->PinAll(ptrs, 3, ids);
  EXPECT_EQ(failed.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(failed.message(), "cannot page in"));
  EXPECT_TRUE(ids[0] != 0 && ids[1] != 0);
  EXPECT_EQ(ids[2], 0u);
  const Statistics s = e->GetStatistics();
  EXPECT_EQ(s.num_failed_pins, 1);
  EXPECT_EQ(s.bytes_active, static_cast<int64_t>(2 * size));
  AllocationInfo info;
  EXPECT_OK(e->Inspect(inputs[2], &info));
  EXPECT_TRUE(info.evicted);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Verify(*e, inputs[i], size, 60 + i), -1);
  EXPECT_OK(e->Unpin(ptrs[0], ids[0]));
  EXPECT_OK(e->Unpin(ptrs[1], ids[1]));
  EXPECT_OK(e->CheckInvariants());
}

TEST(PressureEvictsTheLeastRecentlyUsedInactiveAllocation) {
  auto e = MakeEngine({/*device=*/8, /*host=*/16});
  const size_t size = 4 * kGranule;
  void* a = MustAllocate(*e, size);
  void* b = MustAllocate(*e, size);
  ASSERT_TRUE(a && b);
  Fill(*e, a, size, 1);
  Fill(*e, b, size, 2);
  uint64_t id;
  EXPECT_OK(e->Pin(a, &id));  // a becomes most recently used
  EXPECT_OK(e->Unpin(a, id));
  void* c = MustAllocate(*e, size, /*pin=*/true);
  ASSERT_TRUE(c != nullptr);
  AllocationInfo ia, ib;
  EXPECT_OK(e->Inspect(a, &ia));
  EXPECT_OK(e->Inspect(b, &ib));
  EXPECT_TRUE(!ia.evicted);
  EXPECT_TRUE(ib.evicted);
  Statistics s = e->GetStatistics();
  EXPECT_EQ(s.num_single_reclaims, 1);
  EXPECT_EQ(s.bytes_reclaimed, static_cast<int64_t>(size));
  EXPECT_EQ(e->device_granules_in_use(), 8u);
  // Paging b in needs a's granules: a is inactive, so it goes.
  EXPECT_OK(e->Pin(b, &id));
  EXPECT_EQ(Verify(*e, b, size, 2), -1);
  EXPECT_EQ(Verify(*e, a, size, 1), -1);
  EXPECT_OK(e->Inspect(a, &ia));
  EXPECT_TRUE(ia.evicted);
  EXPECT_OK(e->Unpin(b, id));
}

TEST(SeveralSmallVictimsMakeAFullReclaim) {
  auto e = MakeEngine({/*device=*/8, /*host=*/16});
  std::vector<void*> v;
  for (int i = 0; i < 4; ++i) {
    v.push_back(MustAllocate(*e, 2 * kGranule));
    Fill(*e, v.back(), 2 * kGranule, 100 + i);
  }
  void* big = MustAllocate(*e, 5 * kGranule);
  ASSERT_TRUE(big != nullptr);
  Statistics s = e->GetStatistics();
  EXPECT_EQ(s.num_full_reclaims, 1);
  EXPECT_EQ(s.num_evictions, 3);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(Verify(*e, v[i], 2 * kGranule, 100 + i), -1);
}

TEST(PinnedAllocationsAreNeverEvicted) {
  auto e = MakeEngine({/*device=*/4, /*host=*/16});
  void* a = MustAllocate(*e, 3 * kGranule, /*pin=*/true);
  ASSERT_TRUE(a != nullptr);
  Status s;
  EXPECT_TRUE(e->Allocate(2 * kGranule, /*pin=*/true, &s) == nullptr);
  EXPECT_EQ(static_cast<int>(s.code()), static_cast<int>(StatusCode::kResourceExhausted));
  EXPECT_TRUE(Contains(s.message(), "out of device memory"));
  EXPECT_TRUE(Contains(e->Evict(a).message(), "pinned"));
}

// EvictAhead frees device memory before anyone asks for it, in the
// policy's order (LRU: the least recently used first), and never a pinned
// unit; the request after it takes the room without evicting. Every byte
// survives, and with the room already there it moves nothing (with LMS off:
// WithLmsOffTheEngineIsAPlainCappedAllocator).
TEST(EvictAheadMakesRoomTheNextRequestTakesWithoutEvicting) {
  auto e = MakeEngine({/*device=*/8, /*host=*/16});
  std::vector<void*> v;
  for (int i = 0; i < 4; ++i) {
    v.push_back(MustAllocate(*e, 2 * kGranule));
    ASSERT_TRUE(v.back() != nullptr);
    Fill(*e, v.back(), 2 * kGranule, 300 + i);
  }
  uint64_t id = 0;
  EXPECT_OK(e->Pin(v[0], &id));  // v[0]: pinned; v[1]: the least recently used
  uint64_t units = 0;
  EXPECT_OK(e->EvictAhead(3 * kGranule, &units));  // 3 granules: two units of 2
  EXPECT_EQ(units, 2u);
  AllocationInfo info;
  for (int i = 0; i < 4; ++i) {
    EXPECT_OK(e->Inspect(v[i], &info));
    EXPECT_EQ(info.evicted, i == 1 || i == 2);
  }
  EXPECT_EQ(e->device_granules_in_use(), 4u);
  EXPECT_OK(e->EvictAhead(4 * kGranule, &units));  // already free
  EXPECT_EQ(units, 0u);
  void* c = MustAllocate(*e, 4 * kGranule, /*pin=*/true);
  ASSERT_TRUE(c != nullptr);
  EXPECT_EQ(e->GetStatistics().num_evictions, 2);
  // Room beyond what is inactive: v[3] goes, the pinned stay, no error.
  EXPECT_OK(e->EvictAhead(8 * kGranule, &units));
  EXPECT_EQ(units, 1u);
  EXPECT_OK(e->Inspect(v[0], &info));
  EXPECT_TRUE(!info.evicted);
  EXPECT_OK(e->Unpin(v[0], id));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(Verify(*e, v[i], 2 * kGranule, 300 + i), -1);
  EXPECT_OK(e->CheckInvariants());
}

TEST(WithLmsOffTheEngineIsAPlainCappedAllocator) {
  Setup setup;
  setup.device_granules = 4;
  setup.lms = false;
  auto e = MakeEngine(setup);
  void* a = MustAllocate(*e, 3 * kGranule);
  ASSERT_TRUE(a != nullptr);
  Status s;
  EXPECT_TRUE(e->Allocate(2 * kGranule, false, &s) == nullptr);
  EXPECT_TRUE(Contains(s.message(), "LMS is off"));
  uint64_t units = 1;
  EXPECT_OK(e->EvictAhead(4 * kGranule, &units));  // nothing to evict to
  EXPECT_EQ(units, 0u);
  EXPECT_EQ(e->GetStatistics().num_evictions, 0);
}

TEST(DefragmentationRemapsCachedGranulesInsteadOfEvicting) {
  for (bool defrag : {false, true}) {
    Setup setup;
    setup.device_granules = 8;
    setup.defrag = defrag;
    auto e = MakeEngine(setup);
    // a b c d, 2 granules each; free a and c: 4 free granules in two holes.
    void* p[4];
    for (void*& x : p) x = MustAllocate(*e, 2 * kGranule, /*pin=*/true);
    Fill(*e, p[1], 2 * kGranule, 5);
    EXPECT_OK(e->Free(p[0]));
    EXPECT_OK(e->Free(p[2]));
    EXPECT_EQ(e->cached_granules(), 4u);
    Status s;
    void* big = e->Allocate(4 * kGranule, /*pin=*/true, &s);
    Statistics st = e->GetStatistics();
    if (defrag) {
      EXPECT_TRUE(big != nullptr);
      EXPECT_EQ(st.num_defragmentations, 1);
      EXPECT_EQ(st.bytes_defragged, static_cast<int64_t>(4 * kGranule));
      EXPECT_EQ(st.num_evictions, 0);
    } else {
      // Everything live is pinned: without remapping, the holes are useless.
      EXPECT_TRUE(big == nullptr);
      EXPECT_TRUE(Contains(s.message(), "defragmentation is off"));
    }
    EXPECT_EQ(Verify(*e, p[1], 2 * kGranule, 5), -1);
  }
}

TEST(AFullyCachedFreeRangeIsTakenInsteadOfRemappingGranules) {
  Setup setup;
  setup.device_granules = 8;
  setup.defrag = true;
  auto e = MakeEngine(setup);
  void* a = MustAllocate(*e, 4 * kGranule);  // unpinned: the one to evict
  void* b = MustAllocate(*e, 4 * kGranule, /*pin=*/true);
  void* c = MustAllocate(*e, 4 * kGranule, /*pin=*/true);
  Fill(*e, c, 4 * kGranule, 9);
  EXPECT_EQ(e->GetStatistics().num_evictions, 1);
  EXPECT_OK(e->Free(a));  // evicted: its range is free and maps nothing
  EXPECT_OK(e->Free(b));  // resident: its range is free and cached
  EXPECT_EQ(e->cached_granules(), 4u);
  // Best fit alone takes a's range (the front of the merged free range),
  // then takes b's granules from behind it: an unmap and a map of each.
  void* d = MustAllocate(*e, 4 * kGranule, /*pin=*/true);
  const Statistics st = e->GetStatistics();
  EXPECT_TRUE(d == b);
  EXPECT_EQ(st.num_cached_placements, 1);
  EXPECT_EQ(st.num_defragmentations, 0);
  EXPECT_EQ(st.bytes_defragged, 0);
  EXPECT_EQ(e->cached_granules(), 0u);
  EXPECT_EQ(Verify(*e, c, 4 * kGranule, 9), -1);
  EXPECT_OK(e->CheckInvariants());
}

TEST(UnheldAllocationsAreBornEvictedWhenTheDeviceIsFull) {
  auto e = MakeEngine({/*device=*/4, /*host=*/8, /*lms=*/true, /*defrag=*/true});
  void* held = MustAllocate(*e, 4 * kGranule, /*pin=*/true);  // a running kernel's
  ASSERT_TRUE(held != nullptr);
  Status s;
  // A kernel's own request cannot be served from host memory...
  EXPECT_TRUE(e->Allocate(kGranule, /*pin=*/true, &s) == nullptr);
  EXPECT_TRUE(s.code() == StatusCode::kResourceExhausted);
  // ...but one nobody holds yet (a tensor made from host data) can.
  void* born = MustAllocate(*e, 2 * kGranule);
  void* small = MustAllocate(*e, 300);
  ASSERT_TRUE(born != nullptr && small != nullptr);
  AllocationInfo info;
  EXPECT_OK(e->Inspect(born, &info));
  EXPECT_TRUE(info.evicted);
  EXPECT_OK(e->Inspect(small, &info));
  EXPECT_TRUE(info.evicted);
  EXPECT_EQ(e->GetStatistics().num_born_evicted, 2);
  Fill(*e, born, 2 * kGranule, 11);
  Fill(*e, small, 300, 12);
  EXPECT_OK(e->CheckInvariants());
  // Its first pin pages it in once the device has room.
  uint64_t id = 0;
  EXPECT_TRUE(e->Pin(born, &id).code() == StatusCode::kResourceExhausted);
  EXPECT_OK(e->Free(held));
  EXPECT_OK(e->Pin(born, &id));
  EXPECT_OK(e->Inspect(born, &info));
  EXPECT_TRUE(!info.evicted);
  EXPECT_EQ(Verify(*e, born, 2 * kGranule, 11), -1);
  EXPECT_EQ(Verify(*e, small, 300, 12), -1);
  EXPECT_OK(e->Unpin(born, id));
  EXPECT_OK(e->CheckInvariants());
}

TEST(NothingIsBornEvictedWithLmsOff) {
  auto e = MakeEngine({/*device=*/4, /*host=*/8, /*lms=*/false});
  ASSERT_TRUE(MustAllocate(*e, 4 * kGranule) != nullptr);
  Status s;
  EXPECT_TRUE(e->Allocate(kGranule, false, &s) == nullptr);
  EXPECT_TRUE(Contains(s.message(), "LMS is off"));
  EXPECT_EQ(e->GetStatistics().num_born_evicted, 0);
}

TEST(StrictAlignmentKeepsTheRequestedSize) {
  auto e = MakeEngine({/*device=*/4, /*host=*/4});
  Status s;
  void* p = e->Allocate(1000, false, &s, nullptr, /*alignment=*/4096);
  ASSERT_TRUE(p != nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
  EXPECT_EQ(e->RequestedSize(p), 1000u);
  EXPECT_TRUE(e->Allocate(1000, false, &s, nullptr, 3) == nullptr);
  EXPECT_TRUE(s.code() == StatusCode::kInvalidArgument);
  EXPECT_OK(e->CheckInvariants());
}

TEST(BadInputFailsCleanlyAndNamesTheCause) {
  auto e = MakeEngine({/*device=*/4, /*host=*/4});
  Status s;
  EXPECT_TRUE(e->Allocate(0, false, &s) == nullptr);
  EXPECT_TRUE(Contains(s.message(), "zero-size"));
  EXPECT_TRUE(e->Allocate(9 * kGranule, false, &s) == nullptr);
  EXPECT_TRUE(Contains(s.message(), "exceeds the device memory"));
  void* a = MustAllocate(*e, kGranule);
  Fill(*e, a, kGranule, 3);
  int stack_value = 0;
  EXPECT_TRUE(Contains(e->Free(&stack_value).message(), "no live allocation"));
  EXPECT_TRUE(Contains(e->Free(static_cast<char*>(a) + 64).message(), "no live allocation"));
  uint64_t id;
  EXPECT_TRUE(Contains(e->Unpin(a, 0).message(), "without a matching pin"));
  EXPECT_OK(e->Pin(a, &id));
  EXPECT_TRUE(Contains(e->Unpin(a, id + 1).message(), "was freed"));
  EXPECT_OK(e->Unpin(a, id));
  EXPECT_EQ(Verify(*e, a, kGranule, 3), -1);
  EXPECT_OK(e->Free(a));
  EXPECT_TRUE(Contains(e->Free(a).message(), "already freed"));
  void* small = MustAllocate(*e, 100);
  EXPECT_OK(e->Free(small));
  EXPECT_TRUE(Contains(e->Free(small).message(), "already freed"));
}

TEST(HostPoolExhaustedWhileEvictingIsAnErrorNamingTheSetting) {
  auto e = MakeEngine({/*device=*/4, /*host=*/2});
  void* a = MustAllocate(*e, 4 * kGranule);
  ASSERT_TRUE(a != nullptr);
  Fill(*e, a, 4 * kGranule, 9);
  Status s;
  EXPECT_TRUE(e->Allocate(kGranule, /*pin=*/true, &s) == nullptr);
  EXPECT_TRUE(Contains(s.message(), "TF_GPU_HOST_MEM_LIMIT_IN_MB"));
  // Nothing was lost and the engine still works.
  AllocationInfo info;
  EXPECT_OK(e->Inspect(a, &info));
  EXPECT_TRUE(!info.evicted);
  EXPECT_EQ(Verify(*e, a, 4 * kGranule, 9), -1);
  EXPECT_OK(e->Free(a));
  EXPECT_TRUE(MustAllocate(*e, kGranule) != nullptr);
}

TEST(AFailedRequestCanWaitForAnotherUserToRelease) {
  auto e = MakeEngine({/*device=*/4, /*host=*/16});
  void* held = MustAllocate(*e, 3 * kGranule, /*pin=*/true);
  ASSERT_TRUE(held != nullptr);
  const uint64_t epoch = e->ReleaseEpoch();
  Status s;
  EXPECT_TRUE(e->Allocate(2 * kGranule, /*pin=*/true, &s) == nullptr);  // held is pinned
  EXPECT_TRUE(!e->WaitForRelease(epoch, std::chrono::milliseconds(20)));
  std::thread other([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_OK(e->Unpin(held, 0));  // the other kernel finishes
  });
  EXPECT_TRUE(e->WaitForRelease(epoch, std::chrono::seconds(10)));
  other.join();
  EXPECT_TRUE(MustAllocate(*e, 2 * kGranule) != nullptr);  // evicts held now
  EXPECT_EQ(e->GetStatistics().num_evictions, 1);
}

TEST(HeldBytesCountsPinnedAndUnclaimedMemoryFromItsFirstReadOn) {
  auto e = MakeEngine({/*device=*/8, /*host=*/16});
  void* pinned = MustAllocate(*e, 3 * kGranule, /*pin=*/true);
  void* inactive = MustAllocate(*e, 2 * kGranule);
  ASSERT_TRUE(pinned != nullptr && inactive != nullptr);
  // The first read turns publishing on and sees what is held already.
  EXPECT_EQ(e->HeldBytes(), static_cast<int64_t>(3 * kGranule));
  Status s;
  void* written = e->Allocate(kGranule, Hold::kWriter, &s);  // unclaimed: held
  ASSERT_TRUE(written != nullptr);
  EXPECT_EQ(e->HeldBytes(), static_cast<int64_t>(4 * kGranule));
  uint64_t id = 0;
  EXPECT_OK(e->Pin(inactive, &id));
  EXPECT_EQ(e->HeldBytes(), static_cast<int64_t>(6 * kGranule));
  EXPECT_OK(e->Unpin(pinned, 0));
  EXPECT_OK(e->Unpin(inactive, id));
  EXPECT_EQ(e->HeldBytes(), static_cast<int64_t>(kGranule));
  EXPECT_OK(e->Free(written));
  EXPECT_EQ(e->HeldBytes(), 0);
  EXPECT_OK(e->CheckInvariants());
}

TEST(APinThatCannotPageInFailsCleanlyAndIsCounted) {
  Setup setup;
  setup.device_granules = 4;
  auto e = MakeEngine(setup);
  void* a = MustAllocate(*e, 3 * kGranule);
  Fill(*e, a, 3 * kGranule, 8);
  EXPECT_OK(e->Evict(a));
  void* b = MustAllocate(*e, 2 * kGranule, /*pin=*/true);  // leaves 2 free
  ASSERT_TRUE(b != nullptr);
  uint64_t id;
  Status s = e->Pin(a, &id);
  EXPECT_EQ(static_cast<int>(s.code()), static_cast<int>(StatusCode::kResourceExhausted));
  EXPECT_TRUE(Contains(s.message(), "cannot page in"));
  Statistics st = e->GetStatistics();
  EXPECT_EQ(st.num_failed_pins, 1);
  EXPECT_TRUE(st.peak_bytes_active <= static_cast<int64_t>(4 * kGranule));
  AllocationInfo info;
  EXPECT_OK(e->Inspect(a, &info));
  EXPECT_EQ(info.pin_count, 0u);
  EXPECT_EQ(Verify(*e, a, 3 * kGranule, 8), -1);  // still readable in place
}

// Whether the host may read the byte at `p` (the POSIX backend): write(2)
// from it fails with EFAULT, without a signal, where nothing readable is
// mapped.
bool HostReads(const void* p) {
  int fds[2];
  if (pipe(fds) != 0) return false;
  const bool read = write(fds[1], p, 1) == 1;
  close(fds[0]);
  close(fds[1]);
  return read;
}

// Whether an eviction left `p` mapped: readable by the host (POSIX), or
// over the fake driver whether the eviction made a mapping (the CUDA
// backend's cuMemMap count moved from `mappings_before`).
bool MappedAfterEviction(Engine& e, const void* p, int64_t mappings_before) {
  if (e.backend().HostCanTouch()) return HostReads(p);
  return e.backend().GetStatistics().mappings > mappings_before;
}

// Note [Evicted tensors unmapped]: with the option, an eviction maps
// nothing at the address (without it, the host memory is mapped there);
// the page-in, and the engine's own copies, still find every byte; a unit
// whose page-in failed is mapped back for its kernel to read in place.
TEST(UnmapEvictedLeavesTheAddressUnmappedAndLosesNoByte) {
  for (bool unmap : {false, true}) {
    Setup setup;
    setup.device_granules = 8;
    setup.host_granules = 16;
    setup.unmap_evicted = unmap;
    auto e = MakeEngine(setup);
    EXPECT_EQ(e->unmaps_evicted(), unmap);
    const size_t size = 2 * kGranule + 77;
    void* a = MustAllocate(*e, size);
    void* b = MustAllocate(*e, size);
    ASSERT_TRUE(a != nullptr && b != nullptr);
    Fill(*e, a, size, 21);
    Fill(*e, b, size, 22);
    int64_t before = e->backend().GetStatistics().mappings;
    EXPECT_OK(e->Evict(a));
    EXPECT_EQ(MappedAfterEviction(*e, a, before), !unmap);
    EXPECT_OK(e->CheckInvariants());
    // Paged in from host memory reached only through the pool's window.
    uint64_t id = 0;
    EXPECT_OK(e->Pin(a, &id));
    AllocationInfo info;
    EXPECT_OK(e->Inspect(a, &info));
    EXPECT_TRUE(!info.evicted);
    EXPECT_EQ(Verify(*e, a, size, 21), -1);
    EXPECT_OK(e->Unpin(a, id));
    // An engine's copy of an evicted unit maps it back first.
    before = e->backend().GetStatistics().mappings;
    EXPECT_OK(e->Evict(b));
    EXPECT_EQ(MappedAfterEviction(*e, b, before), !unmap);
    EXPECT_EQ(Verify(*e, b, size, 22), -1);
    EXPECT_TRUE(!e->backend().HostCanTouch() || HostReads(b));
    EXPECT_OK(e->CheckInvariants());
    // A pin that cannot page in: its kernel reads the unit in place, so the
    // address maps its host memory again.
    before = e->backend().GetStatistics().mappings;
    EXPECT_OK(e->Evict(a));
    EXPECT_EQ(MappedAfterEviction(*e, a, before), !unmap);
    void* pinned = MustAllocate(*e, 6 * kGranule, /*pin=*/true);  // leaves 2 free
    ASSERT_TRUE(pinned != nullptr);
    before = e->backend().GetStatistics().mappings;
    EXPECT_EQ(e->Pin(a, &id).code(), StatusCode::kResourceExhausted);
    EXPECT_TRUE(MappedAfterEviction(*e, a, before) || !unmap);
    EXPECT_TRUE(!e->backend().HostCanTouch() || HostReads(a));
    EXPECT_OK(e->CheckInvariants());
    EXPECT_EQ(Verify(*e, a, size, 21), -1);
    EXPECT_OK(e->Unpin(pinned, 0));
    for (void* p : {a, b, pinned}) EXPECT_OK(e->Free(p));
    EXPECT_OK(e->CheckInvariants());
  }
}

}  // namespace
}  // namespace lms::engine_test

int main(int argc, char** argv) { return lms_test::RunAll(argc, argv); }
