#include "backends/unmap_thread.h"

#include <algorithm>
#include <new>
#include <utility>

#include "engine/scoped_nanos.h"

namespace lms {

UnmapThread::UnmapThread(UnmapFn unmap) : unmap_(std::move(unmap)) {
  MutexLock lock(mu_);
  thread_ = new std::thread([this] { Run(); });
}

UnmapThread::~UnmapThread() {
  std::thread* thread = nullptr;
  {
    MutexLock lock(mu_);
    stop_ = true;
    released_through_ = next_ticket_ - 1;
    paused_ = false;
    queued_cv_.notify_all();
    if (!threadless_) thread = thread_;
  }
  if (thread != nullptr) {
    thread->join();  // it makes what is queued first
    delete thread;
  }
}

uint64_t UnmapThread::Push(uintptr_t address, size_t bytes) {
  Request request{0, address, bytes};
  {
    MutexLock lock(mu_);
    request.ticket = next_ticket_++;
    if (!threadless_) {
      queue_.push_back(request);  // the thread is woken by a release
      return request.ticket;
    }
  }
  Make(request);
  return request.ticket;
}

void UnmapThread::Release() {
  MutexLock lock(mu_);
  if (released_through_ + 1 == next_ticket_ && !paused_) return;
  released_through_ = next_ticket_ - 1;
  paused_ = false;
  queued_cv_.notify_one();
}

void UnmapThread::Pause() {
  MutexLock lock(mu_);
  paused_ = true;
}

size_t UnmapThread::held() {
  MutexLock lock(mu_);
  return next_ticket_ - 1 - std::max(released_through_, done_through_);
}

void UnmapThread::WaitFor(uint64_t ticket) {
  MutexLock lock(mu_);
  if (ticket > released_through_ || (paused_ && ticket > waited_through_)) {
    released_through_ = std::max(released_through_, ticket);
    waited_through_ = std::max(waited_through_, ticket);
    queued_cv_.notify_one();
  }
  mu_.Await(done_cv_, [&]() LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_through_ >= ticket; });
}

bool UnmapThread::IsDone(uint64_t ticket) {
  MutexLock lock(mu_);
  return done_through_ >= ticket;
}

std::vector<UnmapThread::Done> UnmapThread::TakeDone() {
  std::vector<Done> done;
  MutexLock lock(mu_);
  done.swap(done_);
  return done;
}

void UnmapThread::Run() {
  for (;;) {
    Request request;
    {
      MutexLock lock(mu_);
      mu_.Await(queued_cv_, [&]() LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (queue_.empty()) return stop_;
        const uint64_t ticket = queue_.front().ticket;
        return ticket <= released_through_ && (!paused_ || ticket <= waited_through_);
      });
      if (queue_.empty()) return;  // stopping, nothing left
      request = queue_.front();
      queue_.pop_front();
    }
    Make(request);
  }
}

void UnmapThread::Make(const Request& request) {
  Status status;
  {
    int64_t ns = 0;
    {
      ScopedNanos timed(&ns);
      status = unmap_(request.address, request.bytes);
    }
    busy_ns_.fetch_add(ns, std::memory_order_relaxed);
  }
  MutexLock lock(mu_);
  done_.push_back({request.ticket, std::move(status)});
  // Tickets are made in order (one thread, or the one thread of a child).
  done_through_ = request.ticket;
  // Under the lock, so that PrepareFork, which takes it, never forks while
  // this thread is inside the condition variable.
  done_cv_.notify_all();
}

void UnmapThread::PrepareFork() {
  mu_.Lock();
  released_through_ = next_ticket_ - 1;
  paused_ = false;
  queued_cv_.notify_one();
  mu_.Await(done_cv_, [&]() LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.empty() && done_through_ + 1 == next_ticket_;
  });
}

void UnmapThread::AfterForkInParent() { mu_.Unlock(); }

void UnmapThread::AfterForkInChild() {
  // The thread does not exist here: never joined, its object left behind.
  // Nobody waits on the condition variables in this one-thread process, but
  // the thread may have been inside one at the fork: fresh ones.
  threadless_ = true;
  thread_ = nullptr;
  new (&queued_cv_) std::condition_variable_any();
  new (&done_cv_) std::condition_variable_any();
  mu_.Unlock();
}

}  // namespace lms
