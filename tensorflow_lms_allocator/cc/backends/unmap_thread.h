// UnmapThread: the CUDA backend's unmaps, made on a thread of their own.
//
// Note [Unmaps on a thread of their own]. cuMemUnmap is synchronous and
// costs the host about 24 us a device handle and 40 a host one on an H200
// (docs/design.md, "Measured on real GPUs"); the engine calls the backend
// under its lock, on the thread that launches the kernels. Once no queued
// work can use a mapping (Note [Retired mappings] in cuda_backend.h), nothing
// needs it gone soon: its slots are free in the engine's view, its granules
// back in their pool (a handle may be mapped at several addresses), and only
// a later cuMemMap at one of its slots needs it gone (cuMemMap refuses a
// mapped range). So the backend hands such unmaps to this thread and goes
// on; a map at a slot still being unmapped waits for that request (WaitFor),
// and so for every earlier one still to be made, since the thread makes them
// in order. On the GPU timing model this took the unmaps' 6.5 ms out of
// DenseNet121's 86 ms step at 1/2 of its peak
// (docs/decisions/0024-unmaps-off-the-launching-thread.md).
//
// Requests wait until released (Release, or a WaitFor of one of them): the
// driver takes one VMM call at a time, so an unmap made while the launching
// thread maps would only make that map wait. The backend releases them once
// its own maps are made (at the end of a Map: the new unit's, or a page-in's),
// so that the unmaps run while the launching thread launches kernels, and
// pauses the thread whenever it makes VMM calls of its own again (a map,
// memory made or released: Pause), which then wait for one unmap at most,
// the one under way. On the GPU timing model, unmaps made as
// soon as they were handed over gave back 1-2 ms of the 6.5 ms they took
// from DenseNet121's step at 1/2 of its peak, the rest spent waiting for the
// driver (decision 0025).
//
// The thread makes the calls in the order they were pushed, one at a time.
// Each request has a ticket
// (1, 2, ...); TakeDone hands the owner the finished ones with their status,
// so the owner's own tables change only on its own thread and need no lock
// of this class's. A failed unmap leaves the mapping in place: the owner
// learns it from TakeDone and may try again.
//
// Fork. The child has no thread: PrepareFork waits until every request is
// done and holds the lock across fork(); in the child the thread is
// forgotten (never joined: it does not exist there) and every later request
// is made on the calling thread, in Push. A CUDA context is unusable in a
// forked child anyway; the child must only not hang.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_UNMAP_THREAD_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_UNMAP_THREAD_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "engine/mutex.h"
#include "engine/status.h"
#include "engine/thread_annotations.h"

namespace lms {

class UnmapThread {
 public:
  // Makes one unmap of `bytes` at `address`; called on the thread.
  using UnmapFn = std::function<Status(uintptr_t address, size_t bytes)>;
  struct Done {
    uint64_t ticket = 0;
    Status status;
  };

  // Starts the thread.
  explicit UnmapThread(UnmapFn unmap);
  // Makes every request still queued, released or not, then joins the
  // thread.
  ~UnmapThread();
  UnmapThread(const UnmapThread&) = delete;
  UnmapThread& operator=(const UnmapThread&) = delete;

  // Queues an unmap, held until released; returns its ticket, one more
  // than the last.
  uint64_t Push(uintptr_t address, size_t bytes) LMS_LOCKS_EXCLUDED(mu_);
  // Lets the thread make every request queued so far, and ends a Pause.
  void Release() LMS_LOCKS_EXCLUDED(mu_);
  // Until Release, the thread starts no request but those waited for
  // (WaitFor): the owner is about to make driver calls of its own, and the
  // driver would make them wait behind the thread's.
  void Pause() LMS_LOCKS_EXCLUDED(mu_);
  // How many requests are queued and not released.
  size_t held() LMS_LOCKS_EXCLUDED(mu_);
  // Releases request `ticket` (and every earlier one) and blocks until it
  // is made.
  void WaitFor(uint64_t ticket) LMS_LOCKS_EXCLUDED(mu_);
  // Whether request `ticket` is made, without waiting.
  bool IsDone(uint64_t ticket) LMS_LOCKS_EXCLUDED(mu_);
  // The requests made since the last call, in ticket order.
  std::vector<Done> TakeDone() LMS_LOCKS_EXCLUDED(mu_);
  // Nanoseconds spent in the unmap calls.
  int64_t busy_ns() const { return busy_ns_.load(std::memory_order_relaxed); }

  // Fork (see the file comment).
  void PrepareFork() LMS_ACQUIRE(mu_);
  void AfterForkInParent() LMS_RELEASE(mu_);
  void AfterForkInChild() LMS_RELEASE(mu_);

 private:
  struct Request {
    uint64_t ticket = 0;
    uintptr_t address = 0;
    size_t bytes = 0;
  };

  void Run() LMS_LOCKS_EXCLUDED(mu_);
  // Makes one request and records it done; called without the lock.
  void Make(const Request& request) LMS_LOCKS_EXCLUDED(mu_);

  const UnmapFn unmap_;
  Mutex mu_;
  std::condition_variable_any queued_cv_;  // released, unpaused, or stop_
  std::condition_variable_any done_cv_;    // done_through_ moved
  std::deque<Request> queue_ LMS_GUARDED_BY(mu_);
  std::vector<Done> done_ LMS_GUARDED_BY(mu_);
  uint64_t next_ticket_ LMS_GUARDED_BY(mu_) = 1;
  uint64_t done_through_ LMS_GUARDED_BY(mu_) = 0;
  // The thread makes requests up to this ticket; while paused_, only up to
  // waited_through_.
  uint64_t released_through_ LMS_GUARDED_BY(mu_) = 0;
  uint64_t waited_through_ LMS_GUARDED_BY(mu_) = 0;
  bool paused_ LMS_GUARDED_BY(mu_) = false;
  bool stop_ LMS_GUARDED_BY(mu_) = false;
  // No thread (a forked child): Push makes the unmap itself.
  bool threadless_ LMS_GUARDED_BY(mu_) = false;
  std::atomic<int64_t> busy_ns_{0};
  // Owned; left behind, never joined, in a forked child.
  std::thread* thread_ LMS_GUARDED_BY(mu_) = nullptr;
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_UNMAP_THREAD_H_
