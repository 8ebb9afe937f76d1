#include "backends/posix_backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

namespace lms {
namespace {

Status Errno(const std::string& what) {
  return Internal(what + " failed: " + std::strerror(errno));
}

const char* PoolName(PoolKind pool) {
  return pool == PoolKind::kDevice ? "device" : "host";
}

}  // namespace

Status PosixBackend::Create(size_t granule_bytes, std::unique_ptr<Backend>* out) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (granule_bytes == 0 || (granule_bytes & (granule_bytes - 1)) != 0 ||
      granule_bytes % page != 0) {
    return InvalidArgument("granule size " + std::to_string(granule_bytes) +
                           " is not a power of two multiple of the page size (" +
                           std::to_string(page) + ")");
  }
  out->reset(new PosixBackend(granule_bytes));
  return Status::Ok();
}

PosixBackend::~PosixBackend() {
  for (PoolFile& p : pools_) {
    if (p.window != nullptr) munmap(p.window, p.granules * granule_);
    if (p.fd >= 0) close(p.fd);
  }
}

Status PosixBackend::ReserveAddressRange(size_t bytes, uintptr_t* base) {
  // Over-reserve by one granule and trim, so the range is granule aligned.
  const size_t padded = bytes + granule_;
  void* p = mmap(nullptr, padded, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return ResourceExhausted("reserving " + FormatBytes(bytes) +
                             " of address space failed: " + std::strerror(errno));
  }
  const uintptr_t start = reinterpret_cast<uintptr_t>(p);
  const uintptr_t aligned = (start + granule_ - 1) & ~(uintptr_t{granule_} - 1);
  if (aligned > start) munmap(p, aligned - start);
  const uintptr_t end = start + padded;
  if (end > aligned + bytes) {
    munmap(reinterpret_cast<void*>(aligned + bytes), end - (aligned + bytes));
  }
  *base = aligned;
  return Status::Ok();
}

void PosixBackend::ReleaseAddressRange(uintptr_t base, size_t bytes) {
  munmap(reinterpret_cast<void*>(base), bytes);
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
  void* w = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (w == MAP_FAILED) {
    Status s = Errno("mapping the " + std::string(PoolName(pool)) + " pool window");
    close(fd);
    return s;
  }
  p.fd = fd;
  p.granules = granules;
  p.window = static_cast<char*>(w);
  return Status::Ok();
}

Status PosixBackend::Map(uintptr_t address, PoolKind pool, const GranuleId* ids,
                         size_t count, Access access) {
  const PoolFile& p = pools_[static_cast<int>(pool)];
  const int prot = access == Access::kNone ? PROT_NONE : PROT_READ | PROT_WRITE;
  // One mmap per run of consecutive granule ids: they are one file range.
  for (size_t i = 0; i < count;) {
    size_t run = 1;
    while (i + run < count && ids[i + run] == ids[i] + run) ++run;
    void* at = reinterpret_cast<void*>(address + i * granule_);
    void* r = mmap(at, run * granule_, prot, MAP_SHARED | MAP_FIXED, p.fd,
                   static_cast<off_t>(ids[i]) * static_cast<off_t>(granule_));
    if (r == MAP_FAILED) {
      Status failed = Errno("mapping " + std::to_string(run) + " " + PoolName(pool) +
                            " granule(s) at " + FormatAddress(at));
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
  void* at = reinterpret_cast<void*>(address);
  void* r = mmap(at, count * granule_, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (r == MAP_FAILED) return Errno("unmapping granules at " + FormatAddress(at));
  return Status::Ok();
}

Status PosixBackend::CopyGranules(PoolKind dst_pool, const GranuleId* dst,
                                  PoolKind src_pool, const GranuleId* src,
                                  size_t bytes) {
  char* dst_window = pools_[static_cast<int>(dst_pool)].window;
  const char* src_window = pools_[static_cast<int>(src_pool)].window;
  // Consecutive ids on both sides are one memcpy.
  size_t i = 0;
  while (bytes > 0) {
    size_t run = 1;
    while (run * granule_ < bytes && dst[i + run] == dst[i] + run &&
           src[i + run] == src[i] + run) {
      ++run;
    }
    const size_t n = std::min(bytes, run * granule_);
    std::memcpy(dst_window + size_t{dst[i]} * granule_,
                src_window + size_t{src[i]} * granule_, n);
    bytes -= n;
    i += run;
  }
  return Status::Ok();
}

}  // namespace lms
