// LmsAllocator: TensorFlow's tsl::Allocator interface over the LMS engine.
//
// TensorFlow sees an ordinary allocator. Two things differ:
//   - an allocation made while a kernel runs on this thread starts pinned and
//     is recorded with that kernel (KernelPins), so nothing evicts a tensor
//     between its allocation and the end of the kernel that produced it;
//   - after a failed allocation, Name() carries the engine's reason until the
//     thread's next successful allocation. TensorFlow puts the allocator's
//     name into its OOM error ("... by allocator <name>"), so the user's
//     ResourceExhaustedError says what was short (device memory, host swap
//     space and TF_GPU_HOST_MEM_LIMIT_IN_MB, ...).
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_LMS_ALLOCATOR_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_LMS_ALLOCATOR_H_

#include <memory>
#include <optional>
#include <string>

#include "engine/engine.h"
#include "xla/tsl/framework/allocator.h"

namespace lms {

class KernelPins;

class LmsAllocator : public tsl::Allocator {
 public:
  // `pins` may be null (no kernel hooks: nothing is pinned on allocation).
  LmsAllocator(std::string name, std::unique_ptr<Engine> engine, KernelPins* pins);
  ~LmsAllocator() override;

  std::string Name() override;
  void* AllocateRaw(size_t alignment, size_t num_bytes) override;
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
  const std::string name_;
  const std::unique_ptr<Engine> engine_;
  KernelPins* const pins_;
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_LMS_ALLOCATOR_H_
