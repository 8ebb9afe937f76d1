// Scale benchmark: how the engine's per-operation costs grow with the number
// of live units, 1,000 to 100,000 (`make bench-scale`).
//
// A synthetic training step shaped like a large transformer's: L layers, each
// with W weights (live for the whole run) and A activations (allocated in the
// forward pass, kept until the backward pass reads them and frees them), and
// a temporary per kernel (allocated and freed inside it). Sizes are drawn
// (fixed seed) from 1 to 8 granules, three in four of 1 or 2, as a recorded
// Transformer's are mostly a few granules with a tail of large ones. L is
// chosen so that the live units at the forward pass's end are 1k, 10k, 100k.
// The engine runs over a backend that keeps no memory (BookkeepingBackend:
// address space reserved, maps, unmaps and copies that do nothing): what is
// measured is the engine's own bookkeeping, which is what grows with the
// number of units. A real backend adds a cost per map, unmap and copy that
// does not depend on how many units there are (and the POSIX backend could
// not hold 100,000 units at all: a mapping each exceeds Linux's
// vm.max_map_count, 65,530).
//
// Per size, the best of a few repetitions after a warm-up, and the best of
// that over --rounds rounds of every size (5):
//   - alloc+free: a pair of a 1-granule unit, with every other unit live and
//     room on the device (no reclaim): arena placement and the tables;
//   - pin+unpin: of a random resident, inactive unit among all of them;
//     and, in order, of each unit in the order they were made (a step's
//     kernels read what the previous ones made): what the random figure
//     adds is the memory's latency, the records of units not in the cache;
//   - a read: one dependent read at random among kRecordBytes a unit (what
//     the engine keeps of a unit in its tables, about), the memory latency
//     the random pin+unpin pays per record not in the cache;
//   - the step under pressure (the device a quarter of the peak), with the
//     learned policy (the default) and with LRU: per reclaim, microseconds
//     in all (planning, copies, remaps) and planning alone
//     (time_planning_ns over reclaims), and ns per engine call of the step;
//   - the engine's creation for a device of that many units.
// The last line is `cost_growth_1k_to_100k R`: the worst ratio, over the
// figures above, of the cost at 100k units to the cost at 1k (target: 1.5).
//
// Example:
//   make bench-scale
//   build/bench/scale_bench --sizes 1000,10000   # fewer sizes
#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/engine.h"
#include "engine/strict_monitor.h"

namespace lms_bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kGranule = 2 << 20;  // as on a GPU
constexpr int kWeightsPerLayer = 4;
constexpr int kActivationsPerLayer = 8;
constexpr int kUnitsPerLayer = kWeightsPerLayer + kActivationsPerLayer;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "scale_bench: %s\n", what.c_str());
  std::exit(1);
}

void Check(const lms::Status& s, const std::string& what) {
  if (!s.ok()) Die(what + ": " + s.ToString());
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Sizes in granules, three in four of 1 or 2, the rest up to 8.
std::vector<size_t> DrawSizes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> quarter(0, 3), small(1, 2), large(3, 8);
  std::vector<size_t> out(n);
  for (size_t& s : out) s = quarter(rng) < 3 ? small(rng) : large(rng);
  return out;
}

