// CudaBackend's side of the stream protocol (Note [Stream protocol] in
// cuda_backend.h): the fenced streams, the fence, the host wait, the drain.
#include <algorithm>
#include <string>

#include "backends/cuda_backend.h"
#include "backends/cuda_context.h"
#include "engine/scoped_nanos.h"

namespace lms {

Status CudaBackend::AddFencedStream(cu::CUstream stream) {
  LMS_CUDA_SCOPE(*driver_, context_);
  MutexLock lock(streams_mu_);
  for (const auto& fenced : fenced_) {
    if (fenced.first == stream) return Status::Ok();
  }
  // A fenced stream may be another device's (a copy between GPUs runs on
  // the sending GPU's streams and writes this device's memory). Its event is
  // created in the stream's own context: cuEventRecord takes only an event
  // of the stream's context (CUDA_ERROR_INVALID_HANDLE otherwise), while the
  // copy stream may wait on an event of any context.
  // A stream fenced now never waited for the copies already queued (an
  // EndRemapBatch orders only the streams fenced then): it waits for them
  // once, or its work could write device granules an eviction gave back
  // before the eviction's copy has read them. A throwaway event of this
  // device's context, since the copy stream is this device's.
  cu::CUevent queued = nullptr;
  LMS_RETURN_IF_ERROR(driver_->Check(
      driver_->cuEventCreate(&queued, cu::CU_EVENT_DISABLE_TIMING), "cuEventCreate"));
  Status ordered = driver_->Check(driver_->cuEventRecord(queued, copy_stream_),
                                  "cuEventRecord on the LMS copy stream");
  if (ordered.ok()) {
    ordered = driver_->Check(driver_->cuStreamWaitEvent(stream, queued, 0),
                             "cuStreamWaitEvent on a stream being fenced");
  }
  driver_->cuEventDestroy(queued);  // CUDA defers it until the wait is done
  LMS_RETURN_IF_ERROR(ordered);
  cu::CUcontext stream_context = nullptr;
  LMS_RETURN_IF_ERROR(
      driver_->Check(driver_->cuStreamGetCtx(stream, &stream_context), "cuStreamGetCtx"));
  ScopedCudaContext in_stream_context(*driver_, stream_context);
  LMS_RETURN_IF_ERROR(in_stream_context.status());
  cu::CUevent event = nullptr;
  LMS_RETURN_IF_ERROR(driver_->Check(
      driver_->cuEventCreate(&event, cu::CU_EVENT_DISABLE_TIMING), "cuEventCreate"));
  fenced_.emplace_back(stream, event);
  return Status::Ok();
}

void CudaBackend::RemoveFencedStream(cu::CUstream stream) {
  ScopedCudaContext scope(*driver_, context_);
  MutexLock lock(streams_mu_);
  auto it = std::find_if(fenced_.begin(), fenced_.end(),
                         [&](const auto& fenced) { return fenced.first == stream; });
  if (it == fenced_.end()) return;
  // The copy stream may still wait on the event; CUDA defers its release.
  if (scope.status().ok()) driver_->cuEventDestroy(it->second);
  fenced_.erase(it);
}

Status CudaBackend::CopiesAfterCompute() {
  LMS_CUDA_SCOPE(*driver_, context_);
  return Fence();
}

Status CudaBackend::Fence() {
  MutexLock lock(streams_mu_);
  if (fenced_.empty()) return Status::Ok();
  ScopedNanos timed(&stats_.fence_ns);
  for (const auto& [stream, event] : fenced_) {
    LMS_RETURN_IF_ERROR(driver_->Check(driver_->cuEventRecord(event, stream),
                                       "cuEventRecord on a fenced stream"));
    LMS_RETURN_IF_ERROR(driver_->Check(driver_->cuStreamWaitEvent(copy_stream_, event, 0),
                                       "cuStreamWaitEvent on the LMS copy stream"));
  }
  // What follows on the copy stream waits for the fence: a host wait on the
  // copy stream now also waits for the fenced work.
  copies_in_flight_ = true;
  ++fences_issued_;
  ++stats_.fences;
  return Status::Ok();
}

Status CudaBackend::WaitForCopies() {
  LMS_CUDA_SCOPE(*driver_, context_);
  return HostWait();
}

Status CudaBackend::BeginRemapBatch() {
  LMS_CUDA_SCOPE(*driver_, context_);
  remap_batch_drained_ = false;
  {
    MutexLock lock(streams_mu_);
    // Every fenced stream's work queued so far (the old mappings' users),
    // not the copy stream: the batch's copies stay in flight.
    {
      ScopedNanos timed(&stats_.fence_ns);
      for (const auto& [stream, event] : fenced_) {
        LMS_RETURN_IF_ERROR(driver_->Check(driver_->cuEventRecord(event, stream),
                                           "cuEventRecord on a fenced stream"));
      }
    }
    if (!fenced_.empty()) {
      ++stats_.fences;  // a round of events on the fenced streams...
      ++stats_.host_waits;  // ...waited for on the host
    }
    ScopedNanos timed(&stats_.wait_ns);
    for (const auto& fenced : fenced_) {
      LMS_RETURN_IF_ERROR(driver_->Check(driver_->cuEventSynchronize(fenced.second),
                                         "cuEventSynchronize on a fenced stream"));
    }
  }
  // That round was a fence waited for: work queued on a buffer freed before
  // it is done, so its slots are unmapped without a drain (UnmapReleased).
  fences_waited_ = ++fences_issued_;
  remap_batch_drained_ = true;
  return Status::Ok();
}

Status CudaBackend::EndRemapBatch() {
  remap_batch_drained_ = false;
  if (!copies_in_flight_) return Status::Ok();
  LMS_CUDA_SCOPE(*driver_, context_);
  ScopedNanos timed(&stats_.fence_ns);
  // copies_in_flight_ stays set: a later HostWait still covers the copies.
  LMS_RETURN_IF_ERROR(driver_->Check(driver_->cuEventRecord(copies_done_, copy_stream_),
                                     "cuEventRecord on the LMS copy stream"));
  MutexLock lock(streams_mu_);
  for (const auto& fenced : fenced_) {
    LMS_RETURN_IF_ERROR(
        driver_->Check(driver_->cuStreamWaitEvent(fenced.first, copies_done_, 0),
                       "cuStreamWaitEvent on a fenced stream (the batch's copies)"));
  }
  return Status::Ok();
}

Status CudaBackend::HostWait() {
  if (!copies_in_flight_) return Status::Ok();
  ScopedNanos timed(&stats_.wait_ns);
  const uint64_t covered = fences_issued_;
  LMS_RETURN_IF_ERROR(driver_->Check(driver_->cuEventRecord(copies_done_, copy_stream_),
                                     "cuEventRecord on the LMS copy stream"));
  ++stats_.host_waits;
  LMS_RETURN_IF_ERROR(driver_->Check(driver_->cuEventSynchronize(copies_done_),
                                     "cuEventSynchronize (waiting for LMS copies)"));
  copies_in_flight_ = false;
  fences_waited_ = covered;
  return Status::Ok();
}

Status CudaBackend::Drain() {
  LMS_RETURN_IF_ERROR(Fence());
  return HostWait();
}

}  // namespace lms
