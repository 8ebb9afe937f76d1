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
  for (const FencedStream& fenced : fenced_) {
    if (fenced.stream == stream) return Status::Ok();
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
  FencedStream fenced{stream, std::vector<cu::CUevent>(kEpochRing, nullptr)};
  Status made;
  for (cu::CUevent& event : fenced.epochs) {
    made = driver_->Check(driver_->cuEventCreate(&event, cu::CU_EVENT_DISABLE_TIMING),
                          "cuEventCreate");
    if (!made.ok()) break;
  }
  if (!made.ok()) {
    for (cu::CUevent event : fenced.epochs) {
      if (event != nullptr) driver_->cuEventDestroy(event);
    }
    return made;
  }
  fenced_.push_back(std::move(fenced));
  // The closed epochs have no event on this stream: none of them covers
  // its work any more. A wait for one closes a new epoch instead.
  std::fill(std::begin(ring_epoch_), std::end(ring_epoch_), 0);
  return Status::Ok();
}

void CudaBackend::RemoveFencedStream(cu::CUstream stream) {
  ScopedCudaContext scope(*driver_, context_);
  MutexLock lock(streams_mu_);
  auto it = std::find_if(fenced_.begin(), fenced_.end(),
                         [&](const FencedStream& fenced) { return fenced.stream == stream; });
  if (it == fenced_.end()) return;
  // The copy stream may still wait on the events; CUDA defers their release.
  if (scope.status().ok()) {
    for (cu::CUevent event : it->epochs) driver_->cuEventDestroy(event);
  }
  fenced_.erase(it);
}

Status CudaBackend::CopiesAfterUse(uint64_t mark) {
  LMS_CUDA_SCOPE(*driver_, context_);
  return CopyStreamAfter(mark);
}

Status CudaBackend::CloseEpoch() {
  const size_t slot = epoch_ % kEpochRing;
  // Unusable until every stream has its record: a failure half way leaves
  // the slot covering nothing.
  ring_epoch_[slot] = 0;
  {
    ScopedNanos timed(&stats_.fence_ns);
    for (const FencedStream& fenced : fenced_) {
      LMS_RETURN_IF_ERROR(driver_->Check(driver_->cuEventRecord(fenced.epochs[slot], fenced.stream),
                                         "cuEventRecord on a fenced stream"));
    }
  }
  ring_epoch_[slot] = epoch_++;
  ++stats_.fences;
  return Status::Ok();
}

Status CudaBackend::SlotFor(uint64_t mark, size_t* slot, uint64_t* covered) {
  while (mark >= epoch_) LMS_RETURN_IF_ERROR(CloseEpoch());
  // The ring holds the last kEpochRing closed epochs; an older one, or one
  // closed before a stream joined, is covered by a new one.
  *slot = mark % kEpochRing;
  if (ring_epoch_[*slot] < mark || ring_epoch_[*slot] == 0) {
    *slot = epoch_ % kEpochRing;
    LMS_RETURN_IF_ERROR(CloseEpoch());
  }
  *covered = ring_epoch_[*slot];
  return Status::Ok();
}

Status CudaBackend::CopyStreamAfter(uint64_t mark) {
  MutexLock lock(streams_mu_);
  if (fenced_.empty() || mark <= epoch_done_ || mark <= copy_stream_after_) {
    return Status::Ok();
  }
  size_t slot = 0;
  uint64_t covered = 0;
  LMS_RETURN_IF_ERROR(SlotFor(mark, &slot, &covered));
  ScopedNanos timed(&stats_.fence_ns);
  for (const FencedStream& fenced : fenced_) {
    LMS_RETURN_IF_ERROR(driver_->Check(driver_->cuStreamWaitEvent(copy_stream_, fenced.epochs[slot], 0),
                                       "cuStreamWaitEvent on the LMS copy stream"));
  }
  // What follows on the copy stream waits for the epoch: a host wait on the
  // copy stream now also completes it.
  copy_stream_after_ = covered;
  copies_in_flight_ = true;
  return Status::Ok();
}

Status CudaBackend::HostWaitForEpoch(uint64_t mark) {
  MutexLock lock(streams_mu_);
  if (fenced_.empty() || mark <= epoch_done_) return Status::Ok();
  size_t slot = 0;
  uint64_t covered = 0;
  LMS_RETURN_IF_ERROR(SlotFor(mark, &slot, &covered));
  ++stats_.host_waits;
  ScopedNanos timed(&stats_.wait_ns);
  for (const FencedStream& fenced : fenced_) {
    LMS_RETURN_IF_ERROR(driver_->Check(driver_->cuEventSynchronize(fenced.epochs[slot]),
                                       "cuEventSynchronize on a fenced stream"));
  }
  epoch_done_ = std::max(epoch_done_, covered);
  return Status::Ok();
}

Status CudaBackend::WaitForCopies() {
  LMS_CUDA_SCOPE(*driver_, context_);
  return HostWait();
}

Status CudaBackend::BeginRemapBatch(uint64_t mark) {
  LMS_CUDA_SCOPE(*driver_, context_);
  remap_batch_drained_ = false;
  // The work queued on the batch's addresses (their units' last uses), not
  // the copy stream: the batch's copies stay in flight. Usually long done:
  // no call at all.
  LMS_RETURN_IF_ERROR(HostWaitForEpoch(mark));
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
  for (const FencedStream& fenced : fenced_) {
    LMS_RETURN_IF_ERROR(
        driver_->Check(driver_->cuStreamWaitEvent(fenced.stream, copies_done_, 0),
                       "cuStreamWaitEvent on a fenced stream (the batch's copies)"));
  }
  return Status::Ok();
}

Status CudaBackend::HostWait() {
  if (!copies_in_flight_) return Status::Ok();
  ScopedNanos timed(&stats_.wait_ns);
  const uint64_t covered = copy_stream_after_;
  LMS_RETURN_IF_ERROR(driver_->Check(driver_->cuEventRecord(copies_done_, copy_stream_),
                                     "cuEventRecord on the LMS copy stream"));
  ++stats_.host_waits;
  LMS_RETURN_IF_ERROR(driver_->Check(driver_->cuEventSynchronize(copies_done_),
                                     "cuEventSynchronize (waiting for LMS copies)"));
  copies_in_flight_ = false;
  epoch_done_ = std::max(epoch_done_, covered);
  return Status::Ok();
}

Status CudaBackend::Drain() {
  LMS_RETURN_IF_ERROR(Fence());
  return HostWait();
}

}  // namespace lms
