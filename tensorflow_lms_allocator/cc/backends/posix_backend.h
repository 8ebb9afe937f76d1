// PosixBackend: the engine's backend on plain Linux memory, the emulated GPU.
//
// Each pool is one memfd of fixed size (the device pool is the emulated
// device's memory, the host pool the swap space). Granule i of a pool is the
// file range [i * granule, (i + 1) * granule). Mapping a granule at an
// address is mmap(MAP_FIXED | MAP_SHARED) of that range, so the same physical
// pages can appear at the allocation's address and in the pool's window: a
// second, permanent mapping of the whole memfd that copies go through.
// Copies between windows touch page tables that are already populated, so an
// eviction or page-in costs a copy (streaming_copy.h) plus one mmap per run
// of granules.
//
// Device granules are mapped populated (MAP_POPULATE): a fresh mapping has
// no page table entries, and the kernels that touch it next would fault once
// per 4 KiB page (writes to a shared mapping get no fault-around). On this
// machine a first write through faults ran at 2.4 GB/s, populating and then
// writing at 4.9 GB/s in all (128 MiB: 11.8 ms to populate, 14.3 to write,
// against 55 ms faulting). A GPU has no such faults, so the emulation is
// closer to it, and their time moves into the remap that LMS accounts.
// Host granules mapped at an evicted allocation are left to fault: they are
// touched only by writers outside kernels and strict mode, if at all.
//
// Huge pages. Populating costs 512 page table entries a 2 MiB granule: on
// this project's machines 140-300 us a granule, 70-150 ms a GiB paged in,
// about as much as the copy itself. In a 2 MiB huge page a granule is mapped
// by one page middle directory entry: 6-14 us a granule (microbenchmark, one
// machine). Two ways to get them for shared memory:
//  - Where the machine's /sys/kernel/mm/transparent_hugepage/shmem_enabled
//    is always, within_size, advise or force (kAdvise), the windows and
//    every device mapping are advised MADV_HUGEPAGE and the first touch of a
//    granule allocates its huge page. A mapping is then populated with
//    MADV_POPULATE_WRITE after the advice (MAP_POPULATE would populate before
//    it, with small pages); without huge pages that is slower than
//    MAP_POPULATE (420 against 230 us), so it is used only with them.
//  - Where it is never (most distributions' default), MADV_COLLAPSE (Linux
//    6.1) still makes a range of shared memory huge on request: the kernel
//    ignores shmem_enabled for it unless it is deny (kCollapse). Each pool
//    granule is collapsed once, before its first use (EnsureHuge): 350-2,500
//    us a granule, once, against 150-300 us saved on every later remap of
//    it. Its page stays huge: pool files never give memory back (a fork
//    child's copies are collapsed again as the child uses them).
// A granule smaller than a huge page is mapped in small pages either way,
// and not collapsed.
//
// Copies are synchronous, so CopiesAfterUse and WaitForCopies have
// nothing to wait for.
//
// Across fork() the child gets its own copy of both pools at the same
// addresses (PrepareFork/AfterForkInChild, Note [Fork] in
// engine/fork_handlers.h): MAP_SHARED memory would otherwise be shared.
//
// Thread-compatible: the engine's lock serialises calls.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_POSIX_BACKEND_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_POSIX_BACKEND_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <mutex>
#include <utility>
#include <vector>

#include "engine/backend.h"
#include "engine/env_options.h"

namespace lms {

// How pool memory gets transparent huge pages (the comment above says why):
// in one of the ways HugePages (engine/env_options.h) names.

// "advise", "collapse", "off" ("auto" for kAuto).
const char* HugePagesName(HugePages mode);

// kAdvise's condition: shmem_enabled is always, within_size, advise or force.
bool MachineAllowsSharedHugePages();

// kCollapse's: MADV_COLLAPSE made a granule of a memfd one huge page when
// this was first asked (a probe of 2 MiB).
bool MachineCollapsesSharedHugePages();

class PosixBackend : public Backend {
 public:
  // `granule_bytes` must be a power of two and a multiple of the page size.
  static Status Create(size_t granule_bytes, std::unique_ptr<Backend>* out,
                       HugePages huge_pages = HugePages::kAuto);
  ~PosixBackend() override;

