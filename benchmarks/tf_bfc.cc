// The only translation unit that includes TensorFlow headers (see tf_bfc.h).
#include "tf_bfc.h"

#include <string>

#include "tensorflow/core/common_runtime/pool_allocator.h"
#include "tsl/platform/numa.h"
#include "xla/tsl/framework/bfc_allocator.h"

namespace lms_bench {

TfBfcAllocator::TfBfcAllocator(size_t memory_limit_bytes) {
  tsl::BFCAllocator::Options options;
  options.allow_growth = true;
  // A failed request should fail at once, not wait for another thread to
  // free memory: the benchmark has no other thread.
  options.allow_retry_on_failure = false;
  auto* sub_allocator = new tensorflow::BasicCPUAllocator(
      tsl::port::kNUMANoAffinity, /*alloc_visitors=*/{}, /*free_visitors=*/{});
  allocator_ = std::make_unique<tsl::BFCAllocator>(
      std::unique_ptr<tsl::SubAllocator>(sub_allocator), memory_limit_bytes,
      "bench_bfc", options);
}

// Defined here, where tsl::Allocator is complete, for the unique_ptr.
TfBfcAllocator::~TfBfcAllocator() = default;

void* TfBfcAllocator::Allocate(size_t bytes) {
  return allocator_->AllocateRaw(tsl::Allocator::kAllocatorAlignment, bytes);
}

void TfBfcAllocator::Free(void* ptr) { allocator_->DeallocateRaw(ptr); }

}  // namespace lms_bench
