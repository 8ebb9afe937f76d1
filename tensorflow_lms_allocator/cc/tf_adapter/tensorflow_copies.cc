#include "tf_adapter/tensorflow_copies.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/common_runtime/dma_helper.h"
#include "tensorflow/core/framework/device.h"
#include "tensorflow/core/framework/device_base.h"
#include "tensorflow/core/framework/tensor.h"

namespace lms {
namespace {

using tensorflow::Device;
using tensorflow::DeviceContext;
using tensorflow::StatusCallback;
using tensorflow::Tensor;

// The interposer passes AllocatorAttributes as the 64-bit integer that
// carries it in one register.
static_assert(std::is_trivially_copyable_v<tsl::AllocatorAttributes> &&
                  sizeof(tsl::AllocatorAttributes) == sizeof(unsigned long long),
              "AllocatorAttributes no longer travels in one register");
tsl::AllocatorAttributes Attributes(unsigned long long bits) {
  tsl::AllocatorAttributes attributes;
  std::memcpy(&attributes, &bits, sizeof(attributes));
  return attributes;
}

// The pins one copy holds, released once: by its `done`, or when the last
// copy of that callback is destroyed without running (TensorFlow dropped the
// copy). Shared, because a StatusCallback must be copyable.
class CopyPins {
 public:
  CopyPins() = default;
  CopyPins(const CopyPins&) = delete;
  CopyPins& operator=(const CopyPins&) = delete;
  ~CopyPins() { Release(); }

  // Pins the unit holding `tensor`'s buffer if an LMS device of `router`
  // owns it, after handing `device_context`'s streams to that device.
  Status Take(PinsRouter& router, const DeviceContext* device_context, const Tensor* tensor,
              const char* what) {
    if (tensor == nullptr || tensor->TotalBytes() == 0) return Status::Ok();
    const void* data = tensorflow::DMAHelper::base(tensor);
    LmsDevice* device = router.Owner(data);
    if (device == nullptr) return Status::Ok();
    router.NoteDeviceContext(device, const_cast<DeviceContext*>(device_context));
    uint64_t unit_id = 0;
    KernelPins::Outcome outcome;
    const Status status = device->pins()->RetryWhileOthersRelease(
        [&] { return device->engine().Pin(data, &unit_id); }, &outcome);
    if (!status.ok()) {
      return Status(status.code(),
                    absl::StrCat("LMS could not page in the ", tensor->TotalBytes(),
                                 "-byte tensor for TensorFlow's ", what, " on ",
                                 device->allocator()->Name(), ": ", status.message()));
    }
    pins_.push_back({device, data, unit_id});
    return Status::Ok();
  }

  bool empty() const { return pins_.empty(); }

  void Release() {
    if (released_.exchange(true, std::memory_order_acq_rel)) return;
    for (const Pin& pin : pins_) (void)pin.device->engine().Unpin(pin.data, pin.unit_id);
  }

