#include "overlay/hooks.h"

#include <dlfcn.h>

#include <utility>

#include "interposer/lms_hooks.h"
#include "tf_adapter/outside_kernel.h"
#include "tf_adapter/runtime.h"
#include "tf_adapter/tensorflow_copies.h"

namespace lms {
namespace {

void* CpuAllocatorHook(void* original, int /*numa_node*/) {
  return Runtime::Get().CpuAllocator(original);
}

void* GpuAllocatorHook(void* original, void* self, const void* options, int tf_device_id,
                       size_t total_bytes, const void* peer_gpu_ids) {
  return Runtime::Get().GpuAllocator(original, self, options, tf_device_id, total_bytes,
                                     peer_gpu_ids);
}

void ContextCreatedHook(void* context, void* params) {
  Runtime::Get().OnContextCreated(context, params);
}

void ContextDestroyedHook(void* context) { Runtime::Get().OnContextDestroyed(context); }

// The interposer passes GPUUtil's arguments as void* (it is C) and `done`,
// a StatusCallback passed by invisible reference, as its address: the copies
// take it from there.
using tensorflow::Device;
using tensorflow::DeviceContext;
using tensorflow::StatusCallback;
using tensorflow::Tensor;

StatusCallback TakeCallback(void* done) {
  return std::move(*static_cast<StatusCallback*>(done));
}

void CopyGpuToCpuHook(void* original, void* gpu_device, const void* device_context,
                      const void* gpu_tensor, void* cpu_tensor, void* done) {
  PinnedCopyGpuTensorToCpu(reinterpret_cast<GpuToCpuFn>(original),
                           static_cast<Device*>(gpu_device),
                           static_cast<const DeviceContext*>(device_context),
                           static_cast<const Tensor*>(gpu_tensor),
                           static_cast<Tensor*>(cpu_tensor), TakeCallback(done));
}

void CopyCpuToGpuHook(void* original, const void* cpu_tensor, const void* device_context,
                      void* gpu_device, void* gpu_tensor, void* done, int sync_dst_compute) {
  PinnedCopyCpuTensorToGpu(reinterpret_cast<CpuToGpuFn>(original),
                           static_cast<const Tensor*>(cpu_tensor),
                           static_cast<const DeviceContext*>(device_context),
                           static_cast<Device*>(gpu_device), static_cast<Tensor*>(gpu_tensor),
                           TakeCallback(done), sync_dst_compute != 0);
}

void CopyGpuToSameGpuHook(void* original, void* gpu_device, const void* device_context,
                          const void* src_tensor, void* dst_tensor, void* done) {
  PinnedCopyGpuTensorToSameGpu(reinterpret_cast<SameGpuFn>(original),
                               static_cast<Device*>(gpu_device),
                               static_cast<const DeviceContext*>(device_context),
                               static_cast<const Tensor*>(src_tensor),
                               static_cast<Tensor*>(dst_tensor), TakeCallback(done));
}

void CopyDeviceToDeviceHook(void* original, void* send_device_context,
                            void* recv_device_context, void* src_device, void* dst_device,
                            unsigned long long src_attributes,
                            unsigned long long dst_attributes, const void* input,
                            void* output, int stream_index, void* done) {
  PinnedDeviceToDeviceCopy(reinterpret_cast<DeviceToDeviceFn>(original),
                           static_cast<DeviceContext*>(send_device_context),
                           static_cast<DeviceContext*>(recv_device_context),
                           static_cast<Device*>(src_device), static_cast<Device*>(dst_device),
                           AllocatorAttributesFromBits(src_attributes),
                           AllocatorAttributesFromBits(dst_attributes),
                           static_cast<const Tensor*>(input), static_cast<Tensor*>(output),
                           stream_index, TakeCallback(done));
}

const TfLmsHooks kHooks = {ContextCreatedHook,     ContextDestroyedHook,
                           CpuAllocatorHook,       GpuAllocatorHook,
                           MakeTensorFromProtoHook, CopyGpuToCpuHook,
                           CopyCpuToGpuHook,       CopyGpuToSameGpuHook,
                           CopyDeviceToDeviceHook};

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
