#include "tf_adapter/hooks.h"

#include <dlfcn.h>

#include "interposer/lms_hooks.h"
#include "tf_adapter/outside_kernel.h"
#include "tf_adapter/overlay.h"

namespace lms {
namespace {

void* CpuAllocatorHook(void* original, int /*numa_node*/) {
  return Overlay::Get().CpuAllocator(original);
}

void* GpuAllocatorHook(void* original, void* self, const void* options, int tf_device_id,
                       size_t total_bytes, const void* peer_gpu_ids) {
  return Overlay::Get().GpuAllocator(original, self, options, tf_device_id, total_bytes,
                                     peer_gpu_ids);
}

void ContextCreatedHook(void* context, void* params) {
  LmsDevice* device = Overlay::Get().router().ForParams(params);
  if (device != nullptr) device->pins()->OnContextCreated(context, params);
}

void ContextDestroyedHook(void* context) {
  // Only the pins that recorded the context act on it.
  Overlay::Get().router().ForEach(
      [context](LmsDevice* device) { device->pins()->OnContextDestroyed(context); });
}

const TfLmsHooks kHooks = {ContextCreatedHook, ContextDestroyedHook, CpuAllocatorHook,
                           GpuAllocatorHook, MakeTensorFromProtoHook};

}  // namespace

Status RegisterOverlayHooks() {
  // Looked up, not linked: the adapter must load (and fail with this
  // message) even where the interposer is missing.
  auto* reg = reinterpret_cast<int (*)(const TfLmsHooks*)>(
      dlsym(RTLD_DEFAULT, "tf_lms_register_hooks"));
  if (reg == nullptr || reg(&kHooks) != 0) {
    return FailedPrecondition("the LMS interposer is not loaded in the global scope");
  }
  return Status::Ok();
}

}  // namespace lms
