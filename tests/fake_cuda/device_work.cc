// Work that touches device memory: copies (cuMemcpyAsync on a stream, the
// synchronous cuMemcpyHtoD / cuMemcpyDtoH) and test "kernels"
// (fake_cuda_launch_kernel). Each is registered with the checker from
// enqueue to completion, with the ranges it touches, and resolves its
// addresses when it executes, not when it is enqueued: a range unmapped or
// without device access at that moment is an illegal address, as on a GPU
// (a violation, and the context's sticky error). One exception, for copies
// only: memory of a device the copying device has no peer path to is moved
// by its own device, staged through host memory (ResolveStaged).
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "address_space.h"
#include "checker.h"
#include "context.h"
#include "entry_points.h"
#include "fake_cuda.h"
#include "knobs.h"
#include "streams.h"
#include "timing.h"

namespace lms {
namespace cu {
namespace fake {
namespace {

std::string Hex(uint64_t value) {
  char text[32];
  std::snprintf(text, sizeof(text), "0x%llx", static_cast<unsigned long long>(value));
  return text;
}

void DelayCopy() {
  if (const unsigned us = GetKnobs().copy_delay_us) usleep(us);
}

// A copy's range the executing device cannot reach: resolved for the device
// holding its memory when the two have no peer path, as the driver then
// stages the copy through host memory and that device moves the bytes (CUDA
// C++ Programming Guide, "Peer-to-Peer Memory Copy": with peer access
// enabled, a copy between two devices "no longer needs to be staged through
// the host"; without it, it is). Null where that does not apply: the range
// is host-located, spans devices, or its device is a peer of the executing
// one (a copy there would use the peer path, and the missing grant faults).
void* ResolveStaged(int executing_device, const DeviceRange& r) {
  const int holder = DeviceHolding(r.address, r.bytes);
  if (holder < 0 || holder == executing_device || CanAccessPeer(executing_device, holder)) {
    return nullptr;
  }
  std::string why;
  return ResolveForDevice(holder, r.address, r.bytes, r.writes, &why);
}

// The alias of each range, or null after recording why `what` may not touch
// it and making CUDA_ERROR_ILLEGAL_ADDRESS the context's sticky error. A
// copy (`copy`) may also reach a range through host staging (ResolveStaged);
// a kernel reaches only what its device was granted.
bool ResolveAll(Context* context, const std::string& what,
                const std::vector<DeviceRange>& ranges, std::vector<void*>* aliases,
                bool copy = false) {
  aliases->clear();
  bool staged = false;
  for (const DeviceRange& r : ranges) {
    std::string why;
    void* alias = ResolveForDevice(context->device, r.address, r.bytes, r.writes, &why);
    if (alias == nullptr && copy) {
      alias = ResolveStaged(context->device, r);
      staged = staged || alias != nullptr;
    }
    if (alias == nullptr) {
      RecordViolation(what + " touches " + DescribeRange(r.address, r.bytes) + ": " +
                      why + " (CUDA_ERROR_ILLEGAL_ADDRESS)");
      SetStickyError(context, CUDA_ERROR_ILLEGAL_ADDRESS);
      return false;
    }
    aliases->push_back(alias);
  }
  if (staged) CountStagedCopy();
  return true;
}

// Runs on the worker: resolve, move the bytes, complete.
void RunCopy(Context* context, uint64_t work, const std::string& what,
             const std::vector<DeviceRange>& ranges) {
  MarkWorkRunning(work);
  std::vector<void*> aliases;
  if (ResolveAll(context, what, ranges, &aliases, /*copy=*/true)) {
    DelayCopy();
    std::shared_lock<std::shared_mutex> moving(AliasMutex());
    std::memmove(aliases[0], aliases[1], ranges[0].bytes);
  }
  CompleteWork(work);
}

// A synchronous copy between host memory and [device, device + bytes).
CUresult CopySync(const char* call, uint64_t device, void* host, size_t bytes,
                  bool to_device) {
  Context* context = nullptr;
  if (CUresult r = RequireContext(&context)) return r;
  if (CUresult sticky = context->sticky_error.load()) return sticky;
  if (bytes == 0) return CUDA_SUCCESS;
  if (host == nullptr || !InsideOneReservation(device, bytes)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const std::string what = std::string(call) + "(" + Hex(device) + ", " +
                           std::to_string(bytes) + ")";
  std::vector<DeviceRange> ranges = {{device, bytes, to_device}};
  const uint64_t work = RegisterWork(what, ranges);
  MarkWorkRunning(work);
  std::vector<void*> aliases;
  const bool ok = ResolveAll(context, what, ranges, &aliases, /*copy=*/true);
  if (ok) {
    DelayCopy();
    std::shared_lock<std::shared_mutex> moving(AliasMutex());
    if (to_device) {
      std::memmove(aliases[0], host, bytes);
    } else {
      std::memmove(host, aliases[0], bytes);
    }
  }
  CompleteWork(work);
  // Synchronous: the host waits for the copy (and for nothing else: the fake
  // has no legacy stream to order it after).
  if (timing::Enabled()) {
    const timing::Engine engine =
        to_device ? timing::Engine::kCopyToDevice : timing::Engine::kCopyToHost;
    timing::HostWaitUntil(timing::Schedule(0, context->device, engine,
                                           timing::CopyNs(engine, bytes)));
  }
  return ok ? CUDA_SUCCESS : CUDA_ERROR_ILLEGAL_ADDRESS;
}

// Which engine of the timing model moves a copy: by where its two ranges'
// memory is located when it is enqueued (what the copy is issued for).
timing::Engine CopyEngine(uint64_t dst, uint64_t src, size_t bytes) {
  const bool to_device = DeviceHolding(dst, bytes) >= 0;
  const bool from_device = DeviceHolding(src, bytes) >= 0;
  if (to_device && !from_device) return timing::Engine::kCopyToDevice;
  if (from_device && !to_device) return timing::Engine::kCopyToHost;
  return timing::Engine::kCopyOnDevice;
}

}  // namespace

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                       CUstream stream) noexcept {
  Context* context = nullptr;
  if (CUresult r = RequireContext(&context)) return r;
  if (bytes == 0) return CUDA_SUCCESS;
  // Addresses must be device addresses now; whether they are mapped is
  // decided when the copy runs.
  if (!InsideOneReservation(dst, bytes) || !InsideOneReservation(src, bytes)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const std::string what = "cuMemcpyAsync(dst=" + Hex(dst) + ", src=" + Hex(src) +
                           ", " + std::to_string(bytes) + ") on stream " +
                           Hex(reinterpret_cast<uintptr_t>(stream));
  std::vector<DeviceRange> ranges = {{dst, bytes, true}, {src, bytes, false}};
  Modeled modeled;
  if (timing::Enabled()) {
    timing::Charge(timing::Call::kLaunch);
    modeled.engine = CopyEngine(dst, src, bytes);
    modeled.ns = timing::CopyNs(modeled.engine, bytes);
  }
  const uint64_t work = RegisterWork(what, ranges);
  const CUresult r = Enqueue(stream, [work, what, ranges](Context* c) {
    RunCopy(c, work, what, ranges);
  }, modeled);
  if (r != CUDA_SUCCESS) CompleteWork(work);
  return r;
}

CUresult cuMemcpyHtoD(CUdeviceptr dst, const void* src, size_t bytes) noexcept {
  return CopySync("cuMemcpyHtoD", dst, const_cast<void*>(src), bytes, true);
}

CUresult cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t bytes) noexcept {
  return CopySync("cuMemcpyDtoH", src, dst, bytes, false);
}

}  // namespace fake
}  // namespace cu
}  // namespace lms