  const char* Name() const override { return "posix"; }
  size_t granule_bytes() const override { return granule_; }
  Status ReserveAddressRange(size_t bytes, uintptr_t* base) override;
  void ReleaseAddressRange(uintptr_t base, size_t bytes) override;
  Status CreatePool(PoolKind pool, size_t granules) override;
  Status Map(uintptr_t address, PoolKind pool, const GranuleId* ids,
             size_t count, Access access) override;
  Status Unmap(uintptr_t address, size_t count) override;
  Status CopyGranules(PoolKind dst_pool, const GranuleId* dst,
                      PoolKind src_pool, const GranuleId* src,
                      size_t bytes) override;
  Status CopyRanges(PoolKind dst_pool, GranuleId dst, PoolKind src_pool, GranuleId src,
                    const ByteRange* ranges, size_t count) override;
  Status CopiesAfterUse(uint64_t) override { return Status::Ok(); }
  Status WaitForCopies() override { return Status::Ok(); }
  // Copies read and write only the pool windows, mapped once at CreatePool
  // and replaced only by fork's handlers, which run with no copy in flight.
  bool CopiesMayRunUnlocked() const override { return true; }
  BackendStatistics GetStatistics() const override;
  void PrepareFork() override;
  void AfterForkInParent() override;
  void AfterForkInChild() override;

  // kAdvise, kCollapse or kOff: what kAuto became on this machine.
  HugePages huge_pages() const { return huge_pages_; }

 private:
  PosixBackend(size_t granule_bytes, HugePages huge_pages)
      : granule_(granule_bytes), huge_pages_(huge_pages) {}

  struct PoolFile {
    int fd = -1;
    size_t granules = 0;
    char* window = nullptr;  // the whole file, mapped once
    // kCollapse: granule i was collapsed (or tried) when collapsed[i] is set.
    // Set before the collapse by whichever call first uses the granule, so
    // a call beside it may map or copy while the kernel collapses: the
    // kernel keeps every byte either way.
    std::unique_ptr<std::atomic<bool>[]> collapsed;
  };

  // One mapping of a pool file in this process, as /proc/self/maps lists it.
  struct PoolMapping {
    uintptr_t start = 0;
    size_t bytes = 0;
    off_t offset = 0;
    int prot = 0;
    int pool = 0;
  };
  // Copies pool `pool`'s written extents into a new memfd (*fd).
  Status SnapshotPool(int pool, int* fd) const;
  // Every current mapping of the pool files, allocations' slots and windows.
  Status ListPoolMappings(std::vector<PoolMapping>* out) const;
  void CloseSnapshots();
  // MADV_HUGEPAGE on [at, at + bytes) with kAdvise; best effort (a kernel
  // without THP refuses the advice and the memory works as before).
  void AdviseHugePages(void* at, size_t bytes) const;
  // kCollapse: collapses granules ids[0, count) of `pool` into huge pages,
  // each the first time it is asked; best effort, as the advice. Called
  // before a granule is mapped or copied into. Writes no byte: the kernel
  // keeps a granule's contents as it collapses it.
  void EnsureHuge(PoolFile& pool, const GranuleId* ids, size_t count);
  // Fills the page tables of a fresh read-write device mapping, made without
  // MAP_POPULATE, in huge pages.
  Status PopulateHuge(void* at, size_t bytes, const PoolFile& pool, off_t offset) const;
  // Adds `copies` copy calls of `bytes` in all, begun at `start`, to stats_.
  void CountCopies(std::chrono::steady_clock::time_point start, int64_t copies, int64_t bytes);

  const size_t granule_;
  const HugePages huge_pages_;
  PoolFile pools_[2];
  // Copies only: nothing here waits or fences. Copies run beside each other
  // and beside the engine's other calls (CopiesMayRunUnlocked), so their
  // counts are added under stats_mu_; the mapping times are written with
  // the engine's lock held.
  mutable std::mutex stats_mu_;
  BackendStatistics stats_;
  // Reserved address ranges (base, bytes): what a fork child must cut off
  // from the parent's memory if it cannot have its own copy.
  std::vector<std::pair<uintptr_t, size_t>> reserved_;
  // Between PrepareFork and the After calls: the child's pool files (-1 if
  // the pool does not exist), the mappings to move to them, and why the
  // snapshot failed (empty if it did not).
  int fork_fds_[2] = {-1, -1};
  std::vector<PoolMapping> fork_mappings_;
  std::string fork_error_;
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_POSIX_BACKEND_H_
