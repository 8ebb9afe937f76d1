// Allocator benchmark: the engine against TensorFlow's own BFC allocator.
//
// One allocation trace shaped like a CNN training step is generated once
// (fixed seed) and replayed identically through
//   (a) TensorFlow 2.21's tsl::BFCAllocator over a BasicCPUAllocator
//       (tf_bfc.h), the baseline;
//   (b) the engine (lms::Engine over lms::PosixBackend) with LMS off;
//   (c) the engine with LMS on and a device pool with room to spare;
//   (c') (c) under the learned policy, each allocation made under a kernel
//       label as TensorFlow's are (TF_LMS_POLICY=learned). The trace's sizes
//       never repeat as a training step's do, so every allocation is a new
//       key to the policy: its table of keys fills (LearnedPolicy::kMaxKeys)
//       and each allocation looks one up in it, a cache miss: the learned
//       policy's worst case, as with shapes that change every step;
//   (d) the engine with a device pool of a third of the trace's peak.
// (a)-(c') time plain allocate+free pairs, the figure comparable across
// allocators. (d) pins each allocation while it is in use, as a kernel would
// (allocated pinned and unpinned after; pinned and unpinned around each
// read), so evictions and page-ins really happen; it is reported apart,
// since its time is mostly copies.
//
// Then figures of the engine alone: pin+unpin of a resident allocation
// (under either policy),
// eviction and page-in bandwidth next to plain memcpy measured in the same run
// over buffers of the same size, and what the first touch after a page-in
// costs on POSIX.
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
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/posix_backend.h"
#include "engine/engine.h"
#include "engine/strict_monitor.h"
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

// Repetitions, each measurement after one warm-up.
constexpr int kAllocFreeReps = 25;
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

// With `labels`, each allocation is made under the next of them as the
// thread's label, as TensorFlow's adapter sets a kernel's name when it starts
// (the learned policy keys allocations by it).
class EngineUnderTest {
 public:
  explicit EngineUnderTest(lms::Engine* engine, const std::vector<std::string>* labels = nullptr)
      : engine_(engine), labels_(labels) {}
  void* Allocate(size_t bytes) {
    if (labels_ != nullptr) {
      lms::StrictMonitor::SetThreadLabel((*labels_)[next_label_].c_str());
      next_label_ = (next_label_ + 1) % labels_->size();
    }
    lms::Status status;
    void* p = engine_->Allocate(bytes, /*pin=*/false, &status);
    if (p == nullptr) Die("engine allocate: " + status.ToString());
    return p;
  }
  void Free(void* ptr) { Check(engine_->Free(ptr), "engine free"); }

 private:
  lms::Engine* engine_;
  const std::vector<std::string>* labels_;
  size_t next_label_ = 0;
};

// Kernel names shaped like a Keras model's.
std::vector<std::string> KernelLabels() {
  std::vector<std::string> labels;
  for (int i = 0; i < kLive; ++i) {
    labels.push_back("functional_1/block_" + std::to_string(i / 4) + "/conv2d_" +
                     std::to_string(i % 4) + "/Conv2D");
  }
  return labels;
}

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

// Nanoseconds per allocate+free pair of one configuration: the best
// replay, and the median to show how noisy the machine was.
struct PairTiming {
  double best_ns = 0;
  double median_ns = 0;
};

// Times each replay (each replays the trace through one allocator) after one
// warm-up replay each, done by the caller: it grows the BFC allocator's
// regions and maps the engine's granules, costs a steady-state training loop
// pays once. The replays take turns, repetition by repetition, so that load
// from other processes falls on all of them alike.
std::vector<PairTiming> TimePairs(const Trace& trace,
                                  const std::vector<std::function<void()>>& replays) {
  const double pairs = static_cast<double>(kLive + trace.steps.size());
  std::vector<std::vector<double>> ns(replays.size());
  for (int r = 0; r < kAllocFreeReps; ++r) {
    for (size_t i = 0; i < replays.size(); ++i) {
      const Clock::time_point start = Clock::now();
      replays[i]();
      ns[i].push_back(SecondsSince(start) * 1e9 / pairs);
    }
  }
  std::vector<PairTiming> timings;
  for (std::vector<double>& v : ns) {
    std::sort(v.begin(), v.end());
    timings.push_back(PairTiming{v.front(), v[v.size() / 2]});
  }
  return timings;
}

