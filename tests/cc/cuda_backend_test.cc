// The CUDA backend's contract (engine/backend.h) and its stream protocol
// (Note [Stream protocol] in backends/cuda_backend.h), over the fake CUDA
// driver that TF_LMS_CUDA_DRIVER_PATH names (tests/fake_cuda). Every test
// starts from a fresh fake and ends by checking that the fake saw no
// violation and that nothing of it outlived the backend.
//
// The stream-ordering tests fail when the protocol is broken: `make
// mutation-check-cuda` (tests/cc/mutation_check.py) rebuilds this test with
// the fence, a host wait or the page-in stream wait removed and expects
// named tests to fail.
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstddef>
#include <cstdlib>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backends/backend_factory.h"
#include "backends/cuda_backend.h"
#include "backends/cuda_context.h"
#include "backends/pinned_host_budget.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "fake_cuda_access.h"
#include "harness.h"
#include "testing/engine_pattern.h"

namespace lms {
namespace {

using lms_test::Fake;

constexpr size_t kGranule = 64 << 10;

using engine_test::MustAllocate;
using lms_test::Contains;

// A fresh fake with the tests' granule; false (and a failure) if it cannot
// be had.
bool FreshFake() {
  const size_t live = Fake().reset();
  if (live != 0) {
    // The previous test failed part-way (it is already counted): start clean.
    std::printf("  (%zu fake CUDA objects left by the previous test destroyed)\n", live);
    Fake().destroy_all();
  }
  if (Fake().reset() != 0 || Fake().set_granularity(kGranule) != 0) {
    std::printf("  the fake CUDA driver could not be reset\n");
    ++lms_test::Failures();
    return false;
  }
  return true;
}

// Checks at the end of a test, after every backend is gone.
void ExpectNoViolationAndNothingLeaked() {
  EXPECT_EQ(Fake().check_invariants(), 0u);
  EXPECT_EQ(Fake().violation_count(), 0u);
  if (Fake().violation_count() != 0) std::printf("%s", Fake().Violations().c_str());
  EXPECT_EQ(Fake().live_handles(), 0u);
  EXPECT_EQ(Fake().live_mappings(), 0u);
  EXPECT_EQ(Fake().live_reservations(), 0u);
  EXPECT_EQ(Fake().live_streams(), 0u);
  EXPECT_EQ(Fake().live_events(), 0u);
}

Status MakeCuda(std::unique_ptr<CudaBackend>* out) {
  return CudaBackend::Create(/*ordinal=*/0, kGranule, /*allow_growth=*/false, out);
}

std::unique_ptr<CudaBackend> MustMakeCuda() {
  std::unique_ptr<CudaBackend> backend;
  Status s = MakeCuda(&backend);
  if (!s.ok()) {
    std::printf("CudaBackend::Create: %s\n", s.ToString().c_str());
    std::abort();
  }
  return backend;
}

std::unique_ptr<Engine> MakeEngine(std::unique_ptr<CudaBackend> backend,
                                   size_t device_granules, size_t host_granules,
                                   bool defrag = false, bool unmap_evicted = false) {
  EngineOptions o;
  o.device_bytes = device_granules * kGranule;
  o.host_bytes = host_granules * kGranule;
  o.defrag_enabled = defrag;
  o.unmap_evicted = unmap_evicted;
  o.policy = PolicyKind::kLru;  // the tests name their victims by order of use
  return engine_test::MustCreateEngine(o, std::move(backend));
}

uintptr_t Address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// The set-up of a test over the fake (TEST_F): a fresh fake, or the body
// does not run; at the end, once the body and everything it made are gone,
// the fake must have seen no violation and hold nothing.
struct FakeCudaTest {
  bool SetUp() { return fresh_ = FreshFake(); }
  ~FakeCudaTest() {
    if (fresh_) ExpectNoViolationAndNothingLeaked();
  }

 private:
  bool fresh_ = false;
};

// With a second GPU.
struct TwoGpuTest : FakeCudaTest {
  bool SetUp() { return FakeCudaTest::SetUp() && Fake().set_device_count(2) == 0; }
};

// A CUDA backend on GPU 0, `b`.
struct BackendTest : FakeCudaTest {
  bool SetUp() {
    if (!FakeCudaTest::SetUp()) return false;
    b = MustMakeCuda();
    return true;
  }
  // Remakes `b` over a driver that maps a handle only from offset 0, as
  // driver 580 did on an H100: pieces are mapped whole.
  void RemakeOverWholeHandles() {
    b.reset();
    Fake().set_map_offset_zero_only(1);
    b = MustMakeCuda();
  }
  // A range of one slot with device granule 0 mapped there (a pool of one).
  uintptr_t MapOneGranule() {
    uintptr_t base = 0;
    EXPECT_OK(b->ReserveAddressRange(kGranule, &base));
    EXPECT_OK(b->CreatePool(PoolKind::kDevice, 1));
    const GranuleId id = 0;
    EXPECT_OK(b->Map(base, PoolKind::kDevice, &id, 1, Access::kReadWrite));
    return base;
  }
  std::unique_ptr<CudaBackend> b;
};

// An engine `e` the body starts, over a backend `b` it owns.
struct EngineTest : FakeCudaTest {
  void StartEngine(std::unique_ptr<CudaBackend> backend, size_t device_granules,
                   size_t host_granules, bool defrag = false) {
    b = backend.get();
    e = MakeEngine(std::move(backend), device_granules, host_granules, defrag);
  }
  // Over GPU 0.
  void StartEngine(size_t device_granules, size_t host_granules, bool defrag = false) {
    StartEngine(MustMakeCuda(), device_granules, host_granules, defrag);
  }
  // Over GPU 0, evictions leaving addresses unmapped (Note [Evicted tensors
  // unmapped]), with defragmentation on as by default.
  void StartEngineUnmappingEvicted(size_t device_granules, size_t host_granules) {
    std::unique_ptr<CudaBackend> backend = MustMakeCuda();
    b = backend.get();
    e = MakeEngine(std::move(backend), device_granules, host_granules, /*defrag=*/true,
                   /*unmap_evicted=*/true);
  }
  // Device memory is mapped in runs from the engine's first eviction on
  // (Note [Mappings within a unit]): one of a granule, freed.
  void StartDeviceRuns() {
    void* first = e->Allocate(kGranule, /*pin=*/false, nullptr);
    EXPECT_TRUE(first != nullptr && e->Evict(first).ok() && e->Free(first).ok());
  }
  CudaBackend* b = nullptr;
  std::unique_ptr<Engine> e;
};

struct TwoGpuEngineTest : EngineTest {
  bool SetUp() { return EngineTest::SetUp() && Fake().set_device_count(2) == 0; }
};

// ------------------------------------------------------ creation and support

TEST(AMissingDriverIsAClearFailedPrecondition) {
  const char* kMissing = "/nonexistent/libcuda.so.1";
  const char* fake = std::getenv(kCudaDriverPathEnv);
  const std::string saved = fake != nullptr ? fake : "";
  setenv(kCudaDriverPathEnv, kMissing, 1);
  std::unique_ptr<Backend> backend;
  BackendSpec spec;
  spec.kind = BackendKind::kCuda;
  Status s = CreateBackend(spec, &backend);
  setenv(kCudaDriverPathEnv, saved.c_str(), 1);
  EXPECT_TRUE(s.code() == StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s.message(), "no NVIDIA driver"));
  EXPECT_TRUE(Contains(s.message(), kMissing));
  EXPECT_TRUE(backend == nullptr);
}

TEST(ADriverWithoutHostVmmIsAClearErrorNamingTheGpuAndDriver) {
  // 12.4 (the fake's default) does not know attribute 141 and answers
  // CUDA_ERROR_INVALID_VALUE, as real drivers before 12.9 do: the backend
  // finds out by creating host memory. 12.9 reports 0 through 141.
  for (int version : {12040, 12090}) {
    if (!FreshFake()) return;
    Fake().set_driver_version(version);
    Fake().set_host_vmm_supported(0);
    std::unique_ptr<CudaBackend> backend;
    Status s = MakeCuda(&backend);
    EXPECT_TRUE(s.code() == StatusCode::kFailedPrecondition);
    EXPECT_TRUE(Contains(s.message(), "(GPU 0)"));
    EXPECT_TRUE(Contains(s.message(), version == 12040 ? "driver 12.4" : "driver 12.9"));
    EXPECT_TRUE(Contains(s.message(), "CUDA 12.2"));  // what is required
    if (version == 12040) {
      EXPECT_TRUE(Contains(s.message(), "cannot report support"));
      EXPECT_TRUE(Contains(s.message(), "CUDA_ERROR_NOT_SUPPORTED"));
    } else {
      EXPECT_TRUE(Contains(s.message(), "reports no support"));
    }
    std::printf("  driver %d message: %s\n", version, s.message().c_str());
    backend.reset();
    ExpectNoViolationAndNothingLeaked();
  }
}

TEST_F(FakeCudaTest, TheHostMemoryProbeOfADriverThatCannotReportSupportFailsCleanly) {
  // 12.4 (the fake's default): attribute 141 unknown, so Create probes
  Fake().fail_nth_mem_create(1);  // the probe's cuMemCreate
  std::unique_ptr<CudaBackend> backend;
  Status s = MakeCuda(&backend);
  EXPECT_TRUE(!s.ok() && backend == nullptr);
  EXPECT_TRUE(Contains(s.message(), "probing host-located VMM support"));
  EXPECT_TRUE(Contains(s.message(), "CUDA_ERROR_OUT_OF_MEMORY"));
  std::printf("  message: %s\n", s.message().c_str());
}

TEST(ADriverThatCannotReportHostVmmButHasItWorks) {
  // Drivers 12.2-12.8 support HOST_NUMA memory without attribute 141.
  for (int version : {12020, 12080, 12090, 13000}) {
    if (!FreshFake()) return;
    Fake().set_driver_version(version);
    std::unique_ptr<CudaBackend> backend;
    Status s = MakeCuda(&backend);
    EXPECT_OK(s);
    if (!s.ok()) continue;
    auto e = MakeEngine(std::move(backend), /*device=*/2, /*host=*/2);
    void* t = MustAllocate(*e, 2 * kGranule, /*pin=*/false);
    ASSERT_TRUE(t != nullptr);
    EXPECT_OK(FillAllocation(*e, t, 2 * kGranule, 9));
    EXPECT_OK(e->Evict(t));  // host memory at HOST_NUMA (HOST on 13.0)
    EXPECT_EQ(VerifyAllocation(*e, t, 2 * kGranule, 9), -1);
    EXPECT_OK(e->Free(t));
    e.reset();
    ExpectNoViolationAndNothingLeaked();
  }
}

// Note [Where host memory is made]: the attributes may say yes while
// cuMemCreate at that location says no (the fake's refuse_host_create knob).
// The backend creates one host granule at each location at Create, prefers
// the GPU's NUMA node, takes HOST only where HOST_NUMA is refused, and fails
// at Create (not at the first eviction) where every location is refused.
TEST(HostMemoryIsMadeAtTheGpusNumaNodeOrWhereTheDriverAcceptsIt) {
  struct Case {
    int version;
    int refused;           // the fake's mask: 1 HOST_NUMA, 2 HOST
    const char* location;  // nullptr: Create must fail
  };
  for (const Case& c : {Case{13000, 0, "HOST_NUMA node 0"}, Case{13000, 1, "HOST"},
                        Case{13000, 2, "HOST_NUMA node 0"}, Case{13000, 3, nullptr},
                        Case{12090, 1, nullptr}}) {
    if (!FreshFake()) return;
    Fake().set_driver_version(c.version);
    Fake().refuse_host_create(c.refused);
    std::unique_ptr<CudaBackend> backend;
    const Status s = MakeCuda(&backend);
    std::printf("  driver %d, refused %d: %s\n", c.version, c.refused,
                s.ok() ? backend->host_location().c_str() : s.message().c_str());
    if (c.location == nullptr) {
      EXPECT_TRUE(s.code() == StatusCode::kFailedPrecondition);
      EXPECT_TRUE(Contains(s.message(), "refused host memory at every location"));
      EXPECT_TRUE(Contains(s.message(), "HOST_NUMA node 0: cuMemCreate failed with "
                                        "CUDA_ERROR_NOT_SUPPORTED"));
      ExpectNoViolationAndNothingLeaked();
      continue;
    }
    EXPECT_OK(s);
    if (!s.ok()) continue;
    EXPECT_TRUE(backend->host_location() == c.location);
    auto e = MakeEngine(std::move(backend), /*device=*/2, /*host=*/2);
    void* t = MustAllocate(*e, 2 * kGranule, /*pin=*/false);
    ASSERT_TRUE(t != nullptr);
    EXPECT_OK(FillAllocation(*e, t, 2 * kGranule, 19));
    EXPECT_OK(e->Evict(t));  // host memory at the chosen location
    EXPECT_EQ(VerifyAllocation(*e, t, 2 * kGranule, 19), -1);
    EXPECT_OK(e->Free(t));
    e.reset();
    ExpectNoViolationAndNothingLeaked();
  }
}

TEST(ATooOldDriverIsAClearError) {
  for (int version : {11080, 12010}) {
    if (!FreshFake()) return;
    Fake().set_driver_version(version);
    std::unique_ptr<CudaBackend> backend;
    Status s = MakeCuda(&backend);
    EXPECT_TRUE(s.code() == StatusCode::kFailedPrecondition);
    EXPECT_TRUE(Contains(s.message(), version == 11080 ? "CUDA 11.8" : "driver 12.1"));
    EXPECT_TRUE(Contains(s.message(), "too old"));
    EXPECT_TRUE(Contains(s.message(), "CUDA 12.2 or newer"));
    std::printf("  driver %d: %s\n", version, s.message().c_str());
    backend.reset();
    ExpectNoViolationAndNothingLeaked();
  }
  EXPECT_EQ(Fake().reset(), 0u);
}

TEST_F(FakeCudaTest, TheGranuleIsTheDriversWhenLarger) {
  EXPECT_EQ(MustMakeCuda()->granule_bytes(), kGranule);
  if (Fake().reset() != 0 || Fake().set_granularity(4 * kGranule) != 0) {
    ++lms_test::Failures();
    return;
  }
  EXPECT_EQ(MustMakeCuda()->granule_bytes(), 4 * kGranule);
}

TEST_F(BackendTest, NoAccessMappingsAreRefusedOnAGpu) {
  uintptr_t base = 0;
  EXPECT_OK(b->ReserveAddressRange(4 * kGranule, &base));
  EXPECT_OK(b->CreatePool(PoolKind::kHost, 2));
  const GranuleId ids[] = {0};
  Status s = b->Map(base, PoolKind::kHost, ids, 1, Access::kNone);
  EXPECT_TRUE(s.code() == StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s.message(), "TF_LMS_STRICT is for the emulated device"));
  b->ReleaseAddressRange(base, 4 * kGranule);
}

// Note [Copy tickets]. A release waits on the host for the copies that
// read or wrote its memory, and only for those: a run whose last copy is
// done is released at once while another copy is in flight, and the run
// that copy writes is released only after it.
TEST_F(BackendTest, AReleaseWaitsForTheCopiesOfItsOwnMemoryOnly) {
  RemakeOverWholeHandles();
  uintptr_t base = 0;
  EXPECT_OK(b->ReserveAddressRange(8 * kGranule, &base));
  EXPECT_OK(b->CreatePool(PoolKind::kDevice, 4));
  EXPECT_OK(b->CreatePool(PoolKind::kHost, 8));
  const GranuleRun done[] = {{0, 2}}, late[] = {{2, 2}};
  b->DefineRuns(PoolKind::kHost, done, 1);
  b->DefineRuns(PoolKind::kHost, late, 1);
  const GranuleId device[] = {0, 1, 2, 3};
  EXPECT_OK(b->Map(base, PoolKind::kDevice, device, 4, Access::kReadWrite));
  std::vector<unsigned char> in(4 * kGranule);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i * 13 + 5);
  EXPECT_OK(b->CopyFromHost(base, in.data(), in.size()));
  const GranuleId to_done[] = {0, 1}, to_late[] = {2, 3};
  EXPECT_OK(b->CopyGranules(PoolKind::kHost, to_done, PoolKind::kDevice, device,
                            2 * kGranule));
  EXPECT_OK(b->WaitForCopies());
  Fake().set_copy_delay_us(200000);
  EXPECT_OK(b->CopyGranules(PoolKind::kHost, to_late, PoolKind::kDevice, device + 2,
                            2 * kGranule));
  const int64_t waits = b->GetStatistics().host_waits;
  b->ReleaseRuns(PoolKind::kHost, done, 1);  // its copy is done: no wait
  EXPECT_EQ(b->GetStatistics().host_waits - waits, 0);
  // The late run's copy still writes it: released after a wait for it, with
  // no copy touching released memory (the fake would record it).
  b->ReleaseRuns(PoolKind::kHost, late, 1);
  EXPECT_EQ(b->GetStatistics().host_waits - waits, 1);
  Fake().set_copy_delay_us(0);
  EXPECT_EQ(Fake().violation_count(), 0u);
  EXPECT_OK(b->Unmap(base, 4));
}

// Note [Copy tickets], past the ring's end: a run whose last copy's ticket
// the ring of kCopyRing events no longer holds (20 batches of copies ended
// since) is released after a wait on the oldest event it holds, which the
// copy stream completes after that copy; one wait, no copy touching released
// memory, and a release of memory copied long before waits no more.
TEST_F(BackendTest, AReleaseOfATicketTheRingNoLongerHoldsWaitsThroughItsOldest) {
  RemakeOverWholeHandles();
  uintptr_t base = 0;
  EXPECT_OK(b->ReserveAddressRange(8 * kGranule, &base));
  EXPECT_OK(b->CreatePool(PoolKind::kDevice, 2));
  EXPECT_OK(b->CreatePool(PoolKind::kHost, 6));
  const GranuleRun early[] = {{0, 2}}, late[] = {{2, 2}}, churn[] = {{4, 2}};
  for (const GranuleRun* r : {early, late, churn}) b->DefineRuns(PoolKind::kHost, r, 1);
  const GranuleId device[] = {0, 1};
  EXPECT_OK(b->Map(base, PoolKind::kDevice, device, 2, Access::kReadWrite));
  std::vector<unsigned char> in(2 * kGranule), out(2 * kGranule);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i * 11 + 3);
  EXPECT_OK(b->CopyFromHost(base, in.data(), in.size()));
  const GranuleId to_early[] = {0, 1}, to_late[] = {2, 3}, to_churn[] = {4, 5};
  EXPECT_OK(b->CopyGranules(PoolKind::kHost, to_early, PoolKind::kDevice, device,
                            2 * kGranule));
  EXPECT_OK(b->EndRemapBatch());
  EXPECT_OK(b->WaitForCopies());
  // Long enough to be in flight still after the 20 batches below on a
  // loaded machine (200 ms was not once, under ASan beside TSan's build).
  Fake().set_copy_delay_us(1000000);
  EXPECT_OK(b->CopyGranules(PoolKind::kHost, to_late, PoolKind::kDevice, device,
                            2 * kGranule));
  EXPECT_OK(b->EndRemapBatch());
  Fake().set_copy_delay_us(0);
  for (int batch = 0; batch < 20; ++batch) {  // behind the late copy on the copy stream
    EXPECT_OK(b->CopyGranules(PoolKind::kHost, to_churn, PoolKind::kDevice, device,
                              2 * kGranule));
    EXPECT_OK(b->EndRemapBatch());
  }
  const int64_t waits = b->GetStatistics().host_waits;
  b->ReleaseRuns(PoolKind::kHost, early, 1);  // its copy was waited for: no wait
  EXPECT_EQ(b->GetStatistics().host_waits - waits, 0);
  b->ReleaseRuns(PoolKind::kHost, late, 1);
  EXPECT_EQ(b->GetStatistics().host_waits - waits, 1);
  EXPECT_EQ(Fake().violation_count(), 0u);
  EXPECT_OK(b->WaitForCopies());
  EXPECT_OK(b->CopyToHost(out.data(), base, out.size()));
  EXPECT_TRUE(in == out);
  EXPECT_OK(b->Unmap(base, 2));
}

