#include "tf_adapter/outside_kernel.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/status.h"
#include "engine/thread_annotations.h"
#include "tensorflow/core/common_runtime/threadpool_device.h"
#include "tensorflow/core/framework/tensor.pb.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"
#include "tsl/platform/logging.h"

namespace lms {
namespace {

thread_local ScopedDeviceOnly* t_device_only = nullptr;

struct Fallback {
  std::mutex mu;
  // Host buffers handed out -> requested bytes.
  std::unordered_map<const void*, size_t> sizes LMS_GUARDED_BY(mu);
  size_t bytes_in_use LMS_GUARDED_BY(mu) = 0;
  std::atomic<bool> warned{false};
};

Fallback& State() {
  static Fallback* state = new Fallback();  // TensorFlow may free after exit
  return *state;
}

}  // namespace

ScopedDeviceOnly::ScopedDeviceOnly() : previous_(t_device_only) { t_device_only = this; }

ScopedDeviceOnly::~ScopedDeviceOnly() { t_device_only = previous_; }

bool OnTensorFlowEventThread() {
  // A thread's name does not change once TensorFlow started it: read once.
  static thread_local const bool on_event_thread = [] {
    char name[16] = "";
    return pthread_getname_np(pthread_self(), name, sizeof(name)) == 0 &&
           std::strncmp(name, "tf_Device_Event", 15) == 0;
  }();
  return on_event_thread;
}

void* HostFallback::Allocate(size_t alignment, size_t bytes, const std::string& reason) {
  if (ScopedDeviceOnly* scope = t_device_only; scope != nullptr) {
    if (!scope->failed_) {
      scope->failed_ = true;
      scope->reason_ = reason;
    }
    return nullptr;
  }
  void* ptr = nullptr;
  const size_t align = std::max<size_t>({alignment, 64, sizeof(void*)});
  if (posix_memalign(&ptr, align, bytes) != 0) return nullptr;
  Fallback& st = State();
  {
    std::lock_guard<std::mutex> lock(st.mu);
    st.sizes.emplace(ptr, bytes);
    st.bytes_in_use += bytes;
  }
  if (!st.warned.exchange(true, std::memory_order_relaxed)) {
    LOG(WARNING) << "tensorflow_lms_allocator: " << FormatBytes(bytes)
                 << " requested where TensorFlow does not check the result (outside any "
                    "kernel, such as converting a NumPy array, or inside one but not "
                    "through its OpKernelContext) did not fit on the device: "
                 << reason
                 << ". It is held in ordinary host memory instead, outside the device's "
                    "cap, as a GPU system stages such data on the host (said once per "
                    "process)";
  }
  return ptr;
}

bool HostFallback::Free(void* ptr) {
  Fallback& st = State();
  {
    std::lock_guard<std::mutex> lock(st.mu);
    auto it = st.sizes.find(ptr);
    if (it == st.sizes.end()) return false;
    st.bytes_in_use -= it->second;
    st.sizes.erase(it);
  }
  std::free(ptr);
  return true;
}

size_t HostFallback::RequestedSize(const void* ptr) {
  Fallback& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  auto it = st.sizes.find(ptr);
  return it == st.sizes.end() ? 0 : it->second;
}

size_t HostFallback::BytesInUse() {
  Fallback& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  return st.bytes_in_use;
}

void* MakeTensorFromProtoHook(void* original, void* status, void* device,
                              const void* proto, unsigned long long attributes, void* tensor) {
  // The original's ABI on x86-64: the returned absl::Status through `status`
  // (first), then `this`, the proto, AllocatorAttributes in one register.
  using Fn = void* (*)(void*, void*, const void*, unsigned long long, void*);
  ScopedDeviceOnly scope;
  reinterpret_cast<Fn>(original)(status, device, proto, attributes, tensor);
  auto* result = static_cast<absl::Status*>(status);
  if (result->ok() || !scope.failed()) return status;
  // TensorFlow says "Cannot parse tensor from proto" for any failure of
  // Tensor::FromProto; here the device's allocator refused the buffer, which
  // is an out-of-memory error, worded as TensorFlow's own OOM errors are.
  const auto& p = *static_cast<const tensorflow::TensorProto*>(proto);
  const auto* d = static_cast<tensorflow::ThreadPoolDevice*>(device);
  std::string shape = "[?]";
  tensorflow::TensorShape parsed;
  if (tensorflow::TensorShape::BuildTensorShape(p.tensor_shape(), &parsed).ok()) {
    shape = parsed.DebugString();
  }
  *result = absl::ResourceExhaustedError(absl::StrCat(
      "OOM when allocating tensor with shape", shape, " and type ",
      tensorflow::DataTypeString(p.dtype()), " on ", d->name(), " by allocator ",
      scope.reason(), ", for a constant of a kernel being created (TensorFlow would ",
      "report \"Cannot parse tensor from proto\")"));
  return status;
}

}  // namespace lms