// A backend of address space only: the engine's calls succeed and do
// nothing. The reservation is PROT_NONE and never touched.
class BookkeepingBackend : public lms::Backend {
 public:
  const char* Name() const override { return "bookkeeping"; }
  size_t granule_bytes() const override { return kGranule; }
  lms::Status ReserveAddressRange(size_t bytes, uintptr_t* base) override {
    void* p = mmap(nullptr, bytes + kGranule, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return lms::ResourceExhausted("reserving address space");
    *base = (reinterpret_cast<uintptr_t>(p) + kGranule - 1) & ~(kGranule - 1);
    return lms::Status::Ok();
  }
  void ReleaseAddressRange(uintptr_t, size_t) override {}  // the process ends soon
  lms::Status CreatePool(lms::PoolKind, size_t) override { return lms::Status::Ok(); }
  lms::Status Map(uintptr_t, lms::PoolKind, const lms::GranuleId*, size_t,
                  lms::Access) override {
    return lms::Status::Ok();
  }
  lms::Status Unmap(uintptr_t, size_t) override { return lms::Status::Ok(); }
  lms::Status CopyGranules(lms::PoolKind, const lms::GranuleId*, lms::PoolKind,
                           const lms::GranuleId*, size_t) override {
    return lms::Status::Ok();
  }
  lms::Status CopyRanges(lms::PoolKind, lms::GranuleId, lms::PoolKind, lms::GranuleId,
                         const lms::ByteRange*, size_t) override {
    return lms::Status::Ok();
  }
  lms::Status CopiesAfterUse(uint64_t) override { return lms::Status::Ok(); }
  lms::Status WaitForCopies() override { return lms::Status::Ok(); }
};

std::unique_ptr<lms::Engine> MakeEngine(size_t device_granules, size_t host_granules,
                                        lms::PolicyKind policy, double* create_s = nullptr) {
  const Clock::time_point start = Clock::now();
  std::unique_ptr<lms::Backend> backend(new BookkeepingBackend());
  lms::EngineOptions options;
  options.device_bytes = device_granules * kGranule;
  options.host_bytes = host_granules * kGranule;
  options.lms_enabled = true;
  options.policy = policy;
  options.small_object_threshold = 0;  // every allocation a unit of its own
  std::unique_ptr<lms::Engine> engine;
  Check(lms::Engine::Create(options, std::move(backend), &engine), "creating the engine");
  if (create_s != nullptr) *create_s = SecondsSince(start);
  return engine;
}

// The model: its layers' weight and activation sizes (granules).
struct Model {
  int layers = 0;
  std::vector<size_t> weights;      // layers * kWeightsPerLayer
  std::vector<size_t> activations;  // layers * kActivationsPerLayer
  std::vector<size_t> temporaries;  // one per kernel (an activation's producer)
  size_t peak_granules = 0;         // weights + activations + one temporary

