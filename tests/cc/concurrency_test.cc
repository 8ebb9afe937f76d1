// Many threads allocate, write, pin, unpin, evict and free at once on one
// engine under a device capacity far below what they hold, so evictions and
// page-ins interleave with every other call. Each thread checks every byte
// of its allocations whenever it holds them pinned. Built plain and under
// TSan (make test-tsan) and ASan, over POSIX or, with LMS_TEST_BACKEND=cuda,
// the CUDA backend over the fake driver or a real GPU (test_backend.h); there
// a "compute stream" is registered and kept busy by host functions
// (cuLaunchHostFunc) meanwhile, and another stream comes and
// goes, so fences and drains race with registration and stream work.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "backends/cuda_backend.h"
#include "backends/cuda_context.h"
#include "engine/engine.h"
#include "gated_backend.h"
#include "harness.h"
#include "test_backend.h"
#include "testing/engine_pattern.h"

namespace lms {
namespace {

const size_t kGranule = lms_test::TestGranule();

// Steps of each thread of ConcurrentUseUnderPressureLosesNoByte. TSan runs
// each step many times slower; half the steps still give it about 1,500
// evictions a run (15-36 of them abandoned over POSIX) and save the suite a
// minute.
#if defined(__SANITIZE_THREAD__)
constexpr int kWorkerSteps = 750;
#else
constexpr int kWorkerSteps = 1500;
#endif

struct Owned {
  void* ptr;
  size_t bytes;
  uint64_t seed;
};

void Worker(Engine* engine, int thread, int steps, std::atomic<int>* corrupt,
            std::atomic<int>* unexpected) {
  std::mt19937_64 rng(1000 + thread);
  std::vector<Owned> owned;
  for (int step = 0; step < steps; ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 4 || owned.empty()) {
      const bool large = rng() % 2 == 0;
      const size_t bytes = large ? kGranule + rng() % (3 * kGranule)
                                 : 1 + rng() % 20000;
      // A kernel's allocation starts pinned; one made outside any kernel
      // does not (and may be born evicted): it is pinned before it is written.
      const bool pinned = rng() % 4 != 0;
      Status s;
      uint64_t id = 0;
      void* p = engine->Allocate(bytes, pinned, &s, &id);
      if (p == nullptr) {
        // Everyone may hold pins at once; running out then is legitimate.
        if (s.code() != StatusCode::kResourceExhausted) ++*unexpected;
        continue;
      }
      if (!pinned && !engine->Pin(p, &id).ok()) {
        if (!engine->Free(p).ok()) ++*unexpected;
        continue;
      }
      const uint64_t seed = rng();
      if (!FillAllocation(*engine, p, bytes, seed).ok()) ++*unexpected;  // while pinned
      if (!engine->Unpin(p, id).ok()) ++*unexpected;
      owned.push_back({p, bytes, seed});
    } else if (op < 8) {
      Owned& o = owned[rng() % owned.size()];
      uint64_t id = 0;
      Status s = engine->Pin(o.ptr, &id);
      if (!s.ok()) {
        if (s.code() != StatusCode::kResourceExhausted) ++*unexpected;
        continue;
      }
      if (VerifyAllocation(*engine, o.ptr, o.bytes, o.seed) != -1) ++*corrupt;
      if (!engine->Unpin(o.ptr, id).ok()) ++*unexpected;
    } else if (op == 8) {
      Status s = engine->Evict(owned[rng() % owned.size()].ptr);
      // Another thread may have evicted or pinned it (or its page).
      if (!s.ok() && s.code() != StatusCode::kFailedPrecondition &&
          s.code() != StatusCode::kResourceExhausted) {
        ++*unexpected;
      }
    } else {
      const size_t i = rng() % owned.size();
      if (!engine->Free(owned[i].ptr).ok()) ++*unexpected;
      owned[i] = owned.back();
      owned.pop_back();
    }
    if (thread == 0 && step % 100 == 0 && !engine->CheckInvariants().ok()) {
      ++*unexpected;
    }
    if (owned.size() > 12) {
      if (!engine->Free(owned.front().ptr).ok()) ++*unexpected;
      owned.erase(owned.begin());
    }
  }
  for (const Owned& o : owned) {
    uint64_t id = 0;
    if (engine->Pin(o.ptr, &id).ok()) {
      if (VerifyAllocation(*engine, o.ptr, o.bytes, o.seed) != -1) ++*corrupt;
      engine->Unpin(o.ptr, id);
    }
    if (!engine->Free(o.ptr).ok()) ++*unexpected;
  }
}

// On the CUDA backend: a fenced stream kept busy with short host functions, and a
// second stream registered and unregistered over and over, until stopped.
class BusyStreams {
 public:
  explicit BusyStreams(CudaBackend* backend) : b_(backend) {
    if (b_ == nullptr) return;
    thread_ = std::thread([this] { Run(); });
  }
  ~BusyStreams() {
    if (b_ == nullptr) return;
    stop_ = true;
    thread_.join();
  }
  bool ok() const { return ok_; }

