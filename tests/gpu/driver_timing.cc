// Microseconds per granule of each CUDA virtual-memory call LMS makes for a
// remap (cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease),
// on device memory and on host-located memory, and the bandwidth of a copy
// between the two (what evictions and page-ins copy), through the backend's
// own driver table (CudaDriver: libcuda.so.1, or TF_LMS_CUDA_DRIVER_PATH's fake).
// Part of `make gpu-check-engine` (tests/gpu/gpu_check_engine.sh).
//
// Usage: driver_timing [granules]   (default 512: 1 GiB of 2 MiB granules)
// Prints one line per location and call; exits 1 if a call fails.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
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

// `count` granules of one location, mapped at one reserved range.
struct Range {
  const char* name;
  size_t granule = 0;
  cu::CUdeviceptr base = 0;
  std::vector<cu::CUmemGenericAllocationHandle> handles;
};

void Row(const Range& r, const char* call, double us_per_granule) {
  std::printf("driver_timing %-5s %-34s %9.2f us/granule (%zu granules of %zu KiB)\n", r.name,
              call, us_per_granule, r.handles.size(), r.granule >> 10);
}

bool MapEach(const CudaDriver& d, const Range& r) {
  for (size_t i = 0; i < r.handles.size(); ++i) {
    if (!Ok(d, d.cuMemMap(r.base + i * r.granule, r.granule, 0, r.handles[i], 0),
            "cuMemMap")) {
      return false;
    }
  }
  return true;
}

// Creates, maps and grants `device` read/write to `count` granules of
// `location`, timing each call. False if a call failed.
bool MapTimed(const CudaDriver& d, cu::CUmemLocation location, cu::CUdevice device,
              size_t count, Range* r) {
  const cu::CUmemAllocationProp prop = Prop(location);
  if (!Ok(d, d.cuMemGetAllocationGranularity(&r->granule, &prop,
                                             cu::CU_MEM_ALLOC_GRANULARITY_MINIMUM),
          "cuMemGetAllocationGranularity")) {
    return false;
  }
  r->handles.resize(count);
  const size_t bytes = count * r->granule;
  const cu::CUmemAccessDesc rw{{cu::CU_MEM_LOCATION_TYPE_DEVICE, device},
                               cu::CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  Clock::time_point t = Clock::now();
  for (auto& h : r->handles) {
    if (!Ok(d, d.cuMemCreate(&h, r->granule, &prop, 0), "cuMemCreate")) return false;
  }
  Row(*r, "cuMemCreate", MicrosSince(t) / count);
  if (!Ok(d, d.cuMemAddressReserve(&r->base, bytes, r->granule, 0, 0), "cuMemAddressReserve")) {
    return false;
  }
  t = Clock::now();
  if (!MapEach(d, *r)) return false;
  Row(*r, "cuMemMap", MicrosSince(t) / count);
  t = Clock::now();
  for (size_t i = 0; i < count; ++i) {
    if (!Ok(d, d.cuMemSetAccess(r->base + i * r->granule, r->granule, &rw, 1),
            "cuMemSetAccess")) {
      return false;
    }
  }
  Row(*r, "cuMemSetAccess, one call a granule", MicrosSince(t) / count);
  t = Clock::now();
  if (!Ok(d, d.cuMemSetAccess(r->base, bytes, &rw, 1), "cuMemSetAccess of the run")) {
    return false;
  }
  Row(*r, "cuMemSetAccess, one call the run", MicrosSince(t) / count);
  return true;
}

// Unmaps granule by granule, maps again and unmaps the run in one call,
// releases: each timed. False if a call failed.
bool UnmapTimed(const CudaDriver& d, Range& r) {
  const size_t count = r.handles.size();
  Clock::time_point t = Clock::now();
  for (size_t i = 0; i < count; ++i) {
    if (!Ok(d, d.cuMemUnmap(r.base + i * r.granule, r.granule), "cuMemUnmap")) return false;
  }
  Row(r, "cuMemUnmap, one call a granule", MicrosSince(t) / count);
  if (!MapEach(d, r)) return false;
  t = Clock::now();
  if (!Ok(d, d.cuMemUnmap(r.base, count * r.granule), "cuMemUnmap of the run")) return false;
  Row(r, "cuMemUnmap, one call the run", MicrosSince(t) / count);
  t = Clock::now();
  for (auto h : r.handles) {
    if (!Ok(d, d.cuMemRelease(h), "cuMemRelease")) return false;
  }
  Row(r, "cuMemRelease", MicrosSince(t) / count);
  return Ok(d, d.cuMemAddressFree(r.base, count * r.granule), "cuMemAddressFree");
}

// GB/s of one cuMemcpyAsync of the whole range each way, best of 3: the
// copies an eviction and a page-in make, between device and host VMM memory.
bool CopyTimed(const CudaDriver& d, const Range& device, const Range& host) {
  const size_t bytes = std::min(device.handles.size() * device.granule,
                                host.handles.size() * host.granule);
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
    std::printf("driver_timing copy  %-34s %9.1f GB/s (%zu MiB, best of 3)\n", what, best,
                bytes >> 20);
  }
  d.cuStreamDestroy(stream);
  return ok;
}

int Run(size_t count) {
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
    Range on_device{"device"}, on_host{"host"};
    ok = scope.status().ok() &&
         MapTimed(d, {cu::CU_MEM_LOCATION_TYPE_DEVICE, device}, device, count, &on_device) &&
         MapTimed(d, host_numa ? numa.location : cu::CUmemLocation{cu::CU_MEM_LOCATION_TYPE_HOST, 0},
                  device, count, &on_host) &&
         CopyTimed(d, on_device, on_host) && UnmapTimed(d, on_device) && UnmapTimed(d, on_host);
  }
  d.cuDevicePrimaryCtxRelease(device);
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace lms

int main(int argc, char** argv) {
  const size_t count = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 512;
  if (count == 0) {
    std::printf("usage: driver_timing [granules > 0]\n");
    return 2;
  }
  return lms::Run(count);
}
