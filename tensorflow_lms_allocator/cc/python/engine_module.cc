// tensorflow_lms_allocator._engine: the engine over the POSIX backend (or the
// CUDA backend), for tests, benchmarks and tools. Calls release the GIL, so
// Python threads exercise the engine's own locking. Engine failures become Python
// exceptions here, at the binding; no exception reaches the engine.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>

#include "backends/backend_factory.h"
#include "backends/cuda_backend.h"
#include "backends/posix_backend.h"  // HugePagesName
#include "engine/engine.h"
#include "engine/env_options.h"
#include "testing/engine_pattern.h"

namespace nb = nanobind;

namespace lms {
namespace {

struct OutOfMemory : std::runtime_error { using std::runtime_error::runtime_error; };
struct UnknownAllocation : std::runtime_error { using std::runtime_error::runtime_error; };
struct WrongState : std::runtime_error { using std::runtime_error::runtime_error; };
struct BackendUnavailable : std::runtime_error { using std::runtime_error::runtime_error; };

[[noreturn]] void Raise(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument: throw std::invalid_argument(s.message());
    case StatusCode::kNotFound: throw UnknownAllocation(s.message());
    case StatusCode::kFailedPrecondition: throw WrongState(s.message());
    case StatusCode::kResourceExhausted: throw OutOfMemory(s.message());
    default: throw std::runtime_error(s.ToString());
  }
}

void Check(const Status& s) {
  if (!s.ok()) Raise(s);
}

class PyEngine {
 public:
  PyEngine(size_t device_bytes, std::optional<size_t> host_bytes,
           size_t granule_bytes, size_t small_object_threshold, bool lms_enabled,
           bool defrag_enabled, bool strict, const std::string& backend_name,
           int device_ordinal, const std::string& policy, size_t tiny_object_threshold,
           size_t host_ahead_bytes, bool unmap_evicted) {
    std::unique_ptr<Backend> backend;
    BackendSpec spec;
    spec.granule_bytes = granule_bytes;
    spec.device_ordinal = device_ordinal;
    Check(ParseBackendKind(backend_name, &spec.kind));
    Status made = CreateBackend(spec, &backend);
    // A backend that cannot exist here (no driver, no GPU, no support) is
    // its own error, apart from a call made in the wrong state.
    if (made.code() == StatusCode::kFailedPrecondition) {
      throw BackendUnavailable(made.message());
    }
    Check(made);
    EngineOptions o;
    o.device_bytes = device_bytes;
    if (host_bytes.has_value()) {
      o.host_bytes = *host_bytes;
    } else {
      Check(HostLimitFromEnv(&o.host_bytes));
    }
    o.small_object_threshold = small_object_threshold;
    o.tiny_object_threshold = tiny_object_threshold;
    o.lms_enabled = lms_enabled;
    o.defrag_enabled = defrag_enabled;
    o.strict = strict;
    o.host_ahead_bytes = host_ahead_bytes;
    o.unmap_evicted = unmap_evicted;
    if (!PolicyFromName(policy, &o.policy)) {
      Check(InvalidArgument("policy '" + policy + "': use \"lru\" or \"learned\""));
    }
    Check(Engine::Create(o, std::move(backend), &engine_));
  }

  uintptr_t Allocate(size_t bytes, bool pin, size_t alignment, bool writer, bool optional,
                     int64_t step) {
    if (pin && writer) Check(InvalidArgument("allocate: pin and writer exclude each other"));
    const Hold hold = pin ? Hold::kPin : writer ? Hold::kWriter : Hold::kNone;
    Status s;
    void* p;
    {
      nb::gil_scoped_release release;
      p = engine_->Allocate(bytes, hold, &s, nullptr, alignment, optional, step);
    }
    if (p == nullptr) Raise(s);
    return reinterpret_cast<uintptr_t>(p);
  }

