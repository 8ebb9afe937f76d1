#include "tf_adapter/tensorflow_copies.h"

#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
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
#include "tf_adapter/outside_kernel.h"
#include "tf_adapter/runtime.h"

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

// The pins one copy holds, released once: by its `done`, or when the last
// copy of that callback is destroyed without running (TensorFlow dropped the
// copy). Shared, because a StatusCallback must be copyable.
class CopyPins {
 public:
  CopyPins() = default;
  CopyPins(const CopyPins&) = delete;
  CopyPins& operator=(const CopyPins&) = delete;
  ~CopyPins() { Release(); }

  // Pins the unit holding `tensor`'s buffer if an LMS device of `devices`
  // owns it, after handing `device_context`'s streams to that device.
  Status Take(DeviceRegistry& devices, const DeviceContext* device_context,
              const Tensor* tensor, const char* what) {
    if (tensor == nullptr || tensor->TotalBytes() == 0) return Status::Ok();
    const void* data = tensorflow::DMAHelper::base(tensor);
    LmsDevice* device = devices.Owner(data);
    if (device == nullptr) return Status::Ok();
    devices.NoteDeviceContext(device, const_cast<DeviceContext*>(device_context));
    uint64_t unit_id = 0;
    const Status status = device->pins()->PinForCopy(data, &unit_id);
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

// Note [Copies from event threads]. A copy issued on one of TensorFlow's
// event threads (the executor runs _Send, _Recv and inexpensive kernels
// inline in a GPU's completion callbacks) must not wait there for other
// kernels' releases (Note [No waits on TensorFlow's event threads] in
// kernel_pins.h), but failing it would fail the step where a wait would
// have served it. So a pin refused there hands the whole copy (its pins,
// then its enqueue) to one thread of LMS's own, which may wait as any
// other thread does; the copy is enqueued later, and its done (which
// TensorFlow waits for in any case) comes later. The thread is started at
// the first such copy and lives until the process exits; it names itself,
// since a thread started from an event thread inherits its name.
class CopyWaiter {
 public:
  static void Post(std::function<void()> task) {
    CopyWaiter& waiter = Get();
    {
      std::lock_guard<std::mutex> lock(waiter.mu_);
      waiter.tasks_.push_back(std::move(task));
    }
    waiter.cv_.notify_one();
  }

 private:
  static CopyWaiter& Get() {
    static CopyWaiter* waiter = new CopyWaiter;  // never destroyed: its thread runs on
    return *waiter;
  }
  CopyWaiter() {
    std::thread([this] {
      pthread_setname_np(pthread_self(), "lms_copy_wait");
      while (true) {
        std::function<void()> task;
        {
          std::unique_lock<std::mutex> lock(mu_);
          cv_.wait(lock, [this] { return !tasks_.empty(); });
          task = std::move(tasks_.front());
          tasks_.pop_front();
        }
        task();
      }
    }).detach();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
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
// A pin refused on an event thread hands the copy to CopyWaiter (Note
// [Copies from event threads]): `launch` is copied there.
template <typename Launch>
void PinnedCopy(const DeviceContext* device_context, std::vector<const Tensor*> tensors,
                const char* what, StatusCallback callback, Launch launch) {
  DeviceRegistry& devices = Runtime::Get().devices();
  auto pins = std::make_shared<CopyPins>();
  for (const Tensor* tensor : tensors) {
    const Status status = pins->Take(devices, device_context, tensor, what);
    if (!status.ok()) {
      pins->Release();
      if (status.code() == StatusCode::kResourceExhausted && OnTensorFlowEventThread()) {
        CopyWaiter::Post([=, callback = std::move(callback)]() mutable {
          PinnedCopy(device_context, tensors, what, std::move(callback), launch);
        });
        return;
      }
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

tsl::AllocatorAttributes AllocatorAttributesFromBits(unsigned long long bits) {
  tsl::AllocatorAttributes attributes;
  std::memcpy(&attributes, &bits, sizeof(attributes));
  return attributes;
}

void PinnedCopyGpuTensorToCpu(GpuToCpuFn unpinned, Device* gpu_device,
                              const DeviceContext* device_context, const Tensor* gpu_tensor,
                              Tensor* cpu_tensor, StatusCallback done) {
  PinnedCopy(device_context, {gpu_tensor}, "device-to-host copy", std::move(done),
             [=](StatusCallback callback) {
               unpinned(gpu_device, device_context, gpu_tensor, cpu_tensor,
                        std::move(callback));
             });
}

void PinnedCopyCpuTensorToGpu(CpuToGpuFn unpinned, const Tensor* cpu_tensor,
                              const DeviceContext* device_context, Device* gpu_device,
                              Tensor* gpu_tensor, StatusCallback done, bool sync_dst_compute) {
  PinnedCopy(device_context, {gpu_tensor}, "host-to-device copy", std::move(done),
             [=](StatusCallback callback) {
               unpinned(cpu_tensor, device_context, gpu_device, gpu_tensor,
                        std::move(callback), sync_dst_compute);
             });
}

void PinnedCopyGpuTensorToSameGpu(SameGpuFn unpinned, Device* gpu_device,
                                  const DeviceContext* device_context,
                                  const Tensor* src_gpu_tensor, Tensor* dst_gpu_tensor,
                                  StatusCallback done) {
  PinnedCopy(device_context, {src_gpu_tensor, dst_gpu_tensor}, "copy within the device",
             std::move(done), [=](StatusCallback callback) {
               unpinned(gpu_device, device_context, src_gpu_tensor, dst_gpu_tensor,
                        std::move(callback));
             });
}

void PinnedDeviceToDeviceCopy(DeviceToDeviceFn unpinned, DeviceContext* send_dev_context,
                              DeviceContext* recv_dev_context, Device* src, Device* dst,
                              tsl::AllocatorAttributes src_alloc_attr,
                              tsl::AllocatorAttributes dst_alloc_attr, const Tensor* input,
                              Tensor* output, int dev_to_dev_stream_index,
                              StatusCallback done) {
  // The copy runs on the sending device's streams (the approximation of
  // Note [TensorFlow's own copies] for a destination on another device).
  PinnedCopy(send_dev_context, {input, output}, "device-to-device copy", std::move(done),
             [=](StatusCallback callback) {
               unpinned(send_dev_context, recv_dev_context, src, dst, src_alloc_attr,
                        dst_alloc_attr, input, output, dev_to_dev_stream_index,
                        std::move(callback));
             });
}

}  // namespace lms