  size_t units() const { return weights.size() + activations.size(); }
};

Model MakeModel(size_t live_units) {
  Model m;
  m.layers = static_cast<int>(std::max<size_t>(1, live_units / kUnitsPerLayer));
  m.weights = DrawSizes(static_cast<size_t>(m.layers) * kWeightsPerLayer, 1);
  m.activations = DrawSizes(static_cast<size_t>(m.layers) * kActivationsPerLayer, 2);
  m.temporaries = DrawSizes(m.activations.size(), 3);
  size_t largest = 0;
  for (size_t t : m.temporaries) largest = std::max(largest, t);
  for (size_t w : m.weights) m.peak_granules += w;
  for (size_t a : m.activations) m.peak_granules += a;
  m.peak_granules += largest;
  return m;
}

// One step through `engine`, as kernels use memory (each kernel under a label
// of its own, as TensorFlow's op names are: the learned policy's keys): each
// forward kernel pins
// its layer's weights and the previous activation, allocates its output
// pinned and a temporary, then unpins; each backward kernel pins the
// activation it reads and its layer's weights, allocates a temporary, unpins
// and frees the activation. Counts engine calls in *calls.
void Step(lms::Engine& e, const Model& m, const std::vector<void*>& weights,
          std::vector<void*>* activations, uint64_t* calls) {
  std::vector<uint64_t> ids(kWeightsPerLayer + 1);
  auto pin = [&](void* p, uint64_t* id) {
    Check(e.Pin(p, id), "pin");
    ++*calls;
  };
  auto unpin = [&](void* p, uint64_t id) {
    Check(e.Unpin(p, id), "unpin");
    ++*calls;
  };
  auto temporary = [&](size_t granules) {
    lms::Status s;
    void* t = e.Allocate(granules * kGranule, /*pin=*/true, &s);
    if (t == nullptr) Die("temporary: " + s.ToString());
    Check(e.Free(t), "free of a temporary");
    *calls += 2;
  };
  char label[32];
  for (int l = 0; l < m.layers; ++l) {
    for (int k = 0; k < kActivationsPerLayer; ++k) {
      const size_t a = static_cast<size_t>(l) * kActivationsPerLayer + k;
      std::snprintf(label, sizeof(label), "layer%d/fwd%d", l, k);
      lms::StrictMonitor::SetThreadLabel(label);
      for (int w = 0; w < kWeightsPerLayer; ++w) {
        pin(weights[static_cast<size_t>(l) * kWeightsPerLayer + w], &ids[w]);
      }
      void* previous = a > 0 ? (*activations)[a - 1] : nullptr;
      if (previous != nullptr) pin(previous, &ids[kWeightsPerLayer]);
      lms::Status s;
      void* out = e.Allocate(m.activations[a] * kGranule, /*pin=*/true, &s);
      if (out == nullptr) Die("activation: " + s.ToString());
      ++*calls;
      temporary(m.temporaries[a]);
      unpin(out, 0);
      if (previous != nullptr) unpin(previous, ids[kWeightsPerLayer]);
      for (int w = 0; w < kWeightsPerLayer; ++w) {
        unpin(weights[static_cast<size_t>(l) * kWeightsPerLayer + w], ids[w]);
      }
      (*activations)[a] = out;
    }
  }
  for (int l = m.layers - 1; l >= 0; --l) {
    for (int k = kActivationsPerLayer - 1; k >= 0; --k) {
      const size_t a = static_cast<size_t>(l) * kActivationsPerLayer + k;
      std::snprintf(label, sizeof(label), "layer%d/bwd%d", l, k);
      lms::StrictMonitor::SetThreadLabel(label);
      for (int w = 0; w < kWeightsPerLayer; ++w) {
        pin(weights[static_cast<size_t>(l) * kWeightsPerLayer + w], &ids[w]);
      }
      pin((*activations)[a], &ids[kWeightsPerLayer]);
      temporary(m.temporaries[a]);
      unpin((*activations)[a], ids[kWeightsPerLayer]);
      for (int w = 0; w < kWeightsPerLayer; ++w) {
        unpin(weights[static_cast<size_t>(l) * kWeightsPerLayer + w], ids[w]);
      }
      Check(e.Free((*activations)[a]), "free of an activation");
      ++*calls;
      (*activations)[a] = nullptr;
    }
  }
  lms::StrictMonitor::SetThreadLabel(nullptr);
}

// Units of `sizes` (granules), each made as a kernel's output (allocated
// pinned, unpinned when it ends), appended to *out.
void AllocateUnits(lms::Engine& e, const std::vector<size_t>& sizes, const char* what,
                   std::vector<void*>* out) {
  for (size_t granules : sizes) {
    lms::Status s;
    void* p = e.Allocate(granules * kGranule, /*pin=*/true, &s);
    if (p == nullptr) Die(std::string(what) + ": " + s.ToString());
    Check(e.Unpin(p, 0), std::string("unpin of a ") + what);
    out->push_back(p);
  }
}

std::vector<void*> AllocateWeights(lms::Engine& e, const Model& m) {
  std::vector<void*> out;
  AllocateUnits(e, m.weights, "weight", &out);
  return out;
}

struct Figures {
  size_t units = 0;
  double alloc_free_ns = 0;
  double pin_unpin_ns = 0;
  double pin_unpin_in_order_ns = 0;
  double read_ns = 0;
  double create_ms = 0;
  // Under pressure, per policy (0: learned, 1: LRU).
  double reclaim_us[2] = {};
  double plan_us[2] = {};
  double call_ns[2] = {};
  double reclaims_per_step[2] = {};
  long max_rss_mib = 0;
};

// alloc+free and pin+unpin with every unit live and room on the device.
void MeasureRoomy(const Model& m, Figures* f) {
  auto e = MakeEngine(m.peak_granules + 64, 0, lms::PolicyKind::kLearned, nullptr);
  std::vector<void*> live = AllocateWeights(*e, m);
  AllocateUnits(*e, m.activations, "activation", &live);
  constexpr int kPairs = 20000;
  double best_alloc = 1e300, best_pin = 1e300, best_in_order = 1e300;
  std::mt19937 rng(7);
  std::uniform_int_distribution<size_t> pick(0, live.size() - 1);
  std::vector<size_t> order(kPairs);
  for (size_t& i : order) i = pick(rng);
  for (int rep = 0; rep < 4; ++rep) {  // the first is the warm-up
    Clock::time_point start = Clock::now();
    for (int i = 0; i < kPairs; ++i) {
      lms::Status s;
      void* p = e->Allocate(kGranule, /*pin=*/false, &s);
      if (p == nullptr) Die("alloc: " + s.ToString());
      Check(e->Free(p), "free");
    }
    const double alloc_ns = SecondsSince(start) * 1e9 / kPairs;
    start = Clock::now();
    for (int i = 0; i < kPairs; ++i) {
      uint64_t id = 0;
      Check(e->Pin(live[order[i]], &id), "pin");
      Check(e->Unpin(live[order[i]], id), "unpin");
    }
    const double pin_ns = SecondsSince(start) * 1e9 / kPairs;
    start = Clock::now();
    for (int i = 0; i < kPairs; ++i) {
      void* p = live[static_cast<size_t>(i) % live.size()];
      uint64_t id = 0;
      Check(e->Pin(p, &id), "pin");
      Check(e->Unpin(p, id), "unpin");
    }
    const double in_order_ns = SecondsSince(start) * 1e9 / kPairs;
    if (rep > 0) {
      best_alloc = std::min(best_alloc, alloc_ns);
      best_pin = std::min(best_pin, pin_ns);
      best_in_order = std::min(best_in_order, in_order_ns);
    }
  }
  f->alloc_free_ns = best_alloc;
  f->pin_unpin_ns = best_pin;
  f->pin_unpin_in_order_ns = best_in_order;
  for (void* p : live) Check(e->Free(p), "free");
}

// What the engine keeps of a unit, about: its arena chunk (64 bytes), its
// residency record (56), its learned policy unit (160), its reclaim order slot
// and set node (64 and 56), and its slots' entries in the unit and backing
// tables.
constexpr size_t kRecordBytes = 400;

// Nanoseconds a read of memory at random among `units` units' records takes
// when each read waits for the one before (a walk of one random cycle through
// the records' cache lines): the latency of a record not in the cache, or of
// one that is when they all fit.
double MeasureRead(size_t units) {
  const size_t lines = std::max<size_t>(2, units * kRecordBytes / 64);
  struct alignas(64) Line {
    size_t next;
  };
  std::vector<Line> memory(lines);
  std::vector<size_t> order(lines);
  for (size_t i = 0; i < lines; ++i) order[i] = i;
  std::mt19937_64 rng(11);
  std::shuffle(order.begin() + 1, order.end(), rng);
  for (size_t i = 0; i < lines; ++i) memory[order[i]].next = order[(i + 1) % lines];
  constexpr int kReads = 2000000;
  double best = 1e300;
  size_t at = 0;
  for (int rep = 0; rep < 4; ++rep) {  // the first is the warm-up
    const Clock::time_point start = Clock::now();
    for (int i = 0; i < kReads; ++i) at = memory[at].next;
    const double ns = SecondsSince(start) * 1e9 / kReads;
    if (rep > 0) best = std::min(best, ns);
  }
  if (at == lines) Die("unreachable");  // keeps the walk
  return best;
}

// Steps on a device a quarter of the peak: two warm-up steps (the learned
// policy learns in the first), then the best of two timed ones.
void MeasurePressure(const Model& m, int policy_index, Figures* f) {
  const lms::PolicyKind policy =
      policy_index == 0 ? lms::PolicyKind::kLearned : lms::PolicyKind::kLru;
  double create_s = 0;
  auto e = MakeEngine(std::max<size_t>(m.peak_granules / 4, 64), m.peak_granules + 64, policy,
                      &create_s);
  if (policy_index == 0) f->create_ms = create_s * 1e3;
  std::vector<void*> weights = AllocateWeights(*e, m);
  std::vector<void*> activations(m.activations.size(), nullptr);
  uint64_t calls = 0;
  for (int s = 0; s < 2; ++s) Step(*e, m, weights, &activations, &calls);
  double best_call = 1e300, best_reclaim = 1e300, best_plan = 1e300, reclaims = 0;
  for (int s = 0; s < 2; ++s) {
    const lms::Statistics before = e->GetStatistics();
    calls = 0;
    const Clock::time_point start = Clock::now();
    Step(*e, m, weights, &activations, &calls);
    const double seconds = SecondsSince(start);
    const lms::Statistics after = e->GetStatistics();
    const double n = static_cast<double>(
        (after.num_single_reclaims + after.num_full_reclaims) -
        (before.num_single_reclaims + before.num_full_reclaims));
    if (n == 0) Die("no reclaim in a step under pressure");
    const double evicting_ns =
        static_cast<double>(after.time_evicting_ns - before.time_evicting_ns);
    const double planning_ns =
        static_cast<double>(after.time_planning_ns - before.time_planning_ns);
    best_call = std::min(best_call, seconds * 1e9 / static_cast<double>(calls));
    best_reclaim = std::min(best_reclaim, (evicting_ns + planning_ns) / n / 1e3);
    best_plan = std::min(best_plan, planning_ns / n / 1e3);
    reclaims = n;
  }
  f->call_ns[policy_index] = best_call;
  f->reclaim_us[policy_index] = best_reclaim;
  f->plan_us[policy_index] = best_plan;
  f->reclaims_per_step[policy_index] = reclaims;
  for (void* p : weights) Check(e->Free(p), "free of a weight");
}

// The lower of each figure of `a` and `b` (RSS: a's, the first round's,
// whose sizes ran from the smallest up).
Figures Best(const Figures& a, const Figures& b) {
  Figures f = a;
  f.alloc_free_ns = std::min(a.alloc_free_ns, b.alloc_free_ns);
  f.pin_unpin_ns = std::min(a.pin_unpin_ns, b.pin_unpin_ns);
  f.pin_unpin_in_order_ns = std::min(a.pin_unpin_in_order_ns, b.pin_unpin_in_order_ns);
  f.read_ns = std::min(a.read_ns, b.read_ns);
  f.create_ms = std::min(a.create_ms, b.create_ms);
  for (int i = 0; i < 2; ++i) {
    f.reclaim_us[i] = std::min(a.reclaim_us[i], b.reclaim_us[i]);
    f.plan_us[i] = std::min(a.plan_us[i], b.plan_us[i]);
    f.call_ns[i] = std::min(a.call_ns[i], b.call_ns[i]);
  }
  return f;
}

std::vector<size_t> ParseSizes(int argc, char** argv, int* rounds) {
  std::vector<size_t> sizes = {1000, 10000, 100000};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      *rounds = std::atoi(argv[++i]);
      if (*rounds < 1) Die(std::string("--rounds: at least 1, got ") + argv[i]);
    } else if (std::strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
      sizes.clear();
      for (char* tok = std::strtok(argv[++i], ","); tok != nullptr;
           tok = std::strtok(nullptr, ",")) {
        const long n = std::strtol(tok, nullptr, 10);
        if (n < 100) Die(std::string("--sizes: each size at least 100 units, got ") + tok);
        sizes.push_back(static_cast<size_t>(n));
      }
    } else {
      Die(std::string("unknown argument ") + argv[i] +
          " (usage: scale_bench [--sizes N,N,...] [--rounds R])");
    }
  }
  return sizes;
}

}  // namespace
}  // namespace lms_bench

