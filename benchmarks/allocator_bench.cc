// Allocator benchmark: the engine against TensorFlow's own BFC allocator.
//
// One allocation trace shaped like a CNN training step is generated once
// (fixed seed) and replayed identically through
//   (a) TensorFlow 2.21's tsl::BFCAllocator over a BasicCPUAllocator
//       (tf_bfc.h), the baseline;
//   (b) the engine (lms::Engine over lms::PosixBackend) with LMS off;
//   (c) the engine with LMS on and a device pool with room to spare;
//   (d) the engine with a device pool of a third of the trace's peak.
// (a)-(c) time plain allocate+free pairs, the figure comparable across
// allocators. (d) pins each allocation while it is in use, as a kernel would
// (allocated pinned and unpinned after; pinned and unpinned around each
// read), so evictions and page-ins really happen; it is reported apart,
// since its time is mostly copies.
//
// Then three figures of the engine alone: pin+unpin of a resident allocation,
// and eviction and page-in bandwidth next to plain memcpy measured in the same
// run over buffers of the same size.
//
// Every figure is the best of several repetitions after a warm-up: the
// machines are shared and have two cores, so the minimum is the figure least
// disturbed by others, and the warm-up keeps one-time costs (growing regions,
// first-touch page faults) out of it.
//
// The last line printed is `alloc_free_ratio_vs_tf_bfc R`, R = (c) / (a).
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/posix_backend.h"
#include "engine/engine.h"
#include "tf_bfc.h"

namespace lms_bench {
namespace {

constexpr size_t kKiB = size_t{1} << 10;
constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kGranule = 2 * kMiB;  // the engine's granule on POSIX

// The trace.
constexpr uint64_t kSeed = 20240617;
constexpr int kLive = 64;              // allocations live at any time
constexpr size_t kSteps = 200000;      // replayed through (a)-(c)
constexpr size_t kPressureSteps = 3000;  // the prefix replayed through (d)

// Repetitions (after one warm-up each).
constexpr int kAllocFreeReps = 7;
constexpr int kPressureReps = 2;
constexpr int kPinUnpinReps = 5;
constexpr int kPinUnpinIters = 2000000;
constexpr int kCopyReps = 5;

// Eviction and page-in bandwidth: kCopyAllocations allocations of
// kCopyBytes each, so one repetition moves 512 MiB each way.
constexpr int kCopyAllocations = 8;
constexpr size_t kCopyBytes = 64 * kMiB;

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "allocator_bench: %s\n", message.c_str());
  std::exit(1);
}

void Check(const lms::Status& status, const char* what) {
  if (!status.ok()) Die(std::string(what) + ": " + status.ToString());
}

void Progress(const char* format, ...) __attribute__((format(printf, 1, 2)));
void Progress(const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::vprintf(format, args);
  va_end(args);
  std::fflush(stdout);  // one line per configuration, as it starts
}

size_t RoundUp(size_t x, size_t to) { return (x + to - 1) / to * to; }

double MiB(size_t bytes) { return static_cast<double>(bytes) / kMiB; }

// ---------------------------------------------------------------------------
// The trace.

// One step of the sliding window: the allocation in `slot` is freed and a new
// one of `bytes` takes its place; then the allocation in `read_slot` (another
// slot) is read. Only (d) acts on reads.
struct Step {
  uint32_t slot;
  uint32_t read_slot;
  size_t bytes;
};

struct Trace {
  std::vector<size_t> initial;  // kLive allocations made before the first step
  std::vector<Step> steps;
};

// Sizes like a CNN's tensors: 60% small (biases, normalisation parameters,
// small activations; log-uniform from 256 B to 64 KiB), 30% mid-sized
// activations and weights (1-9 MiB), 10% large activations (16-48 MiB).
// Sizes are whole float32 elements.
size_t DrawSize(std::mt19937_64& rng) {
  const double kind = std::uniform_real_distribution<double>(0, 1)(rng);
  size_t bytes;
  if (kind < 0.6) {
    bytes = static_cast<size_t>(std::exp(std::uniform_real_distribution<double>(
        std::log(256.0), std::log(64.0 * kKiB))(rng)));
  } else if (kind < 0.9) {
    bytes = std::uniform_int_distribution<size_t>(1 * kMiB, 9 * kMiB)(rng);
  } else {
    bytes = std::uniform_int_distribution<size_t>(16 * kMiB, 48 * kMiB)(rng);
  }
  return RoundUp(bytes, 4);
}

