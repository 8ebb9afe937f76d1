// Runtime: LMS's state in this process, the one both ways in share: it sits
// between TensorFlow's calls (the interposer's hooks, hooks.h, in the runtime
// overlay; the patched functions, patched_tensorflow.h, in a TensorFlow built
// with the patch series) and the C API Python calls (c_api.h).
//
// Settings are checked twice, so a value that cannot give a working device
// never runs silently:
//   1. at import (Configure): every environment value is parsed and
//      range-checked (settings.h), and the emulated device is created once
//      with those values and discarded, so a value the process cannot serve
//      (address space, memory for the engine's tables) is an import error
//      naming the variables;
//   2. at first use (CpuAllocator, GpuAllocator): if a device cannot be created
//      (the process's limits changed since), TensorFlow gets an
//      UnavailableDeviceAllocator whose every allocation fails with the
//      reason, so the first op raises ResourceExhaustedError saying why,
//      rather than running uncapped on TensorFlow's own allocator.
// The settings are fixed once TensorFlow asks for its first allocator.
//
// GPUs: with LMS enabled, each GPU TensorFlow creates gets its own LMS device
// over the CUDA backend (gpu_devices.h says how TensorFlow's memory settings
// apply), and TensorFlow's own GPU allocator is made on a budget of no
// device memory and never used (GpuAllocator says why); with LMS off,
// TensorFlow's allocator serves the GPU, untouched.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_RUNTIME_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_RUNTIME_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/mutex.h"
#include "engine/status.h"
#include "tf_adapter/kernel_pins.h"
#include "tf_adapter/lms_allocator.h"
#include "tf_adapter/lms_device.h"
#include "tf_adapter/device_registry.h"
#include "tf_adapter/settings.h"

namespace lms {

class Runtime {
 public:
  // The process's runtime; never destroyed (TensorFlow outlives us).
  static Runtime& Get();

  // Reads and checks the settings (once; later calls succeed at once).
  // kFailedPrecondition for devices TensorFlow created after an earlier
  // Configure failed. Whoever calls it has checked the TensorFlow version and
  // connected TensorFlow's calls first (c_api.cc; patched_tensorflow.cc).
  Status Configure();

  // The reason the emulated device could not be created, or OK.
  Status DeviceStatus();
  // Python's set_lms_enabled / set_lms_defrag_enabled and their getters
  // (which also read "strict"). Setting a flag to a new value after
  // TensorFlow created its devices is kFailedPrecondition.
  Status SetFlag(const char* name, bool enabled);
  Status GetFlag(const char* name, bool* enabled);
  // Whether strict mode was configured (the fault handler must stay first).
  bool StrictConfigured();

  // The hooks' work. `original` is the allocator TensorFlow would use.
  void* CpuAllocator(void* original);
  // `get_original` is GPUProcessState::GetGPUAllocator (lms_hooks.h). When
  // LMS serves the GPU, it is still called, once, with a budget that takes
  // no device memory (GetGpuHostAllocator needs the allocator it makes).
  void* GpuAllocator(void* get_original, void* self, const void* options,
                     int tf_device_id, size_t total_bytes, const void* peer_gpu_ids);
  // GPU `tf_device_id`'s LMS allocator (a tsl::Allocator*) if LMS serves it
  // (settings or `options`, a const GPUOptions*), else null: TensorFlow's own
  // allocator must serve it. Fixes the settings. `peer_gpu_ids` (a const
  // std::vector<tsl::TfDeviceId>*, or null for none) are the GPUs granted
  // access to its memory.
  void* GpuAllocatorIfEnabled(const void* options, int tf_device_id, size_t total_bytes,
                              const void* peer_gpu_ids);
  // An OpKernelContext was constructed (`params` is its Params*) or is about
  // to be destroyed: the kernel-pin hooks of both ways in.
  void OnContextCreated(void* context, void* params);
  void OnContextDestroyed(void* context);
  // Routes kernel contexts to their LMS device (lock-free).
  DeviceRegistry& devices() { return devices_; }

  // The LMS device named `name` ("CPU:0" for the emulated device, "GPU:<n>"),
  // or null with *status saying why there is none.
  LmsDevice* DeviceNamed(const std::string& name, Status* status);
  // The emulated device's (CPU:0) allocator and engine, or null.
  LmsAllocator* DeviceAllocator(Status* status);
  Engine* DeviceEngine();
  // The names of the LMS devices TensorFlow created, the emulated device
  // first, then GPUs by id: what index i of get_statistics(i) means.
  std::vector<std::string> DeviceNames();

 private:
  // A GPU's LMS device, or why it has none.
  struct GpuEntry {
    std::unique_ptr<LmsDevice> device;
    std::unique_ptr<UnavailableDeviceAllocator> unavailable;
    std::string error;
  };

  Runtime();

  Status DeviceCreationError(const Status& cause) const LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::string> DeviceNamesLocked() LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // At the first kernel (TensorFlow has created every device by then): with
  // LMS enabled and no device served, says so once, and why.
  void WarnIfServingNothing();
  LmsDeviceSpec EmulatedDeviceSpec() const LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes GPU `tf_device_id`'s entry, its engine with `engine`
  // (GpuEngineOptions of its GPUOptions `options`).
  void CreateGpuDevice(GpuEntry* entry, const EngineOptions& engine, const void* options,
                       int tf_device_id, size_t total_bytes, const void* peer_gpu_ids)
      LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Mutex mu_;
  // True once Configure succeeded; the hooks serve nothing before.
  bool configured_ LMS_GUARDED_BY(mu_) = false;
  Settings settings_ LMS_GUARDED_BY(mu_);
  // TensorFlow asked for a device's allocator: the settings are fixed from
  // here on, whether or not LMS serves the device.
  bool settings_fixed_ LMS_GUARDED_BY(mu_) = false;
  // TensorFlow asked for its CPU allocator.
  bool cpu_asked_ LMS_GUARDED_BY(mu_) = false;
  // The emulated device, once TensorFlow created it.
  std::unique_ptr<LmsDevice> device_ LMS_GUARDED_BY(mu_);
  // Set instead of `device_` when the device could not be created.
  std::unique_ptr<UnavailableDeviceAllocator> unavailable_ LMS_GUARDED_BY(mu_);
  std::string device_error_ LMS_GUARDED_BY(mu_);
  // GPUs with LMS, by TensorFlow device id.
  std::map<int, GpuEntry> gpus_ LMS_GUARDED_BY(mu_);
  DeviceRegistry devices_;
  // Whether WarnIfServingNothing has looked (read on every kernel's start).
  std::atomic<bool> looked_for_devices_{false};
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_RUNTIME_H_
