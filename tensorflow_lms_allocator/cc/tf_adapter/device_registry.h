// DeviceRegistry: the process's LMS devices, and which one a kernel context (its
// KernelPins) or a buffer belongs to; it also registers TensorFlow's streams
// with the device their contexts run on.
//
// With one LMS device (the emulated CPU device) every context goes to it: a
// kernel on any TensorFlow device object of this process may read its
// tensors. With LMS devices on GPUs, a context goes to the LMS device whose
// allocator its TensorFlow device allocates from
// (DeviceBase::GetAllocator), found once per TensorFlow device and cached;
// contexts on other devices go to the emulated device if there is one, else
// nowhere.
//
// The first context of a GPU device context (GPUDeviceContext: one per
// stream group) also hands that context's streams to `on_new_device_context`,
// which registers them with the device's backend: their queued work may
// touch LMS memory.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_DEVICE_REGISTRY_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_DEVICE_REGISTRY_H_

#include <atomic>
#include <functional>
#include <mutex>
#include <set>
#include <vector>

#include "engine/mutex.h"
#include "tf_adapter/lms_device.h"

namespace lms {

class DeviceRegistry {
 public:
  // Called once per new (LMS device, TensorFlow device context) pair, with
  // the DeviceContext* of a context on that device.
  using NewDeviceContextFn = std::function<void(LmsDevice* device, void* device_context)>;
  explicit DeviceRegistry(NewDeviceContextFn on_new_device_context)
      : on_new_device_context_(std::move(on_new_device_context)) {}

  // Routes to `device` from now on. `emulated`: the CPU device's, which also
  // serves contexts on devices that are not LMS devices.
  void Add(LmsDevice* device, bool emulated);

  // The LMS device of a context (params: its OpKernelContext::Params*), or
  // null. Lock-free once the context's TensorFlow device was seen.
  LmsDevice* ForParams(void* params);

  // The LMS device whose engine owns `ptr` (any byte of its address range),
  // or null. Lock-free.
  LmsDevice* Owner(const void* ptr) const {
    const int n = num_devices_.load(std::memory_order_acquire);
    for (int i = 0; i < n; ++i) {
      LmsDevice* device = devices_[i].load(std::memory_order_acquire);
      if (device->engine().Owns(ptr)) return device;
    }
    return nullptr;
  }

  // Hands `device_context` (a tensorflow::DeviceContext* on `device`, or
  // null) on as a kernel's is, for work TensorFlow enqueues on it outside
  // kernels (tensorflow_copies.h). Once per pair.
  void NoteDeviceContext(LmsDevice* device, void* device_context) LMS_LOCKS_EXCLUDED(mu_);

  // Every LMS device, for a context being destroyed (its own pins know it;
  // the others ignore it). Lock-free.
  template <typename Fn>
  void ForEach(Fn fn) const {
    const int n = num_devices_.load(std::memory_order_acquire);
    for (int i = 0; i < n; ++i) fn(devices_[i].load(std::memory_order_acquire));
  }

 private:
  static constexpr int kMaxDevices = 64;
  static constexpr int kMaxRoutes = 64;

  // A TensorFlow device seen, and where its contexts go (null: nowhere).
  struct Route {
    std::atomic<const void*> tf_device{nullptr};
    std::atomic<LmsDevice*> device{nullptr};
    // The last device context handed on, so a known one costs one compare.
    std::atomic<const void*> last_device_context{nullptr};
  };

  LmsDevice* Resolve(const void* tf_device) LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const NewDeviceContextFn on_new_device_context_;
  // Append-only, published by num_* (release) after the slot is written.
  std::atomic<LmsDevice*> devices_[kMaxDevices] = {};
  std::atomic<int> num_devices_{0};
  std::atomic<LmsDevice*> emulated_{nullptr};
  // Whether any LMS device is on a GPU; until then every context goes to the
  // emulated device without a lookup.
  std::atomic<bool> routing_{false};
  Route routes_[kMaxRoutes];
  std::atomic<int> num_routes_{0};

  Mutex mu_;  // serialises additions
  std::set<std::pair<LmsDevice*, void*>> device_contexts_ LMS_GUARDED_BY(mu_);
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_DEVICE_REGISTRY_H_
