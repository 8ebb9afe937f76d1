// Strict mode (engine/strict_monitor.h): unpinned touches of evicted memory
// reported, and the fault handler on a stack of its own.
#include <thread>
#include <vector>

#include "engine/strict_monitor.h"
#include "engine_test_util.h"

namespace lms::engine_test {
namespace {

TEST(StrictModeReportsUnpinnedTouchesOfEvictedMemory) {
  Setup setup;
  setup.strict = true;
  if (lms_test::UsingCuda()) {
    // A no-access mapping would kill a CUDA context: strict mode is refused.
    EngineOptions o;
    o.device_bytes = 4 * kGranule;
    o.strict = true;
    std::unique_ptr<Engine> refused;
    Status s = Engine::Create(o, lms_test::MakeTestBackend(kGranule), &refused);
    EXPECT_TRUE(s.code() == StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(s.message(), "TF_LMS_STRICT"));
    EXPECT_TRUE(Contains(s.message(), "emulated device"));
    return;
  }
  auto e = MakeEngine(setup);
  const size_t size = 2 * kGranule;
  char* a = static_cast<char*>(MustAllocate(*e, size));
  ASSERT_TRUE(a != nullptr);
  Fill(*e, a, size, 4);
  EXPECT_OK(e->Evict(a));
  StrictMonitor::SetThreadLabel("MatMul/test");
  volatile char touched = a[kGranule + 7];  // unpinned: faults, is reported
  (void)touched;
  StrictMonitor::SetThreadLabel(nullptr);
  std::vector<UnpinnedTouch> report = e->UnpinnedTouches();
  ASSERT_TRUE(report.size() == 1);
  EXPECT_EQ(report[0].address, reinterpret_cast<uintptr_t>(a + kGranule + 7));
  EXPECT_EQ(report[0].allocation_id, e->AllocationId(a));
  EXPECT_EQ(report[0].allocation_bytes, size);
  EXPECT_TRUE(report[0].label == "MatMul/test");
  uint64_t id;
  EXPECT_OK(e->Pin(a, &id));  // a pinned touch is not reported
  EXPECT_EQ(Verify(*e, a, size, 4), -1);
  EXPECT_EQ(e->UnpinnedTouches().size(), 1u);
}

#if defined(__x86_64__)
// Writes a marker into the 1,024 words below the x86-64 red zone (code that
// keeps data below its stack pointer, as oneDNN's JIT gemm kernels do),
// reads *touch, and returns how many of those words still hold the marker.
int WordsKeptBelowStackAcross(const volatile char* touch) {
  const uint64_t marker = 0x5a17ab1e5eedf00dull;
  int64_t kept;
  asm volatile(
      "lea -136(%%rsp), %%rdi\n\t"
      "mov $1024, %%rcx\n\t"
      "1:\n\t"
      "mov %[marker], (%%rdi)\n\t"
      "sub $8, %%rdi\n\t"
      "dec %%rcx\n\t"
      "jnz 1b\n\t"
      "movzbl (%[touch]), %%eax\n\t"
      "lea -136(%%rsp), %%rdi\n\t"
      "mov $1024, %%rcx\n\t"
      "xor %[kept], %[kept]\n\t"
      "2:\n\t"
      "cmp %[marker], (%%rdi)\n\t"
      "jne 3f\n\t"
      "inc %[kept]\n\t"
      "3:\n\t"
      "sub $8, %%rdi\n\t"
      "dec %%rcx\n\t"
      "jnz 2b\n\t"
      : [kept] "=&r"(kept)
      : [marker] "r"(marker), [touch] "r"(touch)
      : "rax", "rcx", "rdi", "memory", "cc");
  return static_cast<int>(kept);
}
#endif

// Note [Strict mode's own signal stack]: the fault handler of an unpinned
// touch runs on a stack of strict mode's own, never below the touching
// code's stack pointer, on a thread that has used the engine.
TEST(StrictModesFaultHandlerLeavesTheTouchingThreadsStackAlone) {
#if defined(__x86_64__)
  if (lms_test::UsingCuda()) return;  // strict mode is the emulated device's
  Setup setup;
  setup.strict = true;
  auto e = MakeEngine(setup);
  char* a = static_cast<char*>(MustAllocate(*e, kGranule));
  void* b = MustAllocate(*e, kGranule);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  EXPECT_OK(e->Evict(a));
  int kept = -1;
  std::thread kernel([&] {  // a new thread, as TensorFlow's are: no signal stack
    uint64_t id;
    EXPECT_OK(e->Pin(b, &id));
    kept = WordsKeptBelowStackAcross(a + 5);  // unpinned: faults, is reported
    EXPECT_OK(e->Unpin(b, id));
  });
  kernel.join();
  EXPECT_EQ(kept, 1024);
  EXPECT_EQ(e->UnpinnedTouches().size(), 1u);
#endif
}

}  // namespace
}  // namespace lms::engine_test