Trace MakeTrace() {
  std::mt19937_64 rng(kSeed);
  Trace trace;
  for (int i = 0; i < kLive; ++i) trace.initial.push_back(DrawSize(rng));
  std::uniform_int_distribution<uint32_t> any_slot(0, kLive - 1);
  std::uniform_int_distribution<uint32_t> other_slot(1, kLive - 1);
  trace.steps.reserve(kSteps);
  for (size_t i = 0; i < kSteps; ++i) {
    Step step;
    step.slot = any_slot(rng);
    step.read_slot = (step.slot + other_slot(rng)) % kLive;
    step.bytes = DrawSize(rng);
    trace.steps.push_back(step);
  }
  return trace;
}

// What the engine takes for a request: whole granules from one granule up,
// 256-byte units below (its small-object region).
size_t EngineBytes(size_t bytes) {
  return bytes >= kGranule ? RoundUp(bytes, kGranule) : RoundUp(bytes, 256);
}

// The largest sum of live bytes over the first `num_steps` steps, sizes
// rounded by `round` (identity for the requested bytes).
template <typename Round>
size_t PeakBytes(const Trace& trace, size_t num_steps, Round round) {
  std::vector<size_t> live(kLive);
  size_t sum = 0;
  for (int i = 0; i < kLive; ++i) sum += live[i] = round(trace.initial[i]);
  size_t peak = sum;
  for (size_t i = 0; i < num_steps; ++i) {
    const Step& step = trace.steps[i];
    sum -= live[step.slot];
    sum += live[step.slot] = round(step.bytes);
    peak = std::max(peak, sum);
  }
  return peak;
}

// ---------------------------------------------------------------------------
// Allocate+free replay, (a)-(c).

// The allocators under test, behind the same two calls. A failed request
// ends the run: the configurations are sized so that none fails.
class BfcUnderTest {
 public:
  explicit BfcUnderTest(TfBfcAllocator* bfc) : bfc_(bfc) {}
  void* Allocate(size_t bytes) {
    void* p = bfc_->Allocate(bytes);
    if (p == nullptr) Die("TensorFlow's BFC allocator refused " + std::to_string(bytes) + " bytes");
    return p;
  }
  void Free(void* ptr) { bfc_->Free(ptr); }

 private:
  TfBfcAllocator* bfc_;
};

class EngineUnderTest {
 public:
  explicit EngineUnderTest(lms::Engine* engine) : engine_(engine) {}
  void* Allocate(size_t bytes) {
    lms::Status status;
    void* p = engine_->Allocate(bytes, /*pin=*/false, &status);
    if (p == nullptr) Die("engine allocate: " + status.ToString());
    return p;
  }
  void Free(void* ptr) { Check(engine_->Free(ptr), "engine free"); }

 private:
  lms::Engine* engine_;
};

// One replay of the whole trace: the initial allocations, every step, and the
// final frees, so allocations and frees pair up.
template <typename Allocator>
void ReplayAllocFree(const Trace& trace, Allocator& allocator) {
  void* live[kLive];
  for (int i = 0; i < kLive; ++i) live[i] = allocator.Allocate(trace.initial[i]);
  for (const Step& step : trace.steps) {
    allocator.Free(live[step.slot]);
    live[step.slot] = allocator.Allocate(step.bytes);
  }
  for (void* p : live) allocator.Free(p);
}

// Best nanoseconds per allocate+free pair. The warm-up replay grows the BFC
// allocator's regions and maps the engine's granules, costs a steady-state
// training loop pays once.
template <typename Allocator>
double BestNsPerPair(const Trace& trace, Allocator& allocator) {
  const double pairs = static_cast<double>(kLive + trace.steps.size());
  ReplayAllocFree(trace, allocator);
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < kAllocFreeReps; ++r) {
    const Clock::time_point start = Clock::now();
    ReplayAllocFree(trace, allocator);
    best = std::min(best, SecondsSince(start) * 1e9 / pairs);
  }
  return best;
}