// Host memory in runs (backend.h, DefineRuns): a run is made by one
// cuMemCreate and mapped by one cuMemMap wherever it goes, its bytes in order
// (new runs that adjoin in the window are granted there in one call); a Map
// naming part of a run is refused where the driver maps only from offset 0
// (LMS maps pieces whole there, so that every cuMemUnmap covers whole
// mappings, as cuMemUnmap requires); ReleaseRuns gives the memory back, and
// the ids are single granules again.
TEST_F(BackendTest, AHostRunIsOnePieceMadeMappedAndReleasedWhole) {
  RemakeOverWholeHandles();
  EXPECT_TRUE(!b->MapsPartsOfRuns(PoolKind::kHost));
  uintptr_t base = 0;
  EXPECT_OK(b->ReserveAddressRange(8 * kGranule, &base));
  EXPECT_OK(b->CreatePool(PoolKind::kHost, 8));
  const GranuleRun runs[] = {{2, 4}, {6, 2}};
  b->DefineRuns(PoolKind::kHost, runs, 2);
  const GranuleId ids[] = {2, 3, 4, 5, 6, 7};
  const size_t budget_before = PinnedHostBudget::Process().used();
  Fake().reset_call_counts();
  EXPECT_OK(b->Map(base, PoolKind::kHost, ids, 6, Access::kReadWrite));
  EXPECT_EQ(Fake().call_count("cuMemCreate"), 2u);
  EXPECT_EQ(Fake().call_count("cuMemMap"), 4u);        // each into the window, then at base
  EXPECT_EQ(Fake().call_count("cuMemSetAccess"), 2u);  // the window's two at once, base
  EXPECT_EQ(PinnedHostBudget::Process().used() - budget_before, 6 * kGranule);
  std::vector<unsigned char> in(6 * kGranule), out(6 * kGranule);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i * 7 + i / kGranule);
  EXPECT_OK(b->CopyFromHost(base, in.data(), in.size()));
  EXPECT_OK(b->CopyToHost(out.data(), base, out.size()));
  EXPECT_TRUE(in == out);
  const Status part = b->Map(base + 6 * kGranule, PoolKind::kHost, ids + 1, 2,
                             Access::kReadWrite);
  EXPECT_TRUE(part.code() == StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(part.message(), "part of a piece of 4 granules from granule 2"));
  Fake().reset_call_counts();
  EXPECT_OK(b->Unmap(base, 6));
  EXPECT_EQ(Fake().call_count("cuMemUnmap"), 1u);  // both pieces: they adjoin
  b->ReleaseRuns(PoolKind::kHost, runs, 2);
  EXPECT_EQ(Fake().call_count("cuMemRelease"), 2u);
  EXPECT_EQ(PinnedHostBudget::Process().used(), budget_before);
  EXPECT_OK(b->Map(base, PoolKind::kHost, ids + 1, 1, Access::kReadWrite));  // one granule
  EXPECT_OK(b->Unmap(base, 1));
  b->ReleaseAddressRange(base, 8 * kGranule);
}

// Where the driver maps at an offset, part of a host run (consecutive ids of
// it) is one cuMemMap at its offset into the run's piece, made ahead by
// MakeRuns (Note [Host memory made ahead] in engine.h); the slots show that
// part's bytes.
TEST_F(BackendTest, PartOfAHostRunMadeAheadIsOneMappingAtItsOffset) {
  EXPECT_TRUE(b->MapsPartsOfRuns(PoolKind::kHost));
  uintptr_t base = 0;
  EXPECT_OK(b->ReserveAddressRange(8 * kGranule, &base));
  EXPECT_OK(b->CreatePool(PoolKind::kHost, 8));
  const GranuleRun run = {2, 4};
  b->DefineRuns(PoolKind::kHost, &run, 1);
  Fake().reset_call_counts();
  EXPECT_OK(b->MakeRuns(PoolKind::kHost, &run, 1));
  EXPECT_EQ(Fake().call_count("cuMemCreate"), 1u);
  EXPECT_EQ(Fake().pool_bytes_in_use(FAKE_CUDA_POOL_HOST), 4 * kGranule);
  const GranuleId all[] = {2, 3, 4, 5};
  std::vector<unsigned char> in(4 * kGranule);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i * 5 + i / kGranule);
  EXPECT_OK(b->Map(base, PoolKind::kHost, all, 4, Access::kReadWrite));
  EXPECT_OK(b->CopyFromHost(base, in.data(), in.size()));
  EXPECT_OK(b->Unmap(base, 4));
  Fake().reset_call_counts();
  EXPECT_OK(b->Map(base + 5 * kGranule, PoolKind::kHost, all + 1, 2, Access::kReadWrite));
  EXPECT_EQ(Fake().call_count("cuMemCreate"), 0u);
  EXPECT_EQ(Fake().call_count("cuMemMap"), 1u);
  uintptr_t first = 0;
  EXPECT_EQ(b->MappingAt(base + 6 * kGranule, &first), 2u);
  EXPECT_EQ(first, base + 5 * kGranule);
  const auto* seen =
      static_cast<const unsigned char*>(Fake().device_alias(base + 5 * kGranule, 2 * kGranule));
  ASSERT_TRUE(seen != nullptr);
  EXPECT_TRUE(std::equal(in.begin() + kGranule, in.begin() + 3 * kGranule, seen));
  EXPECT_OK(b->Unmap(base + 5 * kGranule, 2));
  b->ReleaseRuns(PoolKind::kHost, &run, 1);
  EXPECT_EQ(Fake().pool_bytes_in_use(FAKE_CUDA_POOL_HOST), 0u);
  b->ReleaseAddressRange(base, 8 * kGranule);
}

TEST_F(TwoGpuTest, EveryCallLeavesTheCallersContextCurrent) {
  auto b = MustMakeCuda();  // GPU 0
  const CudaDriver& d = b->driver();
  cu::CUdevice other_device = 0;
  cu::CUcontext other = nullptr, current = nullptr;
  EXPECT_OK(d.Check(d.cuDeviceGet(&other_device, 1), "cuDeviceGet"));
  EXPECT_OK(d.Check(d.cuDevicePrimaryCtxRetain(&other, other_device), "retain"));
  ASSERT_TRUE(other != b->context());
  uintptr_t base = 0;
  for (cu::CUcontext callers : {static_cast<cu::CUcontext>(nullptr), other}) {
    EXPECT_OK(d.Check(d.cuCtxSetCurrent(callers), "cuCtxSetCurrent"));
    if (base == 0) {
      EXPECT_OK(b->ReserveAddressRange(2 * kGranule, &base));
      EXPECT_OK(b->CreatePool(PoolKind::kDevice, 2));
    }
    const GranuleId ids[] = {0, 1};
    EXPECT_OK(b->Map(base, PoolKind::kDevice, ids, 2, Access::kReadWrite));
    EXPECT_OK(b->Unmap(base, 2));
    EXPECT_OK(d.Check(d.cuCtxGetCurrent(&current), "cuCtxGetCurrent"));
    EXPECT_TRUE(current == callers);
  }
  b->ReleaseAddressRange(base, 2 * kGranule);
  EXPECT_OK(d.Check(d.cuCtxSetCurrent(nullptr), "cuCtxSetCurrent"));
  EXPECT_OK(d.Check(d.cuDevicePrimaryCtxRelease(other_device), "release"));
}

// ------------------------------------------------------------ all or nothing

// On a driver that maps only from offset 0, every device granule is a piece
// of its own, so a pool is made of many; any one failing unmakes the rest.
TEST_F(BackendTest, CreatePoolIsAllOrNothing) {
  RemakeOverWholeHandles();
  EXPECT_TRUE(!b->maps_at_offsets());
  Fake().fail_nth_mem_create(3);  // the third granule's handle
  Status s = b->CreatePool(PoolKind::kDevice, 8);
  EXPECT_TRUE(s.code() == StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(s.message(), "cuMemCreate"));
  EXPECT_EQ(Fake().live_handles(), 0u);
  EXPECT_EQ(Fake().live_reservations(), 0u);
  Fake().fail_nth_mem_map(5, cu::CUDA_ERROR_UNKNOWN);  // mapping the window
  s = b->CreatePool(PoolKind::kDevice, 8);
  EXPECT_TRUE(Contains(s.message(), "cuMemMap"));
  EXPECT_EQ(Fake().live_handles(), 0u);
  EXPECT_EQ(Fake().live_mappings(), 0u);
  EXPECT_EQ(Fake().live_reservations(), 0u);
  EXPECT_EQ(Fake().pool_bytes_in_use(FAKE_CUDA_POOL_DEVICE), 0u);
  EXPECT_OK(b->CreatePool(PoolKind::kDevice, 8));  // the pool never existed
  EXPECT_EQ(Fake().live_handles(), 8u);
}

// Note [Device memory in runs]: the device pool is one piece here (8
// granules, under kDevicePieceBytes), and a run of consecutive ids is one
// cuMemMap at its offset into it, whatever slots it lands on; the bytes are
// the pool's, seen the same through the window and through every mapping.
TEST_F(BackendTest, ARunOfConsecutiveDeviceGranulesIsOneMappingAtItsOffset) {
  EXPECT_TRUE(b->maps_at_offsets());
  uintptr_t base = 0;
  EXPECT_OK(b->ReserveAddressRange(8 * kGranule, &base));
  Fake().reset_call_counts();
  EXPECT_OK(b->CreatePool(PoolKind::kDevice, 8));
  EXPECT_EQ(Fake().call_count("cuMemCreate"), 1u);
  EXPECT_EQ(Fake().live_handles(), 1u);
  Fake().reset_call_counts();
  const GranuleId ids[] = {3, 4, 5, 1, 2};  // two runs: 3..5 and 1..2
  EXPECT_OK(b->Map(base, PoolKind::kDevice, ids, 5, Access::kReadWrite));
  EXPECT_EQ(Fake().call_count("cuMemMap"), 2u);
  EXPECT_EQ(Fake().call_count("cuMemSetAccess"), 1u);
  uintptr_t first = 0;
  EXPECT_EQ(b->MappingAt(base + 2 * kGranule, &first), 3u);
  EXPECT_EQ(first, base);
  EXPECT_EQ(b->MappingAt(base + 4 * kGranule, &first), 2u);
  EXPECT_EQ(first, base + 3 * kGranule);
  std::vector<unsigned char> bytes(5 * kGranule);
  for (size_t i = 0; i < bytes.size(); ++i) {  // a different pattern in each granule
    bytes[i] = static_cast<unsigned char>(i * 7 + 3 + i / kGranule * 13);
  }
  EXPECT_OK(b->CopyFromHost(base, bytes.data(), bytes.size()));  // through the window
  // What a kernel sees at each slot (the fake's alias of the device address,
  // through the slot's own mapping) is that granule's bytes.
  const auto* seen = static_cast<const unsigned char*>(Fake().device_alias(base, 5 * kGranule));
  ASSERT_TRUE(seen != nullptr);
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), seen));
  // Granule 4 (slot 1) read through the window of the pool, by a copy.
  const GranuleId four = 4, spare = 7;
  EXPECT_OK(b->CopyGranules(PoolKind::kDevice, &spare, PoolKind::kDevice, &four, kGranule));
  EXPECT_OK(b->Map(base + 7 * kGranule, PoolKind::kDevice, &spare, 1, Access::kReadWrite));
  std::vector<unsigned char> back(kGranule);
  EXPECT_OK(b->CopyToHost(back.data(), base + 7 * kGranule, back.size()));
  EXPECT_TRUE(std::equal(back.begin(), back.end(), bytes.begin() + kGranule));
  // A mapping goes whole or not at all: cutting one is refused, and nothing
  // is unmapped.
  Fake().reset_call_counts();
  Status s = b->Unmap(base + kGranule, 2);
  EXPECT_TRUE(s.code() == StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "whole mappings"));
  s = b->UnmapReleased(base + 4 * kGranule, 1, b->ReleaseMark());
  EXPECT_TRUE(s.code() == StatusCode::kInvalidArgument);
  const GranuleId six = 6;
  s = b->Map(base + 2 * kGranule, PoolKind::kDevice, &six, 1, Access::kReadWrite);
  EXPECT_TRUE(s.code() == StatusCode::kInvalidArgument);
  EXPECT_EQ(Fake().call_count("cuMemUnmap"), 0u);
  EXPECT_OK(b->CopyToHost(back.data(), base + 4 * kGranule, back.size()));
  EXPECT_TRUE(std::equal(back.begin(), back.end(), bytes.begin() + 4 * kGranule));
  EXPECT_OK(b->Unmap(base, 8));
  EXPECT_EQ(Fake().call_count("cuMemUnmap"), 2u);  // two runs of mapped slots
  EXPECT_EQ(b->GetStatistics().mappings, 3);
  EXPECT_EQ(b->GetStatistics().unmappings, 3);
  b->ReleaseAddressRange(base, 8 * kGranule);
}

// Under allow_growth the device pool's pieces double from one granule, as
// TensorFlow's BFC allocator grows its regions: memory made stays within
// twice what was used, in few handles.
TEST_F(FakeCudaTest, UnderAllowGrowthDevicePiecesDoubleAsTheyAreFirstUsed) {
  std::unique_ptr<CudaBackend> b;
  EXPECT_OK(CudaBackend::Create(0, kGranule, /*allow_growth=*/true, &b));
  if (b == nullptr) return;
  uintptr_t base = 0;
  EXPECT_OK(b->ReserveAddressRange(16 * kGranule, &base));
  EXPECT_OK(b->CreatePool(PoolKind::kDevice, 16));
  EXPECT_EQ(Fake().pool_bytes_in_use(FAKE_CUDA_POOL_DEVICE), 0u);
  const GranuleId ids[] = {0, 1, 2, 3};
  EXPECT_OK(b->Map(base, PoolKind::kDevice, ids, 1, Access::kReadWrite));
  EXPECT_EQ(Fake().pool_bytes_in_use(FAKE_CUDA_POOL_DEVICE), kGranule);  // piece 0
  Fake().reset_call_counts();
  EXPECT_OK(b->Map(base + kGranule, PoolKind::kDevice, ids + 1, 3, Access::kReadWrite));
  // Pieces [1, 3) and [3, 7): made whole, the ids mapped as two runs.
  EXPECT_EQ(Fake().call_count("cuMemCreate"), 2u);
  EXPECT_EQ(Fake().call_count("cuMemMap"), 2u + 2u);  // two into the window, two at slots
  EXPECT_EQ(Fake().pool_bytes_in_use(FAKE_CUDA_POOL_DEVICE), 7 * kGranule);
  EXPECT_OK(b->Unmap(base, 4));
  b->ReleaseAddressRange(base, 16 * kGranule);
  b.reset();
  ExpectNoViolationAndNothingLeaked();
}

TEST_F(BackendTest, MapIsAllOrNothingUnderAnInjectedFailure) {
  uintptr_t base = 0;
  EXPECT_OK(b->ReserveAddressRange(8 * kGranule, &base));
  EXPECT_OK(b->CreatePool(PoolKind::kDevice, 8));
  const size_t window_mappings = Fake().live_mappings();
  const GranuleId first[] = {0, 1, 2, 3};
  EXPECT_OK(b->Map(base, PoolKind::kDevice, first, 2, Access::kReadWrite));
  EXPECT_OK(b->Map(base + 2 * kGranule, PoolKind::kDevice, first + 2, 2, Access::kReadWrite));
  std::vector<unsigned char> bytes(2 * kGranule, 0x5a);
  EXPECT_OK(b->CopyFromHost(base, bytes.data(), bytes.size()));
  // Slots 2..5 replaced by granules 4..7, each a mapping of its own (ids out
  // of order); the third cuMemMap fails.
  Fake().fail_nth_mem_map(3, cu::CUDA_ERROR_OUT_OF_MEMORY);
  const GranuleId second[] = {4, 6, 5, 7};
  Status s = b->Map(base + 2 * kGranule, PoolKind::kDevice, second, 4, Access::kReadWrite);
  EXPECT_TRUE(s.code() == StatusCode::kResourceExhausted);
  // Every slot of the call is unmapped, whatever it held; the others keep
  // theirs and their bytes.
  EXPECT_EQ(Fake().live_mappings(), window_mappings + 1);  // slots 0 and 1: one run
  unsigned char probe[16];
  for (int slot = 2; slot < 6; ++slot) {
    EXPECT_TRUE(b->CopyToHost(probe, base + slot * kGranule, sizeof(probe)).code() ==
                StatusCode::kFailedPrecondition);
  }
  std::vector<unsigned char> back(2 * kGranule);
  EXPECT_OK(b->CopyToHost(back.data(), base, back.size()));
  EXPECT_TRUE(back == bytes);
  // The granules are untouched: mapping them again works.
  EXPECT_OK(b->Map(base + 2 * kGranule, PoolKind::kDevice, second, 4, Access::kReadWrite));
  EXPECT_OK(b->Unmap(base, 6));
  EXPECT_EQ(Fake().live_mappings(), window_mappings);
  b->ReleaseAddressRange(base, 8 * kGranule);
}