int main(int argc, char** argv) {
  using namespace lms_bench;
  int rounds = 5;
  const std::vector<size_t> sizes = ParseSizes(argc, argv, &rounds);
  std::printf("Live units at the forward pass's end; granules of %zu MiB, over a backend that "
              "keeps no memory (the engine's bookkeeping alone); pressure: a device of a "
              "quarter of the peak\n",
              kGranule >> 20);
  std::printf("%8s %9s %10s %10s %6s %10s %12s %12s %12s %12s %11s %11s %9s\n", "units",
              "alloc+free", "pin+unpin", "pin+unpin", "read", "create", "reclaim us",
              "plan us", "reclaim us", "plan us", "call ns", "call ns", "RSS");
  std::printf("%8s %9s %10s %10s %6s %10s %12s %12s %12s %12s %11s %11s %9s\n", "", "ns",
              "ns random", "ns order", "ns", "ms", "learned", "learned", "LRU", "LRU", "learned",
              "LRU", "MiB");
  // Rounds over every size, the best of each figure kept: a slow spell of
  // this shared machine falls on one round of each size, not on one size.
  std::vector<Figures> all(sizes.size());
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      const Model m = MakeModel(sizes[i]);
      Figures f;
      f.units = m.units();
      MeasureRoomy(m, &f);
      f.read_ns = MeasureRead(f.units);
      MeasurePressure(m, 0, &f);
      MeasurePressure(m, 1, &f);
      rusage usage;
      getrusage(RUSAGE_SELF, &usage);
      f.max_rss_mib = usage.ru_maxrss / 1024;
      all[i] = round == 0 ? f : Best(all[i], f);
    }
    std::fprintf(stderr, "  round %d of %d done\n", round + 1, rounds);
  }
  for (const Figures& f : all) {
    std::printf("%8zu %9.0f %10.0f %10.0f %6.0f %10.1f %12.1f %12.1f %12.1f %12.1f %11.0f %11.0f "
                "%9ld\n",
                f.units, f.alloc_free_ns, f.pin_unpin_ns, f.pin_unpin_in_order_ns, f.read_ns,
                f.create_ms,
                f.reclaim_us[0], f.plan_us[0], f.reclaim_us[1], f.plan_us[1], f.call_ns[0],
                f.call_ns[1], f.max_rss_mib);
  }
  if (all.size() < 2) return 0;
  const Figures& small = all.front();
  const Figures& large = all.back();
  struct Ratio {
    const char* name;
    double value;
  };
  const Ratio ratios[] = {
      {"alloc+free", large.alloc_free_ns / small.alloc_free_ns},
      {"pin+unpin (random)", large.pin_unpin_ns / small.pin_unpin_ns},
      {"pin+unpin (in order)", large.pin_unpin_in_order_ns / small.pin_unpin_in_order_ns},
      {"reclaim (learned)", large.reclaim_us[0] / small.reclaim_us[0]},
      {"planning (learned)", large.plan_us[0] / small.plan_us[0]},
      {"reclaim (LRU)", large.reclaim_us[1] / small.reclaim_us[1]},
      {"planning (LRU)", large.plan_us[1] / small.plan_us[1]},
      {"engine call in a step (learned)", large.call_ns[0] / small.call_ns[0]},
      {"engine call in a step (LRU)", large.call_ns[1] / small.call_ns[1]},
  };
  const Ratio* worst = &ratios[0];
  std::printf("\n%zu units against %zu, per figure:\n", large.units, small.units);
  for (const Ratio& r : ratios) {
    std::printf("  %-32s %8.2fx\n", r.name, r.value);
    if (r.value > worst->value) worst = &r;
  }
  std::printf("a read at random among the units' records: %.0f ns at %zu units, %.0f at %zu; "
              "pin+unpin (random) grew by %.1f such reads\n",
              small.read_ns, small.units, large.read_ns, large.units,
              (large.pin_unpin_ns - small.pin_unpin_ns) / large.read_ns);
  std::printf("device creation: %.1f ms for %zu units (the CUDA backend on an H100: 44.3 us a "
              "2 MiB granule, a 64 GiB device in 1.45 s)\n",
              large.create_ms, large.units);
  std::printf("worst: %s\n", worst->name);
  std::printf("cost_growth_1k_to_100k %.2f\n", worst->value);
  return 0;
}
