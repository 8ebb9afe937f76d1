#include "patch/patched_tensorflow.h"

#include <string>

#include "engine/status.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tf_adapter/gpu_devices.h"
#include "tf_adapter/lms_allocator.h"
#include "tf_adapter/overlay.h"
#include "tsl/platform/logging.h"

namespace lms {
namespace {

void ContextCreated(tensorflow::OpKernelContext* context,
                    tensorflow::OpKernelContext::Params* params) {
  Overlay::Get().OnContextCreated(context, params);
}

void ContextDestroyed(tensorflow::OpKernelContext* context) {
  Overlay::Get().OnContextDestroyed(context);
}

const tensorflow::OpKernelContextObserver kContextObserver = {ContextCreated,
                                                              ContextDestroyed};

// The settings' verdict, read once (Configure fixes them for the process).
const Status& Configured() {
  static const Status* status = new Status(Overlay::Get().Configure());
  return *status;
}

}  // namespace

tsl::Allocator* LmsGpuAllocatorOrNull(const tensorflow::GPUOptions& options,
                                      int tf_device_id, size_t total_bytes,
                                      const std::vector<tsl::TfDeviceId>& peer_gpu_ids) {
  const Status& configured = Configured();
  if (!configured.ok()) {
    // The process set TF_LMS_* variables, so it meant to use LMS.
    static UnavailableDeviceAllocator* unavailable = [&configured] {
      LOG(ERROR) << "LMS: " << configured.ToString()
                 << "; every allocation on a GPU fails until the setting is corrected";
      return new UnavailableDeviceAllocator("GPU_lms", configured.ToString());
    }();
    return unavailable;
  }
  void* lms =
      Overlay::Get().GpuAllocatorIfEnabled(&options, tf_device_id, total_bytes, &peer_gpu_ids);
  if (lms == nullptr) return nullptr;
  // Before TensorFlow runs a kernel with this allocator (it has none yet).
  tensorflow::SetOpKernelContextObserver(&kContextObserver);
  return static_cast<tsl::Allocator*>(lms);
}

void PinnedCopyGpuTensorToCpu(GpuToCpuFn unpinned, tensorflow::Device* gpu_device,
                              const tensorflow::DeviceContext* device_context,
                              const tensorflow::Tensor* gpu_tensor,
                              tensorflow::Tensor* cpu_tensor, tensorflow::StatusCallback done) {
  CopyGpuTensorToCpu(Overlay::Get().devices(), unpinned, gpu_device, device_context,
                     gpu_tensor, cpu_tensor, std::move(done));
}

void PinnedCopyCpuTensorToGpu(CpuToGpuFn unpinned, const tensorflow::Tensor* cpu_tensor,
                              const tensorflow::DeviceContext* device_context,
                              tensorflow::Device* gpu_device, tensorflow::Tensor* gpu_tensor,
                              tensorflow::StatusCallback done, bool sync_dst_compute) {
  CopyCpuTensorToGpu(Overlay::Get().devices(), unpinned, cpu_tensor, device_context,
                     gpu_device, gpu_tensor, std::move(done), sync_dst_compute);
}

void PinnedCopyGpuTensorToSameGpu(SameGpuFn unpinned, tensorflow::Device* gpu_device,
                                  const tensorflow::DeviceContext* device_context,
                                  const tensorflow::Tensor* src_gpu_tensor,
                                  tensorflow::Tensor* dst_gpu_tensor,
                                  tensorflow::StatusCallback done) {
  CopyGpuTensorToSameGpu(Overlay::Get().devices(), unpinned, gpu_device, device_context,
                         src_gpu_tensor, dst_gpu_tensor, std::move(done));
}

void PinnedDeviceToDeviceCopy(DeviceToDeviceFn unpinned,
                              tensorflow::DeviceContext* send_dev_context,
                              tensorflow::DeviceContext* recv_dev_context,
                              tensorflow::Device* src, tensorflow::Device* dst,
                              tsl::AllocatorAttributes src_alloc_attr,
                              tsl::AllocatorAttributes dst_alloc_attr,
                              const tensorflow::Tensor* input, tensorflow::Tensor* output,
                              int dev_to_dev_stream_index, tensorflow::StatusCallback done) {
  DeviceToDeviceCopy(Overlay::Get().devices(), unpinned, send_dev_context, recv_dev_context,
                     src, dst, src_alloc_attr, dst_alloc_attr, input, output,
                     dev_to_dev_stream_index, std::move(done));
}

}  // namespace lms
