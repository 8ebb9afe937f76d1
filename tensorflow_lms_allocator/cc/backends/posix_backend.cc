#include "backends/posix_backend.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "backends/streaming_copy.h"
#include "engine/scoped_nanos.h"

// Linux 5.14 and 6.1; older C libraries lack the names.
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

namespace lms {
namespace {

Status Errno(const std::string& what) {
  return Internal(what + " failed: " + std::strerror(errno));
}

const char* PoolName(PoolKind pool) {
  return pool == PoolKind::kDevice ? "device" : "host";
}

// The size of a transparent huge page (2 MiB on x86-64).
size_t HugePageBytes() {
  static const size_t bytes = [] {
    std::ifstream setting("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
    size_t value = 0;
    return setting >> value && value != 0 ? value : size_t{2} << 20;
  }();
  return bytes;
}

// Inaccessible address space of `bytes` at a multiple of `alignment` (a
// power of two): over-reserved by `alignment` and trimmed.
void* ReserveAligned(size_t bytes, size_t alignment) {
  const size_t padded = bytes + alignment;
  void* p = mmap(nullptr, padded, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  const uintptr_t start = reinterpret_cast<uintptr_t>(p);
  const uintptr_t aligned = (start + alignment - 1) & ~(uintptr_t{alignment} - 1);
  if (aligned > start) munmap(p, aligned - start);
  const uintptr_t end = start + padded;
  if (end > aligned + bytes) {
    munmap(reinterpret_cast<void*>(aligned + bytes), end - (aligned + bytes));
  }
  return reinterpret_cast<void*>(aligned);
}

}  // namespace

const char* HugePagesName(HugePages mode) {
  switch (mode) {
    case HugePages::kAuto: return "auto";
    case HugePages::kAdvise: return "advise";
    case HugePages::kCollapse: return "collapse";
    case HugePages::kOff: return "off";
  }
  return "?";
}

bool MachineAllowsSharedHugePages() {
  std::ifstream setting("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  std::string word;
  while (setting >> word) {  // "always within_size advise [never] deny force"
    if (word.front() != '[') continue;
    return word == "[always]" || word == "[within_size]" || word == "[advise]" ||
           word == "[force]";
  }
  return false;
}

bool MachineCollapsesSharedHugePages() {
  static const bool collapses = [] {
    const size_t bytes = HugePageBytes();
    const int fd = memfd_create("tf-lms-collapse-probe", MFD_CLOEXEC);
    if (fd < 0) return false;
    bool ok = false;
    void* at = ReserveAligned(bytes, bytes);
    if (ftruncate(fd, static_cast<off_t>(bytes)) == 0 && at != nullptr &&
        mmap(at, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) != MAP_FAILED &&
        fallocate(fd, 0, 0, sysconf(_SC_PAGESIZE)) == 0) {
      ok = madvise(at, bytes, MADV_COLLAPSE) == 0;
    }
    if (at != nullptr) munmap(at, bytes);
    close(fd);
    return ok;
  }();
  return collapses;
}

Status PosixBackend::Create(size_t granule_bytes, std::unique_ptr<Backend>* out,
                            HugePages huge_pages) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (granule_bytes == 0 || (granule_bytes & (granule_bytes - 1)) != 0 ||
      granule_bytes % page != 0) {
    return InvalidArgument("granule size " + std::to_string(granule_bytes) +
                           " is not a power of two multiple of the page size (" +
                           std::to_string(page) + ")");
  }
  HugePages mode = huge_pages;
  if (mode == HugePages::kAuto) {
    mode = MachineAllowsSharedHugePages()     ? HugePages::kAdvise
           : MachineCollapsesSharedHugePages() ? HugePages::kCollapse
                                               : HugePages::kOff;
  }
  // A granule smaller than a huge page is mapped in small pages whatever
  // memory is behind it: nothing to collapse.
  if (mode == HugePages::kCollapse && granule_bytes % HugePageBytes() != 0) {
    mode = HugePages::kOff;
  }
  // Measured now (a few milliseconds, once a process), not in the first
  // eviction's copy (Note [Copy order] in streaming_copy.h).
  ChooseCopyMethod();
  out->reset(new PosixBackend(granule_bytes, mode));
  return Status::Ok();
}

PosixBackend::~PosixBackend() {
  for (PoolFile& p : pools_) {
    if (p.window != nullptr) munmap(p.window, p.granules * granule_);
    if (p.fd >= 0) close(p.fd);
  }
}

Status PosixBackend::ReserveAddressRange(size_t bytes, uintptr_t* base) {
  void* p = ReserveAligned(bytes, granule_);
  if (p == nullptr) {
    return ResourceExhausted("reserving " + FormatBytes(bytes) +
                             " of address space failed: " + std::strerror(errno));
  }
  *base = reinterpret_cast<uintptr_t>(p);
  reserved_.emplace_back(*base, bytes);
  return Status::Ok();
}

void PosixBackend::ReleaseAddressRange(uintptr_t base, size_t bytes) {
  munmap(reinterpret_cast<void*>(base), bytes);
  reserved_.erase(std::remove(reserved_.begin(), reserved_.end(),
                              std::make_pair(base, bytes)),
                  reserved_.end());
}

Status PosixBackend::CreatePool(PoolKind pool, size_t granules) {
  PoolFile& p = pools_[static_cast<int>(pool)];
  if (p.fd >= 0) return Internal(std::string(PoolName(pool)) + " pool created twice");
  const std::string name = std::string("tf-lms-") + PoolName(pool) + "-pool";
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) return Errno("memfd_create for the " + std::string(PoolName(pool)) + " pool");
  const size_t bytes = granules * granule_;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    Status s = Errno("sizing the " + std::string(PoolName(pool)) + " pool to " +
                     FormatBytes(bytes));
    close(fd);
    return s;
  }
  // At a huge page boundary, or no huge page fits in it.
  void* const reserved = ReserveAligned(bytes, std::max(granule_, HugePageBytes()));
  void* w = reserved == nullptr
                ? MAP_FAILED
                : mmap(reserved, bytes, PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_NORESERVE | MAP_FIXED, fd, 0);
  if (w == MAP_FAILED) {
    Status s = Errno("mapping the " + std::string(PoolName(pool)) + " pool window");
    if (reserved != nullptr) munmap(reserved, bytes);
    close(fd);
    return s;
  }
  // Copies into a granule touch it through the window first: its pages are
  // made huge there, and every later mapping of them maps them huge.
  AdviseHugePages(w, bytes);
  p.fd = fd;
  p.granules = granules;
  p.window = static_cast<char*>(w);
  if (huge_pages_ == HugePages::kCollapse) {
    p.collapsed.reset(new std::atomic<bool>[granules]);
    for (size_t i = 0; i < granules; ++i) p.collapsed[i].store(false, std::memory_order_relaxed);
  }
  return Status::Ok();
}

void PosixBackend::AdviseHugePages(void* at, size_t bytes) const {
  if (huge_pages_ == HugePages::kAdvise) madvise(at, bytes, MADV_HUGEPAGE);
}

void PosixBackend::EnsureHuge(PoolFile& pool, const GranuleId* ids, size_t count) {
  if (huge_pages_ != HugePages::kCollapse) return;
  for (size_t i = 0; i < count; ++i) {
    // Every map and copy asks: a load, not a write, once the granule is done.
    std::atomic<bool>& collapsed = pool.collapsed[ids[i]];
    if (collapsed.load(std::memory_order_relaxed) ||
        collapsed.exchange(true, std::memory_order_relaxed)) {
      continue;
    }
    const off_t offset = static_cast<off_t>(ids[i]) * static_cast<off_t>(granule_);
    // The kernel collapses only ranges with a page in memory (EINVAL
    // otherwise); fallocate adds one if there is none, writing nothing, so
    // a call that maps or copies into this granule beside us loses nothing.
    if (fallocate(pool.fd, 0, offset, sysconf(_SC_PAGESIZE)) == 0) {
      madvise(pool.window + offset, granule_, MADV_COLLAPSE);
    }
  }
}

Status PosixBackend::PopulateHuge(void* at, size_t bytes, const PoolFile& pool,
                                  off_t offset) const {
  // A granule no copy has touched yet gets its huge page here.
  AdviseHugePages(at, bytes);
  if (madvise(at, bytes, MADV_POPULATE_WRITE) == 0) return Status::Ok();
  if (errno != EINVAL) return Errno("populating " + FormatBytes(bytes) + " at " +
                                    FormatAddress(at));
  // EINVAL: a kernel older than 5.14; populate as without huge pages.
  void* r = mmap(at, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE,
                 pool.fd, offset);
  if (r == MAP_FAILED) return Errno("populating " + FormatBytes(bytes) + " at " +
                                    FormatAddress(at));
  return Status::Ok();
}

Status PosixBackend::Map(uintptr_t address, PoolKind pool, const GranuleId* ids,
                         size_t count, Access access) {
  ScopedNanos timed(&stats_.map_ns);
  PoolFile& p = pools_[static_cast<int>(pool)];
  const int prot = access == Access::kNone ? PROT_NONE : PROT_READ | PROT_WRITE;
  if (access != Access::kNone) EnsureHuge(p, ids, count);
  // Populated device mappings: the header's comment says why.
  const bool populate = pool == PoolKind::kDevice && access != Access::kNone;
  // With advised huge pages, populated after the advice (PopulateHuge).
  const bool advised = huge_pages_ == HugePages::kAdvise;
  // One mmap per run of consecutive granule ids: they are one file range.
  for (size_t i = 0; i < count;) {
    size_t run = 1;
    while (i + run < count && ids[i + run] == ids[i] + run) ++run;
    void* at = reinterpret_cast<void*>(address + i * granule_);
    const off_t offset = static_cast<off_t>(ids[i]) * static_cast<off_t>(granule_);
    const int flags = MAP_SHARED | MAP_FIXED | (populate && !advised ? MAP_POPULATE : 0);
    Status failed;
    if (mmap(at, run * granule_, prot, flags, p.fd, offset) == MAP_FAILED) {
      failed = Errno("mapping " + std::to_string(run) + " " + PoolName(pool) +
                     " granule(s) at " + FormatAddress(at));
    } else if (populate && advised) {
      failed = PopulateHuge(at, run * granule_, p, offset);
    }
    if (!failed.ok()) {
      // All or nothing (backend.h): no slot keeps an earlier run's or its
      // previous mapping.
      Status undone = Unmap(address, count);
      return undone.ok() ? failed
                         : Internal(failed.message() + "; undoing it also failed: " +
                                    undone.message());
    }
    i += run;
  }
  return Status::Ok();
}

Status PosixBackend::Unmap(uintptr_t address, size_t count) {
  ScopedNanos timed(&stats_.unmap_ns);
  void* at = reinterpret_cast<void*>(address);
  void* r = mmap(at, count * granule_, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (r == MAP_FAILED) return Errno("unmapping granules at " + FormatAddress(at));
  return Status::Ok();
}

Status PosixBackend::CopyGranules(PoolKind dst_pool, const GranuleId* dst,
                                  PoolKind src_pool, const GranuleId* src,
                                  size_t bytes) {
  const auto start = std::chrono::steady_clock::now();
  EnsureHuge(pools_[static_cast<int>(dst_pool)], dst, (bytes + granule_ - 1) / granule_);
  char* dst_window = pools_[static_cast<int>(dst_pool)].window;
  const char* src_window = pools_[static_cast<int>(src_pool)].window;
  int64_t copies = 0;
  const int64_t bytes_copied = static_cast<int64_t>(bytes);
  // Consecutive ids on both sides are one copy.
  size_t i = 0;
  while (bytes > 0) {
    size_t run = 1;
    while (run * granule_ < bytes && dst[i + run] == dst[i] + run &&
           src[i + run] == src[i] + run) {
      ++run;
    }
    const size_t n = std::min(bytes, run * granule_);
    StreamingCopy(dst_window + size_t{dst[i]} * granule_,
                  src_window + size_t{src[i]} * granule_, n);
    ++copies;
    bytes -= n;
    i += run;
  }
  CountCopies(start, copies, bytes_copied);
  return Status::Ok();
}

Status PosixBackend::CopyRanges(PoolKind dst_pool, GranuleId dst, PoolKind src_pool,
                                GranuleId src, const ByteRange* ranges, size_t count) {
  const auto start = std::chrono::steady_clock::now();
  EnsureHuge(pools_[static_cast<int>(dst_pool)], &dst, 1);
  char* to = pools_[static_cast<int>(dst_pool)].window + size_t{dst} * granule_;
  const char* from = pools_[static_cast<int>(src_pool)].window + size_t{src} * granule_;
  int64_t bytes_copied = 0;
  for (size_t i = 0; i < count; ++i) {
    assert(ranges[i].offset + ranges[i].bytes <= granule_);
    StreamingCopy(to + ranges[i].offset, from + ranges[i].offset, ranges[i].bytes);
    bytes_copied += static_cast<int64_t>(ranges[i].bytes);
  }
  CountCopies(start, static_cast<int64_t>(count), bytes_copied);
  return Status::Ok();
}

void PosixBackend::CountCopies(std::chrono::steady_clock::time_point start, int64_t copies,
                               int64_t bytes) {
  const int64_t copy_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::steady_clock::now() - start)
                              .count();
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.copy_ns += copy_ns;
  stats_.copies += copies;
  stats_.bytes_copied += bytes;
}

BackendStatistics PosixBackend::GetStatistics() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

// fork(): Note [Fork] in engine/fork_handlers.h. All of this runs with the
// engine's lock held (no Map, Unmap or copy in between); PrepareFork in the
// parent before fork(), the After calls in each process after it.

void PosixBackend::PrepareFork() {
  fork_error_.clear();
  fork_mappings_.clear();
  Status s = ListPoolMappings(&fork_mappings_);
  for (int i = 0; i < 2 && s.ok(); ++i) {
    if (pools_[i].fd >= 0) s = SnapshotPool(i, &fork_fds_[i]);
  }
  if (!s.ok()) {
    fork_error_ = s.message();
    CloseSnapshots();
  }
}

void PosixBackend::AfterForkInParent() {
  // The parent keeps its own files; the copies belong to the child.
  CloseSnapshots();
  fork_mappings_.clear();
  fork_error_.clear();
}

void PosixBackend::AfterForkInChild() {
  // Each mapping moves to the same range of the copy: same address, offset
  // and protection, so granule ids, windows and the engine's state all stay
  // valid. MAP_FIXED replaces the old mapping in one step.
  for (size_t i = 0; i < fork_mappings_.size() && fork_error_.empty(); ++i) {
    const PoolMapping& m = fork_mappings_[i];
    void* r = mmap(reinterpret_cast<void*>(m.start), m.bytes, m.prot,
                   MAP_SHARED | MAP_FIXED, fork_fds_[m.pool], m.offset);
    if (r == MAP_FAILED) {
      fork_error_ = "mapping the copy at " +
                    FormatAddress(reinterpret_cast<void*>(m.start)) +
                    " failed: " + std::strerror(errno);
    } else {
      AdviseHugePages(r, m.bytes);
    }
  }
  if (fork_error_.empty()) {
    for (int i = 0; i < 2; ++i) {
      if (fork_fds_[i] < 0) continue;
      close(pools_[i].fd);
      pools_[i].fd = fork_fds_[i];
      fork_fds_[i] = -1;
      // The copies are in small pages: collapsed again as they are used.
      for (size_t g = 0; pools_[i].collapsed != nullptr && g < pools_[i].granules; ++g) {
        pools_[i].collapsed[g].store(false, std::memory_order_relaxed);
      }
    }
  } else {
    // No copy: the child must not reach the parent's pages. Every reserved
    // range and window becomes inaccessible private memory and the pool
    // files are closed, so a touch faults and a Map fails, in this process
    // only.
    for (const auto& [base, bytes] : reserved_) {
      mmap(reinterpret_cast<void*>(base), bytes, PROT_NONE,
           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    }
    for (PoolFile& p : pools_) {
      if (p.window != nullptr) {
        mmap(p.window, p.granules * granule_, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
      }
      if (p.fd >= 0) close(p.fd);
      p.fd = -1;
    }
    CloseSnapshots();
    std::fprintf(stderr,
                 "tensorflow_lms_allocator: this fork() child could not get its own "
                 "copy of the emulated device's memory (%s); LMS memory is "
                 "inaccessible in this process, so that it never writes the "
                 "parent's\n",
                 fork_error_.c_str());
  }
  fork_mappings_.clear();
}

void PosixBackend::CloseSnapshots() {
  for (int& fd : fork_fds_) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
}

Status PosixBackend::SnapshotPool(int pool, int* out) const {
  const PoolFile& p = pools_[pool];
  const PoolKind kind = static_cast<PoolKind>(pool);
  const off_t bytes = static_cast<off_t>(p.granules * granule_);
  const std::string name = std::string("tf-lms-") + PoolName(kind) + "-pool";
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) return Errno("memfd_create for the fork child's " + name);
  Status s;
  if (ftruncate(fd, bytes) != 0) {
    s = Errno("sizing the fork child's " + name);
  }
  // Only written extents: a hole reads as zeros in the copy too.
  for (off_t pos = 0; s.ok() && pos < bytes;) {
    const off_t data = lseek(p.fd, pos, SEEK_DATA);
    if (data < 0) {
      if (errno != ENXIO) s = Errno("finding data in the " + name);
      break;  // ENXIO: no data after pos
    }
    off_t hole = lseek(p.fd, data, SEEK_HOLE);
    if (hole < 0) {
      s = Errno("finding holes in the " + name);
      break;
    }
    hole = std::min(hole, bytes);
    for (off_t at = data; at < hole;) {
      const ssize_t n = pwrite(fd, p.window + at, static_cast<size_t>(hole - at), at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        s = Errno("copying the " + name + " for the fork child");
        break;
      }
      at += n;
    }
    pos = hole;
  }
  if (!s.ok()) {
    close(fd);
    return s;
  }
  *out = fd;
  return Status::Ok();
}

Status PosixBackend::ListPoolMappings(std::vector<PoolMapping>* out) const {
  struct stat files[2];
  for (int i = 0; i < 2; ++i) {
    if (pools_[i].fd >= 0 && fstat(pools_[i].fd, &files[i]) != 0) {
      return Errno("fstat of a pool file");
    }
  }
  FILE* maps = std::fopen("/proc/self/maps", "re");
  if (maps == nullptr) return Errno("opening /proc/self/maps");
  char* line = nullptr;
  size_t capacity = 0;
  while (getline(&line, &capacity, maps) > 0) {
    uintptr_t start = 0, end = 0;
    unsigned long long offset = 0, inode = 0;
    unsigned int major_id = 0, minor_id = 0;
    char perms[8] = {};
    if (std::sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %7s %llx %x:%x %llu", &start, &end,
                    perms, &offset, &major_id, &minor_id, &inode) != 7) {
      continue;
    }
    for (int i = 0; i < 2; ++i) {
      if (pools_[i].fd < 0 || inode != files[i].st_ino ||
          makedev(major_id, minor_id) != files[i].st_dev) {
        continue;
      }
      PoolMapping m;
      m.start = start;
      m.bytes = end - start;
      m.offset = static_cast<off_t>(offset);
      m.prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
               (perms[2] == 'x' ? PROT_EXEC : 0);
      m.pool = i;
      out->push_back(m);
    }
  }
  std::free(line);
  std::fclose(maps);
  return Status::Ok();
}

}  // namespace lms