std::unique_ptr<lms::Engine> MakeEngine(size_t device_bytes, size_t host_bytes,
                                        bool lms_enabled, bool defrag_enabled = false) {
  std::unique_ptr<lms::Backend> backend;
  Check(lms::PosixBackend::Create(kGranule, &backend), "creating the POSIX backend");
  lms::EngineOptions options;
  options.device_bytes = device_bytes;
  options.host_bytes = host_bytes;
  options.lms_enabled = lms_enabled;
  options.defrag_enabled = defrag_enabled;
  std::unique_ptr<lms::Engine> engine;
  Check(lms::Engine::Create(options, std::move(backend), &engine), "creating the engine");
  return engine;
}

// ---------------------------------------------------------------------------
// Under pressure, (d).

// A kernel's protocol: an allocation is pinned while its producer runs
// (allocated pinned, unpinned after) and while a consumer reads it (pinned,
// which pages it in if it was evicted, then unpinned). Returns the first
// failure, naming the step.
lms::Status ReplayPinned(const Trace& trace, size_t num_steps, lms::Engine& engine) {
  auto produce = [&engine](size_t bytes, void** out) {
    lms::Status status;
    *out = engine.Allocate(bytes, /*pin=*/true, &status);
    return *out == nullptr ? status : engine.Unpin(*out, 0);
  };
  auto consume = [&engine](void* ptr) {
    uint64_t id = 0;
    lms::Status status = engine.Pin(ptr, &id);
    return status.ok() ? engine.Unpin(ptr, id) : status;
  };
  void* live[kLive];
  for (int i = 0; i < kLive; ++i) LMS_RETURN_IF_ERROR(produce(trace.initial[i], &live[i]));
  for (size_t i = 0; i < num_steps; ++i) {
    const Step& step = trace.steps[i];
    lms::Status status = engine.Free(live[step.slot]);
    if (status.ok()) status = produce(step.bytes, &live[step.slot]);
    if (status.ok()) status = consume(live[step.read_slot]);
    if (!status.ok()) {
      return lms::Status(status.code(), "step " + std::to_string(i) + " of " +
                                            std::to_string(num_steps) + ": " +
                                            status.message());
    }
  }
  for (void* p : live) LMS_RETURN_IF_ERROR(engine.Free(p));
  return lms::Status::Ok();
}

struct PressureResult {
  bool defrag_enabled = false;
  std::string defrag_off_failure;  // why the engine's defaults failed, if they did
  double us_per_step = 0;
  int64_t evictions = 0;  // per replay
  int64_t page_ins = 0;
  int64_t bytes_moved = 0;  // evicted plus paged in, whole granules
};

// Runs the engine's defaults (defragmentation off) first; if they cannot
// replay the trace, says why and measures with defragmentation on.
PressureResult MeasurePressure(const Trace& trace, size_t num_steps,
                               size_t device_bytes, size_t host_bytes) {
  PressureResult result;
  std::unique_ptr<lms::Engine> engine = MakeEngine(device_bytes, host_bytes, true);
  // The first replay is the warm-up: it faults the pools' pages in.
  const lms::Status defaults = ReplayPinned(trace, num_steps, *engine);
  if (!defaults.ok()) {
    result.defrag_enabled = true;
    result.defrag_off_failure = defaults.ToString();
    engine = MakeEngine(device_bytes, host_bytes, true, /*defrag_enabled=*/true);
    Check(ReplayPinned(trace, num_steps, *engine), "under pressure, defragmentation on");
  }
  result.us_per_step = std::numeric_limits<double>::infinity();
  for (int r = 0; r < kPressureReps; ++r) {
    const lms::Statistics before = engine->GetStatistics();
    const Clock::time_point start = Clock::now();
    Check(ReplayPinned(trace, num_steps, *engine), "under pressure");
    const double seconds = SecondsSince(start);
    const lms::Statistics after = engine->GetStatistics();
    result.us_per_step = std::min(result.us_per_step, seconds * 1e6 / num_steps);
    // The replay is deterministic, so every repetition moves the same bytes.
    result.evictions = after.num_evictions - before.num_evictions;
    result.page_ins = after.num_page_ins - before.num_page_ins;
    result.bytes_moved = (after.bytes_reclaimed - before.bytes_reclaimed) +
                         (after.bytes_paged_in - before.bytes_paged_in);
  }
  return result;
}