  template <typename Fn>
  void Call(Fn fn) {
    Status s;
    {
      nb::gil_scoped_release release;
      s = fn();
    }
    Check(s);
  }

  void Free(uintptr_t a) { Call([&] { return engine_->Free(Ptr(a)); }); }
  uint64_t Pin(uintptr_t a) {
    uint64_t id = 0;
    Call([&] { return engine_->Pin(Ptr(a), &id); });
    return id;
  }
  // Each pin's unit id, or 0 where it failed for want of device memory (the
  // unit stays evicted and holds no pin); any other failure raises.
  std::vector<uint64_t> PinAll(const std::vector<uintptr_t>& addresses) {
    std::vector<const void*> ptrs;
    for (uintptr_t a : addresses) ptrs.push_back(Ptr(a));
    std::vector<uint64_t> ids(ptrs.size());
    Status s;
    {
      nb::gil_scoped_release release;
      s = engine_->PinAll(ptrs.data(), ptrs.size(), ids.data());
    }
    if (!s.ok() && s.code() != StatusCode::kResourceExhausted) Raise(s);
    return ids;
  }
  void Unpin(uintptr_t a, uint64_t id) {
    Call([&] { return engine_->Unpin(Ptr(a), id); });
  }
  void Evict(uintptr_t a) { Call([&] { return engine_->Evict(Ptr(a)); }); }

  void StartTrace(const std::string& path, uint64_t max_bytes) {
    Call([&] { return engine_->StartTrace(path, max_bytes); });
  }
  nb::dict StopTrace() {
    TraceSummary summary;
    Call([&] { return engine_->StopTrace(&summary); });
    nb::dict d;
    d["path"] = summary.path;
    d["events"] = summary.events;
    d["dropped"] = summary.dropped;
    d["max_bytes"] = summary.max_bytes;
    return d;
  }

  nb::dict Inspect(uintptr_t a) {
    AllocationInfo info;
    Check(engine_->Inspect(Ptr(a), &info));
    nb::dict d;
    d["id"] = info.id;
    d["address"] = info.address;
    d["requested_bytes"] = info.requested_bytes;
    d["allocated_bytes"] = info.allocated_bytes;
    d["small"] = info.small;
    d["evicted"] = info.evicted;
    d["pin_count"] = info.pin_count;
    d["unclaimed"] = info.unclaimed;
    d["unit_id"] = info.unit_id;
    d["unit_address"] = info.unit_address;
    return d;
  }

  nb::dict Stats() {
    const Statistics s = engine_->GetStatistics();
    nb::dict d;
#define LMS_STAT(name, doc) d[#name] = s.name;
    LMS_FOR_EACH_STATISTIC(LMS_STAT)
#undef LMS_STAT
    return d;
  }

  void Fill(uintptr_t a, size_t bytes, uint64_t seed) {
    Call([&] { return FillAllocation(*engine_, Ptr(a), bytes, seed); });
  }
  int64_t Verify(uintptr_t a, size_t bytes, uint64_t seed) {
    int64_t bad = -1;
    Call([&] {
      Status s;
      bad = VerifyAllocation(*engine_, Ptr(a), bytes, seed, &s);
      return s;
    });
    return bad;
  }

  // A CUDA stream (its CUstream as an integer, as CuPy's Stream.ptr) whose
  // queued kernels may touch this engine's memory: fenced before every copy
  // out of and unmap of it (Note [Stream protocol] in cuda_backend.h).
  void AddFencedStream(uintptr_t stream) {
    CudaBackend* cuda = Cuda("add_fenced_stream");
    Call([&] { return cuda->AddFencedStream(reinterpret_cast<cu::CUstream>(stream)); });
  }
  void RemoveFencedStream(uintptr_t stream) {
    Cuda("remove_fenced_stream")->RemoveFencedStream(reinterpret_cast<cu::CUstream>(stream));
  }

