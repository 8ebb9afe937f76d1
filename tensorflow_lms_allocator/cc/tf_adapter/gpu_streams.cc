#include "tf_adapter/gpu_streams.h"

#include <algorithm>

#include "tensorflow/core/common_runtime/gpu_device_context.h"
#include "xla/stream_executor/stream.h"

namespace lms {
namespace {

// A GPUDeviceContext has one to four device-to-device streams
// (GPUOptions.Experimental.num_dev_to_dev_copy_streams, at least 1), and
// device_to_device_stream(i) wraps around its list.
constexpr int kMaxDeviceToDeviceStreams = 4;

void AddStream(stream_executor::Stream* stream, std::vector<void*>* out) {
  if (stream == nullptr) return;
  void* handle = stream->platform_specific_handle().stream;
  if (handle != nullptr && std::find(out->begin(), out->end(), handle) == out->end()) {
    out->push_back(handle);
  }
}

}  // namespace

std::vector<void*> GpuDeviceContextStreams(void* device_context) {
  std::vector<void*> streams;
  auto* gpu = dynamic_cast<tensorflow::GPUDeviceContext*>(
      static_cast<tensorflow::DeviceContext*>(device_context));
  if (gpu == nullptr) return streams;
  AddStream(gpu->stream(), &streams);
  AddStream(gpu->host_to_device_stream(), &streams);
  AddStream(gpu->device_to_host_stream(), &streams);
  for (int i = 0; i < kMaxDeviceToDeviceStreams; ++i) {
    AddStream(gpu->device_to_device_stream(i), &streams);
  }
  return streams;
}

}  // namespace lms
