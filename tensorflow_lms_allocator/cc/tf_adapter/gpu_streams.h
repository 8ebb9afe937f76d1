// The CUDA streams of a TensorFlow GPU device context: the compute stream,
// host-to-device, device-to-host and device-to-device streams. Their queued
// work may touch LMS memory, so the CUDA backend fences them before it
// copies or unmaps (docs/design.md,
// "Facts about the GPU path").
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_GPU_STREAMS_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_GPU_STREAMS_H_

#include <vector>

namespace lms {

// The distinct CUstreams (as void*) of `device_context`, a
// tensorflow::DeviceContext*; empty if it is not a GPUDeviceContext.
std::vector<void*> GpuDeviceContextStreams(void* device_context);

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_GPU_STREAMS_H_
