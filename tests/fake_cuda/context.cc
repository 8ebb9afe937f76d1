#include "context.h"

#include <cstdio>
#include <cstring>

#include "entry_points.h"
#include "knobs.h"

namespace lms {
namespace cu {
namespace fake {
namespace {

std::atomic<bool> g_initialized{false};

// Never destroyed: a worker thread may still look at its context at exit.
Context* Contexts() {
  static Context* contexts = [] {
    Context* c = new Context[kMaxDevices];
    for (int i = 0; i < kMaxDevices; ++i) c[i].device = i;
    return c;
  }();
  return contexts;
}

thread_local Context* t_current = nullptr;
thread_local Context* t_executing = nullptr;

bool ValidDevice(CUdevice device) {
  return device >= 0 && device < GetKnobs().device_count.load();
}

Context* FromHandle(CUcontext handle) {
  Context* c = reinterpret_cast<Context*>(handle);
  for (int i = 0; i < kMaxDevices; ++i) {
    if (c == &Contexts()[i]) return c;
  }
  return nullptr;
}

}  // namespace

CUresult RequireInitialized() {
  return g_initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult RequireContext(Context** context) {
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (t_current == nullptr || t_current->refcount.load() <= 0) {
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  *context = t_current;
  return CUDA_SUCCESS;
}

void SetStickyError(Context* context, CUresult error) {
  CUresult expected = CUDA_SUCCESS;
  context->sticky_error.compare_exchange_strong(expected, error);
}

Context*& ExecutingContext() { return t_executing; }

Context* CurrentContextOrNull() { return t_current; }

void ResetContexts() {
  g_initialized = false;
  for (int i = 0; i < kMaxDevices; ++i) {
    Contexts()[i].refcount = 0;
    Contexts()[i].sticky_error = CUDA_SUCCESS;
  }
}

int RetainedContexts() {
  int n = 0;
  for (int i = 0; i < kMaxDevices; ++i) n += Contexts()[i].refcount > 0;
  return n;
}

CUresult cuInit(unsigned int flags) noexcept {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (GetKnobs().environment_error) return CUDA_ERROR_INVALID_VALUE;
  if (GetKnobs().device_count == 0) return CUDA_ERROR_NO_DEVICE;
  g_initialized = true;
  return CUDA_SUCCESS;
}

// Like the real driver, answers before cuInit.
CUresult cuDriverGetVersion(int* version) noexcept {
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = GetKnobs().driver_version;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) noexcept {
  if (CUresult r = RequireInitialized()) return r;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int* count) noexcept {
  if (CUresult r = RequireInitialized()) return r;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = GetKnobs().device_count;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice device) noexcept {
  if (CUresult r = RequireInitialized()) return r;
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<size_t>(len), "Fake CUDA Device %d", device);
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice device) noexcept {
  if (CUresult r = RequireInitialized()) return r;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  const Knobs& k = GetKnobs();
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
      *value = 1;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID:
      *value = 0;
      return CUDA_SUCCESS;
    // As on real drivers, an attribute newer than the driver is unknown
    // (CUDA_ERROR_INVALID_VALUE), not 0: 141 is known from 12.9 on, though
    // HOST_NUMA allocations work from 12.2 on; 145 and HOST ones from 13.0.
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
      if (k.driver_version < kHostNumaAttributeDriver) return CUDA_ERROR_INVALID_VALUE;
      *value = k.host_vmm_supported ? 1 : 0;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
      if (k.driver_version < kHostAttributeDriver) return CUDA_ERROR_INVALID_VALUE;
      *value = k.host_vmm_supported ? 1 : 0;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

// cuda.h, cuDeviceCanAccessPeer: *canAccessPeer is 1 if `dev` can directly
// access memory located on `peerDev`, else 0; CUDA_ERROR_INVALID_DEVICE for
// an ordinal that names no device. Needs cuInit, not a context. A device and
// itself answer 0, as real drivers answer (PyTorch's P2P cache fills in its
// diagonal rather than asking; not checked on a GPU here). The answer comes
// from FAKE_CUDA_NO_P2P / fake_cuda_set_peer_access (knobs.h).
CUresult cuDeviceCanAccessPeer(int* can_access_peer, CUdevice dev, CUdevice peer_dev) noexcept {
  if (CUresult r = RequireInitialized()) return r;
  if (can_access_peer == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(dev) || !ValidDevice(peer_dev)) return CUDA_ERROR_INVALID_DEVICE;
  *can_access_peer = CanAccessPeer(dev, peer_dev) ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice device) noexcept {
  if (CUresult r = RequireInitialized()) return r;
  if (context == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  Context* c = &Contexts()[device];
  c->refcount.fetch_add(1);
  *context = reinterpret_cast<CUcontext>(c);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice device) noexcept {
  if (CUresult r = RequireInitialized()) return r;
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  Context* c = &Contexts()[device];
  int count = c->refcount.load();
  do {
    if (count <= 0) return CUDA_ERROR_INVALID_CONTEXT;
  } while (!c->refcount.compare_exchange_weak(count, count - 1));
  // The last release destroys the primary context, and with it its error.
  if (count == 1) c->sticky_error = CUDA_SUCCESS;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext* context) noexcept {
  if (CUresult r = RequireInitialized()) return r;
  if (context == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *context = reinterpret_cast<CUcontext>(t_current);
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext context) noexcept {
  if (CUresult r = RequireInitialized()) return r;
  if (context == nullptr) {
    t_current = nullptr;
    return CUDA_SUCCESS;
  }
  Context* c = FromHandle(context);
  if (c == nullptr || c->refcount.load() <= 0) return CUDA_ERROR_INVALID_CONTEXT;
  t_current = c;
  return CUDA_SUCCESS;
}

}  // namespace fake
}  // namespace cu
}  // namespace lms
