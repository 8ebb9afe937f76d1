#include "tf_adapter/lms_allocator.h"

#include <atomic>
#include <string>
#include <utility>

#include "tf_adapter/kernel_pins.h"
#include "tf_adapter/outside_kernel.h"
#include "tsl/platform/logging.h"

namespace lms {
namespace {

// The reason of this thread's last failed allocation and the allocator that
// failed it, until that allocator's next success on this thread. TensorFlow
// reads it through that allocator's Name() right after the failure, on the
// same thread; another allocator (another GPU) never shows it.
struct LastFailure {
  const LmsAllocator* allocator = nullptr;
  std::string reason;

  void Set(const LmsAllocator* failed, std::string why) {
    allocator = failed;
    reason = std::move(why);
  }
  void ClearFor(const LmsAllocator* served) {
    if (allocator == served) Set(nullptr, std::string());
  }
};
thread_local LastFailure t_last_failure;

// One out-of-memory error fails many allocations at once; report the first
// few and then every power of two, so the reason is seen but not repeated.
// Counts this failure and returns its number if it should be reported, else 0.
uint64_t FailureToReport(std::atomic<uint64_t>* failures) {
  const uint64_t n = failures->fetch_add(1, std::memory_order_relaxed) + 1;
  return n <= 3 || (n & (n - 1)) == 0 ? n : 0;
}

void ReportFailure(size_t num_bytes, const Status& status) {
  static std::atomic<uint64_t> failures{0};
  const uint64_t n = FailureToReport(&failures);
  if (n == 0) return;
  // TensorFlow's logging, so TF_CPP_MIN_LOG_LEVEL applies; the OOM error
  // TensorFlow raises carries the reason too (Name()).
  LOG(WARNING) << "tensorflow_lms_allocator: allocation of " << num_bytes
               << " bytes failed (failure " << n << " in this process): "
               << status.message();
}

}  // namespace

LmsAllocator::LmsAllocator(std::string name, std::unique_ptr<Engine> engine,
                           KernelPins* pins)
    : name_(std::move(name)), engine_(std::move(engine)), pins_(pins) {
  engine_->SetActivityObserver(TraceMeObserver::Get());
}

LmsAllocator::~LmsAllocator() = default;

std::string LmsAllocator::Name() {
  if (t_last_failure.allocator != this) return name_;
  return name_ + " (" + t_last_failure.reason + ")";
}

void* LmsAllocator::AllocateRaw(size_t alignment, size_t num_bytes) {
  return Allocate(alignment, num_bytes, /*retry_on_failure=*/true, /*checked=*/false);
}

void* LmsAllocator::AllocateRaw(size_t alignment, size_t num_bytes,
                                const tsl::AllocationAttributes& attributes) {
  // OpKernelContext's and OpKernelConstruction's allocate_* set
  // allocation_will_be_logged, and check what they get.
  return Allocate(alignment, num_bytes, attributes.retry_on_failure,
                  attributes.allocation_will_be_logged);
}

void* LmsAllocator::Allocate(size_t alignment, size_t num_bytes, bool retry_on_failure,
                             bool checked) {
  if (num_bytes == 0) return nullptr;  // as TensorFlow's BFC allocator does
  const bool in_kernel = pins_ != nullptr && pins_->InKernel();
  Status status;
  uint64_t id = 0;
  void* ptr = nullptr;
  // The engine meets the alignment by placement (small objects are 256-byte
  // aligned, large ones granule aligned) and records num_bytes as requested.
  // Outside a kernel its writer is not pinned: unclaimed until a kernel pins
  // it (Note [Writers outside kernels] in engine.h).
  const Hold hold = in_kernel ? Hold::kPin : Hold::kWriter;
  // An optional request (no retry_on_failure: cuDNN's autotuning scratch and
  // workspaces, whose kernel falls back to an algorithm without) evicts
  // within its step's allowance and never waits for other kernels (Note
  // [Optional requests] in engine.h).
  const bool optional = !retry_on_failure;
  const int64_t step = optional && pins_ != nullptr ? pins_->CurrentStep() : 0;
  auto attempt = [&] {
    Status s;
    ptr = engine_->Allocate(num_bytes, hold, &s, &id, alignment, optional, step);
    return s;
  };
  KernelPins::Outcome outcome = KernelPins::Outcome::kDone;
  // A kernel's request larger than the device is never worth a wait (nor
  // one on TensorFlow's event threads: RetryWhileOthersRelease makes one
  // attempt there).
  const bool fits_device = num_bytes <= engine_->device_granules() * engine_->granule_bytes();
  const bool may_wait = !in_kernel || fits_device;
  status = pins_ != nullptr && retry_on_failure && may_wait
               ? pins_->RetryWhileOthersRelease(attempt, &outcome)
               : attempt();
  if (!fits_device) outcome = KernelPins::Outcome::kNoRelease;
  bool pinned = in_kernel;
  // Outside a kernel, host memory is offered below (HostFallback).
  if (ptr == nullptr && in_kernel && retry_on_failure &&
      outcome != KernelPins::Outcome::kDone &&
      status.code() == StatusCode::kResourceExhausted && engine_->lms_enabled()) {
    ptr = AllocateInHostMemory(num_bytes, status, &status, &id, &pinned);
  }
  if (ptr == nullptr) {
    t_last_failure.Set(this, std::string(status.message()));
    // Outside a kernel, or inside one but not through its OpKernelContext,
    // nobody may check for null (Note [Allocations outside kernels] in
    // outside_kernel.h): serve host memory instead, unless the caller needs
    // device memory and checks. An optional request (no retry_on_failure:
    // scratch space a kernel can do without) is always checked.
    // Only where the device can use host memory (the emulated device): a
    // GPU given a pageable host pointer as device memory faults.
    const bool unchecked =
        !optional && (!in_kernel || (!checked && !pins_->InXlaKernel()));
    if (unchecked && engine_->backend().HostCanTouch()) {
      ptr = HostFallback::Allocate(alignment, num_bytes, Name());
      if (ptr != nullptr) {
        t_last_failure.ClearFor(this);  // the request was served
        return ptr;
      }
    }
    ReportFailure(num_bytes, status);
    return nullptr;
  }
  t_last_failure.ClearFor(this);
  if (pinned && engine_->Owns(ptr)) {
    pins_->RecordAllocation(ptr, id, num_bytes);
  } else if (in_kernel) {
    // Placed in host memory: still part of the kernel's set, which the
    // device should hold next time (Note [Kernels admitted by their last
    // set] in kernel_pins.h).
    pins_->CountInKernelSet(num_bytes);
  }
  if (ProfilerRecording()) {
    RecordForProfiler(MemoryEvent::kAllocation, ptr, num_bytes, engine_->AllocatedSize(ptr));
  }
  return ptr;
}

void* LmsAllocator::AllocateInHostMemory(size_t num_bytes, const Status& why,
                                         Status* status, uint64_t* id, bool* pinned) {
  // A unit of its own (granule alignment), unpinned, so the engine may place
  // it in host memory. A small object would share a page, which a kernel
  // pinning a neighbour could page in under this kernel's writes. Unclaimed,
  // so nothing evicts or prefetches it under them either.
  Status placed;
  void* ptr = engine_->Allocate(num_bytes, Hold::kWriter, &placed, id,
                                engine_->granule_bytes());
  if (ptr == nullptr) {
    *status = Status(why.code(), why.message() + "; host memory could not hold it either: " +
                                     placed.message());
    return nullptr;
  }
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true, std::memory_order_relaxed)) {
    const char* kernel = StrictMonitor::ThreadLabel();
    LOG(WARNING) << "tensorflow_lms_allocator: kernel "
                 << (kernel != nullptr ? kernel : "(unnamed)") << " needs "
                 << FormatBytes(num_bytes) << " that " << name_
                 << " cannot hold now (" << why.message()
                 << "). It is placed in host memory at its device address: the kernel reads "
                    "and writes it in place, over the bus on a GPU (slow). A larger device, "
                    "a smaller batch or fewer tensors held at once avoids this "
                    "(said once per process; get_statistics()['num_overflow_placements'] counts "
                    "such placements)";
  }
  AllocationInfo info;
  // Resident after all (memory came back since the last attempt): pinned as
  // usual before the kernel sees it, so no eviction runs under its writes.
  // Evicted: only this kernel knows the address until it returns it, so
  // nothing pages it in under its writes; later users pin it and page it in.
  *pinned = engine_->Inspect(ptr, &info).ok() && !info.evicted && engine_->Pin(ptr, id).ok();
  if (!*pinned) engine_->NoteOverflowPlacement();
  return ptr;
}

