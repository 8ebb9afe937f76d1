// tf_lms_test_tensorflow_copy (c_api_testing.h): Note [TensorFlow's own copies]
// (tensorflow_copies.h) exercised without a GPU. The copy hooks run exactly
// as the interposer calls them on a GPU wheel; only GPUUtil's function,
// which needs a GPU, is replaced by a stand-in that behaves as an enqueue
// does: it returns at once and completes the copy later, on another thread.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "tensorflow/core/common_runtime/dma_helper.h"
#include "tensorflow/core/framework/device.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tf_testing/c_api_testing.h"
#include "tf_adapter/runtime.h"
#include "tf_adapter/tensorflow_copies.h"

namespace lms {
namespace {

using tensorflow::Device;
using tensorflow::DeviceContext;
using tensorflow::StatusCallback;
using tensorflow::Tensor;

// The copy in flight: what the stand-in saw, and its completion.
struct Flight {
  Engine* src_engine = nullptr;  // the source's device (also a host source's)
  Engine* dst_engine = nullptr;  // the destination's
  const Tensor* lms_src = nullptr;  // null when the source is host memory
  const Tensor* lms_dst = nullptr;
  std::chrono::milliseconds delay{0};
  // {evicted, pin count} of the source and the destination when the copy
  // was enqueued; -1 for host memory.
  int64_t at_enqueue[4] = {-1, -1, -1, -1};
  bool launched = false;
  std::thread worker;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool failed = false;  // `done` received an error before any launch
  absl::Status status;
};
Flight* g_flight = nullptr;  // the probe in progress (tf_lms_test_tensorflow_copy serialises)

// out[0..2) = {evicted, pin count} of `tensor`'s unit; untouched for host
// memory.
void Describe(Engine* engine, const Tensor* tensor, int64_t* out) {
  AllocationInfo info;
  if (tensor == nullptr || !engine->Inspect(tensorflow::DMAHelper::base(tensor), &info).ok()) {
    return;
  }
  out[0] = info.evicted ? 1 : 0;
  out[1] = info.pin_count;
}

// Bytes of `tensor`, through the engine where it owns them (a GPU's memory
// is not the host's).
std::vector<char> Read(Engine* engine, const Tensor* tensor) {
  std::vector<char> bytes(tensor->TotalBytes());
  const void* data = tensorflow::DMAHelper::base(tensor);
  if (engine->Owns(data)) {
    (void)engine->CopyToHost(data, bytes.data(), bytes.size());
  } else {
    std::memcpy(bytes.data(), data, bytes.size());
  }
  return bytes;
}

void Write(Engine* engine, Tensor* tensor, const std::vector<char>& bytes) {
  void* data = const_cast<void*>(tensorflow::DMAHelper::base(tensor));
  if (engine->Owns(data)) {
    (void)engine->CopyFromHost(data, bytes.data(), bytes.size());
  } else {
    std::memcpy(data, bytes.data(), bytes.size());
  }
}

// The stand-in for every GPUUtil copy: records the tensors' state, then
// copies on a worker thread after the delay and runs `done`.
void Enqueue(const Tensor* src, Tensor* dst, StatusCallback done) {
  Flight* f = g_flight;
  f->launched = true;
  Describe(f->src_engine, f->lms_src, &f->at_enqueue[0]);
  Describe(f->dst_engine, f->lms_dst, &f->at_enqueue[2]);
  // Under the lock: the enqueue may run on another thread than the probe's
  // (Note [Copies from event threads]), which joins the worker once done.
  std::lock_guard<std::mutex> lock(f->mu);
  f->worker = std::thread([f, src, dst, done = std::move(done)] {
    std::this_thread::sleep_for(f->delay);
    Write(f->dst_engine, dst, Read(f->src_engine, src));
    done(absl::OkStatus());
    std::lock_guard<std::mutex> lock(f->mu);
    f->done = true;
    f->cv.notify_all();
  });
}

void GpuToCpu(Device*, const DeviceContext*, const Tensor* src, Tensor* dst,
              StatusCallback done) {
  Enqueue(src, dst, std::move(done));
}
void CpuToGpu(const Tensor* src, const DeviceContext*, Device*, Tensor* dst,
              StatusCallback done, bool) {
  Enqueue(src, dst, std::move(done));
}
void DeviceToDevice(DeviceContext*, DeviceContext*, Device*, Device*, tsl::AllocatorAttributes,
                    tsl::AllocatorAttributes, const Tensor* src, Tensor* dst, int,
                    StatusCallback done) {
  Enqueue(src, dst, std::move(done));
}

}  // namespace
}  // namespace lms