// The engine's default options (defragmentation on), with LMS on or off.
std::unique_ptr<lms::Engine> MakeEngine(size_t device_bytes, size_t host_bytes,
                                        bool lms_enabled,
                                        lms::PolicyKind policy = lms::PolicyKind::kLru) {
  std::unique_ptr<lms::Backend> backend;
  Check(lms::PosixBackend::Create(kGranule, &backend), "creating the POSIX backend");
  lms::EngineOptions options;
  options.device_bytes = device_bytes;
  options.host_bytes = host_bytes;
  options.lms_enabled = lms_enabled;
  options.policy = policy;
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
  double us_per_step = 0;
  int64_t evictions = 0;  // per replay
  int64_t page_ins = 0;
  int64_t bytes_moved = 0;  // evicted plus paged in, whole granules
};

PressureResult MeasurePressure(const Trace& trace, size_t num_steps,
                               size_t device_bytes, size_t host_bytes) {
  PressureResult result;
  std::unique_ptr<lms::Engine> engine = MakeEngine(device_bytes, host_bytes, true);
  // The first replay is the warm-up: it faults the pools' pages in.
  Check(ReplayPinned(trace, num_steps, *engine), "under pressure, warm-up");
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
double PinUnpinNs(lms::PolicyKind policy) {
  std::unique_ptr<lms::Engine> engine = MakeEngine(256 * kMiB, 0, true, policy);
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
  // Reading one byte of every 4 KiB page after a page-in, first and second
  // time: the first pays the page faults of the POSIX backend's remap.
  double first_touch_ns_per_page = 0;
  double second_touch_ns_per_page = 0;
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
//
// Between a page-in and the next eviction every page of the allocations is
// read, as the kernel that pinned them would: the eviction then has to drop
// populated page-table entries at the allocation's address, as it does in
// real use. Those reads are timed apart (first_touch_ns_per_page): on POSIX a
// page-in maps the device granules populated (MAP_POPULATE), so the first
// touch of a page costs what a second does, and the page-table work is in the
// page-in figure (a lazily faulted remap cost about 1.2 us a page instead).
Bandwidth MeasureBandwidth() {
  const size_t total = kCopyAllocations * kCopyBytes;
  const size_t kPage = 4096;
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
  auto touch_all = [&] {
    unsigned sum = 0;
    for (void* p : allocations) {
      const volatile char* bytes = static_cast<const volatile char*>(p);
      for (size_t offset = 0; offset < kCopyBytes; offset += kPage) sum += bytes[offset];
    }
    return sum;
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

  const double inf = std::numeric_limits<double>::infinity();
  double evict_s = inf, page_in_s = inf, copy_s = inf, touch1_s = inf, touch2_s = inf;
  unsigned sink = 0;
  for (int r = 0; r < kCopyReps; ++r) {
    Clock::time_point start = Clock::now();
    sink += touch_all();
    touch1_s = std::min(touch1_s, SecondsSince(start));
    start = Clock::now();
    sink += touch_all();
    touch2_s = std::min(touch2_s, SecondsSince(start));
    start = Clock::now();
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
  if (sink != static_cast<unsigned>(2 * kCopyReps) * (kCopyBytes / kPage) *
                  (kCopyAllocations * 0x5a + kCopyAllocations * (kCopyAllocations - 1) / 2)) {
    Die("eviction and page-in lost data");
  }
  for (int i = 0; i < kCopyAllocations; ++i) {
    if (dst[i][kCopyBytes / 2] != static_cast<char>(0x5a + i)) Die("memcpy lost data");
  }
  for (void* p : allocations) Check(engine->Free(p), "free");
  for (int i = 0; i < kCopyAllocations; ++i) {
    munmap(src[i], kCopyBytes);
    munmap(dst[i], kCopyBytes);
  }
  const double bytes = static_cast<double>(total);
  const double pages = static_cast<double>(total / kPage);
  return Bandwidth{bytes / evict_s / 1e9, bytes / page_in_s / 1e9, bytes / copy_s / 1e9,
                   touch1_s * 1e9 / pages, touch2_s * 1e9 / pages};
}

// Everything the run measured, for the report.
struct Results {
  size_t roomy_bytes = 0;  // the BFC limit and the device pool of (b), (c)
  PairTiming bfc;          // (a)
  size_t bfc_peak_held = 0;
  PairTiming lms_off;      // (b)
  lms::Statistics lms_off_stats;
  PairTiming lms_on;       // (c)
  lms::Statistics lms_on_stats;
  PairTiming learned;      // (c')
  lms::Statistics learned_stats;
  PressureResult pressure;  // (d)
  double pin_unpin_ns = 0;
  double learned_pin_unpin_ns = 0;
  Bandwidth bandwidth;
};

Results Measure(const Trace& trace) {
  Results r;
  // Room to spare: twice the peak, so neither allocator is ever short.
  r.roomy_bytes = RoundUp(2 * PeakBytes(trace, kSteps, EngineBytes), kGranule);

  TfBfcAllocator bfc(r.roomy_bytes);
  std::unique_ptr<lms::Engine> lms_off = MakeEngine(r.roomy_bytes, r.roomy_bytes, false);
  std::unique_ptr<lms::Engine> lms_on = MakeEngine(r.roomy_bytes, r.roomy_bytes, true);
  std::unique_ptr<lms::Engine> learned =
      MakeEngine(r.roomy_bytes, r.roomy_bytes, true, lms::PolicyKind::kLearned);
  const std::vector<std::string> labels = KernelLabels();
  BfcUnderTest a(&bfc);
  EngineUnderTest b(lms_off.get());
  EngineUnderTest c(lms_on.get());
  EngineUnderTest c_learned(learned.get(), &labels);
  const std::vector<std::function<void()>> replays = {
      [&] { ReplayAllocFree(trace, a); },
      [&] { ReplayAllocFree(trace, b); },
      [&] { ReplayAllocFree(trace, c); },
      [&] {
        ReplayAllocFree(trace, c_learned);
        lms::StrictMonitor::SetThreadLabel(nullptr);
      },
  };
  Progress("[1/6] (a) TensorFlow BFC allocator, limit %.0f MiB: warm-up replay\n",
           MiB(r.roomy_bytes));
  replays[0]();
  Progress("[2/6] (b) engine, LMS off, device %.0f MiB: warm-up replay\n", MiB(r.roomy_bytes));
  replays[1]();
  Progress("[3/6] (c) and (c') engine, LMS on, LRU and learned policy, device %.0f MiB: "
           "warm-up replays; then (a) to (c') take turns for %d timed replays each\n",
           MiB(r.roomy_bytes), kAllocFreeReps);
  replays[2]();
  replays[3]();
  const std::vector<PairTiming> timings = TimePairs(trace, replays);
  r.bfc = timings[0];
  r.lms_off = timings[1];
  r.lms_on = timings[2];
  r.learned = timings[3];
  r.bfc_peak_held = bfc.PeakPoolBytes();
  r.lms_off_stats = lms_off->GetStatistics();
  r.lms_on_stats = lms_on->GetStatistics();
  r.learned_stats = learned->GetStatistics();

  // The pressure is relative to the peak of the prefix (d) replays.
  const size_t pressure_peak = PeakBytes(trace, kPressureSteps, EngineBytes);
  const size_t pressure_device = RoundUp(pressure_peak / 3, kGranule);
  Progress("[4/6] (d) engine under pressure, device %.0f MiB = a third of the %.0f MiB "
           "peak of the first %zu steps: warm-up + %d replays\n",
           MiB(pressure_device), MiB(pressure_peak), kPressureSteps, kPressureReps);
  r.pressure = MeasurePressure(trace, kPressureSteps, pressure_device,
                               RoundUp(2 * pressure_peak, kGranule));

  Progress("[5/6] engine pin+unpin of a resident allocation, LRU and learned policy: "
           "warm-up + %d x %d iterations each\n",
           kPinUnpinReps, kPinUnpinIters);
  r.pin_unpin_ns = PinUnpinNs(lms::PolicyKind::kLru);
  r.learned_pin_unpin_ns = PinUnpinNs(lms::PolicyKind::kLearned);

  Progress("[6/6] eviction, page-in and memcpy of %d x %.0f MiB: warm-up + %d repetitions\n",
           kCopyAllocations, MiB(kCopyBytes), kCopyReps);
  r.bandwidth = MeasureBandwidth();
  return r;
}

// The 1, 5 and 15 minute load averages: other work on the machine shows in
// every figure.
std::string LoadAverage() {
  double load[3] = {0, 0, 0};
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
    std::fclose(f);
  }
  char text[64];
  std::snprintf(text, sizeof text, "%.2f %.2f %.2f", load[0], load[1], load[2]);
  return text;
}

const char* Verdict(bool met) { return met ? "met" : "MISSED"; }

void PrintReport(const Results& r) {
  const double ratio = r.lms_on.best_ns / r.bfc.best_ns;
  std::printf("\nAllocate+free pairs, %zu per replay, best of %d replays (median)\n",
              kLive + kSteps, kAllocFreeReps);
  // "held at peak": memory taken from the system (BFC regions) or from the
  // device pool (engine granules, cached ones included).
  std::printf("  %-40s %17s %10s %14s %10s\n", "configuration", "ns/pair", "vs TF BFC",
              "held at peak", "evictions");
  auto row = [&r](const char* name, const PairTiming& t, size_t held, const std::string& evictions) {
    std::printf("  %-40s %8.1f (%6.1f) %10.3f %10.0f MiB %10s\n", name, t.best_ns, t.median_ns,
                t.best_ns / r.bfc.best_ns, MiB(held), evictions.c_str());
  };
  row("(a) TensorFlow BFC (tsl::BFCAllocator)", r.bfc, r.bfc_peak_held, "-");
  row("(b) engine, LMS off", r.lms_off, r.lms_off_stats.peak_bytes_reserved,
      std::to_string(r.lms_off_stats.num_evictions));
  row("(c) engine, LMS on, no pressure", r.lms_on, r.lms_on_stats.peak_bytes_reserved,
      std::to_string(r.lms_on_stats.num_evictions));
  row("(c') (c), learned policy, kernel labels", r.learned,
      r.learned_stats.peak_bytes_reserved, std::to_string(r.learned_stats.num_evictions));

  const PressureResult& p = r.pressure;
  std::printf("\nUnder pressure, pinned while in use (first %zu steps, best of %d replays)\n",
              kPressureSteps, kPressureReps);
  std::printf("  (d) engine, device = peak/3: %.1f us/step\n"
              "      per replay %" PRId64 " evictions, %" PRId64 " page-ins, %.2f GB moved "
              "(%.1f GB/s over the whole replay)\n",
              p.us_per_step, p.evictions,
              p.page_ins, p.bytes_moved / 1e9,
              p.bytes_moved / 1e9 / (p.us_per_step * 1e-6 * kPressureSteps));

  const Bandwidth& bw = r.bandwidth;
  const double evict_share = 100 * bw.eviction_gbps / bw.memcpy_gbps;
  const double page_in_share = 100 * bw.page_in_gbps / bw.memcpy_gbps;
  std::printf("\nEngine operations (best of %d)\n", kCopyReps);
  std::printf("  pin+unpin of a resident allocation  %8.1f ns\n", r.pin_unpin_ns);
  std::printf("    the same, learned policy          %8.1f ns\n", r.learned_pin_unpin_ns);
  std::printf("  eviction, %d x %.0f MiB              %8.2f GB/s  %5.1f%% of memcpy\n",
              kCopyAllocations, MiB(kCopyBytes), bw.eviction_gbps, evict_share);
  std::printf("  page-in, %d x %.0f MiB               %8.2f GB/s  %5.1f%% of memcpy\n",
              kCopyAllocations, MiB(kCopyBytes), bw.page_in_gbps, page_in_share);
  std::printf("  memcpy, same sizes, pre-faulted     %8.2f GB/s\n", bw.memcpy_gbps);
  std::printf("  first read of each 4 KiB page after a page-in: %.0f ns/page, a second read "
              "%.0f ns/page\n    (POSIX page-ins map device memory populated: that work is "
              "in the page-in figure)\n",
              bw.first_touch_ns_per_page, bw.second_touch_ns_per_page);

  std::printf("\nTargets\n");
  std::printf("  alloc+free (c)/(a) <= 1.5, goal 1.0  %7.3f   %s\n", ratio, Verdict(ratio <= 1.5));
  std::printf("  pin+unpin < 100 ns                   %7.1f   %s\n", r.pin_unpin_ns,
              Verdict(r.pin_unpin_ns < 100));
  std::printf("    learned policy                     %7.1f   %s\n", r.learned_pin_unpin_ns,
              Verdict(r.learned_pin_unpin_ns < 100));
  std::printf("  eviction >= 70%% of memcpy            %6.1f%%   %s\n", evict_share,
              Verdict(evict_share >= 70));
  std::printf("  page-in >= 70%% of memcpy             %6.1f%%   %s\n", page_in_share,
              Verdict(page_in_share >= 70));
}

int Run() {
  const Clock::time_point start = Clock::now();
  const Trace trace = MakeTrace();
  std::printf("Allocator benchmark: %zu steps of a sliding window of %d live allocations "
              "(seed %" PRIu64 ")\n"
              "  sizes: 60%% 256 B-64 KiB, 30%% 1-9 MiB, 10%% 16-48 MiB; peak %.0f MiB "
              "requested, %.0f MiB in engine granules\n",
              kSteps, kLive, kSeed, MiB(PeakBytes(trace, kSteps, [](size_t b) { return b; })),
              MiB(PeakBytes(trace, kSteps, EngineBytes)));
  std::printf("  load average at start: %s\n", LoadAverage().c_str());
  const Results results = Measure(trace);
  PrintReport(results);
  std::printf("  (run time %.1f s)\n", SecondsSince(start));
  std::printf("alloc_free_ratio_vs_tf_bfc %.3f\n",
              results.lms_on.best_ns / results.bfc.best_ns);
  return 0;
}

}  // namespace
}  // namespace lms_bench

int main() { return lms_bench::Run(); }
