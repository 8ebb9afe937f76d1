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

void* GpuAllocatorHook(void* original, int tf_device_id) {
  return Overlay::Get().GpuAllocator(original, tf_device_id);
}

void ContextCreatedHook(void* context, void* params) {
  KernelPins* pins = Overlay::Get().active_pins();
  if (pins != nullptr) pins->OnContextCreated(context, params);
}

void ContextDestroyedHook(void* context) {
  KernelPins* pins = Overlay::Get().active_pins();
  if (pins != nullptr) pins->OnContextDestroyed(context);
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