void LmsAllocator::DeallocateRaw(void* ptr) {
  if (ptr == nullptr) return;
  if (!engine_->Owns(ptr) && HostFallback::Free(ptr)) return;
  // A variable's buffer freed inside an XLA kernel: decided when the kernel
  // ends (Note [XLA frees live variables on its error path]).
  if (pins_ != nullptr && pins_->live_variables().DeferFree(ptr)) return;
  // Note [Memory events for the profiler]: the sizes before the free, the
  // figures after it, as BFC records them.
  AllocationInfo freed;
  const bool recording = ProfilerRecording() && engine_->Inspect(ptr, &freed).ok();
  Status s = engine_->Free(ptr);
  if (!s.ok()) LOG(ERROR) << "tensorflow_lms_allocator: " << s.ToString();
  if (recording && s.ok()) {
    RecordForProfiler(MemoryEvent::kDeallocation, ptr, freed.requested_bytes,
                      freed.allocated_bytes);
  }
}

size_t LmsAllocator::RequestedSize(const void* ptr) const {
  if (!engine_->Owns(ptr)) return HostFallback::RequestedSize(ptr);
  return engine_->RequestedSize(ptr);
}

size_t LmsAllocator::AllocatedSize(const void* ptr) const {
  if (!engine_->Owns(ptr)) return HostFallback::RequestedSize(ptr);
  return engine_->AllocatedSize(ptr);
}