  std::vector<nb::dict> Touches() {
    std::vector<nb::dict> out;
    for (const UnpinnedTouch& t : engine_->UnpinnedTouches()) {
      nb::dict d;
      d["address"] = t.address;
      d["allocation_id"] = t.allocation_id;
      d["allocation_address"] = t.allocation_address;
      d["allocation_bytes"] = t.allocation_bytes;
      d["label"] = t.label;
      out.push_back(d);
    }
    return out;
  }

  Engine& engine() { return *engine_; }

 private:
  static void* Ptr(uintptr_t a) { return reinterpret_cast<void*>(a); }
  CudaBackend* Cuda(const char* call) {
    auto* cuda = dynamic_cast<CudaBackend*>(&engine_->backend());
    if (cuda == nullptr) {
      Check(InvalidArgument(std::string(call) + ": streams exist only on backend=\"cuda\"; "
                            "this engine runs on \"" + engine_->backend().Name() + "\""));
    }
    return cuda;
  }
  std::unique_ptr<Engine> engine_;
};

}  // namespace
}  // namespace lms

NB_MODULE(_engine, m) {
  using lms::PyEngine;
  m.doc() = "The LMS engine over emulated device memory (POSIX) or a GPU (CUDA).";
  nb::exception<lms::OutOfMemory>(m, "OutOfMemoryError", PyExc_MemoryError);
  nb::exception<lms::UnknownAllocation>(m, "UnknownAllocationError", PyExc_LookupError);
  nb::exception<lms::WrongState>(m, "AllocationStateError", PyExc_RuntimeError);
  nb::exception<lms::BackendUnavailable>(m, "BackendUnavailableError", PyExc_RuntimeError);

  nb::class_<PyEngine>(m, "Engine")
      .def(nb::init<size_t, std::optional<size_t>, size_t, size_t, bool, bool, bool,
                    const std::string&, int, const std::string&, size_t, size_t, bool>(),
           nb::arg("device_bytes"), nb::arg("host_bytes") = nb::none(),
           // Defaults from the one place for settings (engine/env_options.h).
           nb::arg("granule_bytes") = lms::kDefaultGranuleBytes,
           nb::arg("small_object_threshold") = 0, nb::arg("lms_enabled") = true,
           nb::arg("defrag_enabled") = lms::kDefaultDefragEnabled,
           nb::arg("strict") = lms::kDefaultStrict,
           nb::arg("backend") = "posix", nb::arg("device_ordinal") = 0,
           nb::arg("policy") = lms::PolicyName(lms::kDefaultPolicy),
           nb::arg("tiny_object_threshold") = lms::SmallPages::kTinyBytes,
           nb::arg("host_ahead_bytes") = 0,
           nb::arg("unmap_evicted") = lms::kDefaultUnmapEvicted,
           "Creates an engine with `device_bytes` of device memory.\n\n"
           "backend \"posix\" emulates the device with Linux memory; \"cuda\" uses\n"
           "GPU `device_ordinal` through the NVIDIA driver (libcuda.so.1, or the\n"
           "library TF_LMS_CUDA_DRIVER_PATH names: a testing knob, read when the\n"
           "engine is made), whose granularity wins if larger than granule_bytes;\n"
           "BackendUnavailableError if it cannot be used, saying why.\n"
           "host_bytes defaults to TF_GPU_HOST_MEM_LIMIT_IN_MB (else 64 GiB);\n"
           "small_object_threshold 0 means one granule; small objects below\n"
           "tiny_object_threshold share pages only with each other (0: one\n"
           "class for all). host_ahead_bytes of host memory are made at once\n"
           "where the backend makes memory (CUDA: Note [Host memory made ahead];\n"
           "TensorFlow's GPUs take TF_LMS_HOST_AHEAD_MB's).\n"
           "unmap_evicted leaves an evicted tensor's address with nothing mapped\n"
           "unless someone holds it, so a touch without a pin faults (Note\n"
           "[Evicted tensors unmapped]); strict wins where both are on.\n"
           "policy \"learned\" (the default, as TF_LMS_POLICY's) evicts the unit\n"
           "whose next use, learned from the previous step, is farthest ahead\n"
           "(Note [Learned eviction]); \"lru\" the least recently used first.\n\n"
           "Example:\n"
           "    >>> e = Engine(64 << 20, host_bytes=256 << 20)\n"
           "    >>> p = e.allocate(8 << 20)\n"
           "    >>> e.free(p)")
      .def("allocate", &PyEngine::Allocate, nb::arg("bytes"), nb::arg("pin") = false,
           nb::arg("alignment") = 256, nb::arg("writer") = false,
           nb::arg("optional") = false, nb::arg("step") = 0,
           "Returns the address of a new allocation; raises OutOfMemoryError.\n"
           "With pin, its unit (the allocation, or a small object's page) starts\n"
           "pinned: unpin it with inspect(address)['unit_id']. With writer, it\n"
           "is written outside any kernel: unclaimed, never evicted until its\n"
           "first pin or its free (Note [Writers outside kernels]). With optional\n"
           "(scratch a kernel can do without), it is never born evicted and\n"
           "evicts at most a sixteenth of the device per TensorFlow `step`\n"
           "(Note [Optional requests]).")
      .def("free", &PyEngine::Free, nb::arg("address"))
      .def("pin", &PyEngine::Pin, nb::arg("address"),
           "Pins the unit containing `address` (an allocation, or a small "
           "object's page), paging it in first if evicted. Returns the unit's "
           "id for unpin.")
      .def("pin_all", &PyEngine::PinAll, nb::arg("addresses"),
           "Pins each address as pin does, paging the evicted units in together\n"
           "(a kernel's inputs). Returns each pin's unit id, or 0 where the device\n"
           "could not take it (that unit stays evicted, unpinned). Example:\n"
           "    >>> ids = e.pin_all([a, b])")
      .def("unpin", &PyEngine::Unpin, nb::arg("address"), nb::arg("unit_id") = 0)
      .def("check_invariants",
           [](PyEngine& e) { e.Call([&] { return e.engine().CheckInvariants(); }); },
           "Recomputes every accounting invariant; raises RuntimeError naming "
           "the first that does not hold.")
      .def("evict", &PyEngine::Evict, nb::arg("address"))
      .def("wait_for_copies",
           [](PyEngine& e) { e.Call([&] { return e.engine().WaitForCopies(); }); },
           "Blocks until every eviction and page-in copy so far is complete: a "
           "GPU stream the engine does not fence waits for this before it touches "
           "a tensor just evicted or paged in, or memory just allocated.")
      .def("prefetch",
           [](PyEngine& e, uint64_t lookahead) {
             uint64_t units = 0;
             e.Call([&] { return e.engine().Prefetch(lookahead, &units); });
             return units;
           },
           nb::arg("lookahead") = 16,
           "With policy=\"learned\": pages in, into free device memory only, the\n"
           "evicted units predicted to be used within `lookahead` uses; returns\n"
           "how many (0 with LRU or while predictions are not trusted).")
      .def("evict_ahead",
           [](PyEngine& e, size_t free_bytes) {
             uint64_t units = 0;
             e.Call([&] { return e.engine().EvictAhead(free_bytes, &units); });
             return units;
           },
           nb::arg("free_bytes"),
           "Evicts inactive units, in the policy's order, until `free_bytes` of\n"
           "device memory are free or nothing inactive is left (the moves a\n"
           "helper thread could make ahead of requests); returns how many.\n"
           "Example:\n"
           "    >>> e.evict_ahead(64 << 20)")
      .def("set_learned_order",
           [](PyEngine& e, bool on) { e.Call([&] { return e.engine().SetLearnedOrder(on); }); },
           nb::arg("on"),
           "With policy=\"learned\": reclaims take its order (True, the default)\n"
           "or LRU's while it goes on learning (False), to compare the two in\n"
           "one process. RuntimeError with policy=\"lru\".")
      .def(
          "foresee",
          [](PyEngine& e, uint64_t now, uintptr_t address, std::optional<uint64_t> next_use) {
            e.Call([&] {
              return e.engine().Foresee(now, reinterpret_cast<const void*>(address),
                                        next_use.value_or(lms::LearnedPolicy::kNever));
            });
          },
          nb::arg("now"), nb::arg("address"), nb::arg("next_use").none(),
          "With policy=\"learned\", for replay's perfect-foresight reference: it is\n"
          "`now` and the unit holding `address` is next used at\n"
          "`next_use` (None: not again) on the caller's clock. From the first\n"
          "call on, reclaims order units by what they were told.")
      .def("start_trace", &PyEngine::StartTrace, nb::arg("path"), nb::arg("max_bytes"),
           "Records every later allocate, free, pin, unpin, eviction and page-in\n"
           "into `path` (tensorflow_lms_allocator.trace reads it), at most\n"
           "`max_bytes`.")
      .def("stop_trace", &PyEngine::StopTrace,
           "Finishes the trace file: {path, events, dropped, max_bytes}.")
      .def("inspect", &PyEngine::Inspect, nb::arg("address"))
      .def("stats", &PyEngine::Stats, "Every statistic, as a dict of ints.")
      .def("fill_pattern", &PyEngine::Fill, nb::arg("address"), nb::arg("bytes"),
           nb::arg("seed"),
           "Writes the seeded test pattern (no pin is taken; through the\n"
           "backend's copies where the host cannot touch device memory).")
      .def("verify_pattern", &PyEngine::Verify, nb::arg("address"), nb::arg("bytes"),
           nb::arg("seed"), "First differing offset, or -1 if intact.")
      .def_prop_ro("backend", [](PyEngine& e) { return std::string(e.engine().backend().Name()); },
                   "\"posix\" or \"cuda\".")
      .def("add_fenced_stream", &PyEngine::AddFencedStream, nb::arg("stream"),
           "Registers a CUDA stream (a CUstream as int, e.g. cupy Stream.ptr) whose\n"
           "queued kernels may touch this engine's memory after their unpin.")
      .def("remove_fenced_stream", &PyEngine::RemoveFencedStream, nb::arg("stream"))
      .def("unpinned_touches", &PyEngine::Touches)
      .def("clear_unpinned_touches",
           [](PyEngine& e) { e.engine().ClearUnpinnedTouches(); })
      .def("reset_peaks", [](PyEngine& e) { e.engine().ResetPeaks(); })
      .def_prop_ro("granule_bytes", [](PyEngine& e) { return e.engine().granule_bytes(); })
      .def_prop_ro("small_object_threshold",
                   [](PyEngine& e) { return e.engine().small_object_threshold(); })
      .def_prop_ro("device_granules", [](PyEngine& e) { return e.engine().device_granules(); })
      .def_prop_ro("host_granules", [](PyEngine& e) { return e.engine().host_granules(); })
      .def_prop_ro("device_granules_in_use",
                   [](PyEngine& e) { return e.engine().device_granules_in_use(); })
      .def_prop_ro("cached_granules", [](PyEngine& e) { return e.engine().cached_granules(); })
      .def_prop_ro("small_pages", [](PyEngine& e) { return e.engine().small_pages(); },
                   "Live small-object pages, resident or evicted.")
      .def_prop_rw("lms_enabled", [](PyEngine& e) { return e.engine().lms_enabled(); },
                   [](PyEngine& e, bool v) { e.engine().SetLmsEnabled(v); })
      .def_prop_rw("defrag_enabled", [](PyEngine& e) { return e.engine().defrag_enabled(); },
                   [](PyEngine& e, bool v) { e.engine().SetDefragEnabled(v); });

  nb::dict docs;
#define LMS_STAT_DOC(name, doc) docs[#name] = doc;
  LMS_FOR_EACH_STATISTIC(LMS_STAT_DOC)
#undef LMS_STAT_DOC
  m.attr("STATISTICS") = docs;

  m.def("set_thread_label",
        [](std::optional<std::string> label) {
          // Labels live for the process: a label names a kernel, and there
          // are few of them.
          static std::mutex mu;
          static std::set<std::string>* labels = new std::set<std::string>();
          if (!label.has_value()) {
            lms::StrictMonitor::SetThreadLabel(nullptr);
            return;
          }
          std::lock_guard<std::mutex> lock(mu);
          lms::StrictMonitor::SetThreadLabel(labels->insert(*label).first->c_str());
        },
        nb::arg("label").none(),
        "Labels this thread's later calls as the kernel `label` (None: none),\n"
        "as the TensorFlow adapter labels a running kernel: access traces name\n"
        "ops with it, and the learned policy keys allocations by it (and by\n"
        "their size and occurrence: setting a label starts a new kernel run).");
  m.def("host_limit_from_env", [] {
    size_t bytes = 0;
    lms::Check(lms::HostLimitFromEnv(&bytes));
    return bytes;
  }, "TF_GPU_HOST_MEM_LIMIT_IN_MB in bytes (64 GiB if unset); ValueError if bad.");
  m.def("settings_table", [] {
    nb::list rows;
    for (const lms::SettingInfo& s : lms::kSettings) {
      rows.append(nb::make_tuple(s.name, s.default_value, s.in_readme));
    }
    return rows;
  }, "Every variable LMS reads, as (name, documented default, in the README's\n"
     "table), from engine/env_options.h: the one place for settings.\n\n"
     "Example:\n"
     "    >>> ('TF_LMS_POLICY', 'learned', True) in settings_table()\n"
     "    True");
  m.def("settings_from_env", [] {
    lms::Settings s;
    std::vector<std::string> notes;
    lms::Check(lms::ReadSettingsFromEnv(&s, &notes));
    nb::dict d;
    d["lms_enabled"] = s.engine.lms_enabled;
    d["defrag_enabled"] = s.engine.defrag_enabled;
    d["strict"] = s.engine.strict;
    d["unmap_evicted"] = s.engine.unmap_evicted;
    d["policy"] = lms::PolicyName(s.engine.policy);
    d["prefetch"] = s.prefetch;
    d["granule_bytes"] = s.granule_bytes;
    d["huge_pages"] = lms::HugePagesName(s.huge_pages);
    d["device_bytes"] = s.engine.device_bytes;
    d["host_bytes"] = s.engine.host_bytes;
    d["host_ahead_bytes"] = s.engine.host_ahead_bytes;
    d["cuda_driver_path"] = lms::CudaDriverPathFromEnv();
    d["tensorflow_gpu_allocator"] = lms::TensorFlowGpuAllocatorFromEnv();
    d["notes"] = notes;
    return d;
  }, "The settings TensorFlow's LMS devices would take from this process's\n"
     "environment now (every TF_LMS_* variable and TF_GPU_HOST_MEM_LIMIT_IN_MB,\n"
     "each absent one at its default); ValueError naming a bad value.\n\n"
     "Example:\n"
     "    >>> settings_from_env()['policy']\n"
     "    'learned'");
  m.def("cgroup_memory_limit", [] { return lms::ProcessCgroupMemoryLimitBytes(); },
        "The memory limit of this process's cgroup in bytes (v1 or v2, the\n"
        "smallest of its cgroup and their ancestors), 0 where none is set:\n"
        "TF_GPU_HOST_MEM_LIMIT_IN_MB's default is at most this.\n\n"
        "Example:\n"
        "    >>> cgroup_memory_limit() >= 0\n"
        "    True");
}
