// CudaBackend's side of the stream protocol (Note [Stream protocol] in
// cuda_backend.h): the fenced streams, the fence, the host wait, the drain.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

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
  if (fenced_.empty()) {
    // Every mark handed out so far is complete, and stays so: marks of no
    // fenced stream cover nothing, and a stream removed was synchronized
    // first (RemoveFencedStream). The open epoch would now cover this
    // stream's work too, so marks of it taken before would read as not
    // done: it ends here, with no event (Note [Epochs of use]).
    // open_epoch_marked_ is left as it is (the engine's lock guards it): at
    // worst the next remap batch closes an epoch nobody marked.
    done_before_fence_ = epoch_;
    ++epoch_;
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
  // Marks taken while it was fenced cover its work only through its events:
  // once it is gone they would not (with no stream left, every mark reads
  // done), so an eviction could copy, or an unmap remove, memory its queued
  // kernels still use. Its work ends first: a host wait, in a rare call (a
  // tool's, or at a stream's end).
  {
    cu::CUcontext stream_context = nullptr;
    if (driver_->cuStreamGetCtx(stream, &stream_context) == cu::CUDA_SUCCESS) {
      ScopedCudaContext in_stream_context(*driver_, stream_context);
      if (in_stream_context.status().ok()) driver_->cuStreamSynchronize(stream);
    }
  }
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
      LMS_RETURN_IF_ERROR(
          driver_->Check(driver_->cuEventRecord(fenced.epochs[slot], fenced.stream),
                         "cuEventRecord on a fenced stream"));
    }
  }
  ring_epoch_[slot] = epoch_++;
  open_epoch_marked_.store(false, std::memory_order_relaxed);
  ++stats_.fences;
  return Status::Ok();
}

Status CudaBackend::SlotFor(uint64_t mark, size_t* slot, uint64_t* covered) {
  while (mark >= epoch_) LMS_RETURN_IF_ERROR(CloseEpoch());
  // The ring holds the last kEpochRing closed epochs (0: none, or one
  // closed before a stream joined). Past its end, `mark`'s slot holds a
  // later epoch of any age: the oldest later one waits least.
  *slot = mark % kEpochRing;
  if (ring_epoch_[*slot] != mark || mark == 0) *slot = OldestHeldFrom(mark);
  if (*slot == kEpochRing) {
    *slot = epoch_ % kEpochRing;
    LMS_RETURN_IF_ERROR(CloseEpoch());
  }
  *covered = ring_epoch_[*slot];
  return Status::Ok();
}

size_t CudaBackend::OldestHeldFrom(uint64_t from) const {
  size_t slot = kEpochRing;
  for (size_t i = 0; i < kEpochRing; ++i) {
    const uint64_t e = ring_epoch_[i];
    if (e != 0 && e >= from && (slot == kEpochRing || e < ring_epoch_[slot])) slot = i;
  }
  return slot;
}

void CudaBackend::LearnDoneBeforeFence() {
  epoch_done_ = std::max(epoch_done_, done_before_fence_);
}

