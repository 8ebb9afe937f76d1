// Streams and events: one worker thread per stream runs its operations in
// enqueue order, asynchronously to the thread that enqueued them.
//
// An event's records are numbered; a record is pending from cuEventRecord
// until the stream reaches it. cuStreamWaitEvent waits for the record that
// was the event's most recent when the wait was enqueued (a later record does
// not move it), cuEventQuery / cuEventSynchronize look at the most recent
// record at the time of the call, and an event never recorded is complete.
#ifndef TENSORFLOW_LMS_ALLOCATOR_TESTS_FAKE_CUDA_STREAMS_H_
#define TENSORFLOW_LMS_ALLOCATOR_TESTS_FAKE_CUDA_STREAMS_H_

#include <cstddef>
#include <functional>

#include "backends/cuda_driver_api.h"
#include "context.h"
#include "timing.h"

namespace lms {
namespace cu {
namespace fake {

// What an operation takes in the timing model (timing.h): `ns` on `engine`
// (none: kCount), starting no earlier than `after_ns`.
struct Modeled {
  timing::Engine engine = timing::Engine::kCount;
  uint64_t ns = 0;
  uint64_t after_ns = 0;
};

// Enqueues op(stream's context) to run on the worker of `stream` after all
// earlier work of the stream. CUDA_ERROR_INVALID_HANDLE if `stream` is not a
// live stream (the null stream included: the fake has no legacy stream).
// With the timing model on, schedules `modeled` on the stream's modeled tail.
CUresult Enqueue(CUstream stream, std::function<void(Context*)> op, Modeled modeled = {});

size_t LiveStreams();
size_t LiveEvents();

// Destroys every stream (after its queued work ran, as cuStreamDestroy) and
// every event; returns how many there were.
size_t DestroyAllStreamsAndEvents();

}  // namespace fake
}  // namespace cu
}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_TESTS_FAKE_CUDA_STREAMS_H_