FAKE_CUDA_EXPORT int fake_cuda_launch_kernel(void* stream, void (*fn)(void* user),
                                             void* user, const fake_cuda_range* ranges,
                                             size_t n) noexcept {
  if (fn == nullptr) return lms::cu::CUDA_ERROR_INVALID_VALUE;
  return fake_cuda_launch_kernel_for(stream, 0, fn, user, ranges, n);
}

FAKE_CUDA_EXPORT int fake_cuda_launch_kernel_for(void* stream, unsigned long long duration_ns,
                                                 void (*fn)(void* user), void* user,
                                                 const fake_cuda_range* ranges,
                                                 size_t n) noexcept {
  namespace fake = lms::cu::fake;
  fake::Context* context = nullptr;
  if (lms::cu::CUresult r = fake::RequireContext(&context)) return r;
  if (n > 0 && ranges == nullptr) return lms::cu::CUDA_ERROR_INVALID_VALUE;
  fake::timing::Charge(fake::timing::Call::kLaunch);
  fake::Modeled modeled{fake::timing::Engine::kCompute, duration_ns, 0};
  std::vector<fake::DeviceRange> declared;
  for (size_t i = 0; i < n; ++i) {
    declared.push_back({ranges[i].address, ranges[i].bytes, ranges[i].writes != 0});
  }
  char what[96];
  std::snprintf(what, sizeof(what), "kernel %p(%p) on stream %p",
                reinterpret_cast<void*>(fn), user, stream);
  const uint64_t work = fake::RegisterWork(what, declared);
  const std::string name = what;
  const lms::cu::CUresult r = fake::Enqueue(
      static_cast<lms::cu::CUstream>(stream),
      [work, name, declared, fn, user](fake::Context* c) {
        fake::MarkWorkRunning(work);
        std::vector<void*> aliases;
        if (fake::ResolveAll(c, name, declared, &aliases) && fn != nullptr) fn(user);
        fake::CompleteWork(work);
      },
      modeled);
  if (r != lms::cu::CUDA_SUCCESS) fake::CompleteWork(work);
  return r;
}
