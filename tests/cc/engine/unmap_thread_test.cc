// UnmapThread (backends/unmap_thread.h): the CUDA backend's unmaps on a
// thread of their own. These tests give it a function that records calls;
// the backend's use of it runs over the fake driver (cuda_backend_test.cc).
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "backends/unmap_thread.h"
#include "harness.h"

namespace lms {
namespace {

// Records each call (address and thread), failing those at `fail_at`;
// blocks every call while `held`.
struct Recorder {
  std::mutex mu;
  std::vector<uintptr_t> addresses;
  std::vector<std::thread::id> threads;
  std::atomic<bool> held{false};
  uintptr_t fail_at = 0;

  UnmapThread::UnmapFn Fn() {
    return [this](uintptr_t address, size_t bytes) {
      (void)bytes;
      while (held.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::lock_guard<std::mutex> lock(mu);
      addresses.push_back(address);
      threads.push_back(std::this_thread::get_id());
      return address == fail_at ? Internal("unmap failed") : Status::Ok();
    };
  }
  size_t calls() {
    std::lock_guard<std::mutex> lock(mu);
    return addresses.size();
  }
};

TEST(RequestsAreMadeInOrderOnAnotherThreadAndReportedWithTheirStatus) {
  Recorder r;
  r.fail_at = 0x3000;
  UnmapThread t(r.Fn());
  const uint64_t a = t.Push(0x1000, 4096);
  const uint64_t b = t.Push(0x2000, 4096);
  const uint64_t c = t.Push(0x3000, 4096);
  t.Release();
  EXPECT_EQ(a, 1u);
  EXPECT_EQ(b, 2u);
  EXPECT_EQ(c, 3u);
  t.WaitFor(c);
  EXPECT_TRUE(t.IsDone(a) && t.IsDone(c));
  EXPECT_TRUE((r.addresses == std::vector<uintptr_t>{0x1000, 0x2000, 0x3000}));
  for (const std::thread::id id : r.threads) EXPECT_TRUE(id != std::this_thread::get_id());
  const std::vector<UnmapThread::Done> done = t.TakeDone();
  EXPECT_EQ(done.size(), 3u);
  for (size_t i = 0; i < done.size(); ++i) EXPECT_EQ(done[i].ticket, i + 1);
  EXPECT_TRUE(done[0].status.ok() && done[1].status.ok());
  EXPECT_TRUE(done[2].status.code() == StatusCode::kInternal);
  EXPECT_TRUE(t.TakeDone().empty());  // each is handed over once
}

TEST(WaitForBlocksUntilTheRequestIsMadeAndNoLonger) {
  Recorder r;
  r.held = true;
  UnmapThread t(r.Fn());
  const uint64_t a = t.Push(0x1000, 4096);
  const uint64_t b = t.Push(0x2000, 4096);
  EXPECT_TRUE(!t.IsDone(a));
  std::atomic<bool> waited{false};
  std::thread waiter([&] {
    t.WaitFor(a);
    waited = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(!waited.load());  // the call is held
  r.held = false;
  waiter.join();
  EXPECT_TRUE(t.IsDone(a));
  t.WaitFor(b);
  EXPECT_EQ(r.calls(), 2u);
}

TEST(RequestsWaitUntilReleasedOrWaitedFor) {
  Recorder r;
  UnmapThread t(r.Fn());
  const uint64_t a = t.Push(0x1000, 4096);
  t.Push(0x2000, 4096);
  EXPECT_EQ(t.held(), 2u);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(r.calls(), 0u);
  t.WaitFor(a);  // releases the first only
  EXPECT_EQ(t.held(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(r.calls(), 1u);
  t.Release();
  t.WaitFor(t.Push(0x3000, 4096));
  EXPECT_EQ(r.calls(), 3u);
  EXPECT_EQ(t.held(), 0u);
}

// Paused, the thread ends the call under way and starts no other but those
// waited for; a release ends the pause.
TEST(APausedThreadStartsOnlyRequestsWaitedFor) {
  Recorder r;
  r.held = true;
  UnmapThread t(r.Fn());
  t.Push(0x1000, 4096);
  const uint64_t b = t.Push(0x2000, 4096);
  const uint64_t c = t.Push(0x3000, 4096);
  t.Release();  // the thread starts the first, and is held in it
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  t.Pause();
  r.held = false;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(r.calls(), 1u);
  t.WaitFor(b);
  EXPECT_EQ(r.calls(), 2u);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(!t.IsDone(c));  // still paused
  t.Release();
  t.WaitFor(c);
  EXPECT_EQ(r.calls(), 3u);
}

TEST(DestructionMakesEveryQueuedRequestFirst) {
  Recorder r;
  r.held = true;
  {
    UnmapThread t(r.Fn());
    for (uintptr_t i = 1; i <= 5; ++i) t.Push(i << 12, 4096);
    r.held = false;
  }
  EXPECT_EQ(r.calls(), 5u);
}

// fork(): the child has no thread; its requests are made by the caller, and
// neither it nor its exit waits for the parent's thread.
TEST(AForkedChildMakesItsRequestsItselfAndTheParentsThreadGoesOn) {
  Recorder r;
  UnmapThread t(r.Fn());
  t.WaitFor(t.Push(0x1000, 4096));
  t.PrepareFork();
  const pid_t pid = fork();
  if (pid == 0) {
    t.AfterForkInChild();
    const uint64_t ticket = t.Push(0x2000, 4096);  // made here, now
    const bool ok = t.IsDone(ticket) && r.calls() == 2 &&
                    r.threads.back() == std::this_thread::get_id();
    t.WaitFor(ticket);
    _exit(ok ? 0 : 1);  // no destructors: the object is the parent's too
  }
  t.AfterForkInParent();
  int status = -1;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  t.WaitFor(t.Push(0x3000, 4096));  // the parent's thread still works
  EXPECT_EQ(r.calls(), 2u);
  EXPECT_TRUE(r.threads.back() != std::this_thread::get_id());
}

}  // namespace
}  // namespace lms