int64_t LmsAllocator::AllocationId(const void* ptr) const {
  return static_cast<int64_t>(engine_->AllocationId(ptr));
}

// Note [The limit TensorFlow sees]. TensorFlow makes a GPU device's memory
// (DeviceAttributes.memory_limit, gpu_device.cc) from bytes_limit, and
// Grappler's virtual cluster takes that as the device's memory: for a graph
// whose estimated peak is above it, the memory optimizer's swapping pass
// (on by default, GPU devices only, and TF2 offers no switch for it) inserts
// _CopyFromGpuToHost/_CopyFromHostToGpu pairs through TensorFlow's pinned
// host allocator, a second swapper fighting LMS: its copy-out kernel pins,
// and so pages back in, what LMS evicted. With LMS on, what the device holds
// is its memory and the host budget, and that is the limit TensorFlow sees;
// the bytes_limit statistic stays the device's capacity. Grappler then
// swaps only a graph LMS could not hold either.
int64_t LmsAllocator::LimitTensorFlowSees(const Statistics& s) const {
  if (!engine_->lms_enabled()) return s.bytes_limit;
  return s.bytes_limit +
         static_cast<int64_t>(engine_->host_granules() * engine_->granule_bytes());
}

void LmsAllocator::RecordForProfiler(MemoryEvent event, const void* ptr, size_t requested_bytes,
                                     size_t allocation_bytes) const {
  const Statistics s = engine_->GetStatistics();
  RecordMemoryEvent(event, name_, s, LimitTensorFlowSees(s), ptr, requested_bytes,
                    allocation_bytes);
}

std::optional<tsl::AllocatorStats> LmsAllocator::GetStats() {
  const Statistics s = engine_->GetStatistics();
  tsl::AllocatorStats out;
  out.num_allocs = s.num_allocs;
  out.bytes_in_use = s.bytes_in_use;
  out.peak_bytes_in_use = s.peak_bytes_in_use;
  out.largest_alloc_size = s.largest_alloc_size;
  out.bytes_limit = LimitTensorFlowSees(s);
  out.bytes_reserved = s.bytes_reserved;
  out.peak_bytes_reserved = s.peak_bytes_reserved;
  out.bytes_reservable_limit = s.bytes_reservable_limit;
  out.pool_bytes = s.bytes_reserved;
  out.peak_pool_bytes = s.peak_bytes_reserved;
  return out;
}

bool LmsAllocator::ClearStats() {
  engine_->ResetPeaks();
  return true;
}

UnavailableDeviceAllocator::UnavailableDeviceAllocator(std::string name,
                                                       std::string reason)
    : name_(std::move(name)), reason_(std::move(reason)) {}

void* UnavailableDeviceAllocator::AllocateRaw(size_t /*alignment*/, size_t num_bytes) {
  static std::atomic<uint64_t> failures{0};
  if (FailureToReport(&failures) != 0) {
    LOG(ERROR) << "tensorflow_lms_allocator: allocation of " << num_bytes
               << " bytes failed: " << reason_;
  }
  return nullptr;
}

void UnavailableDeviceAllocator::DeallocateRaw(void* ptr) {
  // Nothing was ever handed out.
  if (ptr != nullptr) {
    LOG(ERROR) << "tensorflow_lms_allocator: " << name_
               << " was asked to free an address it never handed out";
  }
}

}  // namespace lms