// ---------------------------------------------------------------------------
// Engine micro-measurements.

// Best nanoseconds for Pin+Unpin of a resident, inactive allocation: the cost
// a kernel launch pays per tensor when nothing has to move.
double PinUnpinNs() {
  std::unique_ptr<lms::Engine> engine = MakeEngine(256 * kMiB, 0, true);
  lms::Status status;
  void* p = engine->Allocate(kCopyBytes, /*pin=*/false, &status);
  if (p == nullptr) Die("pin+unpin allocation: " + status.ToString());
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < kPinUnpinReps + 1; ++r) {  // the first is the warm-up
    const Clock::time_point start = Clock::now();
    for (int i = 0; i < kPinUnpinIters; ++i) {
      uint64_t id;
      Check(engine->Pin(p, &id), "pin");
      Check(engine->Unpin(p, id), "unpin");
    }
    if (r > 0) best = std::min(best, SecondsSince(start) * 1e9 / kPinUnpinIters);
  }
  Check(engine->Free(p), "free");
  return best;
}

struct Bandwidth {
  double eviction_gbps = 0;
  double page_in_gbps = 0;
  double memcpy_gbps = 0;
};

void* MapAnonymous(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) Die("mmap of " + std::to_string(bytes) + " bytes failed");
  return p;
}

// Eviction and page-in bandwidth of the engine, and memcpy's over buffers of
// the same sizes, interleaved repetition by repetition so that all three see
// the same machine.
Bandwidth MeasureBandwidth() {
  const size_t total = kCopyAllocations * kCopyBytes;
  std::unique_ptr<lms::Engine> engine = MakeEngine(total, total, true);
  std::vector<void*> allocations;
  for (int i = 0; i < kCopyAllocations; ++i) {
    lms::Status status;
    void* p = engine->Allocate(kCopyBytes, /*pin=*/false, &status);
    if (p == nullptr) Die("bandwidth allocation: " + status.ToString());
    std::memset(p, 0x5a + i, kCopyBytes);  // real data in device granules
    allocations.push_back(p);
  }
  // Plain buffers for memcpy, faulted in by the memset (anonymous memory:
  // no transparent huge pages unless madvised, like the engine's pools).
  std::vector<char*> src, dst;
  for (int i = 0; i < kCopyAllocations; ++i) {
    src.push_back(static_cast<char*>(MapAnonymous(kCopyBytes)));
    dst.push_back(static_cast<char*>(MapAnonymous(kCopyBytes)));
    std::memset(src.back(), 0x5a + i, kCopyBytes);
    std::memset(dst.back(), 0, kCopyBytes);
  }

  auto evict_all = [&] {
    for (void* p : allocations) Check(engine->Evict(p), "evict");
  };
  auto page_in_all = [&] {  // a pin pages in; the unpins are not timed
    for (void* p : allocations) Check(engine->Pin(p, nullptr), "pin to page in");
  };
  auto unpin_all = [&] {
    for (void* p : allocations) Check(engine->Unpin(p, 0), "unpin");
  };
  auto copy_all = [&] {
    for (int i = 0; i < kCopyAllocations; ++i) std::memcpy(dst[i], src[i], kCopyBytes);
    asm volatile("" ::: "memory");  // the copies are observable
  };

  // Warm-up: the first cycle faults in the pools' pages through the backend's
  // windows and the host pool's pages.
  evict_all();
  page_in_all();
  unpin_all();
  copy_all();

  double evict_s = std::numeric_limits<double>::infinity();
  double page_in_s = evict_s, copy_s = evict_s;
  for (int r = 0; r < kCopyReps; ++r) {
    Clock::time_point start = Clock::now();
    evict_all();
    evict_s = std::min(evict_s, SecondsSince(start));
    start = Clock::now();
    page_in_all();
    page_in_s = std::min(page_in_s, SecondsSince(start));
    unpin_all();
    start = Clock::now();
    copy_all();
    copy_s = std::min(copy_s, SecondsSince(start));
  }
  // The bytes must have survived the round trips.
  for (int i = 0; i < kCopyAllocations; ++i) {
    const unsigned char* p = static_cast<const unsigned char*>(allocations[i]);
    if (p[0] != 0x5a + i || p[kCopyBytes - 1] != 0x5a + i) Die("eviction lost data");
    if (dst[i][kCopyBytes / 2] != static_cast<char>(0x5a + i)) Die("memcpy lost data");
  }
  for (void* p : allocations) Check(engine->Free(p), "free");
  for (int i = 0; i < kCopyAllocations; ++i) {
    munmap(src[i], kCopyBytes);
    munmap(dst[i], kCopyBytes);
  }
  const double bytes = static_cast<double>(total);
  return Bandwidth{bytes / evict_s / 1e9, bytes / page_in_s / 1e9, bytes / copy_s / 1e9};
}

