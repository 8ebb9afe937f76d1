// LmsDevice: everything one TensorFlow device needs from LMS, made in one
// call. "An LMS allocator for device D with backend B" is this unit, and both
// ways into TensorFlow make their devices through it (runtime.h): the
// runtime overlay for the emulated device and the GPUs of the stock wheel,
// and the source patch from GPUProcessState.
//
// An LmsDevice owns its engine (through the allocator) and the kernel pins
// that the OpKernelContext hooks drive. It lives as long as the process's
// TensorFlow devices: TensorFlow never gives an allocator back.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_LMS_DEVICE_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_LMS_DEVICE_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend_factory.h"
#include "engine/status.h"
#include "tf_adapter/kernel_pins.h"
#include "tf_adapter/lms_allocator.h"
#include "tf_adapter/prefetcher.h"

namespace lms {

struct LmsDeviceSpec {
  // The allocator's name, which TensorFlow puts in its OOM messages.
  std::string name;
  BackendSpec backend;
  // As the settings give them (Settings::engine), with the device's size;
  // Create rounds device_bytes and host_bytes down to whole granules of the
  // backend and hands the rest to the engine unchanged.
  EngineOptions engine;
  bool prefetch = false;  // with the learned policy (prefetcher.h)
};

class LmsDevice {
 public:
  // Errors are Status, never exceptions (built with -fno-exceptions, as
  // TensorFlow builds it): address space the engine cannot reserve, for its
  // memory or its tables, is kResourceExhausted. On failure *out is untouched.
  static Status Create(const LmsDeviceSpec& spec, std::unique_ptr<LmsDevice>* out);

  // Hands `queues` (TensorFlow's CUstreams of this device, as void*) to the
  // backend's fence (Backend::AddFencedQueue).
  Status AddFencedQueues(const std::vector<void*>& queues);

  // A kernel started on this device: the prefetcher (learned policy only)
  // may page in what the next kernels will pin. Lock-free.
  void NoteKernelStarted() {
    if (prefetcher_ != nullptr) prefetcher_->Notify();
  }

  // One line for the log when TensorFlow's device starts using this one, as
  // TensorFlow logs "Created device ... with N MB memory": the device, its
  // budget, host memory for evicted tensors and the policy. `device` is
  // TensorFlow's name for it (CPU:0, GPU:1).
  std::string Describe(const std::string& device) const;

  LmsAllocator* allocator() const { return allocator_.get(); }
  KernelPins* pins() const { return pins_.get(); }
  Engine& engine() const { return allocator_->engine(); }

 private:
  LmsDevice() = default;

  // Owned by the engine, which lives as long as this device.
  Backend* backend_ = nullptr;
  LmsDeviceSpec spec_;  // as created (whole granules), for Describe
  // Declared before the allocator so it outlives it (the allocator holds a
  // pointer to it).
  std::unique_ptr<KernelPins> pins_;
  std::unique_ptr<LmsAllocator> allocator_;
  // Declared after the allocator, so destroyed (its thread joined) before
  // the engine it calls.
  std::unique_ptr<Prefetcher> prefetcher_;
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_LMS_DEVICE_H_
