#include "streams.h"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <utility>

#include "engine/mutex.h"
#include "entry_points.h"

namespace lms {
namespace cu {
namespace fake {
namespace {

// Guards every stream's queue and counters, every event's records and the
// handle maps. Constant-initialized and trivially destructible, so workers
// still running at exit can use it.
Mutex g_stream_mu;

struct Stream {
  Context* context = nullptr;  // immutable after creation
  std::deque<std::function<void(Context*)>> queue LMS_GUARDED_BY(g_stream_mu);
  // enqueued - completed operations are queued or running.
  uint64_t enqueued LMS_GUARDED_BY(g_stream_mu) = 0;
  uint64_t completed LMS_GUARDED_BY(g_stream_mu) = 0;
  // cuStreamDestroy: the worker drains the queue, then exits.
  bool stopping LMS_GUARDED_BY(g_stream_mu) = false;
  std::condition_variable_any work_cv;  // queue non-empty, or stopping
  // The timing model's tail: when the last enqueued operation completes.
  uint64_t model_tail LMS_GUARDED_BY(g_stream_mu) = 0;
  std::thread worker;               // set once by cuStreamCreate
};

struct Event {
  // The context current at cuEventCreate: cuEventRecord takes only a stream
  // of the same context (cuda.h, cuEventRecord: "must be from the same
  // context ... otherwise CUDA_ERROR_INVALID_HANDLE"); cuStreamWaitEvent and
  // the host waits take an event of any context.
  Context* context = nullptr;  // immutable after creation
  uint64_t last_recorded LMS_GUARDED_BY(g_stream_mu) = 0;  // 0: never recorded
  // Records enqueued and not yet reached by their stream.
  std::set<uint64_t> pending LMS_GUARDED_BY(g_stream_mu);
  // The timing model's moment the last record completes.
  uint64_t model_record_ns LMS_GUARDED_BY(g_stream_mu) = 0;
};

struct StreamState {
  // The live streams and events by handle. Queued operations hold their own
  // references, so destroying a handle never frees what a worker still uses.
  std::map<CUstream, std::shared_ptr<Stream>> streams LMS_GUARDED_BY(g_stream_mu);
  std::map<CUevent, std::shared_ptr<Event>> events LMS_GUARDED_BY(g_stream_mu);
  // Notified whenever an operation completes (streams drain, records are
  // reached).
  std::condition_variable_any progress_cv;
};

// Never destroyed: workers of streams nobody destroyed run until exit.
StreamState& State() {
  static StreamState* state = new StreamState;
  return *state;
}

// Waits on `cv` until pred(); g_stream_mu is held on entry and on return.
template <typename Pred>
void Await(std::condition_variable_any& cv, Pred pred)
    LMS_EXCLUSIVE_LOCKS_REQUIRED(g_stream_mu) {
  while (!g_stream_mu.AwaitWithTimeout(cv, std::chrono::milliseconds(1000), pred)) {
  }
}

void RunWorker(Stream* s) {
  ExecutingContext() = s->context;
  StreamState& st = State();
  for (;;) {
    std::function<void(Context*)> op;
    {
      MutexLock lock(g_stream_mu);
      Await(s->work_cv, [s]() LMS_EXCLUSIVE_LOCKS_REQUIRED(g_stream_mu) {
        return !s->queue.empty() || s->stopping;
      });
      if (s->queue.empty()) return;  // stopping, and drained
      op = std::move(s->queue.front());
      s->queue.pop_front();
    }
    op(s->context);
    {
      MutexLock lock(g_stream_mu);
      ++s->completed;
    }
    st.progress_cv.notify_all();
  }
}

// Lets the worker of a stream removed from the map (with `stopping` set)
// drain its queue and exit, and waits for it unless called from it.
void JoinWorker(Stream& s) {
  s.work_cv.notify_one();
  if (s.worker.get_id() == std::this_thread::get_id()) {
    s.worker.detach();  // destroyed from its own host function
  } else {
    s.worker.join();
  }
}

// The preamble of every call that names a stream or an event: holds
// g_stream_mu for its scope and looks the handles up. `stream` and `event`
// are null where a handle names no live one (the call's
// CUDA_ERROR_INVALID_HANDLE); the null handle is never live (no legacy
// stream). The references it holds are dropped after g_stream_mu is
// released (members outlive the destructor's body), so an object whose last
// reference this was ends outside the lock.
class LMS_SCOPED_CAPABILITY Locked {
 public:
  explicit Locked(CUstream stream) LMS_ACQUIRE(g_stream_mu) { LockAndFind(stream, nullptr); }
  explicit Locked(CUevent event) LMS_ACQUIRE(g_stream_mu) { LockAndFind(nullptr, event); }
  Locked(CUstream stream, CUevent event) LMS_ACQUIRE(g_stream_mu) { LockAndFind(stream, event); }
  ~Locked() LMS_RELEASE() { g_stream_mu.Unlock(); }
  Locked(const Locked&) = delete;
  Locked& operator=(const Locked&) = delete;

