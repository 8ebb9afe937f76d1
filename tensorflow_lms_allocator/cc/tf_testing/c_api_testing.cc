#include "tf_testing/c_api_testing.h"

#include <string>
#include <vector>

#include "tensorflow/core/common_runtime/gpu/gpu_id_manager.h"
#include "tensorflow/core/protobuf/config.pb.h"
#include "tf_adapter/gpu_devices.h"
#include "tf_adapter/runtime.h"

namespace {

// The budgets tf_lms_test_gpu_allocator's stand-in for TensorFlow's
// GetGPUAllocator was asked for, in order (test-only; one thread).
std::vector<size_t> g_tensorflow_gpu_allocator_budgets;
// tf_lms_test_set_gpu_count's count (test-only; one thread).
int g_gpu_count = 0;

}  // namespace

extern "C" {

void tf_lms_test_set_gpu_count(int count) { g_gpu_count = count; }

int tf_lms_test_allocate_raw(const char* device, size_t alignment, size_t num_bytes,
                             int retry_on_failure, void** ptr, char* message,
                             size_t message_len) {
  lms::Status status;
  lms::LmsDevice* lms_device =
      lms::Runtime::Get().DeviceNamed(device != nullptr ? device : "", &status);
  *ptr = nullptr;
  if (lms_device == nullptr) return lms::ReportToC(status, message, message_len);
  lms::LmsAllocator* allocator = lms_device->allocator();
  tsl::AllocationAttributes attributes;
  attributes.retry_on_failure = retry_on_failure != 0;
  *ptr = allocator->AllocateRaw(alignment, num_bytes, attributes);
  if (*ptr == nullptr) {
    return lms::FailToC(TF_LMS_RESOURCE_EXHAUSTED, allocator->Name(), message, message_len);
  }
  return TF_LMS_OK;
}

int tf_lms_test_set_learned_order(const char* device, int on, char* message,
                                  size_t message_len) {
  lms::Status status;
  lms::LmsDevice* lms_device =
      lms::Runtime::Get().DeviceNamed(device != nullptr ? device : "", &status);
  if (lms_device != nullptr) status = lms_device->allocator()->engine().SetLearnedOrder(on != 0);
  return lms::ReportToC(status, message, message_len);
}

int tf_lms_test_allocation_sizes(const char* device, const void* ptr, size_t* requested,
                                 size_t* allocated) {
  lms::Status status;
  lms::LmsDevice* lms_device =
      lms::Runtime::Get().DeviceNamed(device != nullptr ? device : "", &status);
  if (lms_device == nullptr) return lms::ReportToC(status, nullptr, 0);
  *requested = lms_device->allocator()->RequestedSize(ptr);
  *allocated = lms_device->allocator()->AllocatedSize(ptr);
  return TF_LMS_OK;
}

int tf_lms_test_deallocate_raw(const char* device, void* ptr) {
  lms::Status status;
  lms::LmsDevice* lms_device =
      lms::Runtime::Get().DeviceNamed(device != nullptr ? device : "", &status);
  if (lms_device == nullptr) return lms::ReportToC(status, nullptr, 0);
  lms_device->allocator()->DeallocateRaw(ptr);
  return TF_LMS_OK;
}

int tf_lms_test_tensorflow_bytes_limit(const char* device, int64_t* bytes_limit) {
  lms::Status status;
  lms::LmsDevice* lms_device =
      lms::Runtime::Get().DeviceNamed(device != nullptr ? device : "", &status);
  if (lms_device == nullptr) return lms::ReportToC(status, nullptr, 0);
  const std::optional<tsl::AllocatorStats> stats = lms_device->allocator()->GetStats();
  *bytes_limit = stats && stats->bytes_limit ? *stats->bytes_limit : 0;
  return TF_LMS_OK;
}

int tf_lms_test_gpu_allocator(int tf_device_id, size_t total_bytes, const void* gpu_options,
                              size_t gpu_options_len, char* message, size_t message_len) {
  tensorflow::GPUOptions options;
  if (gpu_options_len > 0 &&
      !options.ParseFromArray(gpu_options, static_cast<int>(gpu_options_len))) {
    return lms::FailToC(TF_LMS_INVALID_ARGUMENT, "the GPUOptions do not parse", message,
                     message_len);
  }
  // The other GPUs of tf_lms_test_set_gpu_count, named as TensorFlow's GPU
  // device factory names them (every other one).
  std::vector<tsl::TfDeviceId> peers;
  for (int id = 0; id < g_gpu_count; ++id) {
    if (id != tf_device_id) peers.push_back(tsl::TfDeviceId(id));
  }
  // As that factory would have: TfDeviceId n is CUDA device n, for this GPU
  // and its peers.
  std::vector<tsl::TfDeviceId> mapped = peers;
  mapped.push_back(tsl::TfDeviceId(tf_device_id));
  for (tsl::TfDeviceId id : mapped) {
    tsl::PlatformDeviceId platform_id;
    if (!tensorflow::GpuIdManager::TfToPlatformDeviceId(id, &platform_id).ok()) {
      (void)tensorflow::GpuIdManager::InsertTfPlatformDeviceIdPair(
          id, tsl::PlatformDeviceId(id.value()));
    }
  }
  // Stands in for TensorFlow's GetGPUAllocator, which needs a GPU: makes no
  // allocator and records the budget it was asked for.
  auto no_tensorflow_allocator = [](void*, const void*, int, size_t budget,
                                    const void*) -> void* {
    g_tensorflow_gpu_allocator_budgets.push_back(budget);
    return nullptr;
  };
  void* allocator = lms::Runtime::Get().GpuAllocator(
      reinterpret_cast<void*>(+no_tensorflow_allocator), nullptr, &options, tf_device_id,
      total_bytes, g_gpu_count > 0 ? &peers : nullptr);
  if (allocator == nullptr) {
    return lms::FailToC(TF_LMS_FAILED_PRECONDITION,
                     "LMS is not enabled: TensorFlow's own allocator would serve the GPU",
                     message, message_len);
  }
  lms::Status status;
  if (lms::Runtime::Get().DeviceNamed(lms::GpuDeviceName(tf_device_id), &status) ==
      nullptr) {
    return lms::ReportToC(status, message, message_len);
  }
  return TF_LMS_OK;
}

int tf_lms_test_map_gpu(int tf_device_id, int platform_device_id, char* message,
                        size_t message_len) {
  const absl::Status s = tensorflow::GpuIdManager::InsertTfPlatformDeviceIdPair(
      tsl::TfDeviceId(tf_device_id), tsl::PlatformDeviceId(platform_device_id));
  if (s.ok()) return TF_LMS_OK;
  return lms::FailToC(TF_LMS_FAILED_PRECONDITION, std::string(s.message()), message,
                      message_len);
}

int tf_lms_test_tensorflow_gpu_allocator_budgets(size_t* out, int max) {
  const auto& budgets = g_tensorflow_gpu_allocator_budgets;
  for (int i = 0; i < max && i < static_cast<int>(budgets.size()); ++i) out[i] = budgets[i];
  return static_cast<int>(budgets.size());
}

int tf_lms_kernel_contexts(int64_t* out) {
  lms::Status status;
  lms::LmsDevice* device = lms::Runtime::Get().DeviceNamed("CPU:0", &status);
  if (device == nullptr) return 1;
  out[0] = device->pins()->LiveContexts();
  out[1] = device->pins()->ThreadLiveContexts();
  return 0;
}

int tf_lms_turns(int64_t* out) {
  lms::Status status;
  lms::LmsDevice* device = lms::Runtime::Get().DeviceNamed("CPU:0", &status);
  if (device == nullptr) return 1;
  out[0] = device->pins()->NumWaits();
  out[1] = device->pins()->NumDeadlocks();
  return 0;
}

}  // extern "C"
