// LmsAllocator: TensorFlow's tsl::Allocator interface over the LMS engine.
//
// TensorFlow sees an ordinary allocator. Two things differ:
//   - an allocation made while a kernel runs on this thread starts pinned and
//     is recorded with that kernel (KernelPins), so nothing evicts a tensor
//     between its allocation and the end of the kernel that produced it;
//   - after a failed allocation, Name() carries the engine's reason until the
//     thread's next successful allocation from the same allocator (each
//     allocator shows only its own failures). TensorFlow puts the allocator's
//     name into its OOM error ("... by allocator <name>"), so the user's
//     ResourceExhaustedError says what was short (device memory, host swap
//     space and TF_GPU_HOST_MEM_LIMIT_IN_MB, ...).
//
// AllocationAttributes are honoured: with retry_on_failure (TensorFlow's
// default) a request that fails while other kernels hold pinned memory waits
// for them to release it (KernelPins::RetryWhileOthersRelease); if they all
// wait too, or no other kernel holds memory to release, or the request is
// larger than the device, a kernel's request is placed in host memory at its
// address with LMS on (born evicted: the kernel reads and writes it in place,
// over the bus on a GPU; said once per process). Without retry_on_failure
// (optional allocations, such as scratch space a kernel can do without:
// cuDNN's autotuning and workspaces) it is served from free device memory
// only, evicting nothing, and fails at once otherwise (num_optional_refused).
// RequestedSize is always what TensorFlow asked for: an
// alignment above 256 bytes is met by the engine's placement, never by
// inflating the request.
//
// UnavailableDeviceAllocator stands in for a device LMS could not create:
// TensorFlow must still get an allocator, and handing back TensorFlow's own
// would run the program uncapped without LMS. Every allocation fails with the
// reason in Name(), so the first op raises an error that says why.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_LMS_ALLOCATOR_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_LMS_ALLOCATOR_H_

#include <memory>
#include <optional>
#include <string>

#include "engine/engine.h"
#include "tf_adapter/profiler_events.h"
#include "tf_adapter/tf_compat.h"
#include LMS_TSL_ALLOCATOR_H  // tf_compat.h: where this TensorFlow has it

namespace lms {

class KernelPins;

class LmsAllocator : public tsl::Allocator {
 public:
  // `pins` may be null (no kernel hooks: nothing is pinned on allocation).
  LmsAllocator(std::string name, std::unique_ptr<Engine> engine, KernelPins* pins);
  ~LmsAllocator() override;

  std::string Name() override;
  void* AllocateRaw(size_t alignment, size_t num_bytes) override;
  void* AllocateRaw(size_t alignment, size_t num_bytes,
                    const tsl::AllocationAttributes& attributes) override;
  void DeallocateRaw(void* ptr) override;
  bool TracksAllocationSizes() const override { return true; }
  size_t RequestedSize(const void* ptr) const override;
  size_t AllocatedSize(const void* ptr) const override;
  int64_t AllocationId(const void* ptr) const override;
  std::optional<tsl::AllocatorStats> GetStats() override;
  bool ClearStats() override;
  tsl::AllocatorMemoryType GetMemoryType() const override {
    return tsl::AllocatorMemoryType::kDevice;
  }

  Engine& engine() { return *engine_; }

 private:
  // With `retry_on_failure`, waits for other kernels' releases as long as
  // KernelPins allows; without, one attempt. `checked`: the request comes
  // from an OpKernelContext (or OpKernelConstruction), which checks it.
  void* Allocate(size_t alignment, size_t num_bytes, bool retry_on_failure, bool checked);
  // For a kernel's request that the device cannot hold and no release will
  // make room for (every running kernel waits on it, Note [Taking turns] in
  // kernel_pins.h; or none holds memory; or it is larger than the device):
  // places it where the engine can, in host memory at its address if the
  // device is full (born evicted; the kernel reaches it in place). *pinned
  // says whether it is resident and pinned (then the caller records it with
  // the kernel, as any allocation). `why` is the device's refusal.
  void* AllocateInHostMemory(size_t num_bytes, const Status& why, Status* status,
                             uint64_t* id, bool* pinned);
  // The limit TensorFlow sees (Note [The limit TensorFlow sees]), from the
  // engine's statistics `s`.
  int64_t LimitTensorFlowSees(const Statistics& s) const;
  // Records the profiler's memory event of `ptr` (Note [Memory events for
  // the profiler] in profiler_events.h).
  void RecordForProfiler(MemoryEvent event, const void* ptr, size_t requested_bytes,
                         size_t allocation_bytes) const;

  // Immutable after construction; the engine and KernelPins are thread-safe.
  const std::string name_;
  const std::unique_ptr<Engine> engine_;
  KernelPins* const pins_;
};

class UnavailableDeviceAllocator : public tsl::Allocator {
 public:
  // `reason` says which setting and why, e.g. "the emulated device
  // (TF_LMS_CPU_DEVICE_MEMORY_MB=1024) could not be created: ...".
  UnavailableDeviceAllocator(std::string name, std::string reason);

  std::string Name() override { return name_ + " (unavailable: " + reason_ + ")"; }
  void* AllocateRaw(size_t alignment, size_t num_bytes) override;
  void DeallocateRaw(void* ptr) override;
  tsl::AllocatorMemoryType GetMemoryType() const override {
    return tsl::AllocatorMemoryType::kDevice;
  }

 private:
  const std::string name_;
  const std::string reason_;
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_LMS_ALLOCATOR_H_
