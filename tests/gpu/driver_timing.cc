// Microseconds per granule of each CUDA virtual-memory call LMS makes for a
// remap (cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease),
// on device memory and on host-located memory, and the bandwidth of a copy
// between the two (what evictions and page-ins copy), through the backend's
// own driver table (CudaDriver: libcuda.so.1, or TF_LMS_CUDA_DRIVER_PATH's fake).
// Part of `make gpu-check-engine` (tests/gpu/gpu_check_engine.sh).
//
// Usage: driver_timing [MiB]   (default 1024, a multiple of 32)
// Prints one line per location, handle size and call (for 2 MiB handles also
// the maps and unmaps from 2 and 4 threads at once), then whether device
// and host memory map at an offset and sub-ranges of one handle of MiB, in
// microseconds per 2 MiB of wall time; exits 1 if a call fails.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "backends/cuda_context.h"
#include "backends/cuda_driver.h"

namespace lms {
namespace {

using Clock = std::chrono::steady_clock;

bool Ok(const CudaDriver& d, cu::CUresult r, const char* call) {
  if (r == cu::CUDA_SUCCESS) return true;
  std::printf("%s: %s\n", call, d.ErrorName(r).c_str());
  return false;
}

double MicrosSince(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

cu::CUmemAllocationProp Prop(cu::CUmemLocation location) {
  cu::CUmemAllocationProp prop{};
  prop.type = cu::CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = cu::CU_MEM_HANDLE_TYPE_NONE;
  prop.location = location;
  return prop;
}

// `bytes` of one location in handles of `handle` bytes, reserved at one
// range. Every figure is per 2 MiB, whatever the handle size.
struct Range {
  const char* name;
  size_t handle = 0;
  cu::CUdeviceptr base = 0;
  std::vector<cu::CUmemGenericAllocationHandle> handles;
  size_t bytes() const { return handles.size() * handle; }
};

void Row(const Range& r, const char* what, Clock::time_point start) {
  const double per_2m = MicrosSince(start) / (r.bytes() >> 21);
  std::printf("driver_timing %-6s %5zu MiB handles  %-30s %9.2f us per 2 MiB\n", r.name,
              r.handle >> 20, what, per_2m);
}

bool MapEach(const CudaDriver& d, const Range& r) {
  for (size_t i = 0; i < r.handles.size(); ++i) {
    if (!Ok(d, d.cuMemMap(r.base + i * r.handle, r.handle, 0, r.handles[i], 0), "cuMemMap")) {
      return false;
    }
  }
  return true;
}

// Whether the driver remaps in parallel: the range's handles mapped and
// granted, then unmapped, by `threads` threads at once, each its own
// consecutive part (the range starts and ends unmapped). A remap batch could
// spread its victims over threads only if this beats one thread.
bool Threaded(const CudaDriver& d, const Range& r, const cu::CUmemAccessDesc& rw,
              int threads) {
  cu::CUcontext context = nullptr;
  if (!Ok(d, d.cuCtxGetCurrent(&context), "cuCtxGetCurrent")) return false;
  const size_t n = r.handles.size();
  std::vector<int> failed(threads, 0);
  for (bool map : {true, false}) {
    const Clock::time_point t = Clock::now();
    std::vector<std::thread> workers;
    for (int k = 0; k < threads; ++k) {
      workers.emplace_back([&, k] {
        ScopedCudaContext scope(d, context);
        for (size_t i = n * k / threads; i < n * (k + 1) / threads && !failed[k]; ++i) {
          const cu::CUdeviceptr at = r.base + i * r.handle;
          failed[k] = map ? !Ok(d, d.cuMemMap(at, r.handle, 0, r.handles[i], 0), "cuMemMap") ||
                                !Ok(d, d.cuMemSetAccess(at, r.handle, &rw, 1), "cuMemSetAccess")
                          : !Ok(d, d.cuMemUnmap(at, r.handle), "cuMemUnmap");
        }
      });
    }
    for (auto& w : workers) w.join();
    if (std::count(failed.begin(), failed.end(), 1) > 0) return false;
    const std::string what = std::string(map ? "map + access, " : "unmap, ") +
                             std::to_string(threads) + " threads";
    Row(r, what.c_str(), t);
  }
  return true;
}

// Granting access is what costs: cuMemSetAccess of a range already granted
// returns at once, so every grant below is of fresh mappings, and every
// unmap of granted ones, as in a remap.
bool TimeRange(const CudaDriver& d, cu::CUmemLocation location, cu::CUdevice device,
               size_t handle, size_t bytes, Range* r) {
  const cu::CUmemAllocationProp prop = Prop(location);
  r->handle = handle;
  r->handles.resize(bytes / handle);
  const cu::CUmemAccessDesc rw{{cu::CU_MEM_LOCATION_TYPE_DEVICE, device},
                               cu::CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  Clock::time_point t = Clock::now();
  for (auto& h : r->handles) {
    if (!Ok(d, d.cuMemCreate(&h, handle, &prop, 0), "cuMemCreate")) return false;
  }
  Row(*r, "cuMemCreate", t);
  if (!Ok(d, d.cuMemAddressReserve(&r->base, bytes, handle, 0, 0), "cuMemAddressReserve")) {
    return false;
  }
  t = Clock::now();
  for (size_t i = 0; i < r->handles.size(); ++i) {
    const cu::CUdeviceptr at = r->base + i * handle;
    if (!Ok(d, d.cuMemMap(at, handle, 0, r->handles[i], 0), "cuMemMap") ||
        !Ok(d, d.cuMemSetAccess(at, handle, &rw, 1), "cuMemSetAccess")) {
      return false;
    }
  }
  Row(*r, "map + access, a call a handle", t);
  t = Clock::now();
  for (size_t i = 0; i < r->handles.size(); ++i) {
    if (!Ok(d, d.cuMemUnmap(r->base + i * handle, handle), "cuMemUnmap")) return false;
  }
  Row(*r, "unmap, a call a handle", t);
  for (int threads : {2, 4}) {
    if (handle == (size_t{2} << 20) && !Threaded(d, *r, rw, threads)) return false;
  }
  t = Clock::now();
  if (!MapEach(d, *r)) return false;
  Row(*r, "map, a call a handle", t);
  t = Clock::now();
  if (!Ok(d, d.cuMemSetAccess(r->base, bytes, &rw, 1), "cuMemSetAccess of the run")) {
    return false;
  }
  Row(*r, "access, one call the run", t);
  return true;
}

// Unmaps the granted run in one call and releases it.
bool UnmapTimed(const CudaDriver& d, Range& r) {
  Clock::time_point t = Clock::now();
  if (!Ok(d, d.cuMemUnmap(r.base, r.bytes()), "cuMemUnmap of the run")) return false;
  Row(r, "unmap, one call the run", t);
  t = Clock::now();
  for (auto h : r.handles) {
    if (!Ok(d, d.cuMemRelease(h), "cuMemRelease")) return false;
  }
  Row(r, "cuMemRelease", t);
  return Ok(d, d.cuMemAddressFree(r.base, r.bytes()), "cuMemAddressFree");
}

// GB/s of one cuMemcpyAsync of the whole range each way, best of 3: the
// copies an eviction and a page-in make, between device and host VMM memory.
bool CopyTimed(const CudaDriver& d, const Range& device, const Range& host) {
  const size_t bytes = std::min(device.bytes(), host.bytes());
  cu::CUstream stream = nullptr;
  if (!Ok(d, d.cuStreamCreate(&stream, cu::CU_STREAM_NON_BLOCKING), "cuStreamCreate")) {
    return false;
  }
  bool ok = true;
  for (auto [what, dst, src] : {std::tuple{"device->host", host.base, device.base},
                                std::tuple{"host->device", device.base, host.base}}) {
    double best = 0;
    for (int i = 0; ok && i < 3; ++i) {
      const Clock::time_point t = Clock::now();
      ok = Ok(d, d.cuMemcpyAsync(dst, src, bytes, stream), "cuMemcpyAsync") &&
           Ok(d, d.cuStreamSynchronize(stream), "cuStreamSynchronize");
      best = std::max(best, bytes / (MicrosSince(t) * 1e3));
    }
    std::printf("driver_timing copy   %-46s %9.1f GB/s (%zu MiB, best of 3)\n", what, best,
                bytes >> 20);
  }
  d.cuStreamDestroy(stream);
  return ok;
}

// Note [Device memory in runs] (cuda_backend.h): LMS makes device memory in
// handles of up to 1 GiB and maps a unit's run of them with one cuMemMap at
// its offset; host memory made ahead is split the same way (Note [Host
// memory made ahead] in engine.h). Whether the driver takes a nonzero offset
// into memory at `location` (cuda.h's parameter note says "currently must be
// zero", its description allows one), and what a sub-range costs against a
// handle of that size: one handle of `bytes`, cut into sub-ranges of 2 to
// 256 MiB, each mapped at its offset, granted, then unmapped. A refusal is
// printed, not a failure: LMS then maps 2 MiB device handles and whole host
// runs, measured above.
bool SubRangesTimed(const CudaDriver& d, const cu::CUmemLocation& location, const char* name,
                    cu::CUdevice device, size_t bytes) {
  const cu::CUmemAllocationProp prop = Prop(location);
  const cu::CUmemAccessDesc rw{{cu::CU_MEM_LOCATION_TYPE_DEVICE, device},
                               cu::CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  cu::CUmemGenericAllocationHandle h = 0;
  cu::CUdeviceptr base = 0;
  if (!Ok(d, d.cuMemCreate(&h, bytes, &prop, 0), "cuMemCreate of one handle") ||
      !Ok(d, d.cuMemAddressReserve(&base, bytes, 0, 0, 0), "cuMemAddressReserve")) {
    return false;
  }
  constexpr size_t k2M = size_t{2} << 20;
  const cu::CUresult probe = d.cuMemMap(base, k2M, k2M, h, 0);
  std::printf("driver_timing %s %zu MiB handle, a sub-range at a nonzero offset: %s\n", name,
              bytes >> 20, probe == cu::CUDA_SUCCESS ? "mapped" : d.ErrorName(probe).c_str());
  bool ok = probe != cu::CUDA_SUCCESS || Ok(d, d.cuMemUnmap(base, k2M), "cuMemUnmap");
  for (size_t sub : {size_t{2} << 20, size_t{8} << 20, size_t{64} << 20, size_t{256} << 20}) {
    if (!ok || probe != cu::CUDA_SUCCESS || sub > bytes) break;
    const size_t n = bytes / sub;
    Clock::time_point t = Clock::now();
    for (size_t i = 0; ok && i < n; ++i) {
      ok = Ok(d, d.cuMemMap(base + i * sub, sub, i * sub, h, 0), "cuMemMap at an offset") &&
           Ok(d, d.cuMemSetAccess(base + i * sub, sub, &rw, 1), "cuMemSetAccess");
    }
    const double map = MicrosSince(t);
    t = Clock::now();
    for (size_t i = 0; ok && i < n; ++i) {
      ok = Ok(d, d.cuMemUnmap(base + i * sub, sub), "cuMemUnmap of a sub-range");
    }
    const double unmap = MicrosSince(t);
    if (!ok) break;
    const double per_2m = static_cast<double>(bytes / k2M);
    std::printf("driver_timing %s %5zu MiB sub-ranges  %-30s %9.2f us per 2 MiB\n", name,
                sub >> 20, "map at offset + access", map / per_2m);
    std::printf("driver_timing %s %5zu MiB sub-ranges  %-30s %9.2f us per 2 MiB\n", name,
                sub >> 20, "unmap", unmap / per_2m);
  }
  d.cuMemAddressFree(base, bytes);
  return Ok(d, d.cuMemRelease(h), "cuMemRelease") && ok;
}

int Run(size_t bytes) {
  std::unique_ptr<CudaDriver> driver;
  const Status loaded = CudaDriver::Load(&driver);
  if (!loaded.ok()) {
    std::printf("%s\n", loaded.ToString().c_str());
    return 1;
  }
  const CudaDriver& d = *driver;
  cu::CUdevice device = 0;
  cu::CUcontext context = nullptr;
  char gpu[256] = "";
  if (!Ok(d, d.cuInit(0), "cuInit") || !Ok(d, d.cuDeviceGet(&device, 0), "cuDeviceGet") ||
      !Ok(d, d.cuDeviceGetName(gpu, sizeof(gpu), device), "cuDeviceGetName") ||
      !Ok(d, d.cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain")) {
    return 1;
  }
  std::printf("driver_timing on %s through %s\n", gpu, d.library().c_str());
  bool ok;
  {
    ScopedCudaContext scope(d, context);
    // Host memory where LMS makes it (Note [Where host memory is made]):
    // the GPU's NUMA node if the driver takes it, else HOST.
    int node = -1;
    d.cuDeviceGetAttribute(&node, cu::CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, device);
    const cu::CUmemAllocationProp numa =
        Prop({cu::CU_MEM_LOCATION_TYPE_HOST_NUMA, node < 0 ? 0 : node});
    cu::CUmemGenericAllocationHandle probe = 0;
    size_t granule = 0;
    const bool host_numa =
        d.cuMemGetAllocationGranularity(&granule, &numa, cu::CU_MEM_ALLOC_GRANULARITY_MINIMUM) ==
            cu::CUDA_SUCCESS &&
        d.cuMemCreate(&probe, granule, &numa, 0) == cu::CUDA_SUCCESS;
    if (host_numa) d.cuMemRelease(probe);
    std::printf("driver_timing host memory at %s\n",
                host_numa ? ("HOST_NUMA node " + std::to_string(numa.location.id)).c_str()
                          : "HOST");
    const cu::CUmemLocation host =
        host_numa ? numa.location : cu::CUmemLocation{cu::CU_MEM_LOCATION_TYPE_HOST, 0};
    ok = scope.status().ok();
    // The granule LMS maps (2 MiB), then handles 16 times larger: what a
    // mapping costs per call, and what per byte.
    for (size_t handle : {size_t{2} << 20, size_t{32} << 20}) {
      Range on_device{"device"}, on_host{"host"};
      ok = ok && TimeRange(d, {cu::CU_MEM_LOCATION_TYPE_DEVICE, device}, device, handle, bytes,
                           &on_device) &&
           TimeRange(d, host, device, handle, bytes, &on_host) &&
           (handle != (size_t{2} << 20) || CopyTimed(d, on_device, on_host)) &&
           UnmapTimed(d, on_device) && UnmapTimed(d, on_host);
    }
    ok = ok &&
         SubRangesTimed(d, {cu::CU_MEM_LOCATION_TYPE_DEVICE, device}, "device", device, bytes) &&
         SubRangesTimed(d, host, "host", device, bytes);
  }
  d.cuDevicePrimaryCtxRelease(device);
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace lms

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1024;
  if (mib == 0 || mib % 32 != 0) {
    std::printf("usage: driver_timing [MiB, a multiple of 32; default 1024]\n");
    return 2;
  }
  return lms::Run(mib << 20);
}