Status CudaBackend::CopyStreamAfter(uint64_t mark) {
  MutexLock lock(streams_mu_);
  LearnDoneBeforeFence();
  if (fenced_.empty() || mark <= epoch_done_ || mark <= copy_stream_after_) {
    return Status::Ok();
  }
  size_t slot = 0;
  uint64_t covered = 0;
  LMS_RETURN_IF_ERROR(SlotFor(mark, &slot, &covered));
  ScopedNanos timed(&stats_.fence_ns);
  for (const FencedStream& fenced : fenced_) {
    LMS_RETURN_IF_ERROR(
        driver_->Check(driver_->cuStreamWaitEvent(copy_stream_, fenced.epochs[slot], 0),
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
  LearnDoneBeforeFence();
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

bool CudaBackend::EpochDone(uint64_t mark) {
  if (mark <= epoch_done_) return true;
  // No fenced stream: nothing LMS orders can be queued.
  MutexLock lock(streams_mu_);
  return fenced_.empty() || mark <= done_before_fence_;
}

bool CudaBackend::EpochDoneAfterPoll(uint64_t mark, bool polled) {
  if (!polled && !EpochDone(mark)) PollEpochs();
  return EpochDone(mark);
}

void CudaBackend::PollEpochs() {
  MutexLock lock(streams_mu_);
  LearnDoneBeforeFence();
  if (fenced_.empty()) return;
  // A few at a time: each costs a query per fenced stream. The next closed
  // epoch the ring holds (the one after epoch_done_, or a later one where
  // the ring has moved on or a stream joined since) covers every epoch
  // before it.
  for (int n = 0; n < 4; ++n) {
    const size_t slot = OldestHeldFrom(epoch_done_ + 1);
    if (slot == kEpochRing) return;
    for (const FencedStream& fenced : fenced_) {
      if (driver_->cuEventQuery(fenced.epochs[slot]) != cu::CUDA_SUCCESS) return;
    }
    epoch_done_ = ring_epoch_[slot];
  }
}

Status CudaBackend::Retire(uintptr_t address, size_t granules, uint64_t mark) {
  {
    // Closed now, so that its events can complete it later.
    MutexLock lock(streams_mu_);
    while (!fenced_.empty() && mark >= epoch_) LMS_RETURN_IF_ERROR(CloseEpoch());
  }
  const Slot first = *SlotAt(address);
  Pool& p = pools_[static_cast<int>(first.pool)];
  for (size_t k = 0; k < granules; ++k) {
    uint64_t& busy = p.busy_until[first.id + k];
    busy = std::max(busy, mark);
  }
  for (size_t k = 0; k < granules; ++k) {
    Slot& slot = *SlotAt(address + k * granule_);
    slot = Slot();
    slot.retired = true;
  }
  retired_.push_back({address, granules, mark, first.pool, first.id});
  return Status::Ok();
}

bool CudaBackend::MapsWithoutWait(uintptr_t address, size_t count, bool poll) {
  if (retired_.empty() || !AnyRetired(address, count)) return true;
  if (poll) PollEpochs();
  for (const Retired& r : retired_) {
    if (Overlaps(r, address, count) && !EpochDone(r.mark)) return false;
  }
  return true;
}

Status CudaBackend::UnmapCompletedRetired() {
  LMS_CUDA_SCOPE(*driver_, context_);
  return UnmapRetired();
}

Status CudaBackend::SettleMapping(uintptr_t address, size_t count) {
  if (!AnyRetired(address, count) && !AnyPending(address, count)) return Status::Ok();
  LMS_CUDA_SCOPE(*driver_, context_);
  LMS_RETURN_IF_ERROR(UnmapRetired(/*wait=*/true, address, count, /*drop_pending=*/false));
  // Pending with nothing in the way: a map that failed before (MapPending).
  return MapPending(address, count);
}

void CudaBackend::RetryUnmadeMappings() {
  // Made since, dropped (freed, replaced), or pending again behind a retired
  // mapping (made when that goes): not to be tried.
  const auto settled = [&](uintptr_t at) {
    const Slot* slot = SlotAt(at);
    return slot == nullptr || !slot->pending || slot->retired || slot->head != 0;
  };
  // A copy: MapPending finds the ones failing again still listed, so they
  // are said once. Their failure was said when it first failed;
  // SettleMapping reports it where the unit's address must be reached.
  const std::vector<uintptr_t> tried = unmade_;
  for (const uintptr_t at : tried) {
    if (!settled(at)) (void)MapPending(at, SpanAt(at));
  }
  unmade_.erase(std::remove_if(unmade_.begin(), unmade_.end(), settled), unmade_.end());
}

Status CudaBackend::UnmapRetired(bool wait, uintptr_t address, size_t count,
                                 bool drop_pending) {
  if (retired_.empty()) return Status::Ok();
  const auto in_the_way = [&](const Retired& r) { return wait && Overlaps(r, address, count); };
  // The unmap thread's requests in the way are waited for (their epochs are
  // done: only the driver call is left); every request it has made leaves.
  uint64_t ticket = 0;
  for (const Retired& r : retired_) {
    if (in_the_way(r)) ticket = std::max(ticket, r.unmap_ticket);
  }
  Status status = WaitForUnmap(ticket);
  // The waits first: one may complete other retired mappings' epochs too.
  PollEpochs();
  for (const Retired& r : retired_) {
    if (in_the_way(r) && !EpochDone(r.mark)) LMS_RETURN_IF_ERROR(HostWaitForEpoch(r.mark));
  }
  size_t kept = 0;
  std::vector<Retired> unmapped;
  for (size_t i = 0; i < retired_.size(); ++i) {
    const Retired r = retired_[i];
    if (r.unmap_ticket == 0 && EpochDone(r.mark) &&
        (in_the_way(r) || unmapper_ == nullptr || AnyPending(r.address, r.granules))) {
      ScopedNanos timed(&stats_.unmap_ns);
      const Status s =
          driver_->Check(driver_->cuMemUnmap(r.address, r.granules * granule_),
                         "cuMemUnmap of a retired mapping at " +
                             FormatAddress(reinterpret_cast<void*>(r.address)));
      if (s.ok()) {
        ++stats_.unmappings;
        for (size_t k = 0; k < r.granules; ++k) {
          Slot& slot = *SlotAt(r.address + k * granule_);
          slot.retired = false;
          // The caller replaces what is pending there: nothing to map.
          if (drop_pending && in_the_way(r) && slot.pending) slot = Slot();
        }
        unmapped.push_back(r);
        continue;
      }
      if (status.ok()) status = s;
    }
    retired_[kept++] = r;
  }
  retired_.resize(kept);
  // The rest whose epoch is done go to the unmap thread.
  QueueUnmaps(0);
  for (const Retired& r : unmapped) {
    // A failure is the caller's only where the slots are (SettleMapping's);
    // elsewhere the mapping stays pending, to be made later (MapPending).
    Status s = MapPending(r.address, r.granules);
    if (!s.ok() && in_the_way(r) && status.ok()) status = s;
  }
  return status;
}

Status CudaBackend::UnmapOnThread(uintptr_t address, size_t bytes) const {
  ScopedCudaContext scope(*driver_, context_);
  LMS_RETURN_IF_ERROR(scope.status());
  return driver_->Check(driver_->cuMemUnmap(address, bytes),
                        "cuMemUnmap (on the unmap thread) of a retired mapping at " +
                            FormatAddress(reinterpret_cast<void*>(address)));
}

void CudaBackend::QueueUnmaps(size_t from) {
  if (unmapper_ == nullptr) return;
  bool pushed = false;
  for (size_t i = from; i < retired_.size(); ++i) {
    Retired& r = retired_[i];
    if (r.unmap_ticket != 0 || !EpochDone(r.mark) || AnyPending(r.address, r.granules)) {
      continue;
    }
    r.unmap_ticket = unmapper_->Push(r.address, r.granules * granule_);
    // Done: later checks read 0 as done without asking the GPU.
    r.mark = 0;
    ++unmaps_queued_;
    // Counted when handed over, not when made, so that the figure never
    // depends on the thread's timing (a failure takes it back).
    ++stats_.unmappings;
    pushed = true;
  }
  // Held until this thread's next maps are made (Map), unless they pile up.
  if (pushed && unmapper_->held() > kMostHeldUnmaps) unmapper_->Release();
}

void CudaBackend::ReapUnmaps(Status* status) {
  if (unmaps_queued_ == 0 || unmapper_ == nullptr) return;
  for (UnmapThread::Done& done : unmapper_->TakeDone()) {
    const auto it = std::find_if(retired_.begin(), retired_.end(), [&](const Retired& r) {
      return r.unmap_ticket == done.ticket;
    });
    if (it == retired_.end()) continue;  // every request is of a retired mapping
    --unmaps_queued_;
    if (!done.status.ok()) {
      it->unmap_ticket = 0;  // still mapped: unmapped again later
      --stats_.unmappings;
      if (status->ok()) *status = std::move(done.status);
      continue;
    }
    // Nothing is pending there: a deferred mapping is made only at slots
    // mapped and not retired (MapDeferred), and QueueUnmaps skips pending.
    for (size_t k = 0; k < it->granules; ++k) SlotAt(it->address + k * granule_)->retired = false;
    retired_.erase(it);
  }
}

Status CudaBackend::WaitForUnmap(uint64_t ticket) {
  if (ticket != 0 && unmapper_ != nullptr) unmapper_->WaitFor(ticket);
  Status status;
  ReapUnmaps(&status);
  return status;
}

Status CudaBackend::MapPending(uintptr_t address, size_t count) {
  const CudaDriver& d = *driver_;
  Status status;
  for (size_t i = 0; i < count;) {
    const uintptr_t at = address + i * granule_;
    const Slot* slot = SlotAt(at);
    if (slot == nullptr || !slot->pending || slot->retired) {
      ++i;
      continue;
    }
    // The pending mapping's first slot (it may start before `address`) and
    // length: MapDeferred recorded them as Map would map them.
    const uintptr_t start = at - size_t{slot->head} * granule_;
    const size_t length = SpanAt(start);
    const PoolKind pool = SlotAt(start)->pool;
    const GranuleId first_id = SlotAt(start)->id;
    i += length - slot->head;
    bool free = true;
    for (size_t k = 0; free && k < length; ++k) free = !SlotAt(start + k * granule_)->retired;
    if (!free) continue;  // another retired mapping still in the way
    ScopedNanos timed(&stats_.map_ns);
    Status s = d.Check(MapRun(start, length, pool, first_id),
                       "cuMemMap of a deferred mapping at " +
                           FormatAddress(reinterpret_cast<void*>(start)));
    bool made = s.ok();
    if (made) {
      s = d.Check(d.cuMemSetAccess(start, length * granule_, access_.data(), access_.size()),
                  "cuMemSetAccess of a deferred mapping at " +
                      FormatAddress(reinterpret_cast<void*>(start)));
      // Mapped without access, if it cannot be unmapped: recorded as made,
      // so that a later Unmap there unmaps it.
      if (!s.ok()) made = d.cuMemUnmap(start, length * granule_) != cu::CUDA_SUCCESS;
    }
    if (made) {
      for (size_t k = 0; k < length; ++k) SlotAt(start + k * granule_)->pending = false;
    } else if (std::find(unmade_.begin(), unmade_.end(), start) == unmade_.end()) {
      // Still pending, with nothing in the driver: the unit's host granules
      // hold its bytes, but its address reaches nothing until the map is
      // made. Tried again at each remap batch (RetryUnmadeMappings) and
      // wherever the address must be reached (SettleMapping, which reports
      // a failure); a Map or Unmap there drops it with no driver call
      // (UnmapSlots), as a free does. Said once: a caller whose slots these
      // are not is not told (UnmapRetired).
      unmade_.push_back(start);
      std::fprintf(stderr,
                   "tensorflow_lms_allocator: %s; the evicted tensor's bytes are kept in host "
                   "memory, and its address is mapped again at the next move or where it "
                   "must be reached\n",
                   s.message().c_str());
    }
    if (!s.ok() && status.ok()) status = s;
  }
  return status;
}

bool CudaBackend::MapDeferred(uintptr_t address, PoolKind pool, const GranuleId* ids,
                              size_t count) {
  // Every slot is mapped in the driver (a resident unit being evicted), by
  // mappings within the `count` slots: those are retired, with the batch's
  // mark.
  for (size_t i = 0; i < count; ++i) {
    const Slot* slot = SlotAt(address + i * granule_);
    if (!slot->mapped || slot->pending || slot->retired) return false;
  }
  if (!CheckWholeMappings(address, count, "deferring").ok()) return false;
  for (size_t i = 0; i < count;) {
    const uintptr_t at = address + i * granule_;
    const size_t length = SpanAt(at);
    if (!Retire(at, length, batch_mark_).ok()) return false;  // nothing retired yet fails
    i += length;
  }
  for (size_t i = 0; i < count;) {
    const size_t length = NextMapping(pool, ids + i, count - i);
    SetMapping(address + i * granule_, length, pool, ids[i], /*pending=*/true);
    i += length;
  }
  return true;
}

Status CudaBackend::CopiesAfterRetired(PoolKind pool, const GranuleId* ids, size_t count) {
  const Pool& p = pools_[static_cast<int>(pool)];
  uint64_t mark = 0;
  for (size_t i = 0; i < count; ++i) mark = std::max(mark, p.busy_until[ids[i]]);
  return mark > epoch_done_ ? CopyStreamAfter(mark) : Status::Ok();
}

Status CudaBackend::WaitForCopies() {
  LMS_CUDA_SCOPE(*driver_, context_);
  return HostWait();
}

Status CudaBackend::BeginRemapBatch(uint64_t mark) {
  LMS_CUDA_SCOPE(*driver_, context_);
  remap_batch_drained_ = false;
  if (!unmade_.empty()) RetryUnmadeMappings();
  // Those whose epoch is done (a poll of the GPU if any is retired; one is
  // enough for the batch's mark below too).
  const bool polled = !retired_.empty();
  LMS_RETURN_IF_ERROR(UnmapRetired());
  // The work queued on the batch's addresses (their units' last uses), not
  // the copy stream: the batch's copies stay in flight. Usually long done:
  // no call at all. If not, an eviction's remaps are deferred (Map) and
  // only a page-in's wait, in its first Map.
  batch_mark_ = mark;
  batch_wait_left_ = !EpochDoneAfterPoll(mark, polled);
  remap_batch_drained_ = true;
  // Units unpinned from here on get epochs of their own (Note [Epochs of
  // use]). Not this batch's ordering, which is complete: a failure leaves the
  // epoch open, for a wait for one of its marks to close.
  MutexLock lock(streams_mu_);
  if (!fenced_.empty() && open_epoch_marked_.load(std::memory_order_relaxed)) {
    (void)CloseEpoch();
  }
  return Status::Ok();
}

Status CudaBackend::EndRemapBatch() {
  remap_batch_drained_ = false;
  batch_wait_left_ = false;
  if (!copies_in_flight_) return Status::Ok();
  LMS_CUDA_SCOPE(*driver_, context_);
  ScopedNanos timed(&stats_.fence_ns);
  // copies_in_flight_ stays set: a later HostWait still covers the copies.
  // The event ends the open ticket (Note [Copy tickets]).
  cu::CUevent done = copy_events_[copy_ticket_ % kCopyRing];
  LMS_RETURN_IF_ERROR(driver_->Check(driver_->cuEventRecord(done, copy_stream_),
                                     "cuEventRecord on the LMS copy stream"));
  copy_event_after_[copy_ticket_ % kCopyRing] = copy_stream_after_;
  copy_recorded_ = copy_ticket_++;
  MutexLock lock(streams_mu_);
  for (const FencedStream& fenced : fenced_) {
    LMS_RETURN_IF_ERROR(
        driver_->Check(driver_->cuStreamWaitEvent(fenced.stream, done, 0),
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
  // Every copy so far is done: the open ticket ends here.
  copies_done_through_ = copy_ticket_++;
  return Status::Ok();
}

uint64_t CudaBackend::HeldTicket(uint64_t ticket) const {
  // The ring holds the tickets after copy_recorded_ - kCopyRing; an older
  // one is done once the oldest held is (copies complete in order).
  return std::max<uint64_t>(ticket,
                            copy_recorded_ >= kCopyRing ? copy_recorded_ - kCopyRing + 1 : 1);
}

bool CudaBackend::CopyTicketDone(uint64_t ticket) {
  if (ticket <= copies_done_through_) return true;
  if (ticket > copy_recorded_) return false;  // open: no event ends it yet
  const uint64_t asked = HeldTicket(ticket);
  if (driver_->cuEventQuery(copy_events_[asked % kCopyRing]) != cu::CUDA_SUCCESS) {
    return false;  // not ready, or an error a later wait reports
  }
  copies_done_through_ = std::max(copies_done_through_, asked);
  return true;
}

uint64_t CudaBackend::CopyTicketAfter(uint64_t ticket) {
  if (CopyTicketDone(ticket)) return 0;
  // An open ticket is waited for by a host wait on the copy stream now.
  if (ticket > copy_recorded_) return copy_stream_after_;
  return copy_event_after_[HeldTicket(ticket) % kCopyRing];
}

Status CudaBackend::WaitForCopyTicket(uint64_t ticket) {
  if (CopyTicketDone(ticket)) return Status::Ok();
  if (ticket > copy_recorded_) return HostWait();  // open: every copy so far
  // Its own event (or a later one the ring still holds), not every copy in
  // flight: copies issued since may wait on the GPU for kernels.
  ScopedNanos timed(&stats_.wait_ns);
  const uint64_t asked = HeldTicket(ticket);
  ++stats_.host_waits;
  LMS_RETURN_IF_ERROR(
      driver_->Check(driver_->cuEventSynchronize(copy_events_[asked % kCopyRing]),
                     "cuEventSynchronize (waiting for LMS copies of released memory)"));
  copies_done_through_ = std::max(copies_done_through_, asked);
  return Status::Ok();
}

uint64_t CudaBackend::LastCopyTicket(PoolKind pool, const GranuleRun* runs,
                                     size_t count) const {
  const Pool& p = pools_[static_cast<int>(pool)];
  uint64_t last = 0;
  for (size_t r = 0; r < count; ++r) {
    for (uint32_t i = 0; i < runs[r].length; ++i) {
      last = std::max(last, p.copied_in[runs[r].first + i]);
    }
  }
  return last;
}

Status CudaBackend::Drain() {
  LMS_RETURN_IF_ERROR(Fence());
  return HostWait();
}

}  // namespace lms
