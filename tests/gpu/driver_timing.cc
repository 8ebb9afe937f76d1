// Microseconds per granule of each CUDA virtual-memory call LMS makes for a
// remap (cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease),
// on device memory and on host-located memory, through the backend's own
// driver table (CudaDriver: libcuda.so.1, or TF_LMS_CUDA_DRIVER_PATH's fake).
// Part of `make gpu-check-engine` (tests/gpu/gpu_check_engine.sh).
//
// Usage: driver_timing [granules]   (default 512: 1 GiB of 2 MiB granules)
// Prints one line per location and call; exits 1 if a call fails.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
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

// Times each call over `count` granules of `location`, mapped at one
// reserved range that `device` reads and writes. False if a call failed.
bool TimeLocation(const CudaDriver& d, const char* name, cu::CUmemLocation location,
                  cu::CUdevice device, size_t count) {
  const cu::CUmemAllocationProp prop = Prop(location);
  size_t granule = 0;
  if (!Ok(d, d.cuMemGetAllocationGranularity(&granule, &prop,
                                             cu::CU_MEM_ALLOC_GRANULARITY_MINIMUM),
          "cuMemGetAllocationGranularity")) {
    return false;
  }
  std::vector<cu::CUmemGenericAllocationHandle> handles(count);
  cu::CUdeviceptr base = 0;
  const cu::CUmemAccessDesc rw{{cu::CU_MEM_LOCATION_TYPE_DEVICE, device},
                               cu::CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  auto per = [count](Clock::time_point start) { return MicrosSince(start) / count; };
  auto row = [&](const char* call, double us) {
    std::printf("driver_timing %-5s %-34s %9.2f us/granule (%zu granules of %zu KiB)\n", name,
                call, us, count, granule >> 10);
  };
  Clock::time_point t = Clock::now();
  for (auto& h : handles) {
    if (!Ok(d, d.cuMemCreate(&h, granule, &prop, 0), "cuMemCreate")) return false;
  }
  row("cuMemCreate", per(t));
  if (!Ok(d, d.cuMemAddressReserve(&base, count * granule, granule, 0, 0),
          "cuMemAddressReserve")) {
    return false;
  }
  t = Clock::now();
  for (size_t i = 0; i < count; ++i) {
    if (!Ok(d, d.cuMemMap(base + i * granule, granule, 0, handles[i], 0), "cuMemMap")) {
      return false;
    }
  }
  row("cuMemMap", per(t));
  t = Clock::now();
  for (size_t i = 0; i < count; ++i) {
    if (!Ok(d, d.cuMemSetAccess(base + i * granule, granule, &rw, 1), "cuMemSetAccess")) {
      return false;
    }
  }
  row("cuMemSetAccess, one call a granule", per(t));
  t = Clock::now();
  if (!Ok(d, d.cuMemSetAccess(base, count * granule, &rw, 1), "cuMemSetAccess of the run")) {
    return false;
  }
  row("cuMemSetAccess, one call the run", per(t));
  t = Clock::now();
  for (size_t i = 0; i < count; ++i) {
    if (!Ok(d, d.cuMemUnmap(base + i * granule, granule), "cuMemUnmap")) return false;
  }
  row("cuMemUnmap", per(t));
  t = Clock::now();
  for (auto h : handles) {
    if (!Ok(d, d.cuMemRelease(h), "cuMemRelease")) return false;
  }
  row("cuMemRelease", per(t));
  return Ok(d, d.cuMemAddressFree(base, count * granule), "cuMemAddressFree");
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
    ok = scope.status().ok() &&
         TimeLocation(d, "device", {cu::CU_MEM_LOCATION_TYPE_DEVICE, device}, device, count);
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
    ok = ok && TimeLocation(d, "host",
                            host_numa ? numa.location
                                      : cu::CUmemLocation{cu::CU_MEM_LOCATION_TYPE_HOST, 0},
                            device, count);
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
