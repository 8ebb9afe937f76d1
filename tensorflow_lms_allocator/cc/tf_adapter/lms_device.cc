#include "tf_adapter/lms_device.h"

#include <exception>
#include <new>
#include <utility>

namespace lms {

Status LmsDevice::Create(const LmsDeviceSpec& spec, std::unique_ptr<LmsDevice>* out) {
  try {
    std::unique_ptr<Backend> backend;
    LMS_RETURN_IF_ERROR(CreateBackend(spec.backend, &backend));
    EngineOptions options;
    options.device_bytes = spec.device_bytes;
    options.host_bytes = spec.host_bytes;
    options.lms_enabled = spec.lms_enabled;
    options.defrag_enabled = spec.defrag_enabled;
    options.strict = spec.strict;
    std::unique_ptr<Engine> engine;
    LMS_RETURN_IF_ERROR(Engine::Create(options, std::move(backend), &engine));
    std::unique_ptr<LmsDevice> device(new LmsDevice());
    device->pins_ = std::make_unique<KernelPins>(engine.get());
    device->allocator_ =
        std::make_unique<LmsAllocator>(spec.name, std::move(engine), device->pins_.get());
    *out = std::move(device);
    return Status::Ok();
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("out of memory for the LMS device's tables");
  } catch (const std::exception& e) {
    return Internal(e.what());
  }
}

}  // namespace lms
