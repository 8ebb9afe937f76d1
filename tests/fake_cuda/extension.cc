// The fake_cuda_* knobs, observers, checker access and reset of fake_cuda.h
// (kernels and aliases live with the work and the address space).
#include <cstdlib>
#include <cstring>

#include "address_space.h"
#include "checker.h"
#include "context.h"
#include "entry_points.h"
#include "fake_cuda.h"
#include "knobs.h"
#include "memory_state.h"
#include "streams.h"
#include "timing.h"

namespace lms {
namespace cu {
namespace fake {
namespace {

// Loaded once with the library: the defaults a test starts from.
const bool kKnobsLoaded = (LoadKnobsFromEnvironment(), true);

// Handles (released or not), mappings, reservations, streams and events.
size_t LiveObjects() {
  MemoryState& m = Memory();
  size_t n = LiveStreams() + LiveEvents();
  MutexLock lock(m.mu);
  return n + m.handles.size() + m.mappings.size() + m.reservations.size();
}

}  // namespace
}  // namespace fake
}  // namespace cu
}  // namespace lms

namespace fake = lms::cu::fake;

FAKE_CUDA_EXPORT size_t fake_cuda_violation_count(void) noexcept {
  return fake::ViolationCount();
}

FAKE_CUDA_EXPORT char* fake_cuda_violations(void) noexcept {
  return strdup(fake::ViolationText().c_str());
}

FAKE_CUDA_EXPORT void fake_cuda_clear_violations(void) noexcept { fake::ClearViolations(); }

FAKE_CUDA_EXPORT void fake_cuda_set_copy_delay_us(unsigned microseconds) noexcept {
  fake::GetKnobs().copy_delay_us = microseconds;
}

FAKE_CUDA_EXPORT void fake_cuda_hold_unmaps(int hold) noexcept { fake::HoldUnmaps(hold != 0); }

FAKE_CUDA_EXPORT int fake_cuda_unmaps_waiting(void) noexcept { return fake::UnmapsWaiting(); }

FAKE_CUDA_EXPORT void fake_cuda_fail_nth_mem_create(int n) noexcept {
  fake::GetKnobs().fail_create_countdown = n > 0 ? n : 0;
}

FAKE_CUDA_EXPORT void fake_cuda_fail_nth_mem_map(int n, int error) noexcept {
  fake::GetKnobs().fail_map_error = error;
  fake::GetKnobs().fail_map_countdown = n > 0 ? n : 0;
}

FAKE_CUDA_EXPORT void fake_cuda_set_host_vmm_supported(int supported) noexcept {
  fake::GetKnobs().host_vmm_supported = supported != 0;
}

FAKE_CUDA_EXPORT void fake_cuda_refuse_host_create(int mask) noexcept {
  fake::GetKnobs().refuse_host_create = mask & 3;
}

FAKE_CUDA_EXPORT void fake_cuda_set_map_offset_zero_only(int zero_only) noexcept {
  fake::GetKnobs().map_offset_zero_only = zero_only != 0;
}

FAKE_CUDA_EXPORT void fake_cuda_set_driver_version(int version) noexcept {
  fake::GetKnobs().driver_version = version;
}

FAKE_CUDA_EXPORT int fake_cuda_set_device_count(int count) noexcept {
  if (count < 0 || count > fake::kMaxDevices || fake::LiveObjects() != 0) return -1;
  fake::GetKnobs().device_count = count;
  return 0;
}

FAKE_CUDA_EXPORT int fake_cuda_set_peer_access(int a, int b, int can_access) noexcept {
  if (a < 0 || a >= fake::kMaxDevices || b < 0 || b >= fake::kMaxDevices || a == b) return -1;
  fake::SetPeerAccess(a, b, can_access != 0);
  return 0;
}

FAKE_CUDA_EXPORT unsigned long long fake_cuda_staged_copies(void) noexcept {
  return fake::StagedCopies();
}

FAKE_CUDA_EXPORT int fake_cuda_set_granularity(size_t bytes) noexcept {
  if (bytes < 4096 || (bytes & (bytes - 1)) != 0) return -1;
  fake::MemoryState& m = fake::Memory();
  lms::MutexLock lock(m.mu);
  if (!m.handles.empty() || !m.mappings.empty() || !m.reservations.empty()) return -1;
  fake::GetKnobs().granularity = bytes;
  return 0;
}

FAKE_CUDA_EXPORT int fake_cuda_set_pool_capacity(int pool, size_t bytes) noexcept {
  if (pool == FAKE_CUDA_POOL_DEVICE) {
    fake::GetKnobs().device_capacity = bytes;
  } else if (pool == FAKE_CUDA_POOL_HOST) {
    fake::GetKnobs().host_capacity = bytes;
  } else {
    return -1;
  }
  return 0;
}

