// The entry points of a TensorFlow built with the LMS patch series
// (patches/tensorflow_v2.21.0_large_model_support.patch): the patched
// GPUProcessState::GetGPUAllocator asks here first, and the patched GPUUtil
// copies run through here. Built only there (the series adds it to
// TensorFlow's tree; the runtime overlay reaches the same Runtime through the
// interposer instead, hooks.h), because it uses the OpKernelContext observer
// the series adds to tensorflow/core/framework/op_kernel.h.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_PATCH_PATCHED_TENSORFLOW_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_PATCH_PATCHED_TENSORFLOW_H_

#include <cstddef>
#include <vector>

#include "tensorflow/core/protobuf/config.pb.h"
#include "tf_adapter/tensorflow_copies.h"
#include "xla/tsl/framework/allocator.h"
#include "xla/tsl/framework/device_id.h"

namespace lms {

// GPU `tf_device_id`'s LMS allocator if LMS serves it, or null, and then
// TensorFlow's own allocator serves the GPU, untouched. LMS serves a GPU when
// `options.experimental().lms_enabled()` is set (by ConfigProto or
// tf.config.experimental.set_lms_enabled) or TF_LMS_ENABLED=1.
//
// The first call reads and checks the TF_LMS_* settings; if one is invalid,
// every GPU gets an allocator whose every allocation fails naming the
// setting (a TF_LMS_* variable was set, so the process meant to use LMS;
// TensorFlow's allocator would run the model without it). The first LMS allocator installs the
// OpKernelContext observer, so that kernels pin the tensors they use.
// `peer_gpu_ids` (GetGPUAllocator's) are granted access to the GPU's memory.
// Thread-safe.
tsl::Allocator* LmsGpuAllocatorOrNull(const tensorflow::GPUOptions& options,
                                      int tf_device_id, size_t total_bytes,
                                      const std::vector<tsl::TfDeviceId>& peer_gpu_ids);

// The patched GPUUtil copies call lms::PinnedCopyGpuTensorToCpu and the
// other three (tensorflow_copies.h) with their renamed bodies.

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_PATCH_PATCHED_TENSORFLOW_H_