const char* Verdict(bool met) { return met ? "met" : "MISSED"; }

int Run() {
  const Clock::time_point run_start = Clock::now();
  const Trace trace = MakeTrace();
  auto identity = [](size_t b) { return b; };
  const size_t peak = PeakBytes(trace, kSteps, identity);
  const size_t engine_peak = PeakBytes(trace, kSteps, EngineBytes);
  std::printf("Allocator benchmark: %zu steps of a sliding window of %d live allocations "
              "(seed %" PRIu64 ")\n"
              "  sizes: 60%% 256 B-64 KiB, 30%% 1-9 MiB, 10%% 16-48 MiB; peak %.0f MiB "
              "requested, %.0f MiB in engine granules\n",
              kSteps, kLive, kSeed, MiB(peak), MiB(engine_peak));

  // Room to spare: twice the peak, so neither allocator is ever short.
  const size_t roomy = RoundUp(2 * engine_peak, kGranule);

  Progress("[1/6] (a) TensorFlow BFC allocator, limit %.0f MiB: warm-up + %d replays\n",
           MiB(roomy), kAllocFreeReps);
  double bfc_ns;
  size_t bfc_peak_held;
  {
    TfBfcAllocator bfc(roomy);
    BfcUnderTest under_test(&bfc);
    bfc_ns = BestNsPerPair(trace, under_test);
    bfc_peak_held = bfc.PeakPoolBytes();
  }

  Progress("[2/6] (b) engine, LMS off, device %.0f MiB: warm-up + %d replays\n",
           MiB(roomy), kAllocFreeReps);
  double lms_off_ns;
  lms::Statistics lms_off_stats;
  {
    std::unique_ptr<lms::Engine> engine = MakeEngine(roomy, roomy, false);
    EngineUnderTest under_test(engine.get());
    lms_off_ns = BestNsPerPair(trace, under_test);
    lms_off_stats = engine->GetStatistics();
  }

  Progress("[3/6] (c) engine, LMS on, device %.0f MiB: warm-up + %d replays\n",
           MiB(roomy), kAllocFreeReps);
  double lms_on_ns;
  lms::Statistics lms_on_stats;
  {
    std::unique_ptr<lms::Engine> engine = MakeEngine(roomy, roomy, true);
    EngineUnderTest under_test(engine.get());
    lms_on_ns = BestNsPerPair(trace, under_test);
    lms_on_stats = engine->GetStatistics();
  }

  const size_t pressure_peak = PeakBytes(trace, kPressureSteps, EngineBytes);
  const size_t pressure_device = RoundUp(pressure_peak / 3, kGranule);
  Progress("[4/6] (d) engine under pressure, device %.0f MiB = a third of the %.0f MiB "
           "peak of the first %zu steps: warm-up + %d replays\n",
           MiB(pressure_device), MiB(pressure_peak), kPressureSteps, kPressureReps);
  const PressureResult pressure = MeasurePressure(
      trace, kPressureSteps, pressure_device, RoundUp(2 * pressure_peak, kGranule));

  Progress("[5/6] engine pin+unpin of a resident allocation: %d x %d iterations\n",
           kPinUnpinReps + 1, kPinUnpinIters);
  const double pin_unpin_ns = PinUnpinNs();

  Progress("[6/6] eviction, page-in and memcpy of %d x %.0f MiB: warm-up + %d repetitions\n",
           kCopyAllocations, MiB(kCopyBytes), kCopyReps);
  const Bandwidth bw = MeasureBandwidth();

  const double ratio = lms_on_ns / bfc_ns;
  std::printf("\nAllocate+free pairs, %zu per replay, best of %d replays\n",
              kLive + kSteps, kAllocFreeReps);
  // "held at peak": memory taken from the system (BFC regions) or the
  // device pool (engine granules), against the trace's peak of live bytes.
  std::printf("  %-40s %9s %10s %14s %11s\n", "configuration", "ns/pair", "vs TF BFC",
              "held at peak", "evictions");
  std::printf("  %-40s %9.1f %10.3f %10.0f MiB %11s\n", "(a) TensorFlow BFC (tsl::BFCAllocator)",
              bfc_ns, 1.0, MiB(bfc_peak_held), "-");
  std::printf("  %-40s %9.1f %10.3f %10.0f MiB %11" PRId64 "\n", "(b) engine, LMS off",
              lms_off_ns, lms_off_ns / bfc_ns, MiB(lms_off_stats.peak_bytes_reserved),
              lms_off_stats.num_evictions);
  std::printf("  %-40s %9.1f %10.3f %10.0f MiB %11" PRId64 "\n", "(c) engine, LMS on, no pressure",
              lms_on_ns, ratio, MiB(lms_on_stats.peak_bytes_reserved),
              lms_on_stats.num_evictions);

  std::printf("\nUnder pressure, pinned while in use (first %zu steps, best of %d)\n",
              kPressureSteps, kPressureReps);
  if (pressure.defrag_enabled) {
    std::printf("  with the engine's defaults (defragmentation off) the replay failed:\n"
                "    %s\n  so (d) runs with defragmentation on.\n",
                pressure.defrag_off_failure.c_str());
  }
  std::printf("  (d) engine, device = peak/3%s: %.1f us/step; per replay %" PRId64
              " evictions, %" PRId64 " page-ins,\n"
              "      %.2f GB moved (%.1f GB/s over the whole replay)\n",
              pressure.defrag_enabled ? ", defragmentation on" : "", pressure.us_per_step,
              pressure.evictions, pressure.page_ins, pressure.bytes_moved / 1e9,
              pressure.bytes_moved / 1e9 / (pressure.us_per_step * 1e-6 * kPressureSteps));

  std::printf("\nEngine operations\n");
  std::printf("  pin+unpin of a resident allocation   %8.1f ns\n", pin_unpin_ns);
  std::printf("  eviction (%d x %.0f MiB)              %8.2f GB/s  %5.1f%% of memcpy\n",
              kCopyAllocations, MiB(kCopyBytes), bw.eviction_gbps,
              100 * bw.eviction_gbps / bw.memcpy_gbps);
  std::printf("  page-in                              %8.2f GB/s  %5.1f%% of memcpy\n",
              bw.page_in_gbps, 100 * bw.page_in_gbps / bw.memcpy_gbps);
  std::printf("  memcpy, same sizes, pre-faulted      %8.2f GB/s\n", bw.memcpy_gbps);

  std::printf("\nTargets\n");
  std::printf("  (c)/(a) <= 1.5 (goal 1.0):          %.3f  %s\n", ratio, Verdict(ratio <= 1.5));
  std::printf("  pin+unpin < 100 ns:                  %.1f  %s\n", pin_unpin_ns,
              Verdict(pin_unpin_ns < 100));
  std::printf("  eviction >= 70%% of memcpy:           %.1f%%  %s\n",
              100 * bw.eviction_gbps / bw.memcpy_gbps,
              Verdict(bw.eviction_gbps >= 0.7 * bw.memcpy_gbps));
  std::printf("  page-in >= 70%% of memcpy:            %.1f%%  %s\n",
              100 * bw.page_in_gbps / bw.memcpy_gbps,
              Verdict(bw.page_in_gbps >= 0.7 * bw.memcpy_gbps));
  std::printf("  (run time %.1f s)\n", SecondsSince(run_start));
  std::printf("alloc_free_ratio_vs_tf_bfc %.3f\n", ratio);
  return 0;
}

}  // namespace
}  // namespace lms_bench

int main() { return lms_bench::Run(); }
