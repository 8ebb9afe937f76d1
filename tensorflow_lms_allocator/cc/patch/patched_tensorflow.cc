#include "patch/patched_tensorflow.h"

#include <string>

#include "engine/status.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tf_adapter/gpu_devices.h"
#include "tf_adapter/lms_allocator.h"
#include "tf_adapter/runtime.h"
#include "tsl/platform/logging.h"

namespace lms {
namespace {

void ContextCreated(tensorflow::OpKernelContext* context,
                    tensorflow::OpKernelContext::Params* params) {
  Runtime::Get().OnContextCreated(context, params);
}

void ContextDestroyed(tensorflow::OpKernelContext* context) {
  Runtime::Get().OnContextDestroyed(context);
}

const tensorflow::OpKernelContextObserver kContextObserver = {ContextCreated,
                                                              ContextDestroyed};

// The settings' verdict, read once (Configure fixes them for the process).
const Status& Configured() {
  static const Status* status = new Status(Runtime::Get().Configure());
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
      Runtime::Get().GpuAllocatorIfEnabled(&options, tf_device_id, total_bytes, &peer_gpu_ids);
  if (lms == nullptr) return nullptr;
  // Before TensorFlow runs a kernel with this allocator (it has none yet).
  tensorflow::SetOpKernelContextObserver(&kContextObserver);
  return static_cast<tsl::Allocator*>(lms);
}

}  // namespace lms