  std::shared_ptr<Stream> stream;
  std::shared_ptr<Event> event;

 private:
  void LockAndFind(CUstream stream, CUevent event) LMS_ACQUIRE(g_stream_mu) {
    g_stream_mu.Lock();
    StreamState& st = State();
    auto s = st.streams.find(stream);
    if (s != st.streams.end()) this->stream = s->second;
    auto e = st.events.find(event);
    if (e != st.events.end()) this->event = e->second;
  }
};

}  // namespace

CUresult Enqueue(CUstream stream, std::function<void(Context*)> op, Modeled modeled) {
  std::shared_ptr<Stream> s;
  {
    Locked found(stream);
    s = found.stream;
    if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (timing::Enabled()) {
      s->model_tail = timing::Schedule(std::max(s->model_tail, modeled.after_ns),
                                       s->context->device, modeled.engine, modeled.ns);
    }
    s->queue.push_back(std::move(op));
    ++s->enqueued;
  }
  s->work_cv.notify_one();
  return CUDA_SUCCESS;
}

size_t LiveStreams() {
  StreamState& st = State();
  MutexLock lock(g_stream_mu);
  return st.streams.size();
}

size_t LiveEvents() {
  StreamState& st = State();
  MutexLock lock(g_stream_mu);
  return st.events.size();
}

size_t DestroyAllStreamsAndEvents() {
  StreamState& st = State();
  std::map<CUstream, std::shared_ptr<Stream>> streams;
  size_t events = 0;
  {
    MutexLock lock(g_stream_mu);
    streams.swap(st.streams);
    events = st.events.size();
    st.events.clear();
    for (auto& [handle, s] : streams) s->stopping = true;
  }
  for (auto& [handle, s] : streams) JoinWorker(*s);
  return streams.size() + events;
}

CUresult cuStreamCreate(CUstream* stream, unsigned int flags) noexcept {
  Context* context = nullptr;
  if (CUresult r = RequireContext(&context)) return r;
  if (stream == nullptr || (flags & ~CU_STREAM_NON_BLOCKING) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto s = std::make_shared<Stream>();
  s->context = context;
  const CUstream handle = reinterpret_cast<CUstream>(s.get());
  s->worker = std::thread(RunWorker, s.get());
  StreamState& st = State();
  MutexLock lock(g_stream_mu);
  st.streams[handle] = std::move(s);
  *stream = handle;
  return CUDA_SUCCESS;
}

// Unlike the real driver, waits for the stream's work to finish (the real
// one returns at once and releases the stream when its work is done): the
// difference is invisible to a caller that did not use the handle again.
CUresult cuStreamDestroy(CUstream stream) noexcept {
  Context* context = nullptr;
  if (CUresult r = RequireContext(&context)) return r;
  std::shared_ptr<Stream> s;
  {
    Locked found(stream);
    s = found.stream;
    if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    State().streams.erase(stream);
    s->stopping = true;
  }
  JoinWorker(*s);
  return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream stream) noexcept {
  Context* context = nullptr;
  if (CUresult r = RequireContext(&context)) return r;
  std::shared_ptr<Stream> s;
  uint64_t done_ns = 0;
  {
    Locked found(stream);
    s = found.stream;
    if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    const uint64_t target = s->enqueued;
    Await(State().progress_cv, [&]() LMS_EXCLUSIVE_LOCKS_REQUIRED(g_stream_mu) {
      return s->completed >= target;
    });
    done_ns = s->model_tail;
  }
  timing::HostWaitUntil(done_ns);
  return s->context->sticky_error.load();
}

CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) noexcept {
  Context* context = nullptr;
  if (CUresult r = RequireContext(&context)) return r;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Event> e;
  uint64_t target = 0;
  Modeled modeled;
  {
    Locked found(event);
    e = found.event;
    if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    target = e->last_recorded;  // the most recent record as of now
    modeled.after_ns = e->model_record_ns;
  }
  timing::Charge(timing::Call::kWait);
  return Enqueue(stream, [e, target](Context*) {
    StreamState& st = State();
    MutexLock lock(g_stream_mu);
    Await(st.progress_cv, [&]() LMS_EXCLUSIVE_LOCKS_REQUIRED(g_stream_mu) {
      return e->pending.count(target) == 0;
    });
  }, modeled);
}

CUresult cuStreamGetCtx(CUstream stream, CUcontext* context) noexcept {
  if (CUresult r = RequireInitialized()) return r;
  if (context == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Locked found(stream);
  if (found.stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *context = reinterpret_cast<CUcontext>(found.stream->context);
  return CUDA_SUCCESS;
}

CUresult cuLaunchHostFunc(CUstream stream, CUhostFn fn, void* user_data) noexcept {
  Context* context = nullptr;
  if (CUresult r = RequireContext(&context)) return r;
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  timing::Charge(timing::Call::kLaunch);
  return Enqueue(stream, [fn, user_data](Context*) { fn(user_data); });
}

CUresult cuEventCreate(CUevent* event, unsigned int flags) noexcept {
  Context* context = nullptr;
  if (CUresult r = RequireContext(&context)) return r;
  // DEFAULT, BLOCKING_SYNC (0x1), DISABLE_TIMING (0x2), INTERPROCESS (0x4,
  // only with DISABLE_TIMING; accepted but not shareable here).
  if (event == nullptr || (flags & ~0x7u) != 0 ||
      ((flags & 0x4u) != 0 && (flags & CU_EVENT_DISABLE_TIMING) == 0)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto e = std::make_shared<Event>();
  e->context = context;
  const CUevent handle = reinterpret_cast<CUevent>(e.get());
  StreamState& st = State();
  MutexLock lock(g_stream_mu);
  st.events[handle] = std::move(e);
  *event = handle;
  return CUDA_SUCCESS;
}

// As in the real driver, a record still queued completes normally; the
// queued operations hold the event.
CUresult cuEventDestroy(CUevent event) noexcept {
  Context* context = nullptr;
  if (CUresult r = RequireContext(&context)) return r;
  StreamState& st = State();
  MutexLock lock(g_stream_mu);
  return st.events.erase(event) == 1 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuEventRecord(CUevent event, CUstream stream) noexcept {
  Context* context = nullptr;
  if (CUresult r = RequireContext(&context)) return r;
  timing::Charge(timing::Call::kRecord);
  Locked found(stream, event);
  const std::shared_ptr<Event>& e = found.event;
  const std::shared_ptr<Stream>& s = found.stream;
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (s == nullptr || s->context != e->context) return CUDA_ERROR_INVALID_HANDLE;
  // Numbered and enqueued in one critical section, so a wait enqueued after
  // this call targets this record or a later one.
  const uint64_t record = ++e->last_recorded;
  e->pending.insert(record);
  if (timing::Enabled()) {
    s->model_tail = timing::Schedule(s->model_tail, s->context->device,
                                     timing::Engine::kCount, 0);
    e->model_record_ns = s->model_tail;
  }
  s->queue.push_back([e, record](Context*) {
    MutexLock lock(g_stream_mu);
    e->pending.erase(record);
  });
  ++s->enqueued;
  s->work_cv.notify_one();
  return CUDA_SUCCESS;
}

CUresult cuEventQuery(CUevent event) noexcept {
  Context* context = nullptr;
  if (CUresult r = RequireContext(&context)) return r;
  // Charged first: a caller polling in a loop moves the modeled clock on.
  timing::Charge(timing::Call::kSync);
  Locked found(event);
  const std::shared_ptr<Event>& e = found.event;
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (e->pending.count(e->last_recorded) != 0) return CUDA_ERROR_NOT_READY;
  // Done on the real clock, not yet on the modeled one.
  if (timing::Enabled() && e->model_record_ns > timing::HostNow()) return CUDA_ERROR_NOT_READY;
  return context->sticky_error.load();
}

CUresult cuEventSynchronize(CUevent event) noexcept {
  Context* context = nullptr;
  if (CUresult r = RequireContext(&context)) return r;
  uint64_t done_ns = 0;
  {
    Locked found(event);
    const std::shared_ptr<Event>& e = found.event;
    if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    const uint64_t target = e->last_recorded;
    done_ns = e->model_record_ns;
    Await(State().progress_cv, [&]() LMS_EXCLUSIVE_LOCKS_REQUIRED(g_stream_mu) {
      return e->pending.count(target) == 0;
    });
  }
  timing::HostWaitUntil(done_ns);
  return context->sticky_error.load();
}

}  // namespace fake
}  // namespace cu
}  // namespace lms