// Polls `done` until it holds or 10 s pass: another thread's progress, which
// the assertions after it check.
template <typename Done>
void WaitUpTo10s(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Note [Unmaps on a thread of their own]: a freed mapping whose last use is
// done is unmapped by the backend's unmap thread, not by the caller, once a
// map of the caller's is made; a map at its own slot waits for that unmap
// (cuMemMap refuses a mapped range). The fake's gate holds every cuMemUnmap:
// were the unmap the caller's, the call would not return until it opened.
TEST_F(BackendTest, AFreedMappingIsUnmappedOnTheUnmapThreadAndAMapThereWaitsForIt) {
  uintptr_t base = 0;
  EXPECT_OK(b->ReserveAddressRange(2 * kGranule, &base));
  EXPECT_OK(b->CreatePool(PoolKind::kDevice, 2));
  const GranuleId ids[] = {0, 1};
  EXPECT_OK(b->Map(base, PoolKind::kDevice, ids, 1, Access::kReadWrite));
  const size_t mapped = Fake().live_mappings();
  const int64_t unmappings = b->GetStatistics().unmappings;
  Fake().reset_call_counts();
  Fake().hold_unmaps(1);
  std::future<Status> freed = std::async(std::launch::async, [&] {
    return b->UnmapReleased(base, 1, b->ReleaseMark());  // no fenced stream: done
  });
  const bool returned = freed.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  EXPECT_TRUE(returned);  // the free returned with the gate closed
  if (returned) EXPECT_OK(freed.get());
  EXPECT_EQ(b->GetStatistics().unmappings - unmappings, 1);  // handed over
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(Fake().unmaps_waiting(), 0);  // held for the caller's next map
  EXPECT_EQ(Fake().live_mappings(), mapped);
  // Where a unit goes must not depend on the thread's timing: the slot
  // counts as free of queued work (the engine places units there).
  EXPECT_TRUE(b->MapsWithoutWait(base, 1, /*poll=*/true));
  std::future<Status> map = std::async(std::launch::async, [&] {
    return b->Map(base, PoolKind::kDevice, ids + 1, 1, Access::kReadWrite);
  });
  WaitUpTo10s([] { return Fake().unmaps_waiting() != 0; });
  EXPECT_EQ(Fake().unmaps_waiting(), 1);  // the map released it, to another thread
  EXPECT_TRUE(map.wait_for(std::chrono::milliseconds(100)) == std::future_status::timeout);
  Fake().hold_unmaps(0);
  EXPECT_OK(map.get());  // after the unmap: the fake refuses a mapped range
  EXPECT_EQ(Fake().call_count("cuMemUnmap"), 1u);
  EXPECT_EQ(Fake().live_mappings(), mapped);  // the old mapping gone, the new one made
  unsigned char byte = 7;
  EXPECT_OK(b->CopyFromHost(base, &byte, 1));  // the new mapping is the slot's
  EXPECT_OK(b->Unmap(base, 1));
  b->ReleaseAddressRange(base, 2 * kGranule);
}

// The unmaps handed over wait for the caller's next map, and go once it is
// made, elsewhere: the driver takes one VMM call at a time, and a map made
// behind them would wait for them.
TEST_F(BackendTest, HandedOverUnmapsWaitUntilTheCallersNextMapIsMade) {
  uintptr_t base = 0;
  EXPECT_OK(b->ReserveAddressRange(4 * kGranule, &base));
  EXPECT_OK(b->CreatePool(PoolKind::kDevice, 4));
  const GranuleId ids[] = {0, 1, 2, 3};
  EXPECT_OK(b->Map(base, PoolKind::kDevice, ids, 2, Access::kReadWrite));
  Fake().reset_call_counts();
  EXPECT_OK(b->UnmapReleased(base, 2, b->ReleaseMark()));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(Fake().call_count("cuMemUnmap"), 0u);  // held
  EXPECT_OK(b->Map(base + 2 * kGranule, PoolKind::kDevice, ids + 2, 2, Access::kReadWrite));
  WaitUpTo10s([] { return Fake().call_count("cuMemUnmap") != 0; });
  EXPECT_EQ(Fake().call_count("cuMemUnmap"), 1u);  // made by the thread, unasked
  EXPECT_OK(b->Unmap(base, 4));
  b->ReleaseAddressRange(base, 4 * kGranule);
}

TEST_F(EngineTest, InjectedDriverFailuresLoseNoByteAndTheEngineKeepsWorking) {
  StartEngine(/*device=*/4, /*host=*/8);
  const size_t size = 3 * kGranule + 100;
  void* a = MustAllocate(*e, size, /*pin=*/false);
  ASSERT_TRUE(a != nullptr);
  EXPECT_OK(FillAllocation(*e, a, size, 31));
  // The eviction's remap to host granules fails part-way.
  Fake().fail_nth_mem_map(2, cu::CUDA_ERROR_UNKNOWN);
  Status s;
  EXPECT_TRUE(e->Allocate(2 * kGranule, /*pin=*/true, &s) == nullptr);
  EXPECT_TRUE(Contains(s.message(), "cuMemMap"));
  AllocationInfo info;
  EXPECT_OK(e->Inspect(a, &info));
  EXPECT_TRUE(!info.evicted);
  EXPECT_EQ(VerifyAllocation(*e, a, size, 31), -1);
  EXPECT_OK(e->CheckInvariants());
  // The page-in's remap fails: it stays evicted and readable.
  EXPECT_OK(e->Evict(a));
  Fake().fail_nth_mem_map(1, cu::CUDA_ERROR_OUT_OF_MEMORY);
  uint64_t id = 0;
  EXPECT_TRUE(!e->Pin(a, &id).ok());
  EXPECT_OK(e->Inspect(a, &info));
  EXPECT_TRUE(info.evicted && info.pin_count == 0);
  EXPECT_EQ(VerifyAllocation(*e, a, size, 31), -1);
  EXPECT_OK(e->CheckInvariants());
  // And everything works afterwards.
  EXPECT_OK(e->Pin(a, &id));
  EXPECT_EQ(VerifyAllocation(*e, a, size, 31), -1);
  EXPECT_OK(e->Unpin(a, id));
  EXPECT_OK(e->Free(a));
  EXPECT_TRUE(MustAllocate(*e, 4 * kGranule, /*pin=*/true) != nullptr);
  EXPECT_OK(e->CheckInvariants());
}

TEST_F(EngineTest, BytesSurviveEvictionAndPageInCycles) {
  StartEngine(/*device=*/6, /*host=*/16, /*defrag=*/true);
  std::vector<void*> live;
  const size_t sizes[] = {3 * kGranule, 2 * kGranule + 7, 100, 5000};
  for (size_t i = 0; i < 4; ++i) {
    live.push_back(MustAllocate(*e, sizes[i], /*pin=*/false));
    ASSERT_TRUE(live.back() != nullptr);
    EXPECT_OK(FillAllocation(*e, live.back(), sizes[i], 40 + i));
  }
  for (int round = 0; round < 6; ++round) {
    for (size_t i = 0; i < live.size(); ++i) {
      uint64_t id = 0;
      EXPECT_OK(e->Pin(live[i], &id));  // pages it in, evicting others
      EXPECT_EQ(VerifyAllocation(*e, live[i], sizes[i], 40 + i), -1);
      EXPECT_OK(e->Unpin(live[i], id));
      Status s = e->Evict(live[(i + round) % live.size()]);
      EXPECT_TRUE(s.ok() || s.code() == StatusCode::kFailedPrecondition);
    }
    EXPECT_OK(e->CheckInvariants());
  }
  for (size_t i = 0; i < live.size(); ++i) {
    EXPECT_EQ(VerifyAllocation(*e, live[i], sizes[i], 40 + i), -1);
  }
  const Statistics st = e->GetStatistics();
  EXPECT_TRUE(st.num_evictions > 0 && st.num_page_ins > 0);
  EXPECT_TRUE(st.num_copies >= st.num_evictions + st.num_page_ins);
  EXPECT_EQ(st.num_fences, 0);  // no stream registered: nothing to fence
  for (void* p : live) EXPECT_OK(e->Free(p));
}

// ------------------------------------------------------------ stream order

// A "kernel" that blocks until released, then writes the pattern `seed`
// over [address, address + bytes) through the fake's device alias (nothing
// if bytes is 0: a stream blocker).
// A test that stops early opens the latch and waits for the kernel (at most
// 10 s: a kernel the fake refused to run never finishes), so nothing hangs
// on it.
struct LatchedWriter {
  std::atomic<bool> released{false};
  std::atomic<bool> started{false};
  std::atomic<bool> launched{false};
  std::atomic<bool> finished{false};
  uintptr_t address = 0;
  size_t bytes = 0;
  uint64_t seed = 0;

  ~LatchedWriter() {
    released = true;
    for (int i = 0; launched && !finished && i < 10000; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  static void Run(void* self) {
    auto* w = static_cast<LatchedWriter*>(self);
    w->started = true;
    while (!w->released) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (w->bytes != 0) {
      void* alias = Fake().device_alias(w->address, w->bytes);
      if (alias != nullptr) FillPattern(alias, w->bytes, w->seed);
    }
    w->finished = true;
  }
  void WaitStarted() {
    while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // Releases the kernel `delay` from now, on another thread: the caller is
  // about to block on work queued behind it.
  std::thread ReleaseAfter(std::chrono::milliseconds delay) {
    return std::thread([this, delay] {
      std::this_thread::sleep_for(delay);
      released = true;
    });
  }
};

// A fenced non-blocking stream, as the adapter registers TensorFlow's: in
// the backend's context, or with `other_gpu` in that GPU's primary context
// (the sender's stream of a copy between GPUs).
struct FencedStream {
  explicit FencedStream(CudaBackend* backend, int other_gpu = -1) : b(backend) {
    const CudaDriver& d = b->driver();
    context = b->context();
    if (other_gpu >= 0 && (d.cuDeviceGet(&other, other_gpu) != cu::CUDA_SUCCESS ||
                           d.cuDevicePrimaryCtxRetain(&context, other) != cu::CUDA_SUCCESS)) {
      std::abort();
    }
    retained = other_gpu >= 0;
    ScopedCudaContext scope(d, context);
    if (!d.Check(d.cuStreamCreate(&stream, cu::CU_STREAM_NON_BLOCKING), "cuStreamCreate").ok() ||
        !b->AddFencedStream(stream).ok()) {
      std::abort();
    }
  }
  ~FencedStream() {
    const CudaDriver& d = b->driver();
    {
      ScopedCudaContext scope(d, context);
      d.cuStreamSynchronize(stream);
      b->RemoveFencedStream(stream);
      d.cuStreamDestroy(stream);
    }
    if (retained) d.cuDevicePrimaryCtxRelease(other);
  }
  CudaBackend* b;
  cu::CUcontext context = nullptr;  // the stream's
  cu::CUdevice other = 0;
  bool retained = false;
  cu::CUstream stream = nullptr;
};

// Waits until every kernel and copy queued on `stream` has run.
void Synchronize(CudaBackend* b, cu::CUstream stream) {
  ScopedCudaContext scope(b->driver(), b->context());
  b->driver().cuStreamSynchronize(stream);
}

Status LaunchWriter(CudaBackend* b, cu::CUstream stream, LatchedWriter* w) {
  ScopedCudaContext scope(b->driver(), b->context());
  const fake_cuda_range range{w->address, w->bytes, 1};
  Status s = b->driver().Check(
      static_cast<cu::CUresult>(Fake().launch_kernel(stream, &LatchedWriter::Run, w, &range,
                                                     w->bytes != 0 ? 1 : 0)),
      "fake_cuda_launch_kernel");
  w->launched = s.ok();
  return s;
}

// A kernel on `stream` that writes pattern `seed` over [t, t + bytes) once
// released, launched and running (held at its latch) when this returns.
void StartLatchedWriter(CudaBackend* b, cu::CUstream stream, const void* t, size_t bytes,
                        uint64_t seed, LatchedWriter* w) {
  w->address = Address(t);
  w->bytes = bytes;
  w->seed = seed;
  EXPECT_OK(LaunchWriter(b, stream, w));
  w->WaitStarted();
}

// Ends the open epoch and waits for it (Note [Epochs of use]): an eviction of
// a granule allocated for the purpose, whose copy waits on the copy stream
// for the epoch of its birth, then a host wait for that copy, then its free
// (which itself waits for nothing). What was born or last used before is
// then known complete, so a test can tell a mark taken at a unit's birth
// from one taken at its last unpin.
void CompleteAnEpoch(Engine& e) {
  void* z = MustAllocate(e, kGranule, /*pin=*/false);
  ASSERT_TRUE(z != nullptr);
  EXPECT_OK(e.Evict(z));
  EXPECT_OK(e.WaitForCopies());
  EXPECT_OK(e.Free(z));
}

// T (`size` bytes, pattern 1), evicted while a kernel queued before its
// unpin still writes pattern 2 into it: T pinned, filled and its birth's
// epoch complete (only its unpin orders what follows), the kernel queued on
// `stream` (released 200 ms later), T unpinned, then U (a granule more,
// pinned) allocated, which needs T's granules and evicts it. The backend
// looks at its retired mappings while the kernel still runs (every remap
// batch does): one unmapped too early faults. maps_before: the backend's
// mappings just before U's allocation.
struct EvictedUnderAKernel {
  void* t = nullptr;
  void* u = nullptr;
  int64_t maps_before = 0;
};
EvictedUnderAKernel EvictWhileAKernelWrites(Engine& e, CudaBackend* b, cu::CUstream stream,
                                            size_t size) {
  EvictedUnderAKernel out;
  uint64_t id = 0;
  out.t = e.Allocate(size, /*pin=*/true, nullptr, &id);
  if (out.t == nullptr) return out;
  EXPECT_OK(FillAllocation(e, out.t, size, 1));
  CompleteAnEpoch(e);
  // The kernel writes T after its context is gone: T is unpinned while the
  // kernel is still queued.
  LatchedWriter kernel;
  StartLatchedWriter(b, stream, out.t, size, 2, &kernel);
  EXPECT_OK(e.Unpin(out.t, id));
  std::thread release = kernel.ReleaseAfter(std::chrono::milliseconds(200));
  out.maps_before = b->GetStatistics().mappings;
  out.u = MustAllocate(e, size + kGranule, /*pin=*/true);
  EXPECT_OK(b->UnmapCompletedRetired());
  release.join();
  AllocationInfo info;
  EXPECT_OK(e.Inspect(out.t, &info));
  EXPECT_TRUE(info.evicted);
  return out;
}

TEST_F(EngineTest, AnEvictionCopiesWhatAKernelQueuedBeforeTheUnpinStillWrites) {
  StartEngine(/*device=*/5, /*host=*/8);
  FencedStream compute(b);
  const size_t size = 4 * kGranule;
  const EvictedUnderAKernel moved = EvictWhileAKernelWrites(*e, b, compute.stream, size);
  void* t = moved.t;
  void* u = moved.u;
  ASSERT_TRUE(t != nullptr && u != nullptr);
  EXPECT_EQ(VerifyAllocation(*e, t, size, 2), -1);  // the kernel's bytes
  const Statistics st = e->GetStatistics();
  // One epoch closed at T's last use: the copy waits for it on the stream,
  // the unmap on the host.
  EXPECT_TRUE(st.num_fences >= 1);
  EXPECT_TRUE(st.num_host_waits >= 1);
  std::printf("  one eviction with a fenced stream: fences=%lld host_waits=%lld "
              "copies=%lld bytes_copied=%lld\n",
              static_cast<long long>(st.num_fences), static_cast<long long>(st.num_host_waits),
              static_cast<long long>(st.num_copies), static_cast<long long>(st.bytes_copied));
  EXPECT_OK(e->Free(u));
  EXPECT_OK(e->Free(t));
}

// Note [Evicted tensors unmapped]: an eviction that leaves the address
// unmapped unmaps the device mapping only once the kernel queued before the
// unpin has run (retired until then), and the copy still reads what that
// kernel wrote; the page-in finds every byte.
TEST_F(EngineTest, AnEvictionLeftUnmappedRetiresTheMappingAKernelStillWrites) {
  StartEngineUnmappingEvicted(/*device=*/5, /*host=*/8);
  FencedStream compute(b);
  const size_t size = 4 * kGranule;
  const EvictedUnderAKernel moved = EvictWhileAKernelWrites(*e, b, compute.stream, size);
  void* t = moved.t;
  void* u = moved.u;
  ASSERT_TRUE(t != nullptr && u != nullptr);
  // U's mapping only: nothing of host memory at T's address.
  EXPECT_EQ(b->GetStatistics().mappings - moved.maps_before, 1);
  EXPECT_OK(e->Free(u));
  uint64_t again = 0;
  EXPECT_OK(e->Pin(t, &again));
  EXPECT_EQ(VerifyAllocation(*e, t, size, 2), -1);  // the kernel's bytes
  EXPECT_OK(e->Unpin(t, again));
  EXPECT_OK(e->Free(t));
}

// Note [Stream protocol], a reclaim batch: a reclaim that evicts several
// victims closes one epoch (the latest of their last uses), copies them all
// after it on the GPU, and remaps them without a host wait: their old
// mappings are retired until victim 1's kernel has run (Note [Retired
// mappings]). Before epochs it waited on the host for every stream, and
// before batches twice per victim.
TEST_F(EngineTest, AReclaimOfSeveralVictimsClosesOneEpochAndCopiesAfterIt) {
  StartEngine(/*device=*/5, /*host=*/8);
  FencedStream compute(b);
  std::vector<void*> victims;
  for (int i = 0; i < 4; ++i) {
    victims.push_back(MustAllocate(*e, kGranule, /*pin=*/false));
    ASSERT_TRUE(victims.back() != nullptr);
    EXPECT_OK(FillAllocation(*e, victims.back(), kGranule, 60 + i));
  }
  // The victims' births are long done: only victim 1's unpin, the latest
  // last use of the batch, orders the copies.
  CompleteAnEpoch(*e);
  // A kernel queued while victim 1 was pinned still writes it while the
  // reclaim runs: the copies must wait for it (victim 1's last use).
  LatchedWriter kernel;
  kernel.address = Address(victims[1]);
  kernel.bytes = kGranule;
  kernel.seed = 70;
  uint64_t pin = 0;
  EXPECT_OK(e->Pin(victims[1], &pin));
  EXPECT_OK(LaunchWriter(b, compute.stream, &kernel));
  EXPECT_OK(e->Unpin(victims[1], pin));
  kernel.WaitStarted();
  std::thread release = kernel.ReleaseAfter(std::chrono::milliseconds(200));
  const Statistics before = e->GetStatistics();
  // Needs every device granule: one full reclaim of all four victims.
  void* u = MustAllocate(*e, 5 * kGranule, /*pin=*/true);
  const Statistics st = e->GetStatistics();
  // The backend looks at its retired mappings while the kernel still runs
  // (every remap batch does): one unmapped too early faults.
  EXPECT_OK(b->UnmapCompletedRetired());
  release.join();
  ASSERT_TRUE(u != nullptr);
  const int64_t waits = st.num_host_waits - before.num_host_waits;
  const int64_t fences = st.num_fences - before.num_fences;
  std::printf("  a reclaim of %lld victims: host_waits=%lld fences=%lld\n",
              static_cast<long long>(st.num_evictions - before.num_evictions),
              static_cast<long long>(waits), static_cast<long long>(fences));
  EXPECT_EQ(st.num_evictions - before.num_evictions, 4);
  EXPECT_EQ(st.num_full_reclaims + st.num_single_reclaims -
                before.num_full_reclaims - before.num_single_reclaims, 1);
  // The victims' remaps wait for victim 1's kernel, not the host (Note
  // [Retired mappings]); their copies wait for it on the copy stream.
  EXPECT_EQ(waits, 0);
  EXPECT_EQ(fences, 1);  // one epoch: the copies wait for it, the remaps too
  for (int i = 0; i < 4; ++i) {
    AllocationInfo info;
    EXPECT_OK(e->Inspect(victims[i], &info));
    EXPECT_TRUE(info.evicted);
    EXPECT_EQ(VerifyAllocation(*e, victims[i], kGranule, i == 1 ? 70 : 60 + i), -1);
  }
  EXPECT_OK(e->Free(u));
  for (void* p : victims) EXPECT_OK(e->Free(p));
}

// Note [Epochs of use]: a remap batch closes the open epoch, so a unit
// unpinned before a move and evicted after it is ordered by its own last
// use, not by a kernel queued after that move (here still running, held at
// its latch): neither its eviction nor its page-in waits on the host.
TEST_F(EngineTest, AUnitUnpinnedBeforeAMoveMovesWithoutWaitingForKernelsQueuedAfterIt) {
  StartEngine(/*device=*/4, /*host=*/8);
  FencedStream compute(b);
  void* a = MustAllocate(*e, kGranule, /*pin=*/false);
  void* c = MustAllocate(*e, kGranule, /*pin=*/false);
  void* k = MustAllocate(*e, kGranule, /*pin=*/false);
  ASSERT_TRUE(a != nullptr && c != nullptr && k != nullptr);
  EXPECT_OK(FillAllocation(*e, a, kGranule, 80));
  EXPECT_OK(FillAllocation(*e, c, kGranule, 81));
  CompleteAnEpoch(*e);
  uint64_t pin = 0;
  EXPECT_OK(e->Pin(a, &pin));  // A's last use: its mark is the open epoch
  EXPECT_OK(e->Unpin(a, pin));
  EXPECT_OK(e->Evict(c));  // a move of a unit idle long before: no wait of its own
  LatchedWriter kernel;  // queued after the move, running until released
  EXPECT_OK(e->Pin(k, &pin));
  StartLatchedWriter(b, compute.stream, k, kGranule, 82, &kernel);
  EXPECT_OK(e->Unpin(k, pin));
  std::thread release = kernel.ReleaseAfter(std::chrono::milliseconds(300));
  const Statistics before = e->GetStatistics();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_OK(e->Evict(a));
  EXPECT_OK(e->Pin(a, &pin));  // pages A in; the kernel touching it comes next
  const auto took = std::chrono::steady_clock::now() - start;
  const Statistics st = e->GetStatistics();
  release.join();
  const long long ms = std::chrono::duration_cast<std::chrono::milliseconds>(took).count();
  std::printf("  A evicted and paged in under a later kernel: host_waits=%lld, %lld ms\n",
              static_cast<long long>(st.num_host_waits - before.num_host_waits), ms);
  EXPECT_EQ(st.num_host_waits - before.num_host_waits, 0);
  EXPECT_TRUE(ms < 250);  // not held until the kernel's release
  EXPECT_OK(e->Unpin(a, pin));
  Synchronize(b, compute.stream);
  EXPECT_EQ(VerifyAllocation(*e, a, kGranule, 80), -1);
  EXPECT_EQ(VerifyAllocation(*e, c, kGranule, 81), -1);
  EXPECT_EQ(VerifyAllocation(*e, k, kGranule, 82), -1);
  for (void* p : {a, c, k}) EXPECT_OK(e->Free(p));
}

// A "kernel" that reads [address, address + bytes) through the fake's
// device alias when its stream reaches it, and records what VerifyPattern
// said (-1: the pattern `seed` throughout).
struct PatternReader {
  uintptr_t address = 0;
  size_t bytes = 0;
  uint64_t seed = 0;
  std::atomic<int64_t> result{-3};  // -3: never ran
  static void Run(void* self) {
    auto* r = static_cast<PatternReader*>(self);
    const void* alias = Fake().device_alias(r->address, r->bytes);
    r->result = alias != nullptr ? VerifyPattern(alias, r->bytes, r->seed) : -2;
  }
};

Status LaunchReader(CudaBackend* b, cu::CUstream stream, PatternReader* r) {
  ScopedCudaContext scope(b->driver(), b->context());
  const fake_cuda_range range{r->address, r->bytes, 0};
  return b->driver().Check(static_cast<cu::CUresult>(Fake().launch_kernel(
                               stream, &PatternReader::Run, r, &range, 1)),
                           "fake_cuda_launch_kernel");
}

// backend.h, ReleaseRuns: a release that cannot wait for its memory's last
// copy (a context broken by a kernel's illegal address: the copy stream's
// synchronize answers the sticky error) releases nothing, since that copy
// may still be reading the memory. The piece stays made and keeps its shape
// when its ids are defined again one granule each, so a Map of one of them
// is refused, naming the piece, instead of mapping a handle at a length it
// does not have.
TEST_F(BackendTest, AReleaseThatCannotWaitForItsCopyReleasesNothingAndKeepsItsPiece) {
  RemakeOverWholeHandles();
  uintptr_t base = 0;
  EXPECT_OK(b->ReserveAddressRange(4 * kGranule, &base));
  EXPECT_OK(b->CreatePool(PoolKind::kDevice, 2));
  EXPECT_OK(b->CreatePool(PoolKind::kHost, 2));
  const GranuleRun run[] = {{0, 2}};
  b->DefineRuns(PoolKind::kHost, run, 1);
  const GranuleId device[] = {0, 1}, host[] = {0, 1};
  EXPECT_OK(b->Map(base, PoolKind::kDevice, device, 2, Access::kReadWrite));
  std::vector<unsigned char> in(2 * kGranule, 0x5a);
  EXPECT_OK(b->CopyFromHost(base, in.data(), in.size()));
  {
    FencedStream fenced(b.get());
    // A kernel touching the unmapped third granule: an illegal address.
    const fake_cuda_range unmapped{base + 2 * kGranule, kGranule, 0};
    {
      ScopedCudaContext scope(b->driver(), b->context());
      EXPECT_EQ(Fake().launch_kernel(fenced.stream, +[](void*) {}, nullptr, &unmapped, 1), 0);
    }
    Synchronize(b.get(), fenced.stream);
    Fake().set_copy_delay_us(200000);
    EXPECT_OK(b->CopyGranules(PoolKind::kHost, host, PoolKind::kDevice, device, 2 * kGranule));
    const size_t handles = Fake().live_handles();
    b->ReleaseRuns(PoolKind::kHost, run, 1);
    EXPECT_EQ(Fake().live_handles(), handles);  // nothing released
    Fake().set_copy_delay_us(0);
  }
  const GranuleRun singles[] = {{0, 1}, {1, 1}};
  b->DefineRuns(PoolKind::kHost, singles, 2);
  Status s = b->Map(base + 2 * kGranule, PoolKind::kHost, host, 1, Access::kReadWrite);
  EXPECT_TRUE(s.code() == StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "part of a piece of 2 granules from granule 0"));
  EXPECT_EQ(Fake().violation_count(), 1u);  // the kernel's, on purpose
  Fake().clear_violations();
  // On a broken context nothing can wait for the copies, so the backend's
  // destruction unmaps nothing (the process must end anyway): what it left
  // goes with the fake's objects.
  b.reset();
  Fake().destroy_all();
}

// Before a test times a page-in with delayed copies: the copies of the
// evictions before it done. The fenced streams wait for those copies
// (EndRemapBatch), so a page-in's host wait for the fenced streams would
// wait for them too if the fake ran them late.
void FinishEvictionCopies(CudaBackend* b) { EXPECT_OK(b->WaitForCopies()); }

// Note [Stream protocol], page-in: the host does not wait for the page-in
// copy; the pinning kernel's stream (a fenced stream) waits for its event.
TEST_F(EngineTest, APagedInTensorIsReadByTheKernelQueuedAfterThePinWithoutAHostWaitForTheCopy) {
  StartEngine(/*device=*/2, /*host=*/8);
  FencedStream compute(b);
  const size_t size = 2 * kGranule;
  void* t = MustAllocate(*e, size, /*pin=*/false);
  ASSERT_TRUE(t != nullptr);
  EXPECT_OK(FillAllocation(*e, t, size, 11));
  EXPECT_OK(e->Evict(t));
  // The device granules T will get back hold other bytes (pattern 12).
  void* other = MustAllocate(*e, size, /*pin=*/false);
  ASSERT_TRUE(other != nullptr);
  EXPECT_OK(FillAllocation(*e, other, size, 12));
  EXPECT_OK(e->Evict(other));
  FinishEvictionCopies(b);
  const int64_t waits = e->GetStatistics().num_host_waits;
  Fake().set_copy_delay_us(300000);  // the page-in copy lands late
  uint64_t id = 0;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_OK(e->Pin(t, &id));  // pages T in
  const auto pin_time = std::chrono::steady_clock::now() - start;
  PatternReader kernel;
  kernel.address = Address(t);
  kernel.bytes = size;
  kernel.seed = 11;
  EXPECT_OK(LaunchReader(b, compute.stream, &kernel));
  Synchronize(b, compute.stream);
  Fake().set_copy_delay_us(0);
  EXPECT_EQ(kernel.result.load(), -1);  // the paged-in bytes, not pattern 12
  const long long ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(pin_time).count();
  std::printf("  page-in: host_waits=%lld (T's last use is long done; never the copy); pin "
              "took %lld ms with a 300 ms copy\n",
              static_cast<long long>(e->GetStatistics().num_host_waits - waits), ms);
  EXPECT_EQ(e->GetStatistics().num_host_waits - waits, 0);
  EXPECT_TRUE(ms < 250);  // the pin did not wait for the copy
  EXPECT_OK(e->Unpin(t, id));
  EXPECT_EQ(VerifyAllocation(*e, t, size, 11), -1);
  EXPECT_EQ(VerifyAllocation(*e, other, size, 12), -1);
  EXPECT_OK(e->Free(t));
  EXPECT_OK(e->Free(other));
}

// Note [Stream protocol], remap batches: an eviction does not wait on the
// host for its copy either. The device granules it gives back are written by
// the next kernel (here the allocating kernel, on a fenced stream) only
// after the copy has read them.
TEST_F(EngineTest, AnEvictionRemapsWithoutAHostWaitForItsCopyAndTheNextKernelWaitsForIt) {
  StartEngine(/*device=*/2, /*host=*/8);
  FencedStream compute(b);
  const size_t size = 2 * kGranule;
  void* t = MustAllocate(*e, size, /*pin=*/false);
  ASSERT_TRUE(t != nullptr);
  EXPECT_OK(FillAllocation(*e, t, size, 21));
  const int64_t waits = e->GetStatistics().num_host_waits;
  Fake().set_copy_delay_us(300000);  // the eviction copy lands late
  const auto start = std::chrono::steady_clock::now();
  void* u = MustAllocate(*e, size, /*pin=*/true);  // evicts T for its granules
  const auto allocate_time = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(u != nullptr);
  AllocationInfo info;
  EXPECT_OK(e->Inspect(t, &info));
  EXPECT_TRUE(info.evicted);
  LatchedWriter kernel;  // U's kernel writes T's former device granules
  kernel.address = Address(u);
  kernel.bytes = size;
  kernel.seed = 22;
  kernel.released = true;
  EXPECT_OK(LaunchWriter(b, compute.stream, &kernel));
  Synchronize(b, compute.stream);
  Fake().set_copy_delay_us(0);
  const long long ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(allocate_time).count();
  std::printf("  eviction: host_waits=%lld (none for T's last use nor the copy); the "
              "allocation took %lld ms with a 300 ms copy\n",
              static_cast<long long>(e->GetStatistics().num_host_waits - waits), ms);
  EXPECT_EQ(e->GetStatistics().num_host_waits - waits, 0);
  EXPECT_TRUE(ms < 250);  // the eviction did not wait for the copy
  EXPECT_EQ(VerifyAllocation(*e, t, size, 21), -1);  // the copy read T's bytes, not U's
  EXPECT_EQ(VerifyAllocation(*e, u, size, 22), -1);
  EXPECT_OK(e->Free(u));
  EXPECT_OK(e->Free(t));
}

// Note [Stream protocol], remap batches: a stream fenced after an eviction
// (TensorFlow registers streams as it first meets them) was not among the
// streams its EndRemapBatch ordered. It waits for the copies queued before
// its registration, so its first kernel, writing the device granules that
// eviction gave back, runs after the copy has read them.
TEST_F(EngineTest, AStreamFencedAfterAnEvictionWaitsForItsCopy) {
  StartEngine(/*device=*/2, /*host=*/8);
  const size_t size = 2 * kGranule;
  void* t = MustAllocate(*e, size, /*pin=*/false);
  ASSERT_TRUE(t != nullptr);
  EXPECT_OK(FillAllocation(*e, t, size, 41));
  Fake().set_copy_delay_us(300000);  // the eviction copy lands late
  void* u = MustAllocate(*e, size, /*pin=*/true);  // evicts T for its granules
  ASSERT_TRUE(u != nullptr);
  {
    FencedStream late(b);  // registered after the eviction
    LatchedWriter kernel;  // writes T's former device granules
    kernel.address = Address(u);
    kernel.bytes = size;
    kernel.seed = 42;
    kernel.released = true;
    EXPECT_OK(LaunchWriter(b, late.stream, &kernel));
    Synchronize(b, late.stream);
  }
  Fake().set_copy_delay_us(0);
  EXPECT_EQ(VerifyAllocation(*e, t, size, 41), -1);  // the copy read T's bytes
  EXPECT_EQ(VerifyAllocation(*e, u, size, 42), -1);
  EXPECT_OK(e->Free(u));
  EXPECT_OK(e->Free(t));
}

// A kernel on a fenced stream that writes pattern `seed` over
// [address, address + bytes) after sleeping `delay_us`: queued at its unit's
// pin, it runs on after the unpin, while the engine moves the unit.
struct SleepyWriter {
  uintptr_t address = 0;
  size_t bytes = 0;
  uint64_t seed = 0;
  int delay_us = 0;
  static void Run(void* self) {
    auto* w = static_cast<SleepyWriter*>(self);
    std::this_thread::sleep_for(std::chrono::microseconds(w->delay_us));
    void* alias = Fake().device_alias(w->address, w->bytes);
    if (alias != nullptr) FillPattern(alias, w->bytes, w->seed);
  }
};

// The model-based random test of the stream protocol (Note [Stream protocol],
// Note [Retired mappings]): each seed drives an engine over the fake driver,
// with one fenced stream, through random allocations, kernels, evictions,
// frees and reads, with cuMemMap failures injected into the operation that
// follows now and then. A unit's bytes are written only by kernels on the
// stream (each pins it, queues a SleepyWriter with a new seed and unpins it
// at once, so that moves and frees happen under the kernel), as TensorFlow
// orders its own writes. Reads wait for the stream first (as TensorFlow's
// copies to the host do) and must find the last kernel's seed in every byte.
// An operation fails only with kResourceExhausted (an injected failure, or a
// device of 6 granules too fragmented without defragmentation), and leaves
// the model as it was; the engine's
// invariants hold after every operation, and the fake reports no call that
// touches what a queued kernel or copy still uses. Failing, it names the
// seed, step and operation; LMS_TEST_FUZZ_SEEDS=FIRST-LAST and
// LMS_TEST_FUZZ_STEPS replay.
TEST_F(EngineTest, RandomMovesUnderQueuedKernelsAndFailedMapsLoseNoByte) {
  uint64_t first = 1, last = 24;
  int steps = 300;
  if (const char* seeds = std::getenv("LMS_TEST_FUZZ_SEEDS")) {
    if (std::sscanf(seeds, "%" SCNu64 "-%" SCNu64, &first, &last) != 2 || first > last) {
      std::printf("LMS_TEST_FUZZ_SEEDS=%s is not FIRST-LAST\n", seeds);
      std::abort();
    }
  }
  if (const char* n = std::getenv("LMS_TEST_FUZZ_STEPS")) steps = std::atoi(n);
  const size_t sizes[] = {100, 3000, kGranule / 2, kGranule, 2 * kGranule + 7, 3 * kGranule};
  int64_t evictions = 0, page_ins = 0, injected = 0, refused = 0;
  for (uint64_t seed = first; seed <= last; ++seed) {
    if (seed % 3 == 0) {
      StartEngineUnmappingEvicted(/*device=*/6, /*host=*/32);
    } else {
      StartEngine(/*device=*/6, /*host=*/32, /*defrag=*/seed % 2 == 0);
    }
    std::mt19937_64 rng(seed);
    struct Unit {
      void* ptr;
      size_t bytes;
      uint64_t seed;
    };
    std::vector<Unit> live;
    std::vector<std::unique_ptr<SleepyWriter>> kernels;  // until the stream is idle
    uint64_t next_seed = seed << 32;
    bool failed = false;
    {
      FencedStream compute(b);
      // Pins `u`, queues a kernel writing a new seed over it and unpins it.
      const auto write = [&](Unit* u) {
        uint64_t id = 0;
        LMS_RETURN_IF_ERROR(e->Pin(u->ptr, &id));
        auto w = std::make_unique<SleepyWriter>();
        w->address = Address(u->ptr);
        w->bytes = u->bytes;
        w->seed = ++next_seed;
        w->delay_us = static_cast<int>(rng() % 2000);
        const fake_cuda_range range{w->address, w->bytes, 1};
        Status s;
        {
          ScopedCudaContext scope(b->driver(), b->context());
          s = b->driver().Check(static_cast<cu::CUresult>(Fake().launch_kernel(
                                    compute.stream, &SleepyWriter::Run, w.get(), &range, 1)),
                                "fake_cuda_launch_kernel");
        }
        if (s.ok()) {
          u->seed = w->seed;
          kernels.push_back(std::move(w));
        }
        const Status unpinned = e->Unpin(u->ptr, id);
        return s.ok() ? unpinned : s;
      };
      const auto idle = [&] {
        Synchronize(b, compute.stream);
        kernels.clear();
      };
      for (int step = 0; step < steps && !failed; ++step) {
        const bool inject = rng() % 8 == 0;
        if (inject) {
          Fake().fail_nth_mem_map(1 + static_cast<int>(rng() % 3), cu::CUDA_ERROR_OUT_OF_MEMORY);
          ++injected;
        }
        const int roll = static_cast<int>(rng() % 100);
        const char* op = "";
        Status s;
        if (live.empty() || (roll < 25 && live.size() < 8)) {
          op = "allocate and write";
          Unit u{nullptr, sizes[rng() % 6], 0};
          u.ptr = e->Allocate(u.bytes, /*pin=*/false, &s);
          if (u.ptr != nullptr) {
            s = write(&u);
            if (s.ok()) {
              live.push_back(u);
            } else if (!e->Free(u.ptr).ok()) {
              failed = true;
            }
          }
        } else {
          const size_t k = rng() % live.size();
          Unit& u = live[k];
          if (roll < 60) {
            op = "write";
            s = write(&u);
          } else if (roll < 78) {
            op = "evict";
            s = e->Evict(u.ptr);
            if (s.code() == StatusCode::kFailedPrecondition) s = Status::Ok();  // evicted
          } else if (roll < 88) {
            op = "free";
            s = e->Free(u.ptr);
            failed |= !s.ok();
            live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
          } else {
            op = "read";
            idle();
            Status read;
            const int64_t wrong = VerifyAllocation(*e, u.ptr, u.bytes, u.seed, &read);
            failed |= read.ok() && wrong != -1;  // unreadable: an injected failure
            s = read;
          }
        }
        if (inject) Fake().fail_nth_mem_map(0, 0);
        if (!s.ok()) {
          ++refused;
          failed |= s.code() != StatusCode::kResourceExhausted;
        }
        const Status invariants = e->CheckInvariants();
        failed |= !invariants.ok() || Fake().violation_count() != 0;
        if (failed) {
          std::printf("  seed %" PRIu64 " step %d (%s): %s; invariants: %s\n", seed, step, op,
                      s.ToString().c_str(), invariants.ToString().c_str());
        }
        if (kernels.size() > 64) idle();
      }
      idle();
      for (const Unit& u : live) {
        EXPECT_EQ(VerifyAllocation(*e, u.ptr, u.bytes, u.seed), -1);
        EXPECT_OK(e->Free(u.ptr));
      }
      EXPECT_OK(e->CheckInvariants());
      const Statistics st = e->GetStatistics();
      evictions += st.num_evictions;
      page_ins += st.num_page_ins;
    }
    e.reset();
    EXPECT_TRUE(!failed);
    if (failed) break;  // one seed's report is enough
  }
  std::printf("  seeds %" PRIu64 "-%" PRIu64 ", %d steps: evictions=%lld page_ins=%lld "
              "injected=%lld refused=%lld\n",
              first, last, steps, static_cast<long long>(evictions),
              static_cast<long long>(page_ins), static_cast<long long>(injected),
              static_cast<long long>(refused));
  // The runs moved units, and some injected failures were met.
  EXPECT_TRUE(evictions > 0 && page_ins > 0 && refused > 0);
}

// Note [Retired mappings]: T (`size` bytes), evicted while a kernel queued
// before its unpin writes pattern 2 into it, so that its host mapping is left
// pending behind the retired device mapping; once the kernel has run, the
// pending map is made, in `later`, and fails (an injected cuMemMap failure).
// `later` succeeds (T's slots are not its caller's: the failure is said on
// stderr), and T's address then reaches nothing.
template <typename Later>
void* EvictWithItsHostMapFailed(Engine& e, CudaBackend* b, cu::CUstream stream, size_t size,
                                Later later) {
  uint64_t id = 0;
  void* t = e.Allocate(size, /*pin=*/true, nullptr, &id);
  if (t == nullptr) return nullptr;
  EXPECT_OK(FillAllocation(e, t, size, 1));
  CompleteAnEpoch(e);
  LatchedWriter kernel;
  StartLatchedWriter(b, stream, t, size, 2, &kernel);
  EXPECT_OK(e.Unpin(t, id));
  const int64_t maps = b->GetStatistics().mappings;
  EXPECT_OK(e.Evict(t));
  EXPECT_EQ(b->GetStatistics().mappings, maps);  // pending: nothing mapped yet
  kernel.released = true;
  Synchronize(b, stream);
  EXPECT_OK(e.WaitForCopies());
  const unsigned long long maps_before = Fake().call_count("cuMemMap");
  Fake().fail_nth_mem_map(1, cu::CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_OK(later());
  EXPECT_TRUE(Fake().call_count("cuMemMap") > maps_before);  // tried in `later`
  EXPECT_TRUE(Fake().device_alias(Address(t), size) == nullptr);
  Fake().clear_violations();  // that probe's
  return t;
}

// Whether T's address reaches its evicted bytes (pattern 2) in the driver.
bool ReachesTheEvictedBytes(const void* t, size_t size) {
  const void* alias = Fake().device_alias(Address(t), size);
  return alias != nullptr && VerifyPattern(alias, size, 2) == -1;
}

// A pending map that failed is not lost: the next remap batch makes it (a
// kernel reading the evicted tensor in place, the adapter's last resort,
// finds its bytes), and no byte of it is lost meanwhile.
// The free during which it failed, of another tensor, is not failed by it:
// that tensor's host memory goes back to the pool (a failed free keeps it out
// for good).
TEST_F(EngineTest, AnEvictionsHostMapThatFailedIsMadeAtTheNextRemapBatch) {
  StartEngine(/*device=*/6, /*host=*/8);
  FencedStream compute(b);
  void* v = MustAllocate(*e, kGranule, /*pin=*/false);
  void* y = MustAllocate(*e, kGranule, /*pin=*/false);
  ASSERT_TRUE(v != nullptr && y != nullptr);
  EXPECT_OK(e->Evict(y));
  const size_t size = 3 * kGranule;
  void* t = EvictWithItsHostMapFailed(*e, b, compute.stream, size, [&] { return e->Free(y); });
  ASSERT_TRUE(t != nullptr);
  EXPECT_EQ(VerifyAllocation(*e, t, size, 2), -1);  // through the window
  EXPECT_OK(e->Evict(v));  // a remap batch
  EXPECT_TRUE(ReachesTheEvictedBytes(t, size));
  EXPECT_OK(e->CheckInvariants());
  EXPECT_OK(e->Free(v));
  EXPECT_OK(e->Free(t));
}

// Where the address must be reached (a refused pin: SettleMapping), the map
// is tried again, and a failure is reported there too; a page-in or a free of
// a unit whose map was never made makes no driver call for it.
TEST_F(EngineTest, AnEvictionsHostMapThatFailedIsMadeWhereItIsNeededOrDropped) {
  StartEngine(/*device=*/8, /*host=*/12);
  FencedStream compute(b);
  const size_t size = 2 * kGranule;
  const auto sweep = [&] { return b->UnmapCompletedRetired(); };
  void* t = EvictWithItsHostMapFailed(*e, b, compute.stream, size, sweep);
  ASSERT_TRUE(t != nullptr);
  Fake().fail_nth_mem_map(1, cu::CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_TRUE(b->SettleMapping(Address(t), 2).code() == StatusCode::kResourceExhausted);
  EXPECT_OK(b->SettleMapping(Address(t), 2));
  EXPECT_TRUE(ReachesTheEvictedBytes(t, size));
  // Paged in over a map never made.
  void* u = EvictWithItsHostMapFailed(*e, b, compute.stream, size, sweep);
  ASSERT_TRUE(u != nullptr);
  uint64_t id = 0;
  EXPECT_OK(e->Pin(u, &id));
  EXPECT_EQ(VerifyAllocation(*e, u, size, 2), -1);
  EXPECT_OK(e->Unpin(u, id));
  // Freed with its map never made.
  void* w = EvictWithItsHostMapFailed(*e, b, compute.stream, size, sweep);
  ASSERT_TRUE(w != nullptr);
  EXPECT_OK(e->Free(w));
  EXPECT_OK(e->CheckInvariants());
  EXPECT_OK(e->Free(u));
  EXPECT_OK(e->Free(t));
}

// Note [Epochs of use]: a mark only goes from not done to done. A unit last
// used before any stream was fenced (its mark read as done then) is evicted
// once a stream is fenced and busy without waiting for that stream: the copy
// and the host wait for it finish while the stream's kernel is still held.
// Before, the fence made its mark read as not done again, and the eviction's
// copy waited on the GPU for everything queued on the stream.
TEST_F(EngineTest, AUnitUsedBeforeAnyStreamWasFencedMovesWithoutWaitingForOneFencedSince) {
  StartEngine(/*device=*/4, /*host=*/8);
  const size_t size = 2 * kGranule;
  void* t = MustAllocate(*e, size, /*pin=*/false);
  ASSERT_TRUE(t != nullptr);
  EXPECT_OK(FillAllocation(*e, t, size, 43));
  FencedStream compute(b);
  void* u = MustAllocate(*e, kGranule, /*pin=*/true);
  ASSERT_TRUE(u != nullptr);
  LatchedWriter kernel;  // busy on U until released
  StartLatchedWriter(b, compute.stream, u, kGranule, 44, &kernel);
  std::future<Status> moved = std::async(std::launch::async, [&] {
    LMS_RETURN_IF_ERROR(e->Evict(t));
    return e->WaitForCopies();
  });
  const bool returned = moved.wait_for(std::chrono::seconds(2)) == std::future_status::ready;
  kernel.released = true;
  EXPECT_TRUE(returned);  // not after the kernel
  EXPECT_OK(moved.get());
  Synchronize(b, compute.stream);
  AllocationInfo info;
  EXPECT_OK(e->Inspect(t, &info));
  EXPECT_TRUE(info.evicted);
  EXPECT_EQ(VerifyAllocation(*e, t, size, 43), -1);
  EXPECT_EQ(VerifyAllocation(*e, u, kGranule, 44), -1);
  EXPECT_OK(e->Free(u));
  EXPECT_OK(e->Free(t));
}

// A kernel's three evicted inputs paged in by one PinAll or one by one: no
// host wait at all (their last uses were waited for when they were evicted;
// before epochs, one wait per batch: three one by one), none for the
// copies, and a kernel queued after the pins reads every input's own bytes.
TEST_F(EngineTest, PinAllPagesInAKernelsInputsWithoutAHostWaitAndItsKernelReadsThemAll) {
  StartEngine(/*device=*/6, /*host=*/12);
  FencedStream compute(b);
  const size_t size = 2 * kGranule;
  std::vector<void*> inputs;
  for (int i = 0; i < 3; ++i) {
    inputs.push_back(MustAllocate(*e, size, /*pin=*/false));
    ASSERT_TRUE(inputs.back() != nullptr);
    EXPECT_OK(FillAllocation(*e, inputs.back(), size, 80 + i));
  }
  int64_t waits[2] = {0, 0};
  for (int batched = 0; batched < 2; ++batched) {
    for (void* p : inputs) EXPECT_OK(e->Evict(p));
    FinishEvictionCopies(b);
    const int64_t before = e->GetStatistics().num_host_waits;
    Fake().set_copy_delay_us(100000);  // each page-in copy lands late
    // In the reverse order of their eviction: each input gets device granules
    // that held another's bytes, so a read before its copy lands is wrong.
    const void* ptrs[3] = {inputs[2], inputs[1], inputs[0]};
    uint64_t ids[3] = {0, 0, 0};
    const auto start = std::chrono::steady_clock::now();
    if (batched) {
      EXPECT_OK(e->PinAll(ptrs, 3, ids));
    } else {
      for (int i = 0; i < 3; ++i) EXPECT_OK(e->Pin(ptrs[i], &ids[i]));
    }
    const auto pin_time = std::chrono::steady_clock::now() - start;
    waits[batched] = e->GetStatistics().num_host_waits - before;
    PatternReader kernels[3];
    for (int i = 0; i < 3; ++i) {
      kernels[i].address = Address(inputs[i]);
      kernels[i].bytes = size;
      kernels[i].seed = 80 + i;
      EXPECT_OK(LaunchReader(b, compute.stream, &kernels[i]));
    }
    Synchronize(b, compute.stream);
    Fake().set_copy_delay_us(0);
    const long long ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(pin_time).count();
    std::printf("  %s: host_waits=%lld, pins took %lld ms with 100 ms copies\n",
                batched ? "PinAll" : "Pin one by one", static_cast<long long>(waits[batched]),
                ms);
    EXPECT_TRUE(ms < 100);  // waited for no copy
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(kernels[i].result.load(), -1);
      EXPECT_OK(e->Unpin(ptrs[i], ids[i]));
    }
  }
  EXPECT_EQ(waits[0], 0);
  EXPECT_EQ(waits[1], 0);
  for (void* p : inputs) EXPECT_OK(e->Free(p));
}

// A copy between GPUs runs on the sending GPU's streams and writes the
// receiving GPU's memory, so the receiver fences a stream of another context
// (tensorflow_copies.cc). cuEventRecord takes only an event of the stream's
// own context (CUDA_ERROR_INVALID_HANDLE otherwise): an event made in the
// receiver's context failed every later fence, eviction and page-in.
TEST_F(TwoGpuEngineTest, AStreamOfAnotherGpuIsFencedWithAnEventOfItsOwnContext) {
  std::unique_ptr<CudaBackend> backend;
  EXPECT_OK(CudaBackend::Create(/*ordinal=*/1, kGranule, /*allow_growth=*/false, &backend));
  if (backend == nullptr) return;
  StartEngine(std::move(backend), /*device=*/2, /*host=*/8);
  FencedStream sender(b, /*other_gpu=*/0);
  const size_t size = 2 * kGranule;
  void* t = MustAllocate(*e, size, /*pin=*/false);
  ASSERT_TRUE(t != nullptr);
  EXPECT_OK(FillAllocation(*e, t, size, 31));
  EXPECT_OK(e->Evict(t));  // a fence on the sender's stream, then the remap
  void* other = MustAllocate(*e, size, /*pin=*/false);
  ASSERT_TRUE(other != nullptr);
  EXPECT_OK(FillAllocation(*e, other, size, 32));
  uint64_t id = 0;
  EXPECT_OK(e->Pin(t, &id));  // evicts `other`, pages t in: the sender waits
  EXPECT_EQ(VerifyAllocation(*e, t, size, 31), -1);
  EXPECT_OK(e->Unpin(t, id));
  EXPECT_EQ(VerifyAllocation(*e, other, size, 32), -1);
  EXPECT_OK(e->Free(t));
  EXPECT_OK(e->Free(other));
}

// A mapping is reachable only by the devices cuMemSetAccess granted, and
// each new one starts with none (cuda.h, cuMemSetAccess; peer access does not
// cover VMM memory, which is why TensorFlow's GpuVirtualMemAllocator grants
// its peers). A peer GPU's kernel writes an LMS tensor resident, evicted
// (host memory mapped at its address) and paged in again: each remap grants
// the peer anew.
TEST_F(TwoGpuEngineTest, APeerGpuReachesATensorThroughEveryRemap) {
  std::unique_ptr<CudaBackend> backend;
  EXPECT_OK(CudaBackend::Create(/*ordinal=*/0, kGranule, /*allow_growth=*/false, &backend,
                                /*peer_ordinals=*/{1}));
  if (backend == nullptr) return;
  const CudaDriver& d = backend->driver();
  std::unique_ptr<CudaBackend> bad_peer;
  const Status refused = CudaBackend::Create(0, kGranule, false, &bad_peer, {2});
  EXPECT_TRUE(!refused.ok() && Contains(refused.message(), "peer GPU 2 of GPU 0 does not exist"));
  StartEngine(std::move(backend), /*device=*/2, /*host=*/8);
  // Fenced, as the adapter fences a copy's streams: it waits for page-ins.
  FencedStream peer(b, /*other_gpu=*/1);
  const size_t size = 2 * kGranule;
  void* t = MustAllocate(*e, size, /*pin=*/false);
  ASSERT_TRUE(t != nullptr);
  // The peer's kernel writes `seed` over t; false if the fake refused it.
  auto peer_writes = [&](uint64_t seed) {
    ScopedCudaContext scope(d, peer.context);
    LatchedWriter w;
    w.address = Address(t);
    w.bytes = size;
    w.seed = seed;
    w.released = true;
    const fake_cuda_range range{w.address, w.bytes, 1};
    w.launched = Fake().launch_kernel(peer.stream, &LatchedWriter::Run, &w, &range, 1) == 0;
    return w.launched && d.cuStreamSynchronize(peer.stream) == cu::CUDA_SUCCESS;
  };
  EXPECT_TRUE(peer_writes(51));  // resident: mapped at allocation
  EXPECT_EQ(VerifyAllocation(*e, t, size, 51), -1);
  EXPECT_OK(e->Evict(t));
  CompleteAnEpoch(*e);  // t's host memory mapped by now (Note [Retired mappings])
  EXPECT_TRUE(peer_writes(52));  // evicted: host memory mapped at t
  EXPECT_EQ(VerifyAllocation(*e, t, size, 52), -1);
  uint64_t id = 0;
  Fake().set_copy_delay_us(100000);  // the page-in copy lands late: the peer waits
  EXPECT_OK(e->Pin(t, &id));         // paged in: device memory mapped again
  EXPECT_TRUE(peer_writes(53));
  Fake().set_copy_delay_us(0);
  EXPECT_OK(e->Unpin(t, id));
  EXPECT_EQ(VerifyAllocation(*e, t, size, 53), -1);
  EXPECT_OK(e->Free(t));
}

// Three GPUs where GPU 2 has no peer-to-peer path to GPU 0 (their PCIe
// switches hang off different sockets): FAKE_CUDA_NO_P2P, which the fake
// reads at every reset.
struct ThreeGpusWithoutP2pBetween0And2Test : FakeCudaTest {
  bool SetUp() {
    setenv("FAKE_CUDA_NO_P2P", "0-2", 1);
    return FakeCudaTest::SetUp() && Fake().set_device_count(3) == 0;
  }
  ~ThreeGpusWithoutP2pBetween0And2Test() { unsetenv("FAKE_CUDA_NO_P2P"); }
};

// Copies the fake staged through host memory (fake_cuda_staged_copies),
// looked up in the library the backend loaded.
unsigned long long StagedCopies() {
  using Fn = decltype(&fake_cuda_staged_copies);
  static const Fn fn = [] {
    const char* path = std::getenv("TF_LMS_CUDA_DRIVER_PATH");
    void* handle = path != nullptr ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
    return handle != nullptr ? reinterpret_cast<Fn>(dlsym(handle, "fake_cuda_staged_copies"))
                             : nullptr;
  }();
  return fn != nullptr ? fn() : 0;
}

// TensorFlow names every other GPU as a peer (gpu_device.cc, peer_gpu_ids),
// whatever the topology. cuMemSetAccess refuses, with
// CUDA_ERROR_INVALID_DEVICE, to grant a device another's memory without a
// peer path (cuDeviceCanAccessPeer; NVIDIA cuda-samples vectorAddMMAP:
// "cuMemSetAccess is still subject to the constraints of
// cuDeviceCanAccessPeer for cross device mappings"), so granting every named
// peer failed every Map on such a machine. Each GPU's backend grants only the
// peers that can reach it (Note [Access to mapped memory]), every
// allocation, eviction and page-in works, and a copy from GPU 0's memory to
// GPU 2's, issued as TensorFlow's DeviceToDeviceCopy issues it
// (cuMemcpyAsync on the sender's stream, both tensors pinned), arrives: the
// driver stages it through host memory.
TEST_F(ThreeGpusWithoutP2pBetween0And2Test, PeersWithoutAPeerPathAreNotGrantedAndEveryRemapWorks) {
  constexpr int kGpus = 3;
  std::unique_ptr<Engine> engines[kGpus];
  CudaBackend* backends[kGpus] = {};
  for (int gpu = 0; gpu < kGpus; ++gpu) {
    std::vector<int> peers;
    for (int other = 0; other < kGpus; ++other) {
      if (other != gpu) peers.push_back(other);
    }
    std::unique_ptr<CudaBackend> backend;
    EXPECT_OK(CudaBackend::Create(gpu, kGranule, /*allow_growth=*/false, &backend, peers));
    ASSERT_TRUE(backend != nullptr);
    backends[gpu] = backend.get();
    engines[gpu] = MakeEngine(std::move(backend), /*device=*/2, /*host=*/8);
  }
  EXPECT_TRUE(backends[0]->granted_devices() == std::vector<cu::CUdevice>({0, 1}));
  EXPECT_TRUE(backends[0]->skipped_peers() == std::vector<int>({2}));
  EXPECT_TRUE(backends[1]->granted_devices() == std::vector<cu::CUdevice>({1, 0, 2}));
  EXPECT_TRUE(backends[1]->skipped_peers().empty());
  EXPECT_TRUE(backends[2]->granted_devices() == std::vector<cu::CUdevice>({2, 1}));
  EXPECT_TRUE(backends[2]->skipped_peers() == std::vector<int>({0}));
  EXPECT_TRUE(Contains(backends[0]->SkippedPeersMessage(), "GPU 2 cannot access the memory of"));
  EXPECT_TRUE(backends[1]->SkippedPeersMessage().empty());

  // Allocation (a Map), eviction and page-in (two remaps) on every GPU.
  const size_t size = 2 * kGranule;
  void* tensors[kGpus] = {};
  for (int gpu = 0; gpu < kGpus; ++gpu) {
    Engine& e = *engines[gpu];
    tensors[gpu] = MustAllocate(e, size, /*pin=*/false);
    ASSERT_TRUE(tensors[gpu] != nullptr);
    EXPECT_OK(FillAllocation(e, tensors[gpu], size, 70 + gpu));
    EXPECT_OK(e.Evict(tensors[gpu]));
    EXPECT_EQ(VerifyAllocation(e, tensors[gpu], size, 70 + gpu), -1);
    uint64_t id = 0;
    EXPECT_OK(e.Pin(tensors[gpu], &id));
    EXPECT_EQ(VerifyAllocation(e, tensors[gpu], size, 70 + gpu), -1);
    EXPECT_OK(e.Unpin(tensors[gpu], id));
  }

  // GPU 1, granted, writes GPU 0's tensor from a kernel.
  {
    FencedStream peer(backends[0], /*other_gpu=*/1);
    const CudaDriver& d = backends[0]->driver();
    ScopedCudaContext scope(d, peer.context);
    LatchedWriter w;
    w.address = Address(tensors[0]);
    w.bytes = size;
    w.seed = 81;
    w.released = true;
    const fake_cuda_range range{w.address, w.bytes, 1};
    w.launched = Fake().launch_kernel(peer.stream, &LatchedWriter::Run, &w, &range, 1) == 0;
    EXPECT_TRUE(w.launched);
    EXPECT_EQ(d.cuStreamSynchronize(peer.stream), cu::CUDA_SUCCESS);
  }
  EXPECT_EQ(VerifyAllocation(*engines[0], tensors[0], size, 81), -1);

  // GPU 0 sends its tensor to GPU 2's, both evicted first so that the pins
  // page them in, on a stream of GPU 0 that GPU 2's backend fences (as the
  // adapter fences the sender's streams of a copy into its memory).
  EXPECT_OK(engines[0]->Evict(tensors[0]));
  EXPECT_OK(engines[2]->Evict(tensors[2]));
  const unsigned long long staged = StagedCopies();
  {
    FencedStream sender(backends[2], /*other_gpu=*/0);
    uint64_t src_id = 0, dst_id = 0;
    EXPECT_OK(engines[0]->Pin(tensors[0], &src_id));
    EXPECT_OK(engines[2]->Pin(tensors[2], &dst_id));
    const CudaDriver& d = backends[2]->driver();
    {
      ScopedCudaContext scope(d, sender.context);
      EXPECT_OK(d.Check(d.cuMemcpyAsync(Address(tensors[2]), Address(tensors[0]), size,
                                        sender.stream),
                        "cuMemcpyAsync from GPU 0 to GPU 2"));
      EXPECT_OK(d.Check(d.cuStreamSynchronize(sender.stream), "cuStreamSynchronize"));
    }
    EXPECT_OK(engines[0]->Unpin(tensors[0], src_id));
    EXPECT_OK(engines[2]->Unpin(tensors[2], dst_id));
  }
  EXPECT_EQ(StagedCopies(), staged + 1);
  EXPECT_EQ(VerifyAllocation(*engines[2], tensors[2], size, 81), -1);
  EXPECT_EQ(VerifyAllocation(*engines[0], tensors[0], size, 81), -1);
  for (int gpu = 0; gpu < kGpus; ++gpu) EXPECT_OK(engines[gpu]->Free(tensors[gpu]));
}

// Pinned host memory cannot be swapped: one TF_GPU_HOST_MEM_LIMIT_IN_MB per
// GPU let N GPUs pin N times it, and the OOM killer came before any error.
// The fake's host memory is capped at one GPU's limit, as a machine is: the
// second GPU's eviction must be refused by LMS's budget, with bytes kept, not
// by the driver running out; once the first GPU's pool is gone it succeeds.
TEST_F(TwoGpuTest, EachGpuEvictsItsShareOfOneHostBudget) {
  // TF_GPU_HOST_MEM_LIMIT_IN_MB is split among the GPUs (HostShareBytes), and
  // the process's budget is the sum of their pools' limits: each GPU can make
  // its whole share whatever the other holds, and together they never pin
  // more than the setting (here the fake's 4 granules of host memory).
  if (Fake().set_pool_capacity(FAKE_CUDA_POOL_HOST, 4 * kGranule) != 0) return;
  std::unique_ptr<CudaBackend> first, second;
  EXPECT_OK(CudaBackend::Create(0, kGranule, /*allow_growth=*/false, &first));
  EXPECT_OK(CudaBackend::Create(1, kGranule, /*allow_growth=*/false, &second));
  if (first == nullptr || second == nullptr) return;
  const size_t share = HostShareBytes(4 * kGranule, 2, kGranule) / kGranule;
  EXPECT_EQ(share, 2u);
  auto a = MakeEngine(std::move(first), /*device=*/2, /*host=*/share);
  auto b = MakeEngine(std::move(second), /*device=*/2, /*host=*/share);
  EXPECT_EQ(PinnedHostBudget::Process().limit(), 4 * kGranule);
  const size_t size = 2 * kGranule;
  void* a1 = MustAllocate(*a, size, /*pin=*/false);
  void* b1 = MustAllocate(*b, size, /*pin=*/false);
  ASSERT_TRUE(a1 != nullptr && b1 != nullptr);
  EXPECT_OK(FillAllocation(*a, a1, size, 61));
  EXPECT_OK(FillAllocation(*b, b1, size, 63));
  EXPECT_OK(a->Evict(a1));  // the first GPU makes its 2 host granules...
  EXPECT_OK(b->Evict(b1));  // ...and the second its own 2
  EXPECT_EQ(PinnedHostBudget::Process().used(), 4 * kGranule);
  // A GPU's share is all it gets: refused by its engine, before any copy.
  void* a2 = MustAllocate(*a, size, /*pin=*/false);
  ASSERT_TRUE(a2 != nullptr);
  EXPECT_OK(FillAllocation(*a, a2, size, 62));
  const Status refused = a->Evict(a2);
  std::printf("  an eviction beyond the first GPU's share: %s\n", refused.ToString().c_str());
  EXPECT_TRUE(refused.code() == StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(refused.message(), "TF_GPU_HOST_MEM_LIMIT_IN_MB"));
  EXPECT_EQ(VerifyAllocation(*a, a1, size, 61), -1);
  EXPECT_EQ(VerifyAllocation(*a, a2, size, 62), -1);
  EXPECT_EQ(VerifyAllocation(*b, b1, size, 63), -1);
  EXPECT_OK(a->Free(a1));
  EXPECT_OK(a->Free(a2));
  EXPECT_OK(b->Free(b1));
  a.reset();
  b.reset();
  EXPECT_EQ(PinnedHostBudget::Process().used(), 0u);
  EXPECT_EQ(PinnedHostBudget::Process().limit(), 0u);
}

// What a device's creation and a remap cost in driver calls, counted by the
// fake at 2 MiB granules. cuMemMap, cuMemUnmap and cuMemSetAccess are
// synchronous, and a real driver's cost is per mapping (docs/design.md), so
// what matters is how many mappings a move makes and tears down: device
// memory in runs (Note [Device memory in runs]) and host memory in runs
// (RunPool) make one each way for a tensor whose granules are one extent.
// cuMemSetAccess covers a contiguous run of mapped granules in one call.
// The lines mappings_per_gib_* count mappings made at the tensors'
// addresses (unmappings_per_gib_*: torn down there), for 64 MiB tensors.
TEST_F(FakeCudaTest, DriverCallsPerGranuleOfACreatedDeviceAndOfARemap) {
  constexpr size_t k2M = size_t{2} << 20;
  constexpr size_t kGranules = 128;  // 256 MiB: per GiB below is x4
  constexpr size_t kTensors = 4;     // of 64 MiB
  if (Fake().set_granularity(k2M) != 0) return;
  auto count = [](const char* name) { return Fake().call_count(name); };
  std::unique_ptr<CudaBackend> backend;
  EXPECT_OK(CudaBackend::Create(0, k2M, /*allow_growth=*/false, &backend));
  if (backend == nullptr) return;
  EXPECT_TRUE(backend->maps_at_offsets());
  Fake().reset_call_counts();
  EngineOptions o;
  o.device_bytes = kGranules * k2M;
  o.host_bytes = kGranules * k2M;
  o.policy = PolicyKind::kLru;  // the counts benchmarks/README.md gives
  std::unique_ptr<Engine> e;
  EXPECT_OK(Engine::Create(o, std::move(backend), &e));
  if (e == nullptr) return;
  const unsigned long long create = count("cuMemCreate"), map = count("cuMemMap"),
                           access = count("cuMemSetAccess"), all = count(nullptr);
  std::printf("  creating a %zu MiB device: %llu driver calls (cuMemCreate %llu, cuMemMap %llu, "
              "cuMemSetAccess %llu); an 80 GiB device: about %llu (80 pieces of 1 GiB)\n",
              kGranules * 2, all, create, map, access, all - 2 + 2 * 80);
  EXPECT_EQ(create, 1u);  // the device pool, eagerly, one piece; host memory on use
  EXPECT_EQ(map, 1u);     // into the window
  EXPECT_EQ(access, 1u);  // one for the whole window
  const size_t size = kGranules / kTensors * k2M;
  void* t[kTensors];
  for (void*& p : t) {
    p = MustAllocate(*e, size, /*pin=*/false);
    ASSERT_TRUE(p != nullptr);
  }
  // Moves of every tensor: driver calls, mappings made and torn down.
  struct Moves {
    unsigned long long calls, create, map, unmap, access;
    int64_t mappings, unmappings;
  };
  const auto moves = [&](bool evict) {
    Fake().reset_call_counts();
    const BackendStatistics before = e->backend().GetStatistics();
    for (void* p : t) {
      uint64_t id = 0;
      if (evict) {
        EXPECT_OK(e->Evict(p));
      } else {
        EXPECT_OK(e->Pin(p, &id));
        EXPECT_OK(e->Unpin(p, id));
      }
    }
    const BackendStatistics after = e->backend().GetStatistics();
    return Moves{count(nullptr), count("cuMemCreate"), count("cuMemMap"), count("cuMemUnmap"),
                 count("cuMemSetAccess"), after.mappings - before.mappings,
                 after.unmappings - before.unmappings};
  };
  const Moves first = moves(/*evict=*/true);
  const Moves page_in = moves(/*evict=*/false);
  const Moves evict = moves(/*evict=*/true);  // host memory already made
  std::printf("  64 MiB tensors, per GiB: first evicted %llu calls (cuMemCreate %llu, cuMemMap "
              "%llu, cuMemUnmap %llu, cuMemSetAccess %llu; %lld mappings unmapped: allocated "
              "before the first eviction, a granule each); evicted again %llu; paged in %llu\n",
              first.calls * 4, first.create * 4, first.map * 4, first.unmap * 4,
              first.access * 4, static_cast<long long>(first.unmappings * 4), evict.calls * 4,
              page_in.calls * 4);
  std::printf("mappings_per_gib_evicted %lld\nmappings_per_gib_paged_in %lld\n"
              "unmappings_per_gib_evicted %lld\nunmappings_per_gib_paged_in %lld\n",
              static_cast<long long>(evict.mappings * 4),
              static_cast<long long>(page_in.mappings * 4),
              static_cast<long long>(evict.unmappings * 4),
              static_cast<long long>(page_in.unmappings * 4));
  EXPECT_EQ(first.create, kTensors);  // host memory in runs: one piece a tensor
  EXPECT_EQ(first.map, 2 * kTensors);  // into the window, then at the tensor
  EXPECT_EQ(first.access, 2 * kTensors);
  for (const Moves& m : {first, evict, page_in}) {
    EXPECT_EQ(m.mappings, static_cast<int64_t>(kTensors));  // one each way a tensor
  }
  // Allocated before the engine's first eviction, the tensors were mapped a
  // granule at a time (Note [Mappings within a unit]); paged in, in runs.
  EXPECT_EQ(first.unmappings, static_cast<int64_t>(kGranules));
  for (const Moves& m : {evict, page_in}) {
    EXPECT_EQ(m.unmappings, static_cast<int64_t>(kTensors));
    EXPECT_EQ(m.unmap, kTensors);
  }
  EXPECT_EQ(evict.create, 0u);  // evicted again: the same pieces, nothing made
  EXPECT_EQ(evict.map, kTensors);
  EXPECT_EQ(page_in.access, kTensors);
  for (void* p : t) EXPECT_OK(e->Free(p));
}

// Note [Mappings within a unit]. A freed unit's device mapping stays, cached
// (one mapping of 4 granules here). A smaller unit is placed elsewhere rather
// than on part of it (best fit's range would cut it), and the mapping waits
// whole for a unit of its size, which reuses it without a driver call.
TEST_F(EngineTest, ASmallerUnitIsPlacedWhereItCutsNoCachedMapping) {
  StartEngine(/*device=*/8, /*host=*/8, /*defrag=*/true);
  StartDeviceRuns();
  void* a = MustAllocate(*e, 4 * kGranule, /*pin=*/false);
  ASSERT_TRUE(a != nullptr);
  EXPECT_OK(e->Free(a));
  void* u = MustAllocate(*e, 2 * kGranule, /*pin=*/false);
  ASSERT_TRUE(u != nullptr);
  EXPECT_TRUE(u != a);
  EXPECT_EQ(e->GetStatistics().num_cut_mappings_avoided, 1);
  uintptr_t first = 0;
  EXPECT_EQ(b->MappingAt(reinterpret_cast<uintptr_t>(a), &first), 4u);
  Fake().reset_call_counts();
  void* v = MustAllocate(*e, 4 * kGranule, /*pin=*/false);
  EXPECT_TRUE(v == a);
  EXPECT_EQ(Fake().call_count("cuMemMap"), 0u);
  EXPECT_EQ(Fake().call_count("cuMemUnmap"), 0u);
  EXPECT_OK(e->Free(u));
  EXPECT_OK(e->Free(v));
}

// Where every range best fit offers cuts a cached mapping (here 50 freed
// units of 2 granules tile the device's worth of address space, more than
// placement holds while it looks), the unit placed on part of one must not
// share it: cuMemUnmap takes whole mappings, so the unit's eviction would
// have to unmap its free neighbour too. The placement unmaps the cached
// mapping whole and maps the new unit on its own.
TEST_F(EngineTest, AUnitPlacedOverPartOfACachedMappingGetsItsOwnAndMovesAlone) {
  StartEngine(/*device=*/100, /*host=*/8, /*defrag=*/true);
  StartDeviceRuns();
  std::vector<void*> freed;
  for (int i = 0; i < 50; ++i) {
    freed.push_back(MustAllocate(*e, 2 * kGranule, /*pin=*/false));
    ASSERT_TRUE(freed.back() != nullptr);
  }
  for (void* p : freed) EXPECT_OK(e->Free(p));
  void* u = MustAllocate(*e, kGranule, /*pin=*/false);
  ASSERT_TRUE(u == freed[0]);  // best fit's range after every try
  uintptr_t first = 0;
  EXPECT_EQ(b->MappingAt(reinterpret_cast<uintptr_t>(u), &first), 1u);
  EXPECT_EQ(first, reinterpret_cast<uintptr_t>(u));
  EXPECT_EQ(e->cached_granules(), 98u);  // the cut mapping left the cache whole
  EXPECT_OK(FillAllocation(*e, u, kGranule, 41));
  EXPECT_OK(e->Evict(u));
  EXPECT_EQ(VerifyAllocation(*e, u, kGranule, 41), -1);
  uint64_t id = 0;
  EXPECT_OK(e->Pin(u, &id));
  EXPECT_EQ(VerifyAllocation(*e, u, kGranule, 41), -1);
  EXPECT_OK(e->Unpin(u, id));
  EXPECT_OK(e->Free(u));
}

// Defragmentation takes a cached mapping whole: here 3 more granules are
// needed and the only cached mapping has 4, all of which go back to the
// device pool (taking 3 would cut it).
TEST_F(EngineTest, DefragmentationTakesACachedMappingWhole) {
  StartEngine(/*device=*/8, /*host=*/8, /*defrag=*/true);
  StartDeviceRuns();
  void* a = MustAllocate(*e, 4 * kGranule, /*pin=*/false);
  void* x = MustAllocate(*e, 2 * kGranule, /*pin=*/true);
  ASSERT_TRUE(a != nullptr && x != nullptr);
  EXPECT_OK(e->Free(a));  // 4 cached, 2 free
  void* c = MustAllocate(*e, 5 * kGranule, /*pin=*/false);  // not in a's range: too small
  ASSERT_TRUE(c != nullptr);
  EXPECT_TRUE(c != a);
  EXPECT_EQ(e->GetStatistics().bytes_reserved, static_cast<int64_t>(7 * kGranule));
  EXPECT_OK(FillAllocation(*e, c, 5 * kGranule, 42));
  EXPECT_OK(e->Evict(c));
  EXPECT_EQ(VerifyAllocation(*e, c, 5 * kGranule, 42), -1);
  EXPECT_OK(e->Free(c));
  EXPECT_OK(e->Free(x));
}

// A page-in leaves its copy reading the host run in flight, and the run is
// free at once; host memory made is kept to the most ever in use (RunPool),
// so the next eviction may release that run. cuMemUnmap and cuMemRelease are
// not stream-ordered: the release waits for the copy (backend.h, ReleaseRuns).
// (On a driver that maps host runs only whole: with parts, the free run is
// split rather than released.)
TEST_F(EngineTest, AHostRunIsReleasedOnlyAfterThePageInCopyStillReadingIt) {
  Fake().set_map_offset_zero_only(1);
  StartEngine(/*device=*/4, /*host=*/8);
  const size_t size = 2 * kGranule;
  void* t = MustAllocate(*e, size, /*pin=*/false);
  void* u = MustAllocate(*e, kGranule, /*pin=*/false);
  ASSERT_TRUE(t != nullptr && u != nullptr);
  EXPECT_OK(FillAllocation(*e, t, size, 21));
  EXPECT_OK(FillAllocation(*e, u, kGranule, 22));
  EXPECT_OK(e->Evict(t));  // a host run of two: the most ever in use
  FinishEvictionCopies(b);
  Fake().set_copy_delay_us(300000);
  uint64_t id = 0;
  EXPECT_OK(e->Pin(t, &id));  // its copy reads the run for 300 ms; the run is free
  // One granule for u: the free run of two does not fit, one unmade granule
  // is cut, and the run of two, over the most ever in use, is released.
  EXPECT_OK(e->Evict(u));
  Fake().set_copy_delay_us(0);
  EXPECT_OK(e->Unpin(t, id));
  EXPECT_EQ(VerifyAllocation(*e, t, size, 21), -1);
  EXPECT_EQ(VerifyAllocation(*e, u, kGranule, 22), -1);
  EXPECT_OK(e->Free(t));
  EXPECT_OK(e->Free(u));
}

// Note [Device pieces cut to units] (engine.h). On a driver that maps only
// whole handles (driver 580), a tensor allocated before the first eviction
// is a piece a granule; paged in after it, its device memory is cut as one
// piece (the single-granule pieces there released), so each later move maps
// and unmaps it once, and reuses that piece without making memory.
TEST_F(EngineTest, OnADriverThatMapsWholeHandlesATensorIsOnePieceFromTheFirstEvictionOn) {
  Fake().set_map_offset_zero_only(1);
  StartEngine(/*device=*/16, /*host=*/32);
  ASSERT_TRUE(!b->MapsPartsOfRuns(PoolKind::kDevice));
  const size_t size = 8 * kGranule;
  void* t = MustAllocate(*e, size, /*pin=*/false);
  ASSERT_TRUE(t != nullptr);
  uintptr_t first = 0;
  EXPECT_EQ(b->MappingAt(Address(t), &first), 1u);  // before any eviction
  EXPECT_OK(FillAllocation(*e, t, size, 51));
  EXPECT_OK(e->Evict(t));  // the first eviction
  uint64_t id = 0;
  EXPECT_OK(e->Pin(t, &id));
  EXPECT_EQ(b->MappingAt(Address(t), &first), 8u);
  EXPECT_EQ(first, Address(t));
  EXPECT_EQ(VerifyAllocation(*e, t, size, 51), -1);
  EXPECT_OK(e->Unpin(t, id));
  FinishEvictionCopies(b);
  Fake().reset_call_counts();
  EXPECT_OK(e->Evict(t));
  EXPECT_OK(e->Pin(t, &id));
  // One device mapping out, one in; host runs cost theirs (one each way).
  EXPECT_EQ(Fake().call_count("cuMemCreate"), 0u);
  EXPECT_EQ(Fake().call_count("cuMemRelease"), 0u);
  EXPECT_EQ(Fake().call_count("cuMemMap"), 2u);
  EXPECT_EQ(Fake().call_count("cuMemUnmap"), 2u);
  EXPECT_EQ(b->MappingAt(Address(t), &first), 8u);
  EXPECT_EQ(VerifyAllocation(*e, t, size, 51), -1);
  EXPECT_OK(e->Unpin(t, id));
  EXPECT_OK(e->Free(t));
}

// A stretch of device memory is not cut where a retired mapping still in
// use holds it: releasing it would wait on the host for the kernel still
// queued on it (Backend::ReleaseWaitsOnlyForCopies). The unit takes the
// free pieces as they are instead, with no host wait.
TEST_F(EngineTest, DeviceMemoryARetiredMappingStillUsesIsNotCutAgain) {
  Fake().set_map_offset_zero_only(1);
  StartEngine(/*device=*/8, /*host=*/32);
  StartDeviceRuns();
  FencedStream compute(b);
  uint64_t id = 0;
  void* t = e->Allocate(4 * kGranule, /*pin=*/true, nullptr, &id);
  ASSERT_TRUE(t != nullptr);
  uintptr_t first = 0;
  ASSERT_TRUE(b->MappingAt(Address(t), &first) == 4u);  // one piece
  LatchedWriter kernel;
  StartLatchedWriter(b, compute.stream, t, 4 * kGranule, 61, &kernel);
  EXPECT_OK(e->Unpin(t, id));
  // Its device piece goes back to the pool, its mapping retired under the
  // kernel.
  EXPECT_OK(e->Evict(t));
  const int64_t waits = e->GetStatistics().num_host_waits;
  std::thread release = kernel.ReleaseAfter(std::chrono::milliseconds(300));
  // Five granules of eight: every stretch holds part of the retired piece
  // of four.
  void* u = MustAllocate(*e, 5 * kGranule, /*pin=*/true);
  const int64_t waited = e->GetStatistics().num_host_waits - waits;
  release.join();
  ASSERT_TRUE(u != nullptr);
  EXPECT_EQ(waited, 0);
  EXPECT_EQ(b->MappingAt(Address(u), &first), 4u);  // the piece of four, as it is
  EXPECT_OK(FillAllocation(*e, u, 5 * kGranule, 62));
  Synchronize(b, compute.stream);
  EXPECT_EQ(VerifyAllocation(*e, u, 5 * kGranule, 62), -1);
  EXPECT_EQ(VerifyAllocation(*e, t, 4 * kGranule, 61), -1);  // the kernel's bytes
  EXPECT_OK(e->Free(u));
  EXPECT_OK(e->Free(t));
}

// A host run freed while its last copy still waits on the GPU for a kernel
// (T's eviction copy waits for T's last use; T is freed before that kernel
// has run) is not released as more than the pool's peak use (Note [Copy
// tickets]): releasing it would wait on the host for the copy's event, so
// for the kernel. It stays made, within the pool's capacity. Host runs are
// mapped whole here: T's eviction takes the free run of one granule a
// first eviction left and makes a run of three; V's eviction of two takes
// that granule and makes one more, and the pool then holds five granules,
// more than its peak use of four.
TEST_F(EngineTest, AHostRunWhoseLastCopyWaitsForAKernelIsNotReleased) {
  Fake().set_map_offset_zero_only(1);
  StartEngine(/*device=*/8, /*host=*/8);
  ASSERT_TRUE(!b->MapsPartsOfRuns(PoolKind::kHost));
  FencedStream compute(b);
  uint64_t id = 0;
  void* t = e->Allocate(4 * kGranule, /*pin=*/true, nullptr, &id);
  ASSERT_TRUE(t != nullptr);
  EXPECT_OK(FillAllocation(*e, t, 4 * kGranule, 71));
  void* v = MustAllocate(*e, 2 * kGranule, /*pin=*/false);
  ASSERT_TRUE(v != nullptr);
  EXPECT_OK(FillAllocation(*e, v, 2 * kGranule, 73));
  CompleteAnEpoch(*e);  // T's and V's births' epoch complete; a free granule
  // T's copy queued after T's last kernel, which is held.
  LatchedWriter kernel;
  StartLatchedWriter(b, compute.stream, t, 4 * kGranule, 72, &kernel);
  EXPECT_OK(e->Unpin(t, id));
  EXPECT_OK(e->Evict(t));
  EXPECT_OK(e->Free(t));
  EXPECT_EQ(Fake().pool_bytes_in_use(FAKE_CUDA_POOL_HOST), 4 * kGranule);
  const int64_t waits = e->GetStatistics().num_host_waits;
  // Long enough for a loaded machine: released earlier, its epoch done,
  // nothing would be in the way.
  std::thread release = kernel.ReleaseAfter(std::chrono::milliseconds(2000));
  EXPECT_OK(e->Evict(v));
  const int64_t waited = e->GetStatistics().num_host_waits - waits;
  const bool finished = kernel.finished.load();
  const size_t made = Fake().pool_bytes_in_use(FAKE_CUDA_POOL_HOST);
  release.join();
  EXPECT_EQ(waited, 0);
  EXPECT_TRUE(!finished);  // V's eviction did not wait for T's kernel
  EXPECT_EQ(made, 5 * kGranule);  // T's run of three stays
  Synchronize(b, compute.stream);
  EXPECT_OK(e->Pin(v, &id));
  EXPECT_EQ(VerifyAllocation(*e, v, 2 * kGranule, 73), -1);
  EXPECT_OK(e->Unpin(v, id));
  EXPECT_OK(e->Free(v));
}

// Note [Host memory made ahead]: an engine made with host_ahead_bytes makes
// that much host memory at creation (one run here); evictions of units of
// any size take parts of it, each one cuMemMap at its offset, and make no
// memory; parts given back merge, so a unit as large as the run takes it
// whole. Every byte survives.
std::unique_ptr<Engine> EngineMakingHostAhead(std::unique_ptr<CudaBackend> backend,
                                              size_t ahead_granules, size_t host_granules = 32) {
  EngineOptions o;
  o.device_bytes = 12 * kGranule;
  o.host_bytes = host_granules * kGranule;
  o.host_ahead_bytes = ahead_granules * kGranule;
  o.policy = PolicyKind::kLru;
  return engine_test::MustCreateEngine(o, std::move(backend));
}

TEST_F(FakeCudaTest, HostMemoryMadeAheadServesEvictionsOfAnySizeWithoutMakingMore) {
  std::unique_ptr<CudaBackend> backend = MustMakeCuda();
  CudaBackend* b = backend.get();
  EXPECT_TRUE(b->MapsPartsOfRuns(PoolKind::kHost));
  auto e = EngineMakingHostAhead(std::move(backend), 10);
  EXPECT_EQ(e->GetStatistics().host_bytes_made_ahead, static_cast<int64_t>(10 * kGranule));
  EXPECT_EQ(Fake().pool_bytes_in_use(FAKE_CUDA_POOL_HOST), 10 * kGranule);
  const size_t sizes[] = {3, 2, 5};
  void* units[3];
  for (int i = 0; i < 3; ++i) {
    units[i] = MustAllocate(*e, sizes[i] * kGranule, /*pin=*/false);
    ASSERT_TRUE(units[i] != nullptr);
    EXPECT_OK(FillAllocation(*e, units[i], sizes[i] * kGranule, 60 + i));
  }
  Fake().reset_call_counts();
  for (void* u : units) EXPECT_OK(e->Evict(u));
  EXPECT_EQ(Fake().call_count("cuMemCreate"), 0u);
  EXPECT_EQ(Fake().call_count("cuMemMap"), 3u);  // one host mapping a unit
  FinishEvictionCopies(b);
  for (int i = 0; i < 3; ++i) {
    uintptr_t first = 0;
    EXPECT_EQ(b->MappingAt(Address(units[i]), &first), sizes[i]);
    // What an unpinned kernel reads at the unit's address: its own part.
    const void* seen = Fake().device_alias(Address(units[i]), sizes[i] * kGranule);
    ASSERT_TRUE(seen != nullptr);
    EXPECT_EQ(VerifyPattern(seen, sizes[i] * kGranule, 60 + i), -1);
    EXPECT_EQ(VerifyAllocation(*e, units[i], sizes[i] * kGranule, 60 + i), -1);
    uint64_t id = 0;
    EXPECT_OK(e->Pin(units[i], &id));
    EXPECT_EQ(VerifyAllocation(*e, units[i], sizes[i] * kGranule, 60 + i), -1);
    EXPECT_OK(e->Unpin(units[i], id));
    EXPECT_OK(e->Free(units[i]));
  }
  void* whole = MustAllocate(*e, 10 * kGranule, /*pin=*/false);
  ASSERT_TRUE(whole != nullptr);
  EXPECT_OK(FillAllocation(*e, whole, 10 * kGranule, 63));
  Fake().reset_call_counts();
  EXPECT_OK(e->Evict(whole));
  EXPECT_EQ(Fake().call_count("cuMemCreate"), 0u);
  EXPECT_EQ(Fake().call_count("cuMemMap"), 1u);
  EXPECT_EQ(VerifyAllocation(*e, whole, 10 * kGranule, 63), -1);
  EXPECT_OK(e->Free(whole));
  EXPECT_EQ(Fake().pool_bytes_in_use(FAKE_CUDA_POOL_HOST), 10 * kGranule);  // all kept
}

// A driver that maps host memory only from offset 0 gets nothing made ahead
// (a run of no request's size would be released and made again), and memory
// the backend cannot make at creation is made as evictions need it: neither
// is an error.
TEST_F(FakeCudaTest, HostMemoryIsMadeAtEvictionWhereItCannotBeMadeAhead) {
  for (const bool whole_runs_only : {true, false}) {
    Fake().set_map_offset_zero_only(whole_runs_only ? 1 : 0);
    std::unique_ptr<CudaBackend> backend = MustMakeCuda();
    EXPECT_TRUE(backend->MapsPartsOfRuns(PoolKind::kHost) == !whole_runs_only);
    // The device pool's piece is the first cuMemCreate, the run made ahead
    // the second (refused).
    if (!whole_runs_only) Fake().fail_nth_mem_create(2);
    auto e = EngineMakingHostAhead(std::move(backend), 10);
    EXPECT_EQ(e->GetStatistics().host_bytes_made_ahead, 0);
    EXPECT_EQ(Fake().pool_bytes_in_use(FAKE_CUDA_POOL_HOST), 0u);
    void* u = MustAllocate(*e, 3 * kGranule, /*pin=*/false);
    ASSERT_TRUE(u != nullptr);
    EXPECT_OK(FillAllocation(*e, u, 3 * kGranule, 64));
    Fake().reset_call_counts();
    EXPECT_OK(e->Evict(u));
    EXPECT_EQ(Fake().call_count("cuMemCreate"), 1u);  // its run, at the eviction
    EXPECT_EQ(VerifyAllocation(*e, u, 3 * kGranule, 64), -1);
    EXPECT_OK(e->Free(u));
  }
}

// Made ahead in two runs (Engine::kHostAheadRunBytes each at most), the
// second refused: the first, already made, is released too, with its share
// of the pinned budget, and evictions make memory as they need it.
TEST_F(FakeCudaTest, HostMemoryMadeAheadInPartIsReleasedWhole) {
  const size_t per_run = Engine::kHostAheadRunBytes / kGranule;
  std::unique_ptr<CudaBackend> backend = MustMakeCuda();
  const size_t budget_before = PinnedHostBudget::Process().used();
  // The device pool's piece, the first run (made), the second (refused).
  Fake().fail_nth_mem_create(3);
  auto e = EngineMakingHostAhead(std::move(backend), per_run + 2, per_run + 8);
  EXPECT_EQ(e->GetStatistics().host_bytes_made_ahead, 0);
  EXPECT_EQ(Fake().pool_bytes_in_use(FAKE_CUDA_POOL_HOST), 0u);
  EXPECT_EQ(PinnedHostBudget::Process().used(), budget_before);
  void* u = MustAllocate(*e, 3 * kGranule, /*pin=*/false);
  ASSERT_TRUE(u != nullptr);
  EXPECT_OK(FillAllocation(*e, u, 3 * kGranule, 65));
  Fake().reset_call_counts();
  EXPECT_OK(e->Evict(u));
  EXPECT_EQ(Fake().call_count("cuMemCreate"), 1u);  // a run of 3 from id 0, made anew
  EXPECT_EQ(Fake().pool_bytes_in_use(FAKE_CUDA_POOL_HOST), 3 * kGranule);
  EXPECT_EQ(VerifyAllocation(*e, u, 3 * kGranule, 65), -1);
  EXPECT_OK(e->Free(u));
}

// cuMemUnmap is not stream-ordered: the host mapping of an evicted tensor
// goes only after work queued on it is done, and the page-in copies that
// work's bytes. The one legitimate writer of an evicted tensor's host memory
// that holds no pin: TensorFlow's own host-to-device copy into a tensor born
// evicted, outside any kernel, before a kernel's pin claims it (Note
// [Writers outside kernels] in engine.h). The claim is its last use.
TEST_F(EngineTest, APageInWaitsForQueuedWorkOnTheEvictedTensorBeforeTheRemap) {
  StartEngine(/*device=*/4, /*host=*/8, /*defrag=*/true);
  FencedStream host_to_device(b);
  const size_t size = 2 * kGranule;
  void* full = MustAllocate(*e, 4 * kGranule, /*pin=*/true);
  ASSERT_TRUE(full != nullptr);
  Status s;
  uint64_t id = 0;
  void* t = e->Allocate(size, Hold::kWriter, &s, &id);  // the device is full
  ASSERT_TRUE(t != nullptr);
  AllocationInfo info;
  EXPECT_OK(e->Inspect(t, &info));
  EXPECT_TRUE(info.evicted);
  LatchedWriter copy;  // TensorFlow's copy into T, over the bus
  StartLatchedWriter(b, host_to_device.stream, t, size, 15, &copy);
  std::thread release = copy.ReleaseAfter(std::chrono::milliseconds(200));
  EXPECT_OK(e->Free(full));
  EXPECT_OK(e->Pin(t, &id));  // claims T and pages it in
  release.join();
  EXPECT_OK(e->Inspect(t, &info));
  EXPECT_TRUE(!info.evicted);
  EXPECT_EQ(VerifyAllocation(*e, t, size, 15), -1);  // the copy's bytes
  EXPECT_OK(e->Unpin(t, id));
  EXPECT_OK(e->Free(t));
}

// A copy of `bytes` from `src` into `dst` queued on `stream`: what
// TensorFlow's device-to-host copy of an unpinned tensor does to it.
Status QueueCopy(CudaBackend* b, cu::CUstream stream, const void* dst, const void* src,
                 size_t bytes) {
  ScopedCudaContext scope(b->driver(), b->context());
  return b->driver().Check(
      b->driver().cuMemcpyAsync(Address(dst), Address(src), bytes, stream), "cuMemcpyAsync");
}

// An epoch covers every fenced stream: a copy out of T queued on the
// device-to-host stream while T was pinned (the last use before its unpin)
// still runs when T is evicted, and reads T's bytes, not what the eviction
// leaves at T's address.
TEST_F(EngineTest, ACopyQueuedOnAnotherFencedStreamBeforeTheUnpinReadsTheRightBytes) {
  StartEngine(/*device=*/9, /*host=*/8);
  FencedStream device_to_host(b);
  const size_t size = 4 * kGranule;
  void* t = MustAllocate(*e, size, /*pin=*/false);
  void* staging = MustAllocate(*e, 2 * kGranule, /*pin=*/true);  // never evicted
  ASSERT_TRUE(t != nullptr && staging != nullptr);
  EXPECT_OK(FillAllocation(*e, t, size, 3));
  CompleteAnEpoch(*e);
  // The copy waits behind earlier work on its stream, then runs slowly.
  LatchedWriter earlier_work;
  EXPECT_OK(LaunchWriter(b, device_to_host.stream, &earlier_work));
  Fake().set_copy_delay_us(100000);
  uint64_t pin = 0;
  EXPECT_OK(e->Pin(t, &pin));
  EXPECT_OK(QueueCopy(b, device_to_host.stream, staging, t, 2 * kGranule));
  EXPECT_OK(e->Unpin(t, pin));
  std::thread release = earlier_work.ReleaseAfter(std::chrono::milliseconds(150));
  // Needs T's granules: T is evicted while the copy is in flight.
  void* u = MustAllocate(*e, 5 * kGranule, /*pin=*/true);
  EXPECT_OK(b->UnmapCompletedRetired());  // none yet: the copy still reads T
  release.join();
  Fake().set_copy_delay_us(0);
  ASSERT_TRUE(u != nullptr);
  AllocationInfo info;
  EXPECT_OK(e->Inspect(t, &info));
  EXPECT_TRUE(info.evicted);
  EXPECT_EQ(VerifyAllocation(*e, staging, 2 * kGranule, 3), -1);
  EXPECT_EQ(VerifyAllocation(*e, t, size, 3), -1);
  for (void* p : {t, staging, u}) EXPECT_OK(e->Free(p));
}

// An evicted tensor's host memory is touched only while pinned (an
// eviction waited for every earlier use): by the kernels of a tensor larger
// than the device, pinned where it is. Freed with such a kernel's write
// still queued, its host mapping is retired, not unmapped under the write,
// and the free does not wait for it (Note [Retired mappings]).
TEST_F(EngineTest, FreeingAnEvictedTensorRetiresItsMappingUnderQueuedWork) {
  StartEngine(/*device=*/2, /*host=*/8);
  FencedStream compute(b);
  const size_t size = 4 * kGranule;  // larger than the device: born evicted
  void* t = MustAllocate(*e, size, /*pin=*/false);
  ASSERT_TRUE(t != nullptr);
  CompleteAnEpoch(*e);  // T's birth is long done: only its unpin orders the unmap
  uint64_t id = 0;
  EXPECT_OK(e->Pin(t, &id));  // pinned in host memory
  AllocationInfo info;
  EXPECT_OK(e->Inspect(t, &info));
  EXPECT_TRUE(info.evicted);
  LatchedWriter kernel;
  StartLatchedWriter(b, compute.stream, t, size, 4, &kernel);
  EXPECT_OK(e->Unpin(t, id));
  const int64_t waits = e->GetStatistics().num_host_waits;
  EXPECT_OK(e->Free(t));  // retires T's host mapping: the kernel still writes it
  EXPECT_EQ(e->GetStatistics().num_host_waits - waits, 0);
  EXPECT_OK(b->UnmapCompletedRetired());  // none yet: the kernel still writes T
  EXPECT_TRUE(!kernel.finished.load());
  kernel.released = true;
  Synchronize(b, compute.stream);
  EXPECT_OK(b->UnmapCompletedRetired());
  // Unmapped by the next call that looks (here an eviction's batch).
  CompleteAnEpoch(*e);
}

// T evicted while a kernel queued before its unpin still writes it (its
// device mapping retired, and its host mapping pending or, with evicted
// tensors unmapped, none), then freed before that kernel has run: the free
// drops what was pending and leaves the device mapping retired, and waits
// for nothing on the host (Note [Retired mappings]). W's map then lets the
// unmap thread make what it was handed, which must not include the retired
// mapping the kernel still writes (the fake records a violation).
void FreeAnEvictionThatWaitsForAKernel(Engine& e, CudaBackend* b, cu::CUstream stream) {
  const size_t size = 4 * kGranule;
  uint64_t id = 0;
  void* t = e.Allocate(size, /*pin=*/true, nullptr, &id);
  ASSERT_TRUE(t != nullptr);
  EXPECT_OK(FillAllocation(e, t, size, 1));
  CompleteAnEpoch(e);
  LatchedWriter kernel;
  StartLatchedWriter(b, stream, t, size, 2, &kernel);
  EXPECT_OK(e.Unpin(t, id));
  std::thread release = kernel.ReleaseAfter(std::chrono::milliseconds(2000));
  void* u = MustAllocate(e, size + kGranule, /*pin=*/true);  // evicts T
  ASSERT_TRUE(u != nullptr);
  AllocationInfo info;
  EXPECT_OK(e.Inspect(t, &info));
  EXPECT_TRUE(info.evicted);
  const int64_t waits = e.GetStatistics().num_host_waits;
  EXPECT_OK(e.Free(t));
  void* w = MustAllocate(e, kGranule, /*pin=*/true);
  ASSERT_TRUE(w != nullptr);
  EXPECT_EQ(e.GetStatistics().num_host_waits - waits, 0);
  EXPECT_TRUE(!kernel.finished.load());  // neither the free nor W waited for it
  release.join();
  Synchronize(b, stream);
  EXPECT_OK(b->UnmapCompletedRetired());
  EXPECT_OK(FillAllocation(e, u, size + kGranule, 3));
  EXPECT_EQ(VerifyAllocation(e, u, size + kGranule, 3), -1);
  EXPECT_OK(e.Free(u));
  EXPECT_OK(e.Free(w));
}

TEST_F(EngineTest, FreeingATensorWhoseEvictionWaitsForAKernelDoesNotWaitForIt) {
  StartEngine(/*device=*/6, /*host=*/8);
  FencedStream compute(b);
  FreeAnEvictionThatWaitsForAKernel(*e, b, compute.stream);
}

TEST_F(EngineTest, FreeingATensorEvictedUnmappedUnderAKernelDoesNotWaitForIt) {
  StartEngineUnmappingEvicted(/*device=*/6, /*host=*/8);
  FencedStream compute(b);
  FreeAnEvictionThatWaitsForAKernel(*e, b, compute.stream);
}

// The adapter's last resort under a deadlock: a kernel whose pin of an
// evicted input was refused reads it in place. An eviction whose remap was
// deferred (its victim's last kernel still ran) is completed first, so the
// in-place read finds the victim's host memory, not the device memory it
// gave back and another tensor now writes.
TEST_F(EngineTest, AKernelReadingARefusedInputInPlaceSeesItsEvictedBytes) {
  StartEngine(/*device=*/4, /*host=*/8);
  FencedStream compute(b);
  void* w = MustAllocate(*e, 2 * kGranule, /*pin=*/false);
  ASSERT_TRUE(w != nullptr);
  CompleteAnEpoch(*e);
  uint64_t id = 0;
  EXPECT_OK(e->Pin(w, &id));
  LatchedWriter last_use;  // W's last kernel, still running when W is evicted
  StartLatchedWriter(b, compute.stream, w, 2 * kGranule, 41, &last_use);
  EXPECT_OK(e->Unpin(w, id));
  uint64_t p_id = 0;
  void* p = e->Allocate(4 * kGranule, /*pin=*/true, nullptr, &p_id);  // evicts W
  ASSERT_TRUE(p != nullptr);
  AllocationInfo info;
  EXPECT_OK(e->Inspect(w, &info));
  EXPECT_TRUE(info.evicted);
  LatchedWriter p_kernel;  // P's kernel writes the device memory W gave back
  p_kernel.address = Address(p);
  p_kernel.bytes = 4 * kGranule;
  p_kernel.seed = 42;
  p_kernel.released = true;
  EXPECT_OK(LaunchWriter(b, compute.stream, &p_kernel));
  std::thread release = last_use.ReleaseAfter(std::chrono::milliseconds(200));
  EXPECT_TRUE(!e->Pin(w, &id).ok());  // the device is full of pinned memory: refused
  release.join();
  PatternReader in_place;  // the kernel reads W where it is
  in_place.address = Address(w);
  in_place.bytes = 2 * kGranule;
  in_place.seed = 41;
  EXPECT_OK(LaunchReader(b, compute.stream, &in_place));
  Synchronize(b, compute.stream);
  EXPECT_EQ(in_place.result.load(), -1);
  EXPECT_OK(e->Unpin(p, p_id));
  EXPECT_OK(e->Free(p));
  EXPECT_OK(e->Free(w));
}

// A page-in into device memory whose freed buffer a queued kernel still
// writes: the granule is taken without a host wait (its old mapping
// retired), and the page-in copy waits on the GPU for that kernel, so the
// paged-in bytes are the tensor's, not the kernel's.
TEST_F(EngineTest, APageInIntoAFreedGranuleWaitsForTheKernelStillWritingIt) {
  StartEngine(/*device=*/4, /*host=*/8, /*defrag=*/true);
  FencedStream compute(b);
  void* x = MustAllocate(*e, 2 * kGranule, /*pin=*/false);
  ASSERT_TRUE(x != nullptr);
  EXPECT_OK(FillAllocation(*e, x, 2 * kGranule, 30));
  EXPECT_OK(e->Evict(x));
  uint64_t id = 0;
  void* t = e->Allocate(4 * kGranule, /*pin=*/true, nullptr, &id);
  ASSERT_TRUE(t != nullptr);
  LatchedWriter kernel;
  StartLatchedWriter(b, compute.stream, t, 4 * kGranule, 31, &kernel);
  EXPECT_OK(e->Unpin(t, id));
  EXPECT_OK(e->Free(t));  // cached at its range, the kernel still writing
  const int64_t waits = e->GetStatistics().num_host_waits;
  std::thread release = kernel.ReleaseAfter(std::chrono::milliseconds(200));
  uint64_t pin = 0;
  EXPECT_OK(e->Pin(x, &pin));  // takes two of T's granules, pages X in
  EXPECT_EQ(e->GetStatistics().num_host_waits - waits, 0);
  release.join();
  Synchronize(b, compute.stream);
  EXPECT_EQ(VerifyAllocation(*e, x, 2 * kGranule, 30), -1);
  EXPECT_OK(e->Unpin(x, pin));
  EXPECT_OK(e->Free(x));
}

// T (3 granules) and a pinned granule after it (*wall: T's hole stays 3
// slots), a latched kernel writing T on `stream`, and T freed by TensorFlow
// on the host while the kernel still writes it. Returns T's address.
void* FreeWhileAKernelWrites(EngineTest* test, cu::CUstream stream, LatchedWriter* kernel,
                             void** wall) {
  Engine& e = *test->e;
  uint64_t id = 0;
  void* t = e.Allocate(3 * kGranule, /*pin=*/true, nullptr, &id);
  *wall = MustAllocate(e, kGranule, /*pin=*/true);
  EXPECT_TRUE(t != nullptr && *wall != nullptr);
  if (t == nullptr) return nullptr;
  StartLatchedWriter(test->b, stream, t, 3 * kGranule, 5, kernel);
  EXPECT_OK(e.Unpin(t, id));
  EXPECT_OK(e.Free(t));
  return t;
}

// Defragmentation takes granules of a range freed while a kernel still
// writes it without waiting (the range's mapping is retired, Note [Retired
// mappings]); the host's own copy into them waits for that kernel.
TEST_F(EngineTest, DefragmentationRetiresAFreedRangeAndTheNextUserWaits) {
  StartEngine(/*device=*/6, /*host=*/8, /*defrag=*/true);
  FencedStream compute(b);
  LatchedWriter kernel;
  void* wall = nullptr;
  FreeWhileAKernelWrites(this, compute.stream, &kernel, &wall);
  EXPECT_EQ(e->cached_granules(), 3u);
  const int64_t waits = e->GetStatistics().num_host_waits;
  // 4 granules: 2 free, 2 taken from T's freed range, elsewhere.
  void* u = MustAllocate(*e, 4 * kGranule, /*pin=*/true);
  ASSERT_TRUE(u != nullptr);
  EXPECT_EQ(e->GetStatistics().num_host_waits - waits, 0);
  EXPECT_OK(b->UnmapCompletedRetired());  // none yet: the kernel still writes T
  std::thread release = kernel.ReleaseAfter(std::chrono::milliseconds(200));
  EXPECT_OK(FillAllocation(*e, u, 4 * kGranule, 6));  // waits for the kernel
  release.join();
  const Statistics st = e->GetStatistics();
  EXPECT_EQ(st.num_defragmentations, 1);
  EXPECT_TRUE(st.num_host_waits - waits >= 1);
  EXPECT_EQ(VerifyAllocation(*e, u, 4 * kGranule, 6), -1);
  EXPECT_OK(e->Free(u));
  EXPECT_OK(e->Free(wall));
}

// Note [Epochs of use], past the ring's end: a wait for an epoch the ring
// of kEpochRing events no longer holds waits through the oldest it holds
// after it, not through whichever newer epoch took the slot. Kernel 1 is
// queued before epoch M, kernel 2 after M + 70; 130 epochs are closed in
// all, so that M's slot holds an epoch after kernel 2. A page-in in a batch
// whose mark is M waits on the host for kernel 1 only.
TEST_F(BackendTest, AWaitForAnEpochTheRingNoLongerHoldsWaitsThroughTheOldestAfterIt) {
  uintptr_t base = 0;
  EXPECT_OK(b->ReserveAddressRange(2 * kGranule, &base));
  EXPECT_OK(b->CreatePool(PoolKind::kDevice, 2));
  FencedStream compute(b.get());
  const auto close_epochs = [&](int n) {
    for (int i = 0; i < n; ++i) {
      EXPECT_OK(b->BeginRemapBatch(b->ReleaseMark()));
      EXPECT_OK(b->EndRemapBatch());
    }
  };
  LatchedWriter first, second;  // they write nothing: only their order counts
  EXPECT_OK(LaunchWriter(b.get(), compute.stream, &first));
  const uint64_t mark = b->ReleaseMark();
  close_epochs(71);
  EXPECT_OK(LaunchWriter(b.get(), compute.stream, &second));
  close_epochs(60);
  std::thread release_first = first.ReleaseAfter(std::chrono::milliseconds(500));
  std::thread release_second = second.ReleaseAfter(std::chrono::milliseconds(2000));
  const int64_t waits = b->GetStatistics().host_waits;
  EXPECT_OK(b->BeginRemapBatch(mark));
  const GranuleId device[] = {0};
  EXPECT_OK(b->Map(base, PoolKind::kDevice, device, 1, Access::kReadWrite));
  EXPECT_OK(b->EndRemapBatch());
  // One wait, unless kernel 1 had already run when the batch polled (a
  // stalled test thread): then none, and nothing is shown either way.
  EXPECT_TRUE(b->GetStatistics().host_waits - waits <= 1);
  EXPECT_TRUE(first.finished.load());
  EXPECT_TRUE(!second.finished.load());  // the wait was not for kernel 2
  release_first.join();
  release_second.join();
  Synchronize(b.get(), compute.stream);
  EXPECT_OK(b->Unmap(base, 1));
  b->ReleaseAddressRange(base, 2 * kGranule);
}

// Backend::ReleaseWaitsOnlyForCopies: memory that a retired mapping still
// in use maps (a range freed while a kernel queued before the free still
// writes it; no copy of it was ever made) is refused, since its release
// would wait on the host for that kernel, and accepted once the kernel's
// epoch is done. Asking waits for nothing.
TEST_F(BackendTest, MemoryARetiredMappingStillUsesIsNotReleasableUntilItsKernelIsDone) {
  const uintptr_t base = MapOneGranule();
  FencedStream compute(b.get());
  LatchedWriter kernel;
  StartLatchedWriter(b.get(), compute.stream, reinterpret_cast<void*>(base), kGranule, 7,
                     &kernel);
  EXPECT_OK(b->UnmapReleased(base, 1, b->ReleaseMark()));  // retired under the kernel
  const GranuleRun run[] = {{0, 1}};
  EXPECT_TRUE(!b->ReleaseWaitsOnlyForCopies(PoolKind::kDevice, run, 1));
  EXPECT_EQ(b->GetStatistics().host_waits, 0);
  EXPECT_TRUE(!kernel.finished.load());
  kernel.released = true;
  Synchronize(b.get(), compute.stream);
  EXPECT_TRUE(b->ReleaseWaitsOnlyForCopies(PoolKind::kDevice, run, 1));
  EXPECT_OK(b->UnmapCompletedRetired());
  b->ReleaseAddressRange(base, kGranule);
}

// A granule freed before any stream was fenced carries no mark of that
// time: once a stream is fenced and busy, a copy from it at its new address
// waits for none of that stream's work.
TEST_F(BackendTest, AGranuleFreedBeforeAnyStreamWasFencedMakesNoLaterCopyWaitForTheGpu) {
  uintptr_t base = 0;
  EXPECT_OK(b->ReserveAddressRange(3 * kGranule, &base));
  EXPECT_OK(b->CreatePool(PoolKind::kDevice, 2));
  const GranuleId ids[] = {0, 1};
  EXPECT_OK(b->Map(base, PoolKind::kDevice, ids, 1, Access::kReadWrite));
  EXPECT_OK(b->UnmapReleased(base, 1, b->ReleaseMark()));  // no fenced stream: done
  EXPECT_OK(b->Map(base + kGranule, PoolKind::kDevice, ids, 1, Access::kReadWrite));
  EXPECT_OK(b->Map(base + 2 * kGranule, PoolKind::kDevice, ids + 1, 1, Access::kReadWrite));
  FencedStream compute(b.get());
  LatchedWriter kernel;  // busy on granule 1 until released
  StartLatchedWriter(b.get(), compute.stream, reinterpret_cast<void*>(base + 2 * kGranule),
                     kGranule, 3, &kernel);
  const int64_t waits = b->GetStatistics().host_waits;
  std::future<Status> copied = std::async(std::launch::async, [&] {
    unsigned char byte = 0;
    return b->CopyToHost(&byte, base + kGranule, 1);
  });
  const bool returned = copied.wait_for(std::chrono::seconds(2)) == std::future_status::ready;
  kernel.released = true;
  EXPECT_TRUE(returned);  // not after the kernel
  EXPECT_OK(copied.get());
  EXPECT_EQ(b->GetStatistics().host_waits - waits, 0);
  Synchronize(b.get(), compute.stream);
  EXPECT_OK(b->Unmap(base + kGranule, 2));
  b->ReleaseAddressRange(base, 3 * kGranule);
}

// A mapping freed while a stream was fenced, and handed to the unmap thread
// once no stream is (that one removed), stays free of queued work when
// another stream is fenced: its epoch was done when it was handed over.
TEST_F(BackendTest, AnUnmapHandedOverWithNoStreamFencedStaysDoneWhenOneIsFencedAgain) {
  const uintptr_t base = MapOneGranule();
  {
    FencedStream first(b.get());
    EXPECT_OK(b->UnmapReleased(base, 1, b->ReleaseMark()));  // retired, its epoch open
    EXPECT_TRUE(!b->MapsWithoutWait(base, 1, /*poll=*/false));
  }
  EXPECT_OK(b->UnmapCompletedRetired());  // no stream fenced: done, handed over
  FencedStream second(b.get());
  EXPECT_TRUE(b->MapsWithoutWait(base, 1, /*poll=*/true));
  b->ReleaseAddressRange(base, kGranule);
}

// An unmap the thread fails (the range unmapped behind the backend's back)
// leaves its mapping retired, to be tried again; destroying the backend then
// tries it on the destroying thread, once the unmap thread is gone, and
// crashes nothing.
TEST_F(BackendTest, ABackendIsDestroyedCleanlyAfterItsUnmapThreadFailed) {
  const uintptr_t base = MapOneGranule();
  EXPECT_OK(b->UnmapReleased(base, 1, b->ReleaseMark()));  // handed over, held
  {
    ScopedCudaContext scope(b->driver(), b->context());
    EXPECT_EQ(b->driver().cuMemUnmap(base, kGranule), cu::CUDA_SUCCESS);
  }
  b.reset();
  EXPECT_EQ(Fake().live_mappings(), 0u);
}

// A stream unregistered while a kernel it queued still writes a unit: the
// unit's eviction still copies what that kernel wrote, because removal waits
// for the stream's queued work (with no stream left, every mark reads done).
TEST_F(EngineTest, RemovingAFencedStreamKeepsItsQueuedWorkBeforeLaterMoves) {
  StartEngine(/*device=*/4, /*host=*/8);
  FencedStream compute(b);
  uint64_t id = 0;
  void* t = e->Allocate(kGranule, /*pin=*/true, nullptr, &id);
  ASSERT_TRUE(t != nullptr);
  LatchedWriter kernel;
  StartLatchedWriter(b, compute.stream, t, kGranule, 2, &kernel);
  EXPECT_OK(e->Unpin(t, id));
  std::thread release = kernel.ReleaseAfter(std::chrono::milliseconds(200));
  b->RemoveFencedStream(compute.stream);
  EXPECT_TRUE(kernel.finished);  // waited for
  release.join();
  EXPECT_OK(e->Evict(t));
  EXPECT_EQ(VerifyAllocation(*e, t, kGranule, 2), -1);
  EXPECT_OK(e->Free(t));
}

// A freed mapping whose unmap went to the unmap thread before any stream
// was fenced still counts as free of queued work once one is: its epoch was
// done (nothing could be queued), and only the driver call is left. The
// next unit goes there, with no host wait.
TEST_F(EngineTest, AnUnmapHandedOverBeforeAStreamWasFencedLeavesItsSlotsFirstChoice) {
  StartEngine(/*device=*/6, /*host=*/8, /*defrag=*/true);
  void* first = e->Allocate(kGranule, /*pin=*/false, nullptr);
  ASSERT_TRUE(first != nullptr);
  EXPECT_OK(e->Evict(first));
  Fake().hold_unmaps(1);
  EXPECT_OK(e->Free(first));  // its host mapping handed to the unmap thread
  FencedStream compute(b);
  EXPECT_TRUE(b->MapsWithoutWait(reinterpret_cast<uintptr_t>(first), 1, /*poll=*/true));
  const Statistics before = e->GetStatistics();
  std::thread open([] {
    WaitUpTo10s([] { return Fake().unmaps_waiting() != 0; });
    Fake().hold_unmaps(0);  // the map below released it: let it end
  });
  void* next = MustAllocate(*e, kGranule, /*pin=*/true);
  open.join();
  const Statistics after = e->GetStatistics();
  EXPECT_TRUE(next == first);  // best fit, as if the unmap were made
  EXPECT_EQ(after.num_cut_mappings_avoided - before.num_cut_mappings_avoided, 0);
  EXPECT_EQ(after.num_host_waits - before.num_host_waits, 0);
  EXPECT_OK(e->Free(next));
}

// A new unit is not placed where a retired mapping still in use sits (its
// Map would wait on the host for the kernel still writing the freed range,
// Note [Mappings within a unit]): here T's range, taken back by
// defragmentation while a kernel writes it, is skipped for the next unit.
TEST_F(EngineTest, ANewUnitIsPlacedAwayFromARetiredMappingStillInUse) {
  StartEngine(/*device=*/6, /*host=*/8, /*defrag=*/true);
  StartDeviceRuns();
  FencedStream compute(b);
  LatchedWriter kernel;
  void* wall = nullptr;
  void* t = FreeWhileAKernelWrites(this, compute.stream, &kernel, &wall);
  void* u = MustAllocate(*e, 4 * kGranule, /*pin=*/true);  // takes T's granules back
  ASSERT_TRUE(u != nullptr);
  EXPECT_OK(e->Free(u));
  const int64_t waits = e->GetStatistics().num_host_waits;
  const int64_t avoided = e->GetStatistics().num_cut_mappings_avoided;
  // Placed on T's range, its Map would wait for the kernel (released later).
  std::thread release = kernel.ReleaseAfter(std::chrono::milliseconds(300));
  void* v = MustAllocate(*e, kGranule, /*pin=*/true);  // best fit: T's range
  const Statistics st = e->GetStatistics();
  release.join();
  ASSERT_TRUE(v != nullptr);
  EXPECT_TRUE(v != t);
  EXPECT_EQ(st.num_cut_mappings_avoided - avoided, 1);
  EXPECT_EQ(st.num_host_waits - waits, 0);
  EXPECT_OK(e->Free(v));
  EXPECT_OK(e->Free(wall));
}

// When recent frees fill every best fit with retired mappings still in use
// (more than placement tries one by one), a new unit goes to the far end of
// the largest free range, where nothing was mapped, rather than wait on the
// host for the GPU to reach the frees (Engine::PlaceWithoutCuts).
TEST_F(EngineTest, ANewUnitAvoidsRetiredMappingsInEveryBestFit) {
  constexpr int kHoles = 40;  // more than PlaceWithoutCuts tries
  StartEngine(/*device=*/2 * kHoles + 8, /*host=*/8, /*defrag=*/true);
  StartDeviceRuns();
  FencedStream compute(b);
  // Single-granule units between pinned walls: each hole stays one slot.
  std::vector<void*> units, walls;
  std::vector<uint64_t> ids;
  for (int i = 0; i < kHoles; ++i) {
    uint64_t id = 0;
    units.push_back(e->Allocate(kGranule, /*pin=*/true, nullptr, &id));
    ids.push_back(id);
    walls.push_back(MustAllocate(*e, kGranule, /*pin=*/true));
    ASSERT_TRUE(units.back() != nullptr && walls.back() != nullptr);
  }
  LatchedWriter kernel;
  StartLatchedWriter(b, compute.stream, walls[0], kGranule, 7, &kernel);
  for (int i = 0; i < kHoles; ++i) {
    EXPECT_OK(e->Unpin(units[i], ids[i]));
    EXPECT_OK(e->Free(units[i]));  // cached, the kernel still queued
  }
  // Takes the 8 free granules and every hole's (defragmentation retires
  // their mappings: the kernel was queued before the frees).
  void* big = MustAllocate(*e, (kHoles + 8) * kGranule, /*pin=*/true);
  ASSERT_TRUE(big != nullptr);
  EXPECT_OK(e->Free(big));
  const int64_t waits = e->GetStatistics().num_host_waits;
  std::thread release = kernel.ReleaseAfter(std::chrono::milliseconds(300));
  void* v = MustAllocate(*e, kGranule, /*pin=*/true);
  const Statistics st = e->GetStatistics();
  release.join();
  ASSERT_TRUE(v != nullptr);
  EXPECT_EQ(st.num_host_waits - waits, 0);
  for (void* u : units) EXPECT_TRUE(v != u);
  EXPECT_OK(FillAllocation(*e, v, kGranule, 8));
  Synchronize(b, compute.stream);
  EXPECT_EQ(VerifyAllocation(*e, v, kGranule, 8), -1);
  EXPECT_OK(e->Free(v));
  for (void* w : walls) EXPECT_OK(e->Free(w));
}

TEST_F(EngineTest, AGranuleFreedBeforeACompletedFenceIsTakenWithoutAHostWait) {
  StartEngine(/*device=*/6, /*host=*/8, /*defrag=*/true);
  FencedStream compute(b);
  uint64_t id = 0;
  void* t = e->Allocate(3 * kGranule, /*pin=*/true, nullptr, &id);
  void* wall = MustAllocate(*e, kGranule, /*pin=*/true);
  void* x = MustAllocate(*e, 2 * kGranule, /*pin=*/false);
  ASSERT_TRUE(t != nullptr && wall != nullptr && x != nullptr);
  EXPECT_OK(e->Unpin(t, id));
  EXPECT_OK(e->Free(t));
  EXPECT_OK(e->Evict(x));  // fences and waits: covers all T's work
  const int64_t waits = e->GetStatistics().num_host_waits;
  void* u = MustAllocate(*e, 4 * kGranule, /*pin=*/true);  // takes 2 of T's
  ASSERT_TRUE(u != nullptr);
  const Statistics st = e->GetStatistics();
  EXPECT_EQ(st.num_defragmentations, 1);
  EXPECT_EQ(st.num_host_waits, waits);  // no wait for the freed granules
  EXPECT_OK(FillAllocation(*e, u, 4 * kGranule, 7));
  EXPECT_EQ(VerifyAllocation(*e, u, 4 * kGranule, 7), -1);
  for (void* p : {u, wall, x}) EXPECT_OK(e->Free(p));
}

// An H200's device (141 GiB) and a 512 GiB host budget, used to their
// limits over the fake driver without touching that memory (its pools are
// sparse files: only written pages cost): 1 GiB units fill the device
// pinned, so nothing can be evicted, and the next are born evicted into
// host memory until the budget is spent; the one after is refused, naming
// the setting. Freeing every other host unit leaves 256 holes of 1 GiB in
// the host pool: a 2 GiB unit is placed in two of them, and one freed GiB
// takes 512 units of 2 MiB, whose bytes survive (the only memory written).
// Built without TSan only: the engine reserves 1.3 TiB of addresses (twice
// device and host), more than TSan's layout leaves an application, and the
// test has one thread. Last in the file: a mutation that maps every granule
// at one offset (make mutation-check-cuda) makes the fake's mappings too
// many for the kernel, whose refusal ends the process.
#if !defined(__SANITIZE_THREAD__)
TEST_F(FakeCudaTest, A141GiBDeviceAndA512GiBHostBudgetAreUsedToTheirLimits) {
  constexpr size_t k2M = size_t{2} << 20, kGiB = size_t{1} << 30;
  constexpr size_t kDevice = 141 * kGiB, kHost = 512 * kGiB;
  if (Fake().set_granularity(k2M) != 0) return;
  ASSERT_TRUE(Fake().set_pool_capacity(FAKE_CUDA_POOL_DEVICE, kDevice) == 0);
  ASSERT_TRUE(Fake().set_pool_capacity(FAKE_CUDA_POOL_HOST, kHost) == 0);
  std::unique_ptr<CudaBackend> backend;
  EXPECT_OK(CudaBackend::Create(0, k2M, /*allow_growth=*/false, &backend));
  if (backend == nullptr) return;
  EngineOptions o;
  o.device_bytes = kDevice;
  o.host_bytes = kHost;
  o.policy = PolicyKind::kLru;
  auto e = engine_test::MustCreateEngine(o, std::move(backend));
  std::vector<void*> device_units, host_units;
  for (size_t i = 0; i < kDevice / kGiB; ++i) {
    device_units.push_back(MustAllocate(*e, kGiB, /*pin=*/true));
    ASSERT_TRUE(device_units.back() != nullptr);
  }
  Status refused;
  for (size_t i = 0; i <= kHost / kGiB; ++i) {
    void* p = e->Allocate(kGiB, /*pin=*/false, &refused);
    if (p == nullptr) break;
    host_units.push_back(p);
  }
  EXPECT_EQ(host_units.size(), kHost / kGiB);
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted);
  if (!Contains(refused.ToString(), "TF_GPU_HOST_MEM_LIMIT_IN_MB")) {
    std::printf("  refused: %s\n", refused.ToString().c_str());
  }
  EXPECT_TRUE(Contains(refused.ToString(), "TF_GPU_HOST_MEM_LIMIT_IN_MB"));
  Statistics s = e->GetStatistics();
  EXPECT_EQ(s.num_born_evicted, static_cast<int64_t>(kHost / kGiB));
  EXPECT_EQ(s.bytes_in_use, static_cast<int64_t>(kDevice + kHost));
  EXPECT_EQ(s.current_bytes_reclaimed, static_cast<int64_t>(kHost));
  EXPECT_EQ(Fake().pool_bytes_in_use(FAKE_CUDA_POOL_HOST), kHost);
  for (size_t i = 0; i < host_units.size(); i += 2) EXPECT_OK(e->Free(host_units[i]));
  void* two = e->Allocate(2 * kGiB, /*pin=*/false, &refused);  // in two holes
  EXPECT_TRUE(two != nullptr);
  std::vector<void*> small;
  for (size_t i = 0; i < kGiB / k2M; ++i) {
    small.push_back(MustAllocate(*e, k2M, /*pin=*/false));
    ASSERT_TRUE(small.back() != nullptr);
  }
  EXPECT_EQ(e->GetStatistics().num_born_evicted,
            static_cast<int64_t>(kHost / kGiB + 1 + kGiB / k2M));
  for (size_t i = 0; i < small.size(); i += 64) {
    EXPECT_OK(FillAllocation(*e, small[i], k2M, 900 + i));
  }
  for (size_t i = 0; i < small.size(); i += 64) {
    EXPECT_EQ(VerifyAllocation(*e, small[i], k2M, 900 + i), -1);
  }
  for (void* p : small) EXPECT_OK(e->Free(p));
  if (two != nullptr) EXPECT_OK(e->Free(two));
  for (size_t i = 1; i < host_units.size(); i += 2) EXPECT_OK(e->Free(host_units[i]));
  for (void* p : device_units) {
    AllocationInfo info;
    EXPECT_OK(e->Inspect(p, &info));
    EXPECT_OK(e->Unpin(p, info.unit_id));
    EXPECT_OK(e->Free(p));
  }
  s = e->GetStatistics();
  EXPECT_EQ(s.bytes_in_use, 0);
  EXPECT_EQ(s.current_bytes_reclaimed, 0);
  EXPECT_OK(e->CheckInvariants());
}
#endif  // !defined(__SANITIZE_THREAD__)

}  // namespace
}  // namespace lms

int main(int argc, char** argv) { return lms_test::RunAll(argc, argv); }
