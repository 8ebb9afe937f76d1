#include "tf_adapter/lms_device.h"

#include <string>
#include <utility>

#include "backends/streaming_copy.h"

namespace lms {

Status LmsDevice::Create(const LmsDeviceSpec& spec, std::unique_ptr<LmsDevice>* out) {
  std::unique_ptr<Backend> backend;
  LMS_RETURN_IF_ERROR(CreateBackend(spec.backend, &backend));
  // A budget from TensorFlow (a GPU's memory_limit) is rarely whole
  // granules; the engine takes only whole ones.
  const size_t granule = backend->granule_bytes();
  EngineOptions options = spec.engine;
  options.device_bytes -= options.device_bytes % granule;
  options.host_bytes -= options.host_bytes % granule;
  if (options.device_bytes == 0) {
    return InvalidArgument(spec.name + ": a budget of " +
                           std::to_string(spec.engine.device_bytes) +
                           " bytes holds no whole granule of " +
                           std::to_string(granule) + " bytes");
  }
  std::unique_ptr<LmsDevice> device(new LmsDevice());
  device->backend_ = backend.get();
  device->spec_ = spec;
  device->spec_.engine = options;
  std::unique_ptr<Engine> engine;
  LMS_RETURN_IF_ERROR(Engine::Create(options, std::move(backend), &engine));
  device->pins_ = std::make_unique<KernelPins>(engine.get());
  device->allocator_ =
      std::make_unique<LmsAllocator>(spec.name, std::move(engine), device->pins_.get());
  if (options.policy == PolicyKind::kLearned && spec.prefetch && options.lms_enabled) {
    device->prefetcher_ = std::make_unique<Prefetcher>(&device->engine());
  }
  *out = std::move(device);
  return Status::Ok();
}

std::string LmsDevice::Describe(const std::string& device) const {
  const Engine& engine = allocator_->engine();
  const EngineOptions& options = spec_.engine;
  const std::string host_source =
      options.host_limit_devices > 1
          ? " (TF_GPU_HOST_MEM_LIMIT_IN_MB=" + std::to_string(options.host_limit_bytes >> 20) +
                " split among " + std::to_string(options.host_limit_devices) + " GPUs)"
          : " (TF_GPU_HOST_MEM_LIMIT_IN_MB)";
  std::string line = "tensorflow_lms_allocator: LMS serves " + device + " (" + spec_.name +
                     ", " + backend_->Name() + " backend): device memory " +
                     FormatBytes(options.device_bytes) + ", host memory for evicted tensors " +
                     FormatBytes(options.host_bytes) + host_source;
  if (spec_.backend.kind != BackendKind::kPosix && engine.lms_enabled() &&
      options.host_ahead_bytes > 0) {
    // Made at creation where the driver allows (Note [Host memory made ahead]).
    line += ", " + FormatBytes(static_cast<size_t>(engine.GetStatistics().host_bytes_made_ahead)) +
            " of it made ahead (TF_LMS_HOST_AHEAD_MB)";
  }
  line += std::string(", LMS ") + (engine.lms_enabled() ? "on" : "off");
  if (engine.lms_enabled()) {
    line += std::string(", policy ") + PolicyName(options.policy) +
            (prefetcher_ != nullptr ? " with prefetching" : "");
  }
  line += engine.defrag_enabled() ? ", defragmentation on" : ", defragmentation off";
  if (spec_.backend.kind == BackendKind::kPosix) {
    // Remaps cost 10-20x less with them (posix_backend.h): say which it is.
    switch (static_cast<const PosixBackend*>(backend_)->huge_pages()) {
      case HugePages::kAdvise: line += ", huge pages on (shmem_enabled)"; break;
      case HugePages::kCollapse: line += ", huge pages on (MADV_COLLAPSE)"; break;
      default: line += ", huge pages off"; break;
    }
    // Which copy is fastest depends on the machine (Note [Copy order]).
    line += std::string(", copies by ") + CopyMethodName(ChooseCopyMethod());
  }
  if (options.strict) line += ", strict mode (TF_LMS_STRICT)";
  if (engine.unmaps_evicted()) line += ", evicted tensors unmapped (TF_LMS_UNMAP_EVICTED)";
  return line;
}

Status LmsDevice::AddFencedQueues(const std::vector<void*>& queues) {
  for (void* queue : queues) LMS_RETURN_IF_ERROR(backend_->AddFencedQueue(queue));
  return Status::Ok();
}

}  // namespace lms
