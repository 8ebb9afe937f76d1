// The timing model's presets, clock and engines (Note [Timing model] in
// timing.h).
#include "timing.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "engine/mutex.h"
#include "knobs.h"

namespace lms {
namespace cu {
namespace fake {
namespace timing {
namespace {

constexpr int kCalls = static_cast<int>(Call::kCount);
constexpr int kEngines = static_cast<int>(Engine::kCount);

// A call's host cost: `per_handle` + `per_2mib` for each 2 MiB of the handle,
// in nanoseconds.
struct Cost {
  double per_handle = 0;
  double per_2mib = 0;
};

struct Preset {
  const char* name;
  Cost device[kCalls];  // on device-located memory (the VMM calls)
  Cost host[kCalls];    // on host-located memory; the same as device for the others
  double copy_gb_per_s[kEngines];
};

// The VMM calls: a line through our driver_timing rows for 2 MiB and 32 MiB
// handles (per handle = the 2 MiB row minus one 2 MiB share; "access" is
// "map + access, a call a handle" minus "map"). Copies: cudaMemcpyAsync from
// pinned memory, 1 GiB, best of 3. Launches and event calls: assumed (no GPU
// run measured them), the same on both.
//   h200: benchmarks/results/gpu-check-engine-h200-host-runs.log, driver 580.
//   h100: benchmarks/results/gpu-check-engine-h100-eviction-overlap.log.
#define LMS_FIXED_COSTS                                                      \
  /* kLaunch */ {5000, 0}, /* kRecord */ {2000, 0}, /* kWait */ {2000, 0}, \
      /* kSync */ {5000, 0}
const Preset kPresets[] = {
    {"h200",
     // kCreate, kRelease, kMap, kAccess, kUnmap
     {{14000, 0}, {11800, 860}, {1400, 0}, {40200, 0}, {23900, 750}, LMS_FIXED_COSTS},
     {{64600, 425100}, {11300, 40600}, {800, 0}, {55400, 19200}, {38600, 3740},
      LMS_FIXED_COSTS},
     // compute, to host, to device, on device (assumed)
     {0, 55.1, 55.3, 1000}},
    {"h100",
     {{13400, 0}, {13200, 1320}, {1600, 0}, {34400, 0}, {22000, 0}, LMS_FIXED_COSTS},
     {{219000, 350500}, {12200, 57300}, {900, 0}, {47000, 22200}, {34200, 4280},
      LMS_FIXED_COSTS},
     {0, 54.7, 54.8, 1000}},
};
#undef LMS_FIXED_COSTS

std::atomic<bool> g_enabled{false};
Mutex g_mu;
const Preset* g_preset LMS_GUARDED_BY(g_mu) = &kPresets[0];
Totals g_totals LMS_GUARDED_BY(g_mu);
uint64_t g_engine_free[kMaxDevices][kEngines] LMS_GUARDED_BY(g_mu) = {};
// Each modeled thread's clock (Totals::host_now_ns is clock 0's).
uint64_t g_clock[kClocks] LMS_GUARDED_BY(g_mu) = {};
// When the driver ends the last VMM call, on any clock.
uint64_t g_driver_free LMS_GUARDED_BY(g_mu) = 0;
// FreeVmm's mask: bit 0 device-located memory; host-located memory's maps
// (bit 1) and creates (bit 2); every unmap (bit 3).
int g_free_vmm LMS_GUARDED_BY(g_mu) = 0;
// The clock the calling thread charges, and whether it selected one.
thread_local int t_clock = 0;
thread_local bool t_chose = false;
// The clock of the threads that never selected one (OtherThreadsClock).
int g_other_clock LMS_GUARDED_BY(g_mu) = 0;

uint64_t& Now() LMS_EXCLUSIVE_LOCKS_REQUIRED(g_mu) {
  if (t_chose || g_other_clock == 0) return g_clock[t_clock];
  // Handed over by clock 0's thread: no sooner than its time now.
  uint64_t& now = g_clock[g_other_clock];
  now = std::max(now, g_clock[0]);
  return now;
}

bool IsVmm(Call call) {
  switch (call) {
    case Call::kCreate:
    case Call::kRelease:
    case Call::kMap:
    case Call::kAccess:
    case Call::kUnmap:
      return true;
    default:
      return false;
  }
}

}  // namespace

bool Enabled() { return g_enabled.load(std::memory_order_relaxed); }

bool Enable(const char* preset) {
  for (const Preset& p : kPresets) {
    if (preset == nullptr || std::strcmp(p.name, preset) != 0) continue;
    MutexLock lock(g_mu);
    g_preset = &p;
    g_totals = Totals();
    std::fill(&g_engine_free[0][0], &g_engine_free[0][0] + kMaxDevices * kEngines, 0);
    std::fill(g_clock, g_clock + kClocks, 0);
    g_driver_free = 0;
    g_free_vmm = 0;
    g_other_clock = 0;
    g_enabled = true;
    return true;
  }
  return false;
}

void Disable() { g_enabled = false; }

bool UseClock(int clock, uint64_t not_before_ns) {
  if (clock < 0 || clock >= kClocks) return false;
  MutexLock lock(g_mu);
  t_clock = clock;
  t_chose = true;
  uint64_t& now = Now();
  now = std::max(now, not_before_ns);
  return true;
}

bool OtherThreadsClock(int clock) {
  if (clock < 0 || clock >= kClocks) return false;
  MutexLock lock(g_mu);
  g_other_clock = clock;
  return true;
}

uint64_t ClockNow(int clock) {
  if (clock < 0 || clock >= kClocks) return 0;
  MutexLock lock(g_mu);
  return g_clock[clock];
}

// An other thread's VMM call waits, in real time, until clock 0 has reached
// the end of that thread's last call, or kOtherThreadPatience has passed
// (clock 0's thread may be blocked on it, or idle). A real thread spends its
// call's time in the call; here calls take no real time, so without this a
// thread with many calls to make would book the driver far ahead of clock
// 0 in an instant, and clock 0's next VMM call would wait for all of them
// rather than the one under way.
constexpr auto kOtherThreadPatience = std::chrono::milliseconds(2);

bool IsOtherThread() LMS_EXCLUSIVE_LOCKS_REQUIRED(g_mu) {
  return !t_chose && g_other_clock != 0;
}

void WaitForClockZero() LMS_EXCLUSIVE_LOCKS_REQUIRED(g_mu) {
  const auto give_up = std::chrono::steady_clock::now() + kOtherThreadPatience;
  while (g_clock[g_other_clock] > g_clock[0] && std::chrono::steady_clock::now() < give_up) {
    g_mu.Unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    g_mu.Lock();
  }
}

void Charge(Call call, bool host_memory, size_t handle_bytes) {
  if (!Enabled()) return;
  MutexLock lock(g_mu);
  if (IsVmm(call) && IsOtherThread()) WaitForClockZero();
  if (IsVmm(call)) {
    const bool creates = call == Call::kCreate || call == Call::kRelease;
    const int bit = !host_memory ? 0 : creates ? 2 : 1;
    if (((g_free_vmm >> bit) & 1) != 0) return;
    if (call == Call::kUnmap && (g_free_vmm & 8) != 0) return;
  }
  const int c = static_cast<int>(call);
  const Cost& cost = host_memory ? g_preset->host[c] : g_preset->device[c];
  const uint64_t ns = static_cast<uint64_t>(
      cost.per_handle + cost.per_2mib * static_cast<double>(handle_bytes) / (2 << 20));
  uint64_t& now = Now();
  if (IsVmm(call)) {
    if (g_driver_free > now) {
      g_totals.driver_wait_ns += g_driver_free - now;
      now = g_driver_free;
    }
    g_driver_free = now + ns;
  }
  now += ns;
  g_totals.host_call_ns[c] += ns;
}

void FreeVmm(int mask) {
  MutexLock lock(g_mu);
  g_free_vmm = mask & 15;
}

void ChargeHostWork(uint64_t ns) {
  if (!Enabled()) return;
  MutexLock lock(g_mu);
  Now() += ns;
  g_totals.host_work_ns += ns;
}

uint64_t HostNow() {
  MutexLock lock(g_mu);
  return Now();
}

void HostWaitUntil(uint64_t done_ns) {
  if (!Enabled()) return;
  {
    MutexLock lock(g_mu);
    ++g_totals.host_waits;
    uint64_t& now = Now();
    if (done_ns > now) {
      g_totals.host_wait_ns += done_ns - now;
      now = done_ns;
    }
  }
  Charge(Call::kSync);
}

uint64_t Schedule(uint64_t tail, int device, Engine engine, uint64_t ns) {
  MutexLock lock(g_mu);
  const uint64_t now = Now();
  uint64_t start = std::max(tail, now);
  if (engine == Engine::kCount) return start;
  const int e = static_cast<int>(engine);
  uint64_t& engine_free = g_engine_free[std::clamp(device, 0, kMaxDevices - 1)][e];
  if (engine == Engine::kCompute && engine_free > 0 && start > engine_free) {
    // The engine ran a kernel before (not the first since Enable) and now
    // idles until this one can start: late on the host, or held on its
    // stream.
    (tail > now ? g_totals.compute_idle_stream_ns : g_totals.compute_idle_host_ns) +=
        start - engine_free;
  }
  start = std::max(start, engine_free);
  engine_free = start + ns;
  g_totals.busy_ns[e] += ns;
  return start + ns;
}

uint64_t CopyNs(Engine engine, size_t bytes) {
  MutexLock lock(g_mu);
  const double gb_per_s = g_preset->copy_gb_per_s[static_cast<int>(engine)];
  return gb_per_s > 0 ? static_cast<uint64_t>(static_cast<double>(bytes) / gb_per_s) : 0;
}

Totals GetTotals() {
  MutexLock lock(g_mu);
  Totals t = g_totals;
  t.host_now_ns = g_clock[0];
  return t;
}

}  // namespace timing
}  // namespace fake
}  // namespace cu
}  // namespace lms