 private:
  struct Pin {
    LmsDevice* device;
    const void* data;
    uint64_t unit_id;
  };
  std::vector<Pin> pins_;
  std::atomic<bool> released_{false};
};

absl::Status ToAbsl(const Status& status) {
  return absl::Status(status.code() == StatusCode::kResourceExhausted
                          ? absl::StatusCode::kResourceExhausted
                          : absl::StatusCode::kInternal,
                      status.message());
}

// Note [TensorFlow's own copies]: pins the LMS buffers among `tensors`, then
// runs `launch` (which enqueues the copy) with a callback that unpins before
// it runs TensorFlow's `done`. If a buffer cannot be pinned, the copy is not
// launched and `done` receives the error.
template <typename Launch>
void PinnedCopy(PinsRouter& router, const DeviceContext* device_context,
                std::initializer_list<const Tensor*> tensors, const char* what, void* done,
                Launch launch) {
  StatusCallback callback = std::move(*static_cast<StatusCallback*>(done));
  auto pins = std::make_shared<CopyPins>();
  for (const Tensor* tensor : tensors) {
    const Status status = pins->Take(router, device_context, tensor, what);
    if (!status.ok()) {
      pins->Release();
      callback(ToAbsl(status));
      return;
    }
  }
  if (pins->empty()) {  // no LMS memory in this copy
    launch(std::move(callback));
    return;
  }
  launch([pins, callback = std::move(callback)](const absl::Status& status) {
    pins->Release();
    callback(status);
  });
}

}  // namespace

unsigned long long AllocatorAttributeBits(tsl::AllocatorAttributes attributes) {
  unsigned long long bits = 0;
  std::memcpy(&bits, &attributes, sizeof(bits));
  return bits;
}

void CopyGpuTensorToCpu(PinsRouter& router, void* original, void* gpu_device,
                        const void* device_context, const void* gpu_tensor,
                        void* cpu_tensor, void* done) {
  auto* context = static_cast<const DeviceContext*>(device_context);
  auto* src = static_cast<const Tensor*>(gpu_tensor);
  PinnedCopy(router, context, {src}, "device-to-host copy", done,
             [&](StatusCallback callback) {
               reinterpret_cast<GpuToCpuFn>(original)(static_cast<Device*>(gpu_device),
                                                      context, src,
                                                      static_cast<Tensor*>(cpu_tensor),
                                                      std::move(callback));
             });
}

void CopyCpuTensorToGpu(PinsRouter& router, void* original, const void* cpu_tensor,
                        const void* device_context, void* gpu_device, void* gpu_tensor,
                        void* done, bool sync_dst_compute) {
  auto* context = static_cast<const DeviceContext*>(device_context);
  auto* dst = static_cast<Tensor*>(gpu_tensor);
  PinnedCopy(router, context, {dst}, "host-to-device copy", done,
             [&](StatusCallback callback) {
               reinterpret_cast<CpuToGpuFn>(original)(static_cast<const Tensor*>(cpu_tensor),
                                                      context,
                                                      static_cast<Device*>(gpu_device), dst,
                                                      std::move(callback), sync_dst_compute);
             });
}

void CopyGpuTensorToSameGpu(PinsRouter& router, void* original, void* gpu_device,
                            const void* device_context, const void* src_tensor,
                            void* dst_tensor, void* done) {
  auto* context = static_cast<const DeviceContext*>(device_context);
  auto* src = static_cast<const Tensor*>(src_tensor);
  auto* dst = static_cast<Tensor*>(dst_tensor);
  PinnedCopy(router, context, {src, dst}, "copy within the device", done,
             [&](StatusCallback callback) {
               reinterpret_cast<SameGpuFn>(original)(static_cast<Device*>(gpu_device),
                                                     context, src, dst, std::move(callback));
             });
}

void DeviceToDeviceCopy(PinsRouter& router, void* original, void* send_device_context,
                        void* recv_device_context, void* src_device, void* dst_device,
                        unsigned long long src_attributes,
                        unsigned long long dst_attributes, const void* input,
                        void* output, int stream_index, void* done) {
  // The copy runs on the sending device's streams (the approximation of
  // Note [TensorFlow's own copies] for a destination on another device).
  auto* send = static_cast<DeviceContext*>(send_device_context);
  auto* src = static_cast<const Tensor*>(input);
  auto* dst = static_cast<Tensor*>(output);
  PinnedCopy(router, send, {src, dst}, "device-to-device copy", done,
             [&](StatusCallback callback) {
               reinterpret_cast<DeviceToDeviceFn>(original)(
                   send, static_cast<DeviceContext*>(recv_device_context),
                   static_cast<Device*>(src_device), static_cast<Device*>(dst_device),
                   Attributes(src_attributes), Attributes(dst_attributes), src, dst,
                   stream_index, std::move(callback));
             });
}

}  // namespace lms
