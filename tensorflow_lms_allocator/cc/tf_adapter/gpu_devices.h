// What an LMS device on a GPU is made from: TensorFlow's view of the GPU
// (its id, the memory it budgeted, its GPUOptions) turned into an
// LmsDeviceSpec over the CUDA backend.
//
// TensorFlow's device memory settings are honoured because TensorFlow has
// already applied them when it asks for the allocator:
//   - memory_limit of logical devices and per_process_gpu_memory_fraction
//     decide `total_bytes`, the device's budget (rounded down to whole
//     granules by the backend);
//   - visible_device_list and CUDA_VISIBLE_DEVICES decide the TfDeviceId ->
//     platform id mapping (GpuIdManager), and the platform id is the CUDA
//     device ordinal;
//   - allow_growth (or TF_FORCE_GPU_ALLOW_GROWTH) asks the backend to create
//     device memory as it is first used rather than all at once.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_GPU_DEVICES_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_GPU_DEVICES_H_

#include <cstddef>
#include <string>

#include "engine/status.h"
#include "tf_adapter/lms_device.h"
#include "tf_adapter/settings.h"

namespace lms {

// LMS's fields of GPUOptions.Experimental, as the source patch adds them to
// config.proto: `bool lms_enabled = 20; bool lms_defrag_enabled = 21;`.
// Read by field number: through reflection where TensorFlow's descriptor has
// them (a TensorFlow built with the patch), from the message's unknown fields
// where it does not (the stock wheel, whose C++ runtime keeps the fields of
// a ConfigProto that Python serialized with them: tensorflow_lms_allocator
// extends Python's descriptor, overlay/config_proto.py). proto3 serializes only
// true, so each is "asked for" or "not said": never a request to turn off.
inline constexpr int kLmsEnabledField = 20;
inline constexpr int kLmsDefragEnabledField = 21;
struct LmsGpuOptions {
  bool lms_enabled = false;
  bool lms_defrag_enabled = false;
};
// `gpu_options` is a const tensorflow::GPUOptions*, or null.
LmsGpuOptions ReadLmsGpuOptions(const void* gpu_options);

// "GPU:<tf_device_id>", the name statistics and messages use.
std::string GpuDeviceName(int tf_device_id);

// The engine options of a GPU's LMS device: the settings', with LMS and
// defragmentation also on where its GPUOptions turn them on
// (ReadLmsGpuOptions, read here and nowhere else). device_bytes is left to
// GpuDeviceSpec (TensorFlow's budget for the GPU).
EngineOptions GpuEngineOptions(const Settings& settings, const void* gpu_options);

// The spec of GPU `tf_device_id`'s LMS device with `engine`
// (GpuEngineOptions) and a budget of `total_bytes`. `gpu_options` is
// TensorFlow's const GPUOptions* for the device (for allow_growth).
// kFailedPrecondition where LMS cannot serve a GPU with these options
// (strict mode), kNotFound if TensorFlow has no platform id for the device.
// `peer_gpu_ids` (const std::vector<tsl::TfDeviceId>*, or null) are the GPUs
// TensorFlow enabled peer access with: each is granted access to the
// device's memory (Note [Access to mapped memory] in cuda_backend.h).
// TensorFlow names every other GPU it creates, so the device's host pool is
// `engine.host_bytes` (TF_GPU_HOST_MEM_LIMIT_IN_MB) split among them all:
// HostShareBytes of it for peers + 1 GPUs in whole `granule_bytes`
// (TF_LMS_GRANULE_MB; engine.host_limit_bytes and host_limit_devices say
// so).
Status GpuDeviceSpec(const EngineOptions& engine, bool prefetch, size_t granule_bytes,
                     const void* gpu_options,
                     int tf_device_id, size_t total_bytes, const void* peer_gpu_ids,
                     LmsDeviceSpec* spec);

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_GPU_DEVICES_H_
