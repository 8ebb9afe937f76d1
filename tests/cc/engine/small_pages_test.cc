// Small objects packed in pages (engine/small_pages.h) through the engine:
// size classes, live-bytes-only copies, pages evicted and paged in whole.
#include <algorithm>
#include <vector>

#include "engine_test_util.h"

namespace lms::engine_test {
namespace {


// Note [Live bytes only]: an eviction and a page-in of a page copy its live
// objects, one copy per run of them, none of the room between them; every
// byte of the objects survives, and the room takes new objects after.
TEST(APageCopiesOnlyItsLiveObjects) {
  auto e = MakeEngine({/*device=*/4, /*host=*/16});
  const size_t size = kGranule / 8;  // gaps this wide are skipped: a call per object
  std::vector<void*> objects;
  for (int i = 0; i < 8; ++i) {
    objects.push_back(MustAllocate(*e, size));
    ASSERT_TRUE(objects.back() != nullptr);
    Fill(*e, objects.back(), size, i);
  }
  EXPECT_EQ(e->small_pages(), 1u);
  for (int i = 1; i < 8; i += 2) EXPECT_OK(e->Free(objects[i]));
  const Statistics before = e->GetStatistics();
  EXPECT_OK(e->Evict(objects[0]));
  const Statistics out = e->GetStatistics();
  EXPECT_EQ(out.bytes_reclaimed - before.bytes_reclaimed, static_cast<int64_t>(kGranule));
  EXPECT_EQ(out.bytes_copied_out - before.bytes_copied_out, static_cast<int64_t>(4 * size));
  EXPECT_EQ(out.bytes_copied - before.bytes_copied, static_cast<int64_t>(4 * size));
  EXPECT_EQ(out.num_copies - before.num_copies, 4);
  uint64_t id = 0;
  EXPECT_OK(e->Pin(objects[2], &id));
  const Statistics in = e->GetStatistics();
  EXPECT_EQ(in.bytes_copied_in - out.bytes_copied_in, static_cast<int64_t>(4 * size));
  EXPECT_EQ(in.num_copies - out.num_copies, 4);
  for (int i = 0; i < 8; i += 2) EXPECT_EQ(Verify(*e, objects[i], size, i), -1);
  for (int i = 1; i < 8; i += 2) {
    objects[i] = MustAllocate(*e, size);
    ASSERT_TRUE(objects[i] != nullptr);
    Fill(*e, objects[i], size, 100 + i);
  }
  EXPECT_EQ(e->small_pages(), 1u);
  EXPECT_OK(e->Unpin(objects[2], id));
  EXPECT_OK(e->Evict(objects[0]));
  EXPECT_EQ(e->GetStatistics().bytes_copied_out - in.bytes_copied_out,
            static_cast<int64_t>(kGranule));  // full now: one copy of all of it
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(Verify(*e, objects[i], size, i % 2 == 0 ? i : 100 + i), -1);
  }
  for (void* p : objects) EXPECT_OK(e->Free(p));
  EXPECT_OK(e->CheckInvariants());
}

// Neighbours less than a 32nd of a granule apart (Engine::kCopyGapsPerGranule)
// are copied in one call, the gap with them; a gap that wide is skipped.
TEST(ObjectsOfAPageLessThanAGapApartAreCopiedInOneCall) {
  const size_t gap = kGranule / 32;
  for (size_t hole : {gap - 256, gap}) {
    auto e = MakeEngine({/*device=*/4, /*host=*/16});
    // One size class for all three at any granule: A, the hole B, C in a row.
    char* a = static_cast<char*>(MustAllocate(*e, gap));
    char* b = static_cast<char*>(MustAllocate(*e, hole));
    char* c = static_cast<char*>(MustAllocate(*e, gap));
    ASSERT_TRUE(a != nullptr && b == a + gap && c == b + hole);
    Fill(*e, a, gap, 1);
    Fill(*e, c, gap, 3);
    EXPECT_OK(e->Free(b));
    const Statistics before = e->GetStatistics();
    EXPECT_OK(e->Evict(a));
    const Statistics out = e->GetStatistics();
    const bool merged = hole < gap;
    EXPECT_EQ(out.bytes_copied_out - before.bytes_copied_out,
              static_cast<int64_t>(2 * gap + (merged ? hole : 0)));
    EXPECT_EQ(out.num_copies - before.num_copies, merged ? 1 : 2);
    EXPECT_EQ(Verify(*e, a, gap, 1), -1);
    EXPECT_EQ(Verify(*e, c, gap, 3), -1);
    EXPECT_OK(e->Free(a));
    EXPECT_OK(e->Free(c));
    EXPECT_OK(e->CheckInvariants());
  }
}

TEST(SmallObjectsArePackedInPagesThatAreEvictedAndPagedInWhole) {
  auto e = MakeEngine({/*device=*/4, /*host=*/16});
  // 1024 bytes each: a page and a half of them.
  const int per_page = static_cast<int>(kGranule / 1024);
  const int count = per_page * 3 / 2;
  std::vector<void*> small;
  for (int i = 0; i < count; ++i) {
    small.push_back(MustAllocate(*e, 1000));
    ASSERT_TRUE(small.back() != nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(small.back()) % 256, 0u);
    Fill(*e, small.back(), 1000, i);
  }
  EXPECT_EQ(e->small_pages(), 2u);
  EXPECT_EQ(e->device_granules_in_use(), 2u);
  EXPECT_OK(e->CheckInvariants());
  AllocationInfo a, b;
  EXPECT_OK(e->Inspect(small[0], &a));
  EXPECT_OK(e->Inspect(small[count - 1], &b));
  EXPECT_TRUE(a.small && b.small && a.unit_address != b.unit_address);
  EXPECT_EQ(a.unit_address % kGranule, 0u);
  // Evicting through one object evicts its whole page.
  EXPECT_OK(e->Evict(small[0]));
  EXPECT_OK(e->Inspect(small[per_page - 1], &a));
  EXPECT_TRUE(a.evicted);
  EXPECT_EQ(e->device_granules_in_use(), 1u);
  for (int i = 0; i < count; ++i) EXPECT_EQ(Verify(*e, small[i], 1000, i), -1);
  EXPECT_OK(e->CheckInvariants());
  // Pinning any object of it pages the page in; the unit id unpins it.
  uint64_t id = 0;
  EXPECT_OK(e->Pin(small[3], &id));
  EXPECT_EQ(id, a.unit_id);
  EXPECT_OK(e->Inspect(small[0], &a));
  EXPECT_TRUE(!a.evicted && a.pin_count == 1);
  EXPECT_EQ(e->GetStatistics().num_page_ins, 1);
  // 3 granules need the other page's granule: it is evicted, the pinned one not.
  void* big = MustAllocate(*e, 3 * kGranule, /*pin=*/true);
  ASSERT_TRUE(big != nullptr);
  EXPECT_OK(e->Inspect(small[count - 1], &b));
  EXPECT_TRUE(b.evicted);
  for (int i = 0; i < count; ++i) EXPECT_EQ(Verify(*e, small[i], 1000, i), -1);
  EXPECT_OK(e->CheckInvariants());
  EXPECT_OK(e->Unpin(small[3], id));
  EXPECT_OK(e->Free(big));
  for (void* p : small) EXPECT_OK(e->Free(p));
  EXPECT_EQ(e->GetStatistics().bytes_in_use, 0);
  EXPECT_EQ(e->small_pages(), 0u);
  EXPECT_EQ(e->GetStatistics().host_bytes_in_use, 0);
  EXPECT_OK(e->CheckInvariants());
}

TEST(TinyObjectsShareNoPageWithLargerOnesSoPinningACounterPinsNoActivation) {
  // Note [Size classes] in small_pages.h: a loop counter, activations made
  // after it, a shape vector.
  auto e = MakeEngine({/*device=*/4, /*host=*/16});
  const size_t activation = std::max<size_t>(4096, kGranule / 32);
  void* counter = MustAllocate(*e, 8);
  std::vector<void*> activations;
  for (int i = 0; i < 8; ++i) {
    activations.push_back(MustAllocate(*e, activation));
    Fill(*e, activations.back(), activation, i);
  }
  void* shape = MustAllocate(*e, 16);
  AllocationInfo c, a, s;
  EXPECT_OK(e->Inspect(counter, &c));
  EXPECT_OK(e->Inspect(activations[0], &a));
  EXPECT_OK(e->Inspect(shape, &s));
  EXPECT_TRUE(c.unit_address == s.unit_address && c.unit_address != a.unit_address);
  EXPECT_EQ(e->small_pages(), 2u);
  // A kernel reading the counter pins the counter's page only.
  uint64_t id = 0;
  EXPECT_OK(e->Pin(counter, &id));
  EXPECT_OK(e->Evict(activations[0]));
  EXPECT_OK(e->Inspect(activations[7], &a));
  EXPECT_TRUE(a.evicted && a.pin_count == 0);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(Verify(*e, activations[i], activation, i), -1);
  EXPECT_OK(e->Unpin(counter, id));
  // 4 KiB is not tiny: a new page, though the counter's has room; 4095 is.
  void* larger = MustAllocate(*e, 4096, /*pin=*/true);
  void* tiny = MustAllocate(*e, 4095, /*pin=*/true);
  AllocationInfo l, t;
  EXPECT_OK(e->Inspect(larger, &l));
  EXPECT_OK(e->Inspect(tiny, &t));
  EXPECT_TRUE(l.unit_address != c.unit_address && t.unit_address == c.unit_address);
  EXPECT_EQ(e->small_pages(), 3u);
  EXPECT_OK(e->CheckInvariants());
  EXPECT_OK(e->Unpin(larger, l.unit_id));
  EXPECT_OK(e->Unpin(tiny, t.unit_id));
  for (void* p : activations) EXPECT_OK(e->Free(p));
  for (void* p : {counter, shape, larger, tiny}) EXPECT_OK(e->Free(p));
  EXPECT_EQ(e->small_pages(), 0u);
  EXPECT_EQ(e->GetStatistics().bytes_in_use, 0);
  EXPECT_OK(e->CheckInvariants());
}

TEST(OnADeviceOfOneGranuleAKernelHoldsTinyAndLargerObjectsInOnePage) {
  // The classes never cost a kernel its device (Note [Size classes]).
  auto e = MakeEngine({/*device=*/1, /*host=*/4});
  void* shape = MustAllocate(*e, 16, /*pin=*/true);
  void* output = MustAllocate(*e, std::max<size_t>(4096, kGranule / 4), /*pin=*/true);
  ASSERT_TRUE(shape != nullptr && output != nullptr);
  AllocationInfo s, o;
  EXPECT_OK(e->Inspect(shape, &s));
  EXPECT_OK(e->Inspect(output, &o));
  EXPECT_EQ(s.unit_address, o.unit_address);
  EXPECT_OK(e->CheckInvariants());
  EXPECT_OK(e->Unpin(shape, s.unit_id));
  EXPECT_OK(e->Unpin(output, o.unit_id));
  EXPECT_OK(e->Free(output));
  EXPECT_OK(e->Free(shape));
  EXPECT_EQ(e->small_pages(), 0u);
  EXPECT_OK(e->CheckInvariants());
}

TEST(FreedSmallObjectsGiveTheirPagesBackSoLargeRequestsFit) {
  // Half-granule objects created and freed, then a
  // request of most of the device, with LMS off.
  auto e = MakeEngine({/*device=*/32, /*host=*/0, /*lms=*/false, /*defrag=*/true});
  std::vector<void*> small;
  for (int i = 0; i < 50; ++i) small.push_back(MustAllocate(*e, kGranule / 2 - 100));
  EXPECT_EQ(e->small_pages(), 25u);
  for (void* p : small) EXPECT_OK(e->Free(p));
  EXPECT_EQ(e->small_pages(), 0u);
  EXPECT_OK(e->CheckInvariants());
  void* big = MustAllocate(*e, 30 * kGranule);
  EXPECT_TRUE(big != nullptr);
  EXPECT_OK(e->Free(big));
  EXPECT_OK(e->CheckInvariants());
}

TEST(APinnedPageOutlivesItsLastObjectUntilUnpinned) {
  auto e = MakeEngine({/*device=*/4, /*host=*/4});
  void* p = MustAllocate(*e, 100);
  uint64_t id = 0;
  EXPECT_OK(e->Pin(p, &id));
  EXPECT_OK(e->Free(p));  // a kernel's input freed while it runs
  EXPECT_EQ(e->small_pages(), 1u);
  EXPECT_OK(e->CheckInvariants());
  EXPECT_OK(e->Unpin(p, id));  // the kernel ends: the page goes
  EXPECT_EQ(e->small_pages(), 0u);
  EXPECT_TRUE(e->Unpin(p, id).code() == StatusCode::kNotFound);
  EXPECT_OK(e->CheckInvariants());
}

TEST(NewSmallObjectsGoToResidentPagesOnly) {
  auto e = MakeEngine({/*device=*/4, /*host=*/4});
  void* a = MustAllocate(*e, 100);
  Fill(*e, a, 100, 7);
  EXPECT_OK(e->Evict(a));
  void* b = MustAllocate(*e, 100);
  AllocationInfo ia, ib;
  EXPECT_OK(e->Inspect(a, &ia));
  EXPECT_OK(e->Inspect(b, &ib));
  EXPECT_TRUE(ia.evicted && !ib.evicted && ia.unit_address != ib.unit_address);
  EXPECT_EQ(e->small_pages(), 2u);
  EXPECT_EQ(Verify(*e, a, 100, 7), -1);
  EXPECT_OK(e->CheckInvariants());
}

TEST(ANewObjectMakesItsPageTheMostRecentlyUsed) {
  auto e = MakeEngine({/*device=*/3, /*host=*/8});
  void* a = MustAllocate(*e, kGranule * 5 / 8);  // page P
  void* b = MustAllocate(*e, kGranule / 2);  // does not fit in P: page Q, newer
  void* c = MustAllocate(*e, kGranule / 4);  // best fit is P's rest: P is now newest
  AllocationInfo ia, ib, ic;
  EXPECT_OK(e->Inspect(a, &ia));
  EXPECT_OK(e->Inspect(b, &ib));
  EXPECT_OK(e->Inspect(c, &ic));
  ASSERT_TRUE(ia.unit_address == ic.unit_address && ia.unit_address != ib.unit_address);
  // Two granules: one is free, the other comes from the least recently used.
  ASSERT_TRUE(MustAllocate(*e, 2 * kGranule, /*pin=*/true) != nullptr);
  EXPECT_OK(e->Inspect(a, &ia));
  EXPECT_OK(e->Inspect(b, &ib));
  EXPECT_TRUE(!ia.evicted && ib.evicted);
  EXPECT_OK(e->CheckInvariants());
}

}  // namespace
}  // namespace lms::engine_test
