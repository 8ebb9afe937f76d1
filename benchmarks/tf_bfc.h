// TfBfcAllocator: TensorFlow 2.21's own allocator, the baseline the engine
// is measured against.
//
// It is the allocator the stock CPU device builds with
// TF_CPU_ALLOCATOR_USE_BFC=true: a tsl::BFCAllocator (best-fit with
// coalescing, xla/tsl/framework/bfc_allocator.h) growing on demand over a
// tensorflow::BasicCPUAllocator (aligned malloc), taken straight from
// libtensorflow_framework.so.2.
//
// This header names no TensorFlow type, so that only tf_bfc.cc is compiled
// against TensorFlow's headers (tens of seconds); the benchmark itself
// recompiles in a moment.
#ifndef TENSORFLOW_LMS_ALLOCATOR_BENCHMARKS_TF_BFC_H_
#define TENSORFLOW_LMS_ALLOCATOR_BENCHMARKS_TF_BFC_H_

#include <cstddef>
#include <memory>

namespace tsl {
class Allocator;
}  // namespace tsl

namespace lms_bench {

class TfBfcAllocator {
 public:
  // The BFC allocator refuses to hold more than `memory_limit_bytes`; it
  // grows its regions as requests come (allow_growth), as TensorFlow's CPU
  // device does.
  explicit TfBfcAllocator(size_t memory_limit_bytes);
  ~TfBfcAllocator();
  TfBfcAllocator(const TfBfcAllocator&) = delete;
  TfBfcAllocator& operator=(const TfBfcAllocator&) = delete;

  // TensorFlow's own call: AllocateRaw with Allocator::kAllocatorAlignment
  // (64 bytes). Returns nullptr when the limit is reached.
  void* Allocate(size_t bytes);
  void Free(void* ptr);

  // The most memory the allocator has held (its regions), in bytes.
  size_t PeakPoolBytes();

 private:
  std::unique_ptr<tsl::Allocator> allocator_;
};

}  // namespace lms_bench

#endif  // TENSORFLOW_LMS_ALLOCATOR_BENCHMARKS_TF_BFC_H_
