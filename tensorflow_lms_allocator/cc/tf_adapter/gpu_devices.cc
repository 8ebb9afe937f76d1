#include "tf_adapter/gpu_devices.h"

#include "engine/env_options.h"
#include "tensorflow/core/common_runtime/gpu/gpu_id_manager.h"
#include "tensorflow/core/protobuf/config.pb.h"

namespace lms {

std::string GpuDeviceName(int tf_device_id) {
  return "GPU:" + std::to_string(tf_device_id);
}

Status GpuDeviceSpec(const Settings& settings, const void* gpu_options, int tf_device_id,
                     size_t total_bytes, LmsDeviceSpec* spec) {
  const std::string name = GpuDeviceName(tf_device_id);
  if (settings.strict) {
    // Strict mode maps evicted memory with no access so that an unpinned
    // touch faults; on a GPU that fault is an illegal address that kills the
    // CUDA context, and every later call of the process fails.
    return FailedPrecondition(
        "TF_LMS_STRICT=1 is for the emulated device (TF_LMS_CPU_DEVICE_MEMORY_MB) "
        "only: on " + name + " an unpinned touch would kill the CUDA context; unset "
        "TF_LMS_STRICT, or hide the GPUs (CUDA_VISIBLE_DEVICES=) to run strict mode on "
        "the emulated device");
  }
  tsl::PlatformDeviceId platform_id;
  const absl::Status found =
      tensorflow::GpuIdManager::TfToPlatformDeviceId(tsl::TfDeviceId(tf_device_id),
                                                     &platform_id);
  if (!found.ok()) {
    return NotFound("TensorFlow has no CUDA device for " + name + ": " +
                    std::string(found.message()));
  }
  const auto* options = static_cast<const tensorflow::GPUOptions*>(gpu_options);
  bool allow_growth = options != nullptr && options->allow_growth();
  bool present = false;
  bool forced = false;
  // TensorFlow reads TF_FORCE_GPU_ALLOW_GROWTH as "true"/"false"; a value it
  // rejects was already reported by TensorFlow, so only a valid one counts.
  if (FlagFromEnv("TF_FORCE_GPU_ALLOW_GROWTH", &present, &forced).ok() && present) {
    allow_growth = forced;
  }
  spec->name = name + "_lms";
  spec->backend.kind = BackendKind::kCuda;
  spec->backend.device_ordinal = platform_id.value();
  spec->backend.allow_growth = allow_growth;
  spec->device_bytes = total_bytes;
  spec->host_bytes = settings.host_bytes;
  spec->lms_enabled = settings.lms_enabled;
  spec->defrag_enabled = settings.defrag_enabled;
  spec->strict = false;
  return Status::Ok();
}

}  // namespace lms
