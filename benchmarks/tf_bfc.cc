// The only translation unit that includes TensorFlow headers (see tf_bfc.h).
#include "tf_bfc.h"

#include <optional>
#include <string>

#include "tensorflow/core/common_runtime/pool_allocator.h"
#include "tsl/platform/numa.h"
#include "xla/tsl/framework/bfc_allocator.h"

namespace lms_bench {

TfBfcAllocator::TfBfcAllocator(size_t memory_limit_bytes) {
  // The options TensorFlow's ProcessState gives its CPU BFC allocator: growth
  // on, everything else default (retry on failure included; no request of
  // the benchmark fails, so the retry path only costs its fast-path check).
  tsl::BFCAllocator::Options options;
  options.allow_growth = true;
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

size_t TfBfcAllocator::PeakPoolBytes() {
  const std::optional<tsl::AllocatorStats> stats = allocator_->GetStats();
  return stats && stats->peak_pool_bytes ? static_cast<size_t>(*stats->peak_pool_bytes) : 0;
}

}  // namespace lms_bench
