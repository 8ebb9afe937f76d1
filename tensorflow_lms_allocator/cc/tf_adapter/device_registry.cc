#include "tf_adapter/device_registry.h"

#include "tensorflow/core/framework/device_base.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace lms {

void DeviceRegistry::Add(LmsDevice* device, bool emulated) {
  MutexLock lock(mu_);
  const int n = num_devices_.load(std::memory_order_relaxed);
  if (n == kMaxDevices) return;  // more LMS devices than TensorFlow can make
  devices_[n].store(device, std::memory_order_relaxed);
  num_devices_.store(n + 1, std::memory_order_release);
  if (emulated) {
    emulated_.store(device, std::memory_order_release);
  } else {
    routing_.store(true, std::memory_order_release);
  }
}

LmsDevice* DeviceRegistry::Resolve(const void* tf_device) {
  tsl::Allocator* allocator =
      static_cast<tensorflow::DeviceBase*>(const_cast<void*>(tf_device))
          ->GetAllocator(tsl::AllocatorAttributes());
  const int n = num_devices_.load(std::memory_order_relaxed);
  for (int i = 0; i < n; ++i) {
    LmsDevice* device = devices_[i].load(std::memory_order_relaxed);
    if (device->allocator() == allocator) return device;
  }
  return nullptr;
}

void DeviceRegistry::NoteDeviceContext(LmsDevice* device, void* device_context) {
  if (device_context == nullptr) return;
  MutexLock lock(mu_);
  if (device_contexts_.insert({device, device_context}).second) {
    on_new_device_context_(device, device_context);
  }
}

LmsDevice* DeviceRegistry::ForParams(void* params) {
  LmsDevice* emulated = emulated_.load(std::memory_order_acquire);
  if (!routing_.load(std::memory_order_acquire)) return emulated;
  const auto* p = static_cast<const tensorflow::OpKernelContext::Params*>(params);
  const void* tf_device = p->device;
  Route* route = nullptr;
  int n = num_routes_.load(std::memory_order_acquire);
  for (int i = 0; i < n && route == nullptr; ++i) {
    if (routes_[i].tf_device.load(std::memory_order_relaxed) == tf_device) route = &routes_[i];
  }
  LmsDevice* device = nullptr;
  if (route != nullptr) {
    device = route->device.load(std::memory_order_relaxed);
  } else {
    MutexLock lock(mu_);
    device = Resolve(tf_device);
    n = num_routes_.load(std::memory_order_relaxed);
    for (int i = 0; i < n && route == nullptr; ++i) {  // another thread's, meanwhile
      if (routes_[i].tf_device.load(std::memory_order_relaxed) == tf_device) {
        route = &routes_[i];
      }
    }
    // Beyond kMaxRoutes TensorFlow devices (never seen in practice) every
    // context resolves again: slower, still right.
    if (route == nullptr && n < kMaxRoutes) {
      routes_[n].tf_device.store(tf_device, std::memory_order_relaxed);
      routes_[n].device.store(device, std::memory_order_relaxed);
      num_routes_.store(n + 1, std::memory_order_release);
      route = &routes_[n];
    }
  }
  if (device == nullptr || device == emulated) return emulated;
  void* device_context = p->op_device_context;
  if (device_context != nullptr &&
      (route == nullptr ||
       route->last_device_context.load(std::memory_order_relaxed) != device_context)) {
    NoteDeviceContext(device, device_context);
    if (route != nullptr) {
      route->last_device_context.store(device_context, std::memory_order_relaxed);
    }
  }
  return device;
}

}  // namespace lms
