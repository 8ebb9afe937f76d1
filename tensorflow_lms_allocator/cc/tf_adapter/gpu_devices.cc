#include "tf_adapter/gpu_devices.h"

#include <utility>
#include <vector>

#include "engine/env_options.h"
#include "tensorflow/core/common_runtime/gpu/gpu_id_manager.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/unknown_field_set.h"
#include "tensorflow/core/protobuf/config.pb.h"

namespace lms {
namespace {

// The bool field `number` of `message`: known to its descriptor, or kept as
// an unknown varint (the last occurrence wins, as when parsing).
bool BoolField(const google::protobuf::Message& message, int number) {
  const google::protobuf::Reflection* reflection = message.GetReflection();
  const google::protobuf::FieldDescriptor* field =
      message.GetDescriptor()->FindFieldByNumber(number);
  if (field != nullptr) {
    return field->type() == google::protobuf::FieldDescriptor::TYPE_BOOL &&
           reflection->GetBool(message, field);
  }
  const google::protobuf::UnknownFieldSet& unknown = reflection->GetUnknownFields(message);
  bool value = false;
  for (int i = 0; i < unknown.field_count(); ++i) {
    const google::protobuf::UnknownField& f = unknown.field(i);
    if (f.number() == number && f.type() == google::protobuf::UnknownField::TYPE_VARINT) {
      value = f.varint() != 0;
    }
  }
  return value;
}

}  // namespace

LmsGpuOptions ReadLmsGpuOptions(const void* gpu_options) {
  LmsGpuOptions out;
  const auto* options = static_cast<const tensorflow::GPUOptions*>(gpu_options);
  if (options == nullptr || !options->has_experimental()) return out;
  out.lms_enabled = BoolField(options->experimental(), kLmsEnabledField);
  out.lms_defrag_enabled = BoolField(options->experimental(), kLmsDefragEnabledField);
  return out;
}

std::string GpuDeviceName(int tf_device_id) {
  return "GPU:" + std::to_string(tf_device_id);
}

EngineOptions GpuEngineOptions(const Settings& settings, const void* gpu_options) {
  EngineOptions engine = settings.engine;
  const LmsGpuOptions asked = ReadLmsGpuOptions(gpu_options);
  engine.lms_enabled = engine.lms_enabled || asked.lms_enabled;
  engine.defrag_enabled = engine.defrag_enabled || asked.lms_defrag_enabled;
  engine.device_bytes = 0;  // the emulated device's size is not a GPU's
  return engine;
}

Status GpuDeviceSpec(const EngineOptions& engine, bool prefetch, size_t granule_bytes,
                     const void* gpu_options,
                     int tf_device_id, size_t total_bytes, const void* peer_gpu_ids,
                     LmsDeviceSpec* spec) {
  const std::string name = GpuDeviceName(tf_device_id);
  if (engine.strict) {
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
  std::vector<int> peer_ordinals;
  if (peer_gpu_ids != nullptr) {
    for (tsl::TfDeviceId peer :
         *static_cast<const std::vector<tsl::TfDeviceId>*>(peer_gpu_ids)) {
      tsl::PlatformDeviceId peer_platform_id;
      const absl::Status known =
          tensorflow::GpuIdManager::TfToPlatformDeviceId(peer, &peer_platform_id);
      if (!known.ok()) {
        return NotFound("TensorFlow has no CUDA device for " + name + "'s peer " +
                        GpuDeviceName(peer.value()) + ": " + std::string(known.message()));
      }
      peer_ordinals.push_back(peer_platform_id.value());
    }
  }
  const auto* options = static_cast<const tensorflow::GPUOptions*>(gpu_options);
  bool allow_growth = options != nullptr && options->allow_growth();
  bool forced = false;
  if (ForcedGpuAllowGrowthFromEnv(&forced)) allow_growth = forced;
  spec->name = name + "_lms";
  spec->backend.kind = BackendKind::kCuda;
  spec->backend.device_ordinal = platform_id.value();
  spec->backend.allow_growth = allow_growth;
  spec->backend.peer_ordinals = std::move(peer_ordinals);
  spec->engine = engine;
  spec->engine.device_bytes = total_bytes;
  // TensorFlow names every other GPU it creates as a peer, so each GPU sees
  // the same count and the shares add up to the setting (Note in
  // pinned_host_budget.h), in whole granules of the setting's size (a
  // driver's larger granule rounds it down again in LmsDevice::Create).
  const size_t gpus = spec->backend.peer_ordinals.size() + 1;
  spec->backend.granule_bytes = granule_bytes;
  spec->engine.host_limit_bytes = engine.host_bytes;
  spec->engine.host_limit_devices = gpus;
  spec->engine.host_bytes = HostShareBytes(engine.host_bytes, gpus, granule_bytes);
  spec->prefetch = prefetch;
  return Status::Ok();
}

}  // namespace lms