 private:
  static void Nothing(void*) { std::this_thread::sleep_for(std::chrono::microseconds(200)); }
  void Run() {
    const CudaDriver& d = b_->driver();
    ScopedCudaContext scope(d, b_->context());
    cu::CUstream busy = nullptr, other = nullptr;
    ok_ = scope.status().ok() &&
          d.cuStreamCreate(&busy, cu::CU_STREAM_NON_BLOCKING) == cu::CUDA_SUCCESS &&
          d.cuStreamCreate(&other, cu::CU_STREAM_NON_BLOCKING) == cu::CUDA_SUCCESS &&
          b_->AddFencedStream(busy).ok();
    for (int i = 0; ok_ && !stop_; ++i) {
      ok_ = d.cuLaunchHostFunc(busy, &Nothing, nullptr) == cu::CUDA_SUCCESS;
      if (i % 2 == 0) ok_ = ok_ && b_->AddFencedStream(other).ok();
      else b_->RemoveFencedStream(other);
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    b_->RemoveFencedStream(other);
    b_->RemoveFencedStream(busy);
    for (cu::CUstream s : {busy, other}) {
      if (s == nullptr) continue;
      d.cuStreamSynchronize(s);
      d.cuStreamDestroy(s);
    }
  }

  CudaBackend* const b_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> ok_{true};
};

// The engine's Mutex (engine/thread_annotations.h) under more threads than
// cores, some holding it past the spin so that others sleep on the futex:
// no two threads inside at once (the counter is a plain int64_t, so TSan also
// reports a race if they are), and every thread ends (a sleeper is woken by an
// unlock or its timed sleep).
TEST(TheEngineMutexExcludesAndEverySleeperWakes) {
  Mutex mu;
  int64_t counter = 0;
  bool inside = false;
  std::atomic<int> overlaps{0};
  constexpr int kThreads = 8;
  constexpr int kIterations = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIterations; ++i) {
        MutexLock lock(mu);
        if (inside) ++overlaps;
        inside = true;
        ++counter;
        // Longer than the spin (about 11 us): the waiters go to sleep.
        if ((i + t) % 64 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
        inside = false;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  MutexLock lock(mu);
  EXPECT_EQ(counter, int64_t{kThreads} * kIterations);
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_TRUE(mu.waited_ns() > 0);
}

// Await releases the mutex while it waits and holds it again on return.
TEST(TheEngineMutexIsReleasedWhileAThreadAwaits) {
  Mutex mu;
  std::condition_variable_any cv;
  bool ready = false;
  bool seen = false;
  std::thread waiter([&] {
    MutexLock lock(mu);
    mu.Await(cv, [&]() LMS_EXCLUSIVE_LOCKS_REQUIRED(mu) { return ready; });
    seen = ready;
  });
  {
    MutexLock lock(mu);  // taken while the waiter waits (or before it starts)
    ready = true;
    cv.notify_all();
  }
  waiter.join();
  MutexLock lock(mu);
  EXPECT_TRUE(seen);
}

TEST(ConcurrentUseUnderPressureLosesNoByte) {
  // (defrag, policy): the learned policy runs with a prefetching thread, as
  // the TensorFlow adapter runs it (tf_adapter/prefetcher.h).
  int64_t abandoned = 0;  // over every configuration
  bool copies_unlocked = false;
  for (auto [defrag, policy] : {std::pair{false, PolicyKind::kLru},
                                std::pair{true, PolicyKind::kLru},
                                std::pair{true, PolicyKind::kLearned}}) {
    std::unique_ptr<Backend> backend = lms_test::MakeTestBackend(kGranule);
    auto* cuda = dynamic_cast<CudaBackend*>(backend.get());
    EngineOptions o;
    o.device_bytes = 48 * kGranule;  // threads hold far more than this
    o.host_bytes = 1024 * kGranule;
    o.defrag_enabled = defrag;
    o.policy = policy;
    std::unique_ptr<Engine> engine;
    ASSERT_TRUE(Engine::Create(o, std::move(backend), &engine).ok());
    std::atomic<int> corrupt{0}, unexpected{0};
    std::vector<std::thread> threads;
    const int kThreads = 6;
    {
      BusyStreams streams(cuda);
      for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back(Worker, engine.get(), t, kWorkerSteps, &corrupt, &unexpected);
      }
      std::atomic<bool> done{false};
      std::thread prefetcher([&] {
        while (policy == PolicyKind::kLearned && !done.load()) {
          uint64_t units = 0;
          if (!engine->Prefetch(8, &units).ok()) ++unexpected;
          std::this_thread::yield();
        }
      });
      for (std::thread& t : threads) t.join();
      done.store(true);
      prefetcher.join();
      EXPECT_TRUE(streams.ok());
    }
    const Statistics s = engine->GetStatistics();
    if (cuda != nullptr) {
      EXPECT_TRUE(s.num_fences > 0 && s.num_host_waits > 0);
      EXPECT_EQ(s.num_evictions_abandoned, 0);  // its copies run under the lock
    } else {
      EXPECT_TRUE(s.num_fences == 0 && s.num_host_waits == 0);
      copies_unlocked = true;
      abandoned += s.num_evictions_abandoned;
    }
    EXPECT_EQ(corrupt.load(), 0);
    EXPECT_EQ(unexpected.load(), 0);
    EXPECT_EQ(s.bytes_in_use, 0);
    EXPECT_EQ(s.bytes_active, 0);
    EXPECT_EQ(s.bytes_inactive, 0);
    EXPECT_EQ(s.host_bytes_in_use, 0);
    EXPECT_TRUE(s.num_evictions > 0);
    EXPECT_TRUE(s.num_page_ins > 0);
    // Six threads evicting under one lock: some waited for another's turn.
    EXPECT_TRUE(s.time_lock_waiting_ns > 0);
    EXPECT_EQ(engine->small_pages(), 0u);  // every page went back
    EXPECT_TRUE(engine->CheckInvariants().ok());
    std::printf("  defrag=%d policy=%s evictions=%lld abandoned=%lld born_evicted=%lld "
                "page_ins=%lld defrags=%lld fences=%lld host_waits=%lld prefetches=%lld "
                "lock_waiting_ms=%.1f\n",
                defrag, PolicyName(policy), static_cast<long long>(s.num_evictions),
                static_cast<long long>(s.num_evictions_abandoned),
                static_cast<long long>(s.num_born_evicted),
                static_cast<long long>(s.num_page_ins),
                static_cast<long long>(s.num_defragmentations),
                static_cast<long long>(s.num_fences), static_cast<long long>(s.num_host_waits),
                static_cast<long long>(s.num_prefetches), s.time_lock_waiting_ns / 1e6);
  }
  // Copies ran without the lock, and pins reached some of their victims:
  // 12-87 of 1,800-3,000 evictions a configuration alone, plain and under
  // ASan (15-36 of 1,500 under TSan's shorter run); with the machine's cores
  // busy with other work (CI runs two checks at once), 0-10 a configuration
  // and at least 4 over the three. So the race is required over all three:
  // the gated tests below show each abandonment step by step.
  if (copies_unlocked) EXPECT_TRUE(abandoned > 0);
}

// Note [Copies outside the lock], step by step over a gated POSIX backend:
// each test holds an eviction's or a page-in's copy in flight and acts beside
// it. `done` tells whether `action`, run on its own thread, finished within
// the time given while the copy was held.
bool FinishesWhileCopyIsHeld(const std::function<void()>& action, std::thread* runner,
                             std::chrono::milliseconds within = std::chrono::seconds(10)) {
  auto finished = std::make_shared<std::atomic<bool>>(false);
  *runner = std::thread([action, finished] {
    action();
    finished->store(true);
  });
  const auto deadline = std::chrono::steady_clock::now() + within;
  while (!finished->load() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return finished->load();
}

// Four granules each: a, then b, filled and unpinned, on a device of eight.
struct TwoInactive {
  void* a;
  void* b;
};

TwoInactive FillTwo(Engine& e) {
  const size_t size = 4 * kGranule;
  void* a = e.Allocate(size, /*pin=*/false, nullptr);
  void* b = e.Allocate(size, /*pin=*/false, nullptr);
  if (a == nullptr || b == nullptr) std::abort();
  FillAllocation(e, a, size, 1);
  FillAllocation(e, b, size, 2);
  return {a, b};
}

// Two inactive tensors, a and b, on a full device of eight granules; a
// kernel's allocation c of four evicts a (the least recently used), whose
// copy the constructor leaves held at the gate. Finish() lets it through.
class HeldEviction {
 public:
  static constexpr size_t kSize = 4;  // granules
  HeldEviction() : e(lms_test::MakeGatedEngine(8, 16, kGranule, &gate)), t(FillTwo(*e)) {
    allocator_ = std::thread([this] { c = e->Allocate(kSize * kGranule, /*pin=*/true, nullptr); });
    held = gate->AwaitCopy();
  }
  ~HeldEviction() { Finish(); }
  void Finish() {
    gate->Open();
    if (allocator_.joinable()) allocator_.join();
  }

  lms_test::GatedBackend* gate = nullptr;
  std::unique_ptr<Engine> e;
  const TwoInactive t;
  bool held = false;
  void* c = nullptr;

 private:
  std::thread allocator_;
};

TEST(APinDuringAnEvictionsUnlockedCopyKeepsItsWrites) {
  HeldEviction h;
  ASSERT_TRUE(h.held);
  const size_t size = HeldEviction::kSize * kGranule;
  // Meanwhile a kernel pins a and writes it: the lock is free, and the
  // eviction, whose copy read a's old bytes, is abandoned. (A request that
  // finds no room first hears what is being evicted.)
  std::thread kernel;
  EXPECT_TRUE(FinishesWhileCopyIsHeld(
      [&] {
        Status refused;
        EXPECT_TRUE(h.e->Allocate(size, Hold::kPin, &refused, nullptr, 256,
                                  /*optional=*/true) == nullptr);
        EXPECT_TRUE(refused.message().find(FormatBytes(size) +
                                           " being evicted by other threads") !=
                    std::string::npos);
        uint64_t id = 0;
        EXPECT_OK(h.e->Pin(h.t.a, &id));
        FillAllocation(*h.e, h.t.a, size, 3);
        EXPECT_OK(h.e->Unpin(h.t.a, id));
      },
      &kernel));
  h.Finish();
  kernel.join();
  ASSERT_TRUE(h.c != nullptr);
  // The reclaim planned again and took b instead.
  EXPECT_EQ(VerifyAllocation(*h.e, h.t.a, size, 3), -1);
  EXPECT_EQ(VerifyAllocation(*h.e, h.t.b, size, 2), -1);
  AllocationInfo ia, ib;
  EXPECT_OK(h.e->Inspect(h.t.a, &ia));
  EXPECT_OK(h.e->Inspect(h.t.b, &ib));
  EXPECT_TRUE(!ia.evicted && ib.evicted);
  const Statistics s = h.e->GetStatistics();
  EXPECT_EQ(s.num_evictions_abandoned, 1);
  EXPECT_EQ(s.num_evictions, 1);
  EXPECT_EQ(s.host_bytes_in_use, static_cast<int64_t>(size));
  // b's copy counts as evicted; a's dropped one only among the copies made.
  EXPECT_EQ(s.bytes_copied_out, static_cast<int64_t>(size));
  EXPECT_EQ(s.bytes_copied, static_cast<int64_t>(2 * size));
  EXPECT_OK(h.e->CheckInvariants());
}

TEST(AFreeOfAUnitBeingEvictedWaitsForItsCopy) {
  HeldEviction h;
  ASSERT_TRUE(h.held);
  // Freed now, a's device granules could back another tensor written while
  // the copy still reads them: the free waits.
  std::thread user;
  EXPECT_TRUE(!FinishesWhileCopyIsHeld([&] { EXPECT_OK(h.e->Free(h.t.a)); }, &user,
                                       std::chrono::milliseconds(200)));
  h.Finish();
  user.join();
  ASSERT_TRUE(h.c != nullptr);
  EXPECT_EQ(VerifyAllocation(*h.e, h.t.b, HeldEviction::kSize * kGranule, 2), -1);
  const Statistics s = h.e->GetStatistics();
  EXPECT_EQ(s.num_evictions, 1);
  EXPECT_EQ(s.num_evictions_abandoned, 0);
  EXPECT_EQ(s.host_bytes_in_use, 0);  // a was evicted, then freed
  // The free waited from its call until the copy was let go, 200 ms later.
  EXPECT_TRUE(s.time_move_waiting_ns >= 100'000'000);
  EXPECT_OK(h.e->CheckInvariants());
}

TEST(APinOfAUnitPagingInWaitsForItsCopyWhileOthersAllocate) {
  lms_test::GatedBackend* gate = nullptr;
  // One granule to spare: a small-object page's, evicting nothing.
  std::unique_ptr<Engine> e = lms_test::MakeGatedEngine(9, 16, kGranule, &gate);
  const size_t size = 4 * kGranule;
  const TwoInactive t = FillTwo(*e);
  gate->Open();
  EXPECT_OK(e->Evict(t.a));  // under the lock: the tool's eviction
  gate->Close();
  uint64_t first_id = 0;
  std::thread pager([&] { EXPECT_OK(e->Pin(t.a, &first_id)); });
  ASSERT_TRUE(gate->AwaitCopy());
  // The lock is free: another kernel allocates in the free device memory...
  std::thread other;
  EXPECT_TRUE(FinishesWhileCopyIsHeld(
      [&] {
        void* small = e->Allocate(1000, /*pin=*/false, nullptr);
        EXPECT_TRUE(small != nullptr);
        EXPECT_OK(e->Free(small));
      },
      &other));
  other.join();
  // ... but a second pin of a waits for the bytes.
  uint64_t second_id = 0;
  std::thread second;
  EXPECT_TRUE(!FinishesWhileCopyIsHeld([&] { EXPECT_OK(e->Pin(t.a, &second_id)); }, &second,
                                       std::chrono::milliseconds(200)));
  gate->Open();
  pager.join();
  second.join();
  EXPECT_EQ(VerifyAllocation(*e, t.a, size, 1), -1);
  AllocationInfo ia;
  EXPECT_OK(e->Inspect(t.a, &ia));
  EXPECT_TRUE(!ia.evicted);
  EXPECT_EQ(ia.pin_count, 2u);
  EXPECT_EQ(e->GetStatistics().num_page_ins, 1);
  EXPECT_OK(e->Unpin(t.a, first_id));
  EXPECT_OK(e->Unpin(t.a, second_id));
  EXPECT_OK(e->CheckInvariants());
}

// A kernel's two evicted inputs do not fit the device together (a pinned
// tensor holds the rest), so PinAll pages them in one by one. While the
// first one's copy runs without the lock, the pinned tensor is freed and
// another kernel pins the second input, paging it in beside: PinAll waits
// for that page-in and skips the input, instead of paging it in again.
TEST(PinAllsOneByOneFallbackSkipsAnInputAnotherPinPagesIn) {
  lms_test::GatedBackend* gate = nullptr;
  std::unique_ptr<Engine> e = lms_test::MakeGatedEngine(6, 16, kGranule, &gate);
  const size_t size = 3 * kGranule;
  void* inputs[2];
  for (int i = 0; i < 2; ++i) {
    inputs[i] = e->Allocate(size, /*pin=*/false, nullptr);
    ASSERT_TRUE(inputs[i] != nullptr);
    FillAllocation(*e, inputs[i], size, 30 + i);
  }
  gate->Open();
  for (void* input : inputs) EXPECT_OK(e->Evict(input));  // under the lock: the tool's
  gate->Close();
  uint64_t held_id = 0;  // a kernel's output, pinned: 4 of 6 granules left
  void* held = e->Allocate(2 * kGranule, /*pin=*/true, nullptr, &held_id);
  ASSERT_TRUE(held != nullptr);
  uint64_t kernel_ids[2] = {0, 0};
  std::thread kernel([&] {
    const void* ptrs[] = {inputs[0], inputs[1]};
    EXPECT_OK(e->PinAll(ptrs, 2, kernel_ids));
  });
  ASSERT_TRUE(gate->AwaitCopy());  // the first input's copy, alone
  // The lock is free: that kernel ends, its output is freed, room for the
  // second input.
  EXPECT_OK(e->Unpin(held, held_id));
  EXPECT_OK(e->Free(held));
  uint64_t other_id = 0;
  std::thread other([&] { EXPECT_OK(e->Pin(inputs[1], &other_id)); });
  ASSERT_TRUE(gate->AwaitCopy(2));  // both page-ins copy at once
  gate->Open();
  kernel.join();
  other.join();
  EXPECT_EQ(e->GetStatistics().num_page_ins, 2);  // each input once
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(VerifyAllocation(*e, inputs[i], size, 30 + i), -1);
    AllocationInfo info;
    EXPECT_OK(e->Inspect(inputs[i], &info));
    EXPECT_TRUE(!info.evicted);
    EXPECT_EQ(info.pin_count, i == 0 ? 1u : 2u);
    EXPECT_OK(e->Unpin(inputs[i], kernel_ids[i]));
  }
  EXPECT_OK(e->Unpin(inputs[1], other_id));
  EXPECT_OK(e->CheckInvariants());
  for (void* input : inputs) EXPECT_OK(e->Free(input));
}

TEST(AReclaimShortOfInactiveMemoryWaitsForAnEvictionInFlight) {
  lms_test::GatedBackend* gate = nullptr;
  std::unique_ptr<Engine> e = lms_test::MakeGatedEngine(8, 16, kGranule, &gate);
  // a (four granules), then b and d (two each), all inactive.
  void* a = e->Allocate(4 * kGranule, /*pin=*/false, nullptr);
  void* b = e->Allocate(2 * kGranule, /*pin=*/false, nullptr);
  void* d = e->Allocate(2 * kGranule, /*pin=*/false, nullptr);
  ASSERT_TRUE(a && b && d);
  FillAllocation(*e, a, 4 * kGranule, 1);
  FillAllocation(*e, b, 2 * kGranule, 2);
  FillAllocation(*e, d, 2 * kGranule, 3);
  // Two granules for one kernel: a, least recently used, is evicted, held.
  std::thread first([&] { EXPECT_TRUE(e->Allocate(2 * kGranule, /*pin=*/true, nullptr)); });
  ASSERT_TRUE(gate->AwaitCopy());
  // Six for another: only b and d (four) are inactive while a moves. It
  // waits for a's eviction to end, then takes a's other two granules and
  // evicts b and d, instead of failing.
  void* big = nullptr;
  std::thread second;
  EXPECT_TRUE(!FinishesWhileCopyIsHeld(
      [&] { big = e->Allocate(6 * kGranule, /*pin=*/true, nullptr); }, &second,
      std::chrono::milliseconds(200)));
  gate->Open();
  second.join();
  first.join();
  EXPECT_TRUE(big != nullptr);
  EXPECT_EQ(e->GetStatistics().num_evictions, 3);
  EXPECT_EQ(VerifyAllocation(*e, a, 4 * kGranule, 1), -1);
  EXPECT_EQ(VerifyAllocation(*e, b, 2 * kGranule, 2), -1);
  EXPECT_EQ(VerifyAllocation(*e, d, 2 * kGranule, 3), -1);
  EXPECT_OK(e->CheckInvariants());
}

TEST(ForkWaitsForACopyOutsideTheLock) {
  HeldEviction h;
  ASSERT_TRUE(h.held);
  // A child forked now would hold half a copy: fork's handler waits.
  std::thread forker;
  EXPECT_TRUE(!FinishesWhileCopyIsHeld(
      [&] {
        h.e->PrepareFork();
        h.e->AfterForkInParent();
      },
      &forker, std::chrono::milliseconds(200)));
  h.Finish();
  forker.join();
  EXPECT_TRUE(h.c != nullptr);
  EXPECT_EQ(h.e->GetStatistics().num_evictions, 1);
  EXPECT_EQ(VerifyAllocation(*h.e, h.t.a, HeldEviction::kSize * kGranule, 1), -1);
  EXPECT_OK(h.e->CheckInvariants());
}

// A writer outside any kernel (a tf.data thread filling a batch; on a GPU, a
// kernel that TensorFlow's event-thread callback launches into the output
// it just allocated, as Where and the segment reductions do) writes its
// allocation unpinned, a piece at a time, while other threads make pressure
// (allocate, unpin) and one tries to evict whatever is being written.
struct Writing {
  std::atomic<void*> ptr{nullptr};
  std::atomic<uint64_t> generation{0};  // odd while ptr is being written
};

void SlowWriter(Engine* engine, int thread, int buffers, Writing* writing,
                std::atomic<int>* corrupt, std::atomic<int>* unexpected) {
  std::mt19937_64 rng(2000 + thread);
  for (int b = 0; b < buffers; ++b) {
    const size_t bytes = rng() % 2 == 0 ? 2 * kGranule + rng() % kGranule : 1 + rng() % 30000;
    Status s;
    uint64_t id = 0;
    auto* p = static_cast<unsigned char*>(engine->Allocate(bytes, Hold::kWriter, &s, &id));
    if (p == nullptr) {
      if (s.code() != StatusCode::kResourceExhausted) ++*unexpected;
      continue;
    }
    writing->ptr.store(p);
    ++writing->generation;
    const uint64_t seed = rng();
    if (engine->backend().HostCanTouch()) {
      const size_t words = (bytes + 7) / 8;
      for (size_t w = 0; w < words; ++w) {
        const uint64_t value = PatternWord(seed, w);
        std::memcpy(p + 8 * w, &value, std::min<size_t>(8, bytes - 8 * w));
        if (w % 1024 == 0) std::this_thread::yield();
      }
    } else {
      // On a GPU the writer is device work queued after the allocation (a
      // kernel an event-thread callback launches into the output it just
      // allocated): here, copies into the allocation, 8 KiB at a time.
      std::vector<unsigned char> pattern(bytes);
      FillPattern(pattern.data(), bytes, seed);
      for (size_t at = 0; at < bytes; at += 8192) {
        if (!engine->CopyFromHost(p + at, pattern.data() + at, std::min<size_t>(8192, bytes - at))
                 .ok()) {
          ++*unexpected;
        }
        std::this_thread::yield();
      }
    }
    ++writing->generation;
    // Handed over: its first kernel pins it (and claims it), reads it.
    if (!engine->Pin(p, &id).ok()) {
      ++*unexpected;
    } else {
      if (VerifyAllocation(*engine, p, bytes, seed) != -1) ++*corrupt;
      if (!engine->Unpin(p, id).ok()) ++*unexpected;
    }
    if (!engine->Free(p).ok()) ++*unexpected;
  }
}

TEST(WritersOutsideKernelsLoseNoWrite) {
#if defined(__SANITIZE_THREAD__)
  if (lms_test::UsingFakeCuda()) {
    // Once in CI, TSan failed to map shadow memory for the fake driver's
    // mappings under this test's remaps ("failed to allocate 0x1fe068c0ff000
    // bytes", errno 12), a limit of TSan's address layout, not a race. TSan
    // runs it over POSIX; the ASan build and a real GPU run it over CUDA.
    std::printf("  skipped under TSan over the fake driver: it runs in the ASan build\n");
    return;
  }
#endif
  std::unique_ptr<Backend> backend = lms_test::MakeTestBackend(kGranule);
  EngineOptions o;
  o.device_bytes = 24 * kGranule;
  o.host_bytes = 1024 * kGranule;
  o.policy = PolicyKind::kLru;  // as written before the defaults agreed
  std::unique_ptr<Engine> engine;
  ASSERT_TRUE(Engine::Create(o, std::move(backend), &engine).ok());
  constexpr int kWriters = 3;
  std::atomic<int> corrupt{0}, unexpected{0}, refused{0};
  Writing writing[kWriters];
  std::atomic<int> writers_left{kWriters};
  std::vector<std::thread> threads;
  for (int t = 0; t < kWriters; ++t) {
    threads.emplace_back([&, t] {
      SlowWriter(engine.get(), t, 60, &writing[t], &corrupt, &unexpected);
      --writers_left;
    });
  }
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back(Worker, engine.get(), t, 800, &corrupt, &unexpected);
  }
  // Nothing may evict memory its writer is still writing (Note [Writers
  // outside kernels]); a reclaim never picks it either (the Workers'
  // pressure), which the final check of every byte shows.
  threads.emplace_back([&] {
    while (writers_left.load() > 0) {
      for (Writing& w : writing) {
        const uint64_t generation = w.generation.load();
        void* p = w.ptr.load();
        if (generation % 2 == 0 || p == nullptr) continue;
        Status e = engine->Evict(p);
        if (e.code() == StatusCode::kFailedPrecondition) {
          ++refused;
        } else if (w.generation.load() == generation) {
          ++unexpected;  // evicted (or not found) while its writer was writing it
        }
      }
      std::this_thread::yield();
    }
  });
  for (std::thread& t : threads) t.join();
  const Statistics s = engine->GetStatistics();
  EXPECT_EQ(corrupt.load(), 0);
  EXPECT_EQ(unexpected.load(), 0);
  EXPECT_TRUE(refused.load() > 0);
  EXPECT_TRUE(s.num_evictions > 0);
  EXPECT_EQ(s.bytes_in_use, 0);
  EXPECT_EQ(s.bytes_unclaimed, 0);
  EXPECT_TRUE(engine->CheckInvariants().ok());
  std::printf("  evictions=%lld born_evicted=%lld refused evictions of unclaimed=%d\n",
              static_cast<long long>(s.num_evictions),
              static_cast<long long>(s.num_born_evicted), refused.load());
}

// Strict mode (POSIX only): threads touching one evicted granule at the same
// moment, and touching it while another thread pages it in. Before, the
// first touch's handler unwatched the granule before opening it, so a second
// thread faulting meanwhile found it unwatched and the process died with
// SIGSEGV (a tf.data pipeline read by a multi-threaded kernel, issue 18).
TEST(StrictModeServesConcurrentTouchesAndPageIns) {
#if defined(__SANITIZE_THREAD__)
  // TSan records a remap (mmap) as a write to the range and does not carry
  // the handler's acquire back to the faulting thread: the waits here would
  // read as races. ASan and the plain build run it.
  std::printf("  skipped under TSan: it runs in the ASan build\n");
  return;
#endif
  std::unique_ptr<Backend> backend = lms_test::MakeTestBackend(kGranule);
  if (!backend->HostCanTouch()) {
    std::printf("  skipped on this backend: strict mode is for the emulated device\n");
    return;
  }
  EngineOptions o;
  o.device_bytes = 8 * kGranule;
  o.host_bytes = 64 * kGranule;
  o.strict = true;
  o.policy = PolicyKind::kLru;  // as written before the defaults agreed
  std::unique_ptr<Engine> engine;
  ASSERT_TRUE(Engine::Create(o, std::move(backend), &engine).ok());
  constexpr int kReaders = 4;
  constexpr int kRounds = 200;
  const size_t bytes = 2 * kGranule;
  std::atomic<int> corrupt{0}, unexpected{0};
  for (int round = 0; round < kRounds; ++round) {
    Status s;
    void* p = engine->Allocate(bytes, Hold::kNone, &s);
    ASSERT_TRUE(p != nullptr);
    FillPattern(p, bytes, round);
    ASSERT_TRUE(engine->Evict(p).ok());
    engine->ClearUnpinnedTouches();
    std::atomic<int> ready{0};
    std::vector<std::thread> readers;
    for (int t = 0; t < kReaders; ++t) {
      readers.emplace_back([&] {
        ++ready;
        while (ready.load() < kReaders + 1) {
        }
        if (VerifyPattern(p, bytes, round) != -1) ++corrupt;
      });
    }
    ++ready;
    while (ready.load() < kReaders + 1) {
    }
    // Every other round, the main thread pages it in under the readers.
    uint64_t id = 0;
    const bool page_in = round % 2 == 1;
    if (page_in && !engine->Pin(p, &id).ok()) ++unexpected;
    for (std::thread& t : readers) t.join();
    if (page_in && !engine->Unpin(p, id).ok()) ++unexpected;
    // At most one report per granule each thread faulted on before the
    // first touch opened it.
    if (engine->UnpinnedTouches().size() > 2 * kReaders) ++unexpected;
    if (VerifyPattern(p, bytes, round) != -1) ++corrupt;
    ASSERT_TRUE(engine->Free(p).ok());
  }
  EXPECT_EQ(corrupt.load(), 0);
  EXPECT_EQ(unexpected.load(), 0);
  EXPECT_TRUE(engine->CheckInvariants().ok());
}

}  // namespace
}  // namespace lms

int main(int argc, char** argv) { return lms_test::RunAll(argc, argv); }
