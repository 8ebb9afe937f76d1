// The POSIX backend (backends/posix_backend.h), the emulated device: device
// memory populated when mapped, and in huge pages where the machine allows.
#include <fcntl.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <memory>
#include <vector>

#include "backends/posix_backend.h"
#include "engine_test_util.h"

namespace lms::engine_test {
namespace {

// How many of the 4 KiB pages of [p, p + bytes) have a page table entry in
// this process (/proc/self/pagemap, bit 63: present), or -1 if unreadable.
int64_t PresentPages(const void* p, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  std::vector<uint64_t> entries(bytes / page);
  const off_t at = static_cast<off_t>(reinterpret_cast<uintptr_t>(p) / page * 8);
  const ssize_t n = pread(fd, entries.data(), entries.size() * 8, at);
  close(fd);
  if (n != static_cast<ssize_t>(entries.size() * 8)) return -1;
  int64_t present = 0;
  for (uint64_t e : entries) present += (e >> 63) & 1;
  return present;
}

// On the emulated device a fresh mapping has no page table entries, and a
// kernel's first write to each page would fault (PosixBackend's comment has
// the measurements): device memory comes mapped populated, at allocation and
// at page-in. The host memory of an evicted allocation is not populated.
TEST(EmulatedDeviceMemoryIsPopulatedWhenMappedSoKernelsTakeNoFirstTouchFaults) {
  auto e = MakeEngine({/*device=*/8, /*host=*/16});
  if (!e->backend().HostCanTouch()) {
    std::printf("  skipped on this backend: no host page tables back device memory\n");
    return;
  }
  const size_t size = 3 * kGranule;
  const int64_t pages = static_cast<int64_t>(size / static_cast<size_t>(sysconf(_SC_PAGESIZE)));
  void* a = MustAllocate(*e, size);
  ASSERT_TRUE(a != nullptr);
  EXPECT_EQ(PresentPages(a, size), pages);
  Fill(*e, a, size, 5);
  EXPECT_OK(e->Evict(a));
  EXPECT_EQ(PresentPages(a, size), 0);
  uint64_t id = 0;
  EXPECT_OK(e->Pin(a, &id));
  EXPECT_EQ(PresentPages(a, size), pages);
  EXPECT_EQ(Verify(*e, a, size, 5), -1);
  EXPECT_OK(e->Unpin(a, id));
  EXPECT_OK(e->Free(a));
}

// Kilobytes of the mappings that start in [p, p + bytes) mapped by page
// middle directory entries (huge pages), from /proc/self/smaps; -1 if no
// mapping starts there.
int64_t PmdMappedKb(const void* p, size_t bytes) {
  FILE* smaps = std::fopen("/proc/self/smaps", "r");
  if (smaps == nullptr) return -1;
  const uintptr_t first = reinterpret_cast<uintptr_t>(p);
  char line[512];
  int64_t kb = -1;
  bool in_range = false;
  while (std::fgets(line, sizeof line, smaps) != nullptr) {
    unsigned long start = 0, end = 0;
    if (std::sscanf(line, "%lx-%lx ", &start, &end) == 2) {
      in_range = start >= first && start < first + bytes;
      if (in_range && kb < 0) kb = 0;
      continue;
    }
    long value = 0;
    if (in_range && (std::sscanf(line, "ShmemPmdMapped: %ld kB", &value) == 1 ||
                     std::sscanf(line, "FilePmdMapped: %ld kB", &value) == 1)) {
      kb += value;
    }
  }
  std::fclose(smaps);
  return kb;
}

// Two 2 MiB granules of a POSIX backend with huge pages `mode`: mapped,
// written, evicted to host granules, paged back into other device granules,
// every word checked each time; *pmd_kb gets the kilobytes of the granules'
// mappings in huge pages after each of the three mappings.
void MapEvictAndPageInGranules(HugePages mode, std::vector<int64_t>* pmd_kb) {
  const size_t granule = size_t{2} << 20;
  std::unique_ptr<Backend> made;
  ASSERT_TRUE((PosixBackend::Create(granule, &made, mode)).ok());
  auto* backend = static_cast<PosixBackend*>(made.get());
  uintptr_t base = 0;
  ASSERT_TRUE((backend->ReserveAddressRange(2 * granule, &base)).ok());
  ASSERT_TRUE((backend->CreatePool(PoolKind::kDevice, 2)).ok());
  ASSERT_TRUE((backend->CreatePool(PoolKind::kHost, 2)).ok());
  auto* bytes = reinterpret_cast<uint32_t*>(base);
  const size_t words = 2 * granule / sizeof(uint32_t);
  auto wrong_words = [&] {
    size_t wrong = 0;
    for (size_t i = 0; i < words; ++i) wrong += bytes[i] != static_cast<uint32_t>(i * 2654435761u);
    return wrong;
  };
  const GranuleId device[] = {0, 1}, host[] = {1, 0}, paged_in[] = {1, 0};
  ASSERT_TRUE((backend->Map(base, PoolKind::kDevice, device, 2, Access::kReadWrite)).ok());
  pmd_kb->push_back(PmdMappedKb(bytes, 2 * granule));
  for (size_t i = 0; i < words; ++i) bytes[i] = static_cast<uint32_t>(i * 2654435761u);
  // An eviction and a page-in, as the engine makes them.
  ASSERT_TRUE((backend->CopyGranules(PoolKind::kHost, host, PoolKind::kDevice, device,
                                     2 * granule)).ok());
  ASSERT_TRUE((backend->Map(base, PoolKind::kHost, host, 2, Access::kReadWrite)).ok());
  EXPECT_EQ(wrong_words(), 0u);
  pmd_kb->push_back(PmdMappedKb(bytes, 2 * granule));
  ASSERT_TRUE((backend->CopyGranules(PoolKind::kDevice, paged_in, PoolKind::kHost, host,
                                     2 * granule)).ok());
  ASSERT_TRUE((backend->Map(base, PoolKind::kDevice, paged_in, 2, Access::kReadWrite)).ok());
  pmd_kb->push_back(PmdMappedKb(bytes, 2 * granule));
  EXPECT_EQ(wrong_words(), 0u);
  ASSERT_TRUE((backend->Unmap(base, 2)).ok());
  backend->ReleaseAddressRange(base, 2 * granule);
}

// The emulated device's pool memory in transparent huge pages where the
// machine gives them (PosixBackend's comment: populating a 2 MiB granule
// costs one entry, not 512), by advice or by collapse, and bytes kept across
// an eviction and a page-in on each path whether or not the machine gives
// huge pages.
TEST(EmulatedDeviceMemoryUsesHugePagesWhereTheMachineAllows) {
  if (lms_test::UsingCuda()) {
    std::printf("  skipped on the CUDA backend: a POSIX backend's memory\n");
    return;
  }
  const HugePages machine = MachineAllowsSharedHugePages()     ? HugePages::kAdvise
                            : MachineCollapsesSharedHugePages() ? HugePages::kCollapse
                                                                : HugePages::kOff;
  std::printf("  this machine: %s\n", HugePagesName(machine));
  for (HugePages mode : {HugePages::kAuto, HugePages::kAdvise, HugePages::kCollapse}) {
    std::unique_ptr<Backend> made;
    ASSERT_TRUE((PosixBackend::Create(size_t{2} << 20, &made, mode)).ok());
    EXPECT_EQ(static_cast<PosixBackend*>(made.get())->huge_pages(),
              mode == HugePages::kAuto ? machine : mode);
    // Huge where the machine gives this path: advice where shmem_enabled
    // allows it, collapse where the kernel collapses shared memory (which
    // shmem_enabled's advise does not forbid).
    const bool huge = mode == HugePages::kAdvise ? MachineAllowsSharedHugePages()
                      : mode == HugePages::kCollapse ? MachineCollapsesSharedHugePages()
                                                     : machine != HugePages::kOff;
    const int64_t kb = huge ? 4096 : 0;
    const std::vector<int64_t> expected = {kb, kb, kb};
    std::vector<int64_t> pmd_kb;
    MapEvictAndPageInGranules(mode, &pmd_kb);
    if (pmd_kb != expected) {
      // The kernel gives a huge page only if it finds 2 MiB free and
      // contiguous, or makes it: once more, on the rare chance it did not.
      std::printf("  %s: %" PRId64 ", %" PRId64 ", %" PRId64 " kB in huge pages; again\n",
                  HugePagesName(mode), pmd_kb[0], pmd_kb[1], pmd_kb[2]);
      pmd_kb.clear();
      MapEvictAndPageInGranules(mode, &pmd_kb);
    }
    EXPECT_TRUE(pmd_kb == expected);
    std::printf("  %s: %" PRId64 " kB of 4096 in huge pages after each mapping (%s)\n",
                HugePagesName(mode), pmd_kb.empty() ? -1 : pmd_kb.back(),
                huge ? "huge expected" : "small expected");
  }
}

}  // namespace
}  // namespace lms::engine_test
