// Allocations made outside any kernel that the device cannot hold.
//
// Note [Allocations outside kernels]
// ==================================
// Most of what TensorFlow allocates on a device it allocates inside a
// kernel, which checks the result and fails with ResourceExhaustedError. A
// few paths allocate outside any kernel and do not check: converting a NumPy
// array that is not 64-byte aligned copies it into a buffer from the CPU
// device's allocator (TF_NewTensor) and memcpy()s into whatever came back,
// so a failed allocation there is a SIGSEGV (tf.constant(numpy), and
// model.fit(numpy_x) through tf.data.Dataset.from_tensor_slices). On a GPU
// system those buffers are host memory (TensorFlow stages NumPy data on the
// host and copies it to the device in a kernel, whose failure is a clean
// OOM); on the emulated device CPU:0 is both host and device, so they come
// from the capped allocator. Inside a kernel, only what comes through its
// OpKernelContext (allocate_output/temp/persistent, which set
// AllocationAttributes::allocation_will_be_logged) is checked: tf.data's
// MakeIterator runs Grappler, which makes a fake input for each placeholder
// with a plain Tensor constructor and fills it unchecked (SIGSEGV in
// grappler::InitializeTensor for Dataset.from_tensor_slices of 60 MiB on a
// 24 MiB device with LMS off, measured), so such requests are served the
// same way.
//
// What LMS does (LmsAllocator::AllocateRaw, when not in a kernel):
//   1. the engine places the request if it can (with LMS on, evicting; the
//      engine may also place it directly in its host pool, "born evicted");
//   2. if it cannot, the request is served from ordinary host memory
//      (posix_memalign), outside the device's cap, as a GPU system would
//      hold it: the program runs on, never dereferencing a null buffer. A
//      warning says so once per process. Such a buffer is never pinned,
//      evicted or counted in the device's statistics; kernels read it in
//      place. Only if the host has no memory either does the request fail,
//      as it would in stock TensorFlow.
//   3. except where TensorFlow does need device memory and checks the
//      result: a device parsing a constant for a kernel being built
//      (ThreadPoolDevice::MakeTensorFromProto, e.g. a Const that Grappler
//      folded from a huge tf.fill). Inside that call (a ScopedDeviceOnly),
//      nothing is served from host memory, and a failed allocation turns
//      TensorFlow's "Cannot parse tensor from proto" into the OOM a GPU
//      gives: ResourceExhaustedError naming the shape, the device and the
//      allocator's reason.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_OUTSIDE_KERNEL_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_OUTSIDE_KERNEL_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace lms {

// Ordinary host memory serving outside-kernel requests the device refused.
// Thread-safe. Its calls are off the fast path: LmsAllocator consults it only
// after the engine failed, or for pointers the engine does not own.
class HostFallback {
 public:
  // Called when the engine refused an outside-kernel request of `bytes`.
  // Returns host memory aligned to at least `alignment` (and 64), or null
  // inside a ScopedDeviceOnly (recording `reason` there) or if the host has
  // none. `reason` is the allocator's name with the engine's reason.
  static void* Allocate(size_t alignment, size_t bytes, const std::string& reason);
  // Frees `ptr` and returns true if it came from Allocate; false otherwise.
  static bool Free(void* ptr);
  // The size Allocate was asked for, or 0 if `ptr` did not come from it.
  static size_t RequestedSize(const void* ptr);
  // Bytes currently served from host memory (for tests and messages).
  static size_t BytesInUse();
};

// Whether this thread is one of TensorFlow's device event threads (the
// EventMgr's pool "Device_Event_Manager", two threads per GPU: Linux names
// them "tf_Device_Event"). Some GPU kernels allocate their outputs in
// callbacks run there (Where, segment reductions, DynamicPartition, Unique:
// a count is copied to the host first); such a request must not wait for
// other kernels' releases, since every later callback of the device, the
// done callbacks that end those kernels among them, waits behind it.
bool OnTensorFlowEventThread();

// While alive on a thread, allocations on that thread must come from the
// device: HostFallback serves none, and remembers the first refusal.
class ScopedDeviceOnly {
 public:
  ScopedDeviceOnly();
  ~ScopedDeviceOnly();
  ScopedDeviceOnly(const ScopedDeviceOnly&) = delete;
  ScopedDeviceOnly& operator=(const ScopedDeviceOnly&) = delete;

  // Whether an allocation failed on the device in this scope, and why.
  bool failed() const { return failed_; }
  const std::string& reason() const { return reason_; }

 private:
  friend class HostFallback;
  ScopedDeviceOnly* const previous_;
  bool failed_ = false;
  std::string reason_;
};

// The interposer's hook around ThreadPoolDevice::MakeTensorFromProto
// (x86-64 only, see interposer.c): runs `original` inside a ScopedDeviceOnly
// and rewrites its error into an OOM if the device's allocator failed.
// `status` is the absl::Status* the call returns through.
void* MakeTensorFromProtoHook(void* original, void* status, void* device,
                              const void* proto, unsigned long long attributes, void* tensor);

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_OUTSIDE_KERNEL_H_