FAKE_CUDA_EXPORT size_t fake_cuda_live_handles(void) noexcept {
  fake::MemoryState& m = fake::Memory();
  lms::MutexLock lock(m.mu);
  size_t n = 0;
  for (const auto& [id, h] : m.handles) n += h.released ? 0 : 1;
  return n;
}

FAKE_CUDA_EXPORT size_t fake_cuda_live_mappings(void) noexcept {
  fake::MemoryState& m = fake::Memory();
  lms::MutexLock lock(m.mu);
  return m.mappings.size();
}

FAKE_CUDA_EXPORT size_t fake_cuda_live_reservations(void) noexcept {
  fake::MemoryState& m = fake::Memory();
  lms::MutexLock lock(m.mu);
  return m.reservations.size();
}

FAKE_CUDA_EXPORT size_t fake_cuda_live_streams(void) noexcept { return fake::LiveStreams(); }

FAKE_CUDA_EXPORT size_t fake_cuda_live_events(void) noexcept { return fake::LiveEvents(); }

FAKE_CUDA_EXPORT size_t fake_cuda_work_in_flight(void) noexcept {
  return fake::WorkInFlight();
}

FAKE_CUDA_EXPORT size_t fake_cuda_work_running(void) noexcept { return fake::WorkRunning(); }

FAKE_CUDA_EXPORT size_t fake_cuda_pool_bytes_in_use(int pool) noexcept {
  fake::MemoryState& m = fake::Memory();
  lms::MutexLock lock(m.mu);
  if (pool != FAKE_CUDA_POOL_DEVICE && pool != FAKE_CUDA_POOL_HOST) return 0;
  return fake::PoolOf(m, pool == FAKE_CUDA_POOL_HOST).used;
}

FAKE_CUDA_EXPORT int fake_cuda_timing_enable(const char* preset) noexcept {
  return fake::timing::Enable(preset) ? 0 : -1;
}

FAKE_CUDA_EXPORT void fake_cuda_timing_disable(void) noexcept { fake::timing::Disable(); }

FAKE_CUDA_EXPORT void fake_cuda_timing_host_work(unsigned long long ns) noexcept {
  fake::timing::ChargeHostWork(ns);
}

FAKE_CUDA_EXPORT int fake_cuda_timing_use_clock(int clock,
                                                unsigned long long not_before_ns) noexcept {
  return fake::timing::UseClock(clock, not_before_ns) ? 0 : -1;
}

FAKE_CUDA_EXPORT int fake_cuda_timing_other_threads_clock(int clock) noexcept {
  return fake::timing::OtherThreadsClock(clock) ? 0 : -1;
}

FAKE_CUDA_EXPORT unsigned long long fake_cuda_timing_clock(int clock) noexcept {
  return fake::timing::ClockNow(clock);
}

FAKE_CUDA_EXPORT void fake_cuda_timing_free_vmm(int mask) noexcept {
  fake::timing::FreeVmm(mask);
}

FAKE_CUDA_EXPORT void fake_cuda_timing_totals(fake_cuda_timing* out) noexcept {
  using fake::timing::Call;
  using fake::timing::Engine;
  const fake::timing::Totals t = fake::timing::GetTotals();
  const auto busy = [&](Engine e) { return t.busy_ns[static_cast<int>(e)]; };
  const auto call = [&](Call c) { return t.host_call_ns[static_cast<int>(c)]; };
  out->host_now_ns = t.host_now_ns;
  out->compute_busy_ns = busy(Engine::kCompute);
  out->copy_to_host_busy_ns = busy(Engine::kCopyToHost);
  out->copy_to_device_busy_ns = busy(Engine::kCopyToDevice);
  out->copy_on_device_busy_ns = busy(Engine::kCopyOnDevice);
  out->host_remap_ns = call(Call::kMap) + call(Call::kAccess) + call(Call::kUnmap);
  out->host_create_ns = call(Call::kCreate) + call(Call::kRelease);
  out->host_stream_ns = call(Call::kLaunch) + call(Call::kRecord) + call(Call::kWait) +
                        call(Call::kSync);
  out->host_work_ns = t.host_work_ns;
  out->host_wait_ns = t.host_wait_ns;
  out->host_waits = t.host_waits;
  out->compute_idle_host_ns = t.compute_idle_host_ns;
  out->compute_idle_stream_ns = t.compute_idle_stream_ns;
  out->driver_wait_ns = t.driver_wait_ns;
}

FAKE_CUDA_EXPORT size_t fake_cuda_destroy_all(void) noexcept {
  // Streams first: their queued work may still touch memory.
  const size_t streams_and_events = fake::DestroyAllStreamsAndEvents();
  return streams_and_events + fake::DestroyAllMemory();
}

FAKE_CUDA_EXPORT size_t fake_cuda_reset(void) noexcept {
  if (const size_t live = fake::LiveObjects()) return live;
  fake::LoadKnobsFromEnvironment();
  fake::ClearViolations();
  fake::ResetStagedCopies();
  fake::ResetContexts();
  fake_cuda_reset_call_counts();
  return 0;
}
