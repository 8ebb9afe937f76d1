// The entry point of a TensorFlow built with the LMS patch series
// (patches/v2.21.0/): the patched GPUProcessState::GetGPUAllocator asks here
// first. Built only there (the series adds it to TensorFlow's tree; the
// runtime overlay reaches the same Overlay through the interposer instead,
// hooks.h), because it uses the OpKernelContext observer the series adds to
// tensorflow/core/framework/op_kernel.h.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_PATCHED_TENSORFLOW_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_PATCHED_TENSORFLOW_H_

#include <cstddef>

#include "tensorflow/core/protobuf/config.pb.h"
#include "xla/tsl/framework/allocator.h"

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
// Thread-safe.
tsl::Allocator* LmsGpuAllocatorOrNull(const tensorflow::GPUOptions& options,
                                      int tf_device_id, size_t total_bytes);

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_PATCHED_TENSORFLOW_H_
