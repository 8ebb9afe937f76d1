// Overlay: the runtime overlay's state in this process, between the hooks
// the interposer calls (hooks.h) and the C API Python calls (c_api.h).
//
// Settings are checked twice, so a value that cannot give a working device
// never runs silently:
//   1. at import (Configure): every environment value is parsed and
//      range-checked (settings.h), and the emulated device is created once
//      with those values and discarded, so a value the process cannot serve
//      (address space, memory for the engine's tables) is an import error
//      naming the variables;
//   2. at first use (CpuAllocator): if the device still cannot be created
//      (the process's limits changed since), TensorFlow gets an
//      UnavailableDeviceAllocator whose every allocation fails with the
//      reason, so the first op raises ResourceExhaustedError saying why,
//      rather than running uncapped on TensorFlow's own allocator.
// The settings are fixed once TensorFlow asks for its first allocator.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_OVERLAY_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_OVERLAY_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "engine/status.h"
#include "engine/thread_annotations.h"
#include "tf_adapter/kernel_pins.h"
#include "tf_adapter/lms_allocator.h"
#include "tf_adapter/lms_device.h"
#include "tf_adapter/settings.h"

namespace lms {

class Overlay {
 public:
  // The process's overlay; never destroyed (TensorFlow outlives us).
  static Overlay& Get();

  // Registers the hooks with the interposer, then reads and checks the
  // settings (once; later calls succeed at once). kFailedPrecondition for
  // another TensorFlow version, a missing interposer, or devices TensorFlow
  // created after an earlier Configure failed.
  Status Configure(const char* tf_version);

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
  void* GpuAllocator(void* original, int tf_device_id);
  // The emulated device's kernel pins, or null. Lock-free: set once, before
  // TensorFlow runs a kernel on the device.
  KernelPins* active_pins() const { return active_pins_.load(std::memory_order_acquire); }

  // The emulated device's allocator, or null with *status saying why there
  // is none.
  LmsAllocator* DeviceAllocator(Status* status);
  Engine* DeviceEngine();

 private:
  Overlay() = default;

  Status DeviceCreationError(const Status& cause) const LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  LmsDeviceSpec EmulatedDeviceSpec() const LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Mutex mu_;
  // True once Configure succeeded; the hooks serve nothing before.
  bool configured_ LMS_GUARDED_BY(mu_) = false;
  bool hooks_registered_ LMS_GUARDED_BY(mu_) = false;
  Settings settings_ LMS_GUARDED_BY(mu_);
  // TensorFlow asked for its CPU allocator: the settings are fixed from here
  // on, whether or not LMS serves the device.
  bool device_created_ LMS_GUARDED_BY(mu_) = false;
  // The emulated device, once TensorFlow created it.
  std::unique_ptr<LmsDevice> device_ LMS_GUARDED_BY(mu_);
  // Set instead of `device_` when the device could not be created.
  std::unique_ptr<UnavailableDeviceAllocator> unavailable_ LMS_GUARDED_BY(mu_);
  std::string device_error_ LMS_GUARDED_BY(mu_);
  bool gpu_warned_ LMS_GUARDED_BY(mu_) = false;
  std::atomic<KernelPins*> active_pins_{nullptr};
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_OVERLAY_H_