extern "C" int tf_lms_test_tensorflow_copy(const char* device_name, const char* dst_name,
                                           int kind, size_t bytes, int delay_ms,
                                           int fill_device, int64_t* out, char* message,
                                           size_t message_len) {
  using namespace lms;  // NOLINT: a test entry point
  static std::mutex probe_mu;
  std::lock_guard<std::mutex> probe_lock(probe_mu);
  Status status;
  LmsDevice* device = Runtime::Get().DeviceNamed(device_name, &status);
  if (device == nullptr) {
    return FailToC(TF_LMS_NOT_FOUND, status.message(), message, message_len);
  }
  LmsDevice* dst_device = device;
  if (dst_name != nullptr && dst_name[0] != '\0') {
    dst_device = Runtime::Get().DeviceNamed(dst_name, &status);
    if (dst_device == nullptr) {
      return FailToC(TF_LMS_NOT_FOUND, status.message(), message, message_len);
    }
  }
  if (kind < 0 || kind > 3 || bytes == 0 || (dst_device != device && kind != 3)) {
    return FailToC(TF_LMS_INVALID_ARGUMENT,
                   "kind must be 0-3 (3 for another destination device) and bytes positive",
                   message, message_len);
  }
  Engine& engine = device->engine();
  Engine& dst_engine = dst_device->engine();
  const tensorflow::TensorShape shape({static_cast<int64_t>(bytes)});
  Tensor lms_a(device->allocator(), tensorflow::DT_UINT8, shape);
  Tensor lms_b(dst_device->allocator(), tensorflow::DT_UINT8, shape);
  Tensor host_a(tsl::cpu_allocator_base(), tensorflow::DT_UINT8, shape);
  Tensor host_b(tsl::cpu_allocator_base(), tensorflow::DT_UINT8, shape);
  if (!lms_a.IsInitialized() || !lms_b.IsInitialized()) {
    return FailToC(TF_LMS_RESOURCE_EXHAUSTED, "the probe's tensors do not fit", message,
                message_len);
  }
  // kind: 0 device-to-host, 1 host-to-device, 2 within the device, 3 device-to-device.
  Tensor* src = kind == 1 ? &host_a : &lms_a;
  Tensor* dst = kind == 0 ? &host_b : &lms_b;
  std::vector<char> pattern(bytes);
  for (size_t i = 0; i < bytes; ++i) pattern[i] = static_cast<char>((i * 131 + 7) >> 3);
  Write(&engine, src, pattern);
  Flight flight;
  flight.src_engine = &engine;
  flight.dst_engine = &dst_engine;
  flight.lms_src = src == &lms_a ? src : nullptr;
  flight.lms_dst = dst == &lms_b ? dst : nullptr;
  flight.delay = std::chrono::milliseconds(delay_ms);
  for (const Tensor* t : {flight.lms_src, flight.lms_dst}) {
    if (t == nullptr) continue;
    // Made and written outside any kernel, the tensors are unclaimed (Note
    // [Writers outside kernels]): a pin claims them, as their first kernel's
    // would, so that they can be evicted.
    Engine& owner = t == flight.lms_src ? engine : dst_engine;
    const void* data = tensorflow::DMAHelper::base(t);
    uint64_t id = 0;
    if (owner.Pin(data, &id).ok()) (void)owner.Unpin(data, id);
    (void)owner.Evict(data);
  }
  std::vector<void*> fillers;
  while (fill_device == 1) {
    Status s;
    void* p = engine.Allocate(engine.granule_bytes(), /*pin=*/true, &s);
    if (p == nullptr) break;
    fillers.push_back(p);
  }
  // fill_device 2: a running kernel fills the device, and ends after the delay.
  std::thread holder;
  if (fill_device == 2) {
    std::atomic<bool> filled{false};
    holder = std::thread([&engine, device, &filled, delay_ms] {
      tensorflow::OpKernelContext::Params params;
      int context = 0;  // the kernel's context: only a key to the adapter
      device->pins()->OnContextCreated(&context, &params);
      std::vector<void*> held;
      while (true) {
        Status s;
        uint64_t id = 0;
        void* p = engine.Allocate(engine.granule_bytes(), /*pin=*/true, &s, &id);
        if (p == nullptr) break;
        device->pins()->RecordAllocation(p, id, engine.granule_bytes());
        held.push_back(p);
      }
      filled = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      device->pins()->OnContextDestroyed(&context);  // unpins what it held
      for (void* p : held) (void)engine.Free(p);
    });
    while (!filled) std::this_thread::yield();
  }
  auto page_ins_now = [&] {
    return engine.GetStatistics().num_page_ins +
           (&dst_engine != &engine ? dst_engine.GetStatistics().num_page_ins : 0);
  };
  const int64_t page_ins = page_ins_now();
  g_flight = &flight;
  StatusCallback done = [](const absl::Status& s) {
    if (s.ok()) return;  // the stand-in's worker marks the copy done
    std::lock_guard<std::mutex> lock(g_flight->mu);
    g_flight->status = s;  // a failed pin: called before any launch
    g_flight->failed = true;
    g_flight->cv.notify_all();
  };
  switch (kind) {
    case 0:
      PinnedCopyGpuTensorToCpu(&GpuToCpu, nullptr, nullptr, src, dst, std::move(done));
      break;
    case 1:
      PinnedCopyCpuTensorToGpu(&CpuToGpu, src, nullptr, nullptr, dst, std::move(done), false);
      break;
    case 2:
      PinnedCopyGpuTensorToSameGpu(&GpuToCpu, nullptr, nullptr, src, dst, std::move(done));
      break;
    case 3:
      PinnedDeviceToDeviceCopy(&DeviceToDevice, nullptr, nullptr, nullptr, nullptr, {}, {}, src,
                               dst, 0, std::move(done));
      break;
  }
  int64_t in_flight[2] = {-1, -1};
  if (flight.lms_src != nullptr) {
    Describe(&engine, flight.lms_src, in_flight);
  } else {
    Describe(&dst_engine, flight.lms_dst, in_flight);
  }
  {
    // Launched now, or later by the thread a copy on an event thread is
    // handed to (Note [Copies from event threads]); or failed.
    std::unique_lock<std::mutex> lock(flight.mu);
    flight.cv.wait_for(lock, std::chrono::seconds(30),
                       [&] { return flight.done || flight.failed; });
  }
  if (flight.worker.joinable()) flight.worker.join();
  if (holder.joinable()) holder.join();
  g_flight = nullptr;
  int64_t after_src[2] = {-1, -1}, after_dst[2] = {-1, -1};
  Describe(&engine, flight.lms_src, after_src);
  Describe(&dst_engine, flight.lms_dst, after_dst);
  out[0] = flight.launched ? 1 : 0;
  out[1] = static_cast<int64_t>(flight.status.code());
  for (int i = 0; i < 4; ++i) out[2 + i] = flight.at_enqueue[i];
  out[6] = in_flight[1];
  out[7] = std::max<int64_t>(after_src[1], 0) + std::max<int64_t>(after_dst[1], 0);
  out[8] = flight.launched && Read(&dst_engine, dst) == pattern ? 1 : 0;
  out[9] = page_ins_now() - page_ins;
  for (void* p : fillers) {
    (void)engine.Unpin(p, 0);
    (void)engine.Free(p);
  }
  if (!flight.status.ok()) {
    FailToC(TF_LMS_OK, std::string(flight.status.message()), message, message_len);
  }
  return TF_LMS_OK;
}
