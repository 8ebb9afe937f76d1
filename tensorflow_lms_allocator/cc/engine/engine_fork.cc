// The engine across fork(): the registry of live engines and the
// pthread_atfork handlers that lock them and carry their memory over.
// See Note [Fork] in engine/fork_handlers.h.
#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <new>
#include <vector>

#include "engine/engine.h"
#include "engine/fork_handlers.h"

namespace lms {
namespace {

struct ForkRegistry {
  Mutex mu;
  // Live engines, in registration order: the handlers lock them in this
  // order and unlock them in the reverse.
  std::vector<Engine*> engines LMS_GUARDED_BY(mu);
};

ForkRegistry& Registry() {
  static ForkRegistry* registry = new ForkRegistry();  // outlives every engine
  return *registry;
}

// The three handlers hold the registry's lock from PrepareHandler to the
// parent's or child's handler, which a per-function analysis cannot follow;
// each says what it assumes instead.

// Runs in the parent before fork(): holds the registry's lock and every
// engine's lock until AfterFork* release them in the parent and the child.
void PrepareHandler() LMS_THREAD_ANNOTATION(no_thread_safety_analysis) {
  ForkRegistry& r = Registry();
  r.mu.Lock();
  for (Engine* engine : r.engines) engine->PrepareFork();
}

// Requires the registry's lock (taken by PrepareHandler).
void ParentHandler() LMS_THREAD_ANNOTATION(no_thread_safety_analysis) {
  ForkRegistry& r = Registry();
  for (auto it = r.engines.rbegin(); it != r.engines.rend(); ++it) {
    (*it)->AfterForkInParent();
  }
  r.mu.Unlock();
}

// Requires the registry's lock (taken by PrepareHandler in the parent).
void ChildHandler() LMS_THREAD_ANNOTATION(no_thread_safety_analysis) {
  ForkRegistry& r = Registry();
  for (auto it = r.engines.rbegin(); it != r.engines.rend(); ++it) {
    (*it)->AfterForkInChild();
  }
  // The forking thread locked it in PrepareHandler and is the child's only
  // thread: unlocking it here is sound (a store; nobody sleeps on it).
  r.mu.Unlock();
}

}  // namespace

void RegisterForFork(Engine* engine) {
  static std::once_flag installed;
  std::call_once(installed, [] {
    pthread_atfork(PrepareHandler, ParentHandler, ChildHandler);
  });
  ForkRegistry& r = Registry();
  MutexLock lock(r.mu);
  r.engines.push_back(engine);
}

void UnregisterForFork(Engine* engine) {
  ForkRegistry& r = Registry();
  MutexLock lock(r.mu);
  r.engines.erase(std::remove(r.engines.begin(), r.engines.end(), engine),
                  r.engines.end());
}

void Engine::PrepareFork() {
  mu_.Lock();  // released by AfterForkInParent / AfterForkInChild
  // A copy in flight without the lock (Note [Copies outside the lock]) would
  // be half done in the child, where its thread does not exist: the moves
  // end first, and none starts while this waits.
  fork_waiting_ = true;
  mu_.Await(moved_,
            [this]() LMS_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return moves_in_flight_ == 0; });
  fork_waiting_ = false;
  backend_->PrepareFork();
}

void Engine::AfterForkInParent() {
  backend_->AfterForkInParent();
  mu_.Unlock();
}

void Engine::AfterForkInChild() {
  backend_->AfterForkInChild();
  // Threads that waited for a release in the parent do not exist here, and a
  // condition variable that counts phantom waiters may block a notify: start
  // a fresh one (nobody can be waiting on it in this one-thread process).
  new (&released_) std::condition_variable_any();
  new (&moved_) std::condition_variable_any();
  // Page-ins that the parent's threads claimed and had not begun to copy
  // (waiting for other moves): those threads are not here to end them.
  for (ChunkId c = 0; c < residency_.size(); ++c) {
    if (residency_.tracked(c) && residency_.record(c).move != Residency::Move::kNone) {
      residency_.EndMove(c);
    }
  }
  release_waiters_ = 0;
  mu_.Unlock();
}

}  // namespace lms
