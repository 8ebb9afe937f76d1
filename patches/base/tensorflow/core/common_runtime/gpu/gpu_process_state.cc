// APPROXIMATE EXCERPT, not TensorFlow v2.21.0's file (patches/README.md):
// three passages of tensorflow/core/common_runtime/gpu/gpu_process_state.cc
// in the mirror hexagon-geo-surv/tensorflow at
// b8289d9baac3f4e926e00e29ffc841ab502feffa (the include list, the start of
// GetGPUAllocator, the executor search of GetGpuHostAllocator). The rest of
// the file is omitted.

#include "tensorflow/core/common_runtime/device/device_host_allocator.h"
#include "tensorflow/core/common_runtime/device_id_utils.h"
#include "tensorflow/core/common_runtime/gpu/gpu_bfc_allocator.h"
#include "tensorflow/core/common_runtime/gpu/gpu_cudamalloc_allocator.h"
#include "tensorflow/core/common_runtime/gpu/gpu_debug_allocator.h"
#include "tensorflow/core/common_runtime/gpu/gpu_id_manager.h"
#include "tensorflow/core/common_runtime/pool_allocator.h"
#include "tensorflow/core/common_runtime/shared_counter.h"
#include "tensorflow/core/framework/log_memory.h"
#include "tensorflow/core/framework/tracking_allocator.h"
#include "tsl/platform/mutex.h"
#include "tsl/platform/strcat.h"

// [... omitted ...]

Allocator* GPUProcessState::GetGPUAllocator(
    const GPUOptions& options, tsl::TfDeviceId tf_device_id, size_t total_bytes,
    const std::vector<tsl::TfDeviceId>& peer_gpu_ids) {
  CHECK(process_state_);
#if (defined(GOOGLE_CUDA) && GOOGLE_CUDA) || \
    (defined(TENSORFLOW_USE_ROCM) && TENSORFLOW_USE_ROCM)
  const string& allocator_type = options.allocator_type();
  mutex_lock lock(mu_);
  tsl::CheckValidTfDeviceId(
      DEVICE_GPU, se::GPUMachineManager()->VisibleDeviceCount(), tf_device_id);

// [... omitted ...]

  mutex_lock lock(mu_);
  // Find the first valid StreamExecutor to request CUDA or ROCm host memory
  // through, since any will work.
  //
  // This search isn't super clean, and it would be nice to use a
  // better source of information about which executor to use.  For
  // example, process_state could maybe save the first stream executor
  // it knows is valid.
  se::StreamExecutor* se = nullptr;
  for (int i = 0; i < static_cast<int>(gpu_allocators_.size()); ++i) {
#ifdef TF_GPU_USE_PJRT
    if (gpu_allocators_[i].allocator_not_owned != nullptr) {
#else
    if (gpu_allocators_[i].allocator != nullptr) {
#endif  // TF_GPU_USE_PJRT
      se = DeviceIdUtil::ExecutorForTfDeviceId(
               DEVICE_GPU, se::GPUMachineManager(), tsl::TfDeviceId(i))
               .value();
      break;
    }
  }

  CHECK_NE(nullptr, se);

  int64_t mem_limit_bytes =
      options.experimental().gpu_host_mem_limit_in_mb() * (1LL << 20);
  if (mem_limit_bytes <= 0) {

// [... omitted ...]
