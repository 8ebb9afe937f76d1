"""Proves the stream-ordering and access tests of cuda_backend_test.cc can fail.

Each mutation removes one part of the stream protocol (Note [Stream protocol]
in backends/cuda_backend.h), of the access rules for several GPUs (Note
[Access to mapped memory]) or of the host budget they share from a copy of one
backend source or header, builds the test against that copy and runs it over
the fake driver. The check passes only if every named test fails under its
mutation and no other test does, except tests named as racing it (a mutation
that unorders copies makes such a test fail only when the race shows; ANY
where every test may) and the random test of the stream protocol (FUZZ),
which may fail under any; production sources are never touched. A test that ends
the test process (a crash) fails, and the tests after it run each in a process
of its own. A drain (an unmap with no mark: a fence of everything and a host
wait) is left only on failure paths and at teardown, which no ordering test
reaches, so no mutation of it is listed.

Usage: python tests/cc/mutation_check.py BUILD_DIR CXX FAKE_DRIVER [NAME...]
(NAMEs: only those mutations, for iterating on one.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SRC = Path("tensorflow_lms_allocator/cc")
STREAMS = SRC / "backends/cuda_backend_streams.cc"
MEMORY = SRC / "backends/cuda_backend.cc"

EVICTION = "AnEvictionCopiesWhatAKernelQueuedBeforeTheUnpinStillWrites"
COPY = "ACopyQueuedOnAnotherFencedStreamBeforeTheUnpinReadsTheRightBytes"
FREE = "FreeingAnEvictedTensorRetiresItsMappingUnderQueuedWork"
DEFRAG = "DefragmentationRetiresAFreedRangeAndTheNextUserWaits"
PAGE_IN_FREED = "APageInIntoAFreedGranuleWaitsForTheKernelStillWritingIt"
IN_PLACE = "AKernelReadingARefusedInputInPlaceSeesItsEvictedBytes"
RECLAIM = "AReclaimOfSeveralVictimsClosesOneEpochAndCopiesAfterIt"
PAGE_IN_READ = "APagedInTensorIsReadByTheKernelQueuedAfterThePinWithoutAHostWaitForTheCopy"
PAGE_IN_QUEUED = "APageInWaitsForQueuedWorkOnTheEvictedTensorBeforeTheRemap"
EVICTION_IN_FLIGHT = "AnEvictionRemapsWithoutAHostWaitForItsCopyAndTheNextKernelWaitsForIt"
PIN_ALL = "PinAllPagesInAKernelsInputsWithoutAHostWaitAndItsKernelReadsThemAll"
LATE_STREAM = "AStreamFencedAfterAnEvictionWaitsForItsCopy"
OTHER_GPU_STREAM = "AStreamOfAnotherGpuIsFencedWithAnEventOfItsOwnContext"
PEER = "APeerGpuReachesATensorThroughEveryRemap"
NO_P2P = "PeersWithoutAPeerPathAreNotGrantedAndEveryRemapWorks"
SETUP = SRC / "backends/cuda_backend_setup.cc"
HEADER = SRC / "backends/cuda_backend.h"
ENGINE = SRC / "engine/engine.cc"
RECLAIM_SRC = SRC / "engine/engine_reclaim.cc"
BUDGET = SRC / "backends/pinned_host_budget.h"
HOST_LOCATION = "HostMemoryIsMadeAtTheGpusNumaNodeOrWhereTheDriverAcceptsIt"
NO_PROBE = {"TheHostMemoryProbeOfADriverThatCannotReportSupportFailsCleanly"}
RUNS = "ARunOfConsecutiveDeviceGranulesIsOneMappingAtItsOffset"
TRIM = "AUnitPlacedOverPartOfACachedMappingGetsItsOwnAndMovesAlone"
AVOID = "ASmallerUnitIsPlacedWhereItCutsNoCachedMapping"
AWAY = "ANewUnitIsPlacedAwayFromARetiredMappingStillInUse"
REMOVED = "RemovingAFencedStreamKeepsItsQueuedWorkBeforeLaterMoves"
HANDED_OVER = "AnUnmapHandedOverWithNoStreamFencedStaysDoneWhenOneIsFencedAgain"
AWAY_ALL = "ANewUnitAvoidsRetiredMappingsInEveryBestFit"
STEAL = "DefragmentationTakesACachedMappingWhole"
RUN_POOL = SRC / "engine/run_pool.cc"
AHEAD = "HostMemoryMadeAheadServesEvictionsOfAnySizeWithoutMakingMore"
HOST_PART = "PartOfAHostRunMadeAheadIsOneMappingAtItsOffset"
NOT_AHEAD = "HostMemoryIsMadeAtEvictionWhereItCannotBeMadeAhead"
IN_PART = "HostMemoryMadeAheadInPartIsReleasedWhole"
OWN_EPOCH = "AUnitUnpinnedBeforeAMoveMovesWithoutWaitingForKernelsQueuedAfterIt"
ONE_PIECE = "OnADriverThatMapsWholeHandlesATensorIsOnePieceFromTheFirstEvictionOn"
NOT_CUT = "DeviceMemoryARetiredMappingStillUsesIsNotCutAgain"
NOT_RELEASABLE = "MemoryARetiredMappingStillUsesIsNotReleasableUntilItsKernelIsDone"
OWN_COPIES = "AReleaseWaitsForTheCopiesOfItsOwnMemoryOnly"
HOST_RELEASE = "AHostRunIsReleasedOnlyAfterThePageInCopyStillReadingIt"
UNMAPPED = "AnEvictionLeftUnmappedRetiresTheMappingAKernelStillWrites"
RING = "AReleaseOfATicketTheRingNoLongerHoldsWaitsThroughItsOldest"
BROKEN_RELEASE = "AReleaseThatCannotWaitForItsCopyReleasesNothingAndKeepsItsPiece"
UNMAPPER = SRC / "backends/unmap_thread.cc"
UNMAP_THREAD = "AFreedMappingIsUnmappedOnTheUnmapThreadAndAMapThereWaitsForIt"
HELD = "HandedOverUnmapsWaitUntilTheCallersNextMapIsMade"
FREED_DEFERRED = "FreeingATensorWhoseEvictionWaitsForAKernelDoesNotWaitForIt"
FREED_UNMAPPED = "FreeingATensorEvictedUnmappedUnderAKernelDoesNotWaitForIt"
RING_WRAP = "AWaitForAnEpochTheRingNoLongerHoldsWaitsThroughTheOldestAfterIt"
HELD_COPY = "AHostRunWhoseLastCopyWaitsForAKernelIsNotReleased"
LIMITS = "A141GiBDeviceAndA512GiBHostBudgetAreUsedToTheirLimits"
# As a mutation's tests that may also fail: any test may (a race).
ANY = frozenset({"*"})
MAP_FAILED_BATCH = "AnEvictionsHostMapThatFailedIsMadeAtTheNextRemapBatch"
MAP_FAILED_NEEDED = "AnEvictionsHostMapThatFailedIsMadeWhereItIsNeededOrDropped"
BEFORE_FENCE = "AUnitUsedBeforeAnyStreamWasFencedMovesWithoutWaitingForOneFencedSince"
# The model-based random test of the stream protocol may fail under any
# mutation: it catches what a mutation breaks only where its seeds reach it.
FUZZ = "RandomMovesUnderQueuedKernelsAndFailedMapsLoseNoByte"

# name -> (source, text to find, replacement, tests that must fail)
MUTATIONS = {
    # A run of a piece mapped from the piece's start, not its offset (Note
    # [Device memory in runs]; a part of a host run, Note [Host memory made
    # ahead]): a tensor sees another's bytes.
    "device-run-mapped-at-offset-zero": (
        MEMORY, "size_t{first_id - piece} * granule_,", "0, /* MUTATION */",
        {RUNS, COPY, RECLAIM, PIN_ALL, EVICTION, IN_PLACE, PEER, HOST_PART, AHEAD, OWN_EPOCH,
         UNMAPPED, LIMITS, MAP_FAILED_BATCH, MAP_FAILED_NEEDED, BEFORE_FENCE}),
    # Host memory made ahead is not made (Note [Host memory made ahead]):
    # the first evictions make it.
    "made-ahead-not-made": (
        MEMORY, "  return EnsureGranules(pool, firsts.data(), firsts.size());",
        "  return Status::Ok();  // MUTATION", {AHEAD, HOST_PART, NOT_AHEAD, IN_PART}),
    # Parts of a host run given back stay apart: a unit as large as the run
    # gets several mappings, and in time memory is made again.
    "host-parts-not-merged": (
        RUN_POOL, "    if (splits_) {\n      const GranuleId run = run_start_[start];",
        "    if (false) {  // MUTATION\n      const GranuleId run = run_start_[start];",
        {AHEAD}),
    # A new unit shares a cached mapping with the free slots beside it (Note
    # [Mappings within a unit]): its eviction would have to cut the mapping.
    "cached-mapping-not-trimmed": (
        RECLAIM_SRC, "    if (*from < first || *from + *count > first + n) return true;",
        "    // MUTATION", {TRIM, AVOID}),
    # A new unit placed on a retired mapping still in use: its Map waits on
    # the host for the kernel still writing the freed range.
    "placed-on-a-retired-mapping": (
        STREAMS, "  if (retired_.empty() || !AnyRetired(address, count)) return true;",
        "  return true;  // MUTATION",
        {AWAY, AWAY_ALL, HANDED_OVER, FREED_DEFERRED, FREED_UNMAPPED}),
    # When every best fit tried holds a retired mapping still in use, the
    # far end of the largest free range is not tried: the Map waits.
    "far-end-not-tried": (
        RECLAIM_SRC, "  if (placed == kNoChunk && waits) {",
        "  if (false) {  // MUTATION", {AWAY_ALL}),
    # Defragmentation takes as many cached granules as it needs, cutting a
    # mapping.
    "cached-mapping-stolen-in-part": (
        RECLAIM_SRC,
        "    if (!UncacheMapping(from, count).ok()) break;\n    stolen += count;",
        "    if (!UncacheMapping(from + count - 1, 1).ok()) break;  // MUTATION\n"
        "    stolen += 1;",
        {STEAL, PAGE_IN_FREED, UNMAPPED, AWAY}),
    # The copy stream never waits for a unit's last use (Note [Epochs of
    # use]): an eviction copies before the kernel queued before the unpin
    # has written, a page-in before TensorFlow's copy into a born-evicted
    # tensor.
    "no-last-use-wait-before-copies": (
        STREAMS, "Status CudaBackend::CopyStreamAfter(uint64_t mark) {\n",
        "Status CudaBackend::CopyStreamAfter(uint64_t mark) {\n  return Status::Ok();  // MUTATION\n",
        {EVICTION, RECLAIM, PAGE_IN_FREED, PAGE_IN_QUEUED, IN_PLACE, NOT_CUT, UNMAPPED,
         HELD_COPY, MAP_FAILED_BATCH, MAP_FAILED_NEEDED},
        # Their page-ins (and the copy's eviction) go into memory whose
        # eviction was deferred, or not, as the fake's workers happen to be
        # ahead of the poll: they fail when it was.
        {PIN_ALL, COPY}),
    # Note [Device pieces cut to units]: the engine's device pool keeps
    # cutting single granules after its first eviction.
    "device-pieces-never-cut": (
        RECLAIM_SRC, "  device_pool_.CutUnits();  // Note [Device pieces cut to units]\n",
        "  // MUTATION\n", {ONE_PIECE, NOT_CUT}),
    # Memory a retired mapping still in use holds is releasable: its release
    # waits on the host for the kernel queued on it. (A stretch an evicted
    # tensor's retired mapping holds is still not cut: the eviction's copy
    # waits for the same kernel, release-ignores-the-copys-epoch.)
    "stretch-held-by-a-retired-mapping-cut": (
        MEMORY, "    if (!EpochDoneAfterPoll(r.mark, polled)) return false;\n",
        "    // MUTATION\n", {NOT_RELEASABLE}),
    # Note [Copy tickets]: a release does not wait for the copies of its
    # memory still in flight (cuMemUnmap and cuMemRelease under a copy).
    "release-ignores-its-copies": (
        MEMORY, "  if (!WaitForCopyTicket(LastCopyTicket(pool, runs, count)).ok()) return;\n",
        "  // MUTATION\n", {OWN_COPIES, HOST_RELEASE, RING, BROKEN_RELEASE},
        # Their cuts release memory an eviction's copy may still read, as
        # the fake's workers happen to be behind: they fail when it was.
        {ONE_PIECE, NOT_CUT}),
    # A release waits for every copy in flight, its memory's or not.
    "release-waits-for-every-copy": (
        MEMORY, "  if (!WaitForCopyTicket(LastCopyTicket(pool, runs, count)).ok()) return;\n",
        "  if (!HostWait().ok()) return;  // MUTATION\n", {OWN_COPIES, RING}),
    # A ticket no event ends yet (its copies still being issued) is taken
    # for done: memory a copy still reads is released.
    "open-ticket-taken-as-done": (
        STREAMS, "  if (ticket > copy_recorded_) return false;  // open: no event ends it yet\n",
        "  // MUTATION\n", {OWN_COPIES}),
    # A remap batch leaves the open epoch open: a unit unpinned before a move
    # waits for every kernel queued until its own eviction (Note [Epochs of
    # use]); the ring test's mark, which its batches never close, is closed
    # by the wait, after both kernels.
    "open-epoch-left-open-by-a-batch": (
        STREAMS, "  if (!fenced_.empty() && open_epoch_marked_.load(std::memory_order_relaxed)) {\n",
        "  if (false) {  // MUTATION\n", {OWN_EPOCH, RING_WRAP}),
    # The engine never notes a kernel's unpin as a use: the eviction of what
    # it wrote waits only for the unit's birth.
    "unpin-not-a-use": (
        ENGINE, "  NoteUse(c);  // the kernel queued its work on the unit before it let go\n",
        "  // MUTATION\n", {EVICTION, RECLAIM, COPY, IN_PLACE, UNMAPPED, FREED_DEFERRED,
                           FREED_UNMAPPED, HELD_COPY, MAP_FAILED_BATCH, MAP_FAILED_NEEDED}),
    # A batch's victims ordered by the first victim's last use, not the latest.
    "batch-mark-of-one-victim": (
        RECLAIM_SRC, "  for (const Victim& v : batch) mark = std::max(mark, UseMark(v.id));\n",
        "  if (!batch.empty()) mark = UseMark(batch.front().id);  // MUTATION\n", {RECLAIM}),
    # Retired mappings unmapped whatever their epoch: under the work still
    # queued on them.
    "retired-unmapped-at-once": (
        STREAMS,
        "    if (r.unmap_ticket == 0 && EpochDone(r.mark) &&\n"
        "        (in_the_way(r) || unmapper_ == nullptr || AnyPending(r.address, r.granules))) {\n",
        "    if (r.unmap_ticket == 0) {  // MUTATION\n",
        {FREE, DEFRAG, EVICTION, RECLAIM, COPY, PAGE_IN_FREED, AWAY_ALL, UNMAPPED,
         FREED_DEFERRED, FREED_UNMAPPED, HELD_COPY}),
    # The unmap thread (Note [Unmaps on a thread of their own]) handed
    # retired mappings whatever their epoch: it unmaps under queued work.
    "unmap-thread-ignores-the-epoch": (
        STREAMS,
        "    if (r.unmap_ticket != 0 || !EpochDone(r.mark) || AnyPending(r.address, r.granules)) {",
        "    if (r.unmap_ticket != 0 || AnyPending(r.address, r.granules)) {  // MUTATION",
        {DEFRAG, PAGE_IN_FREED, FREED_DEFERRED, FREED_UNMAPPED, HELD_COPY},
        # Held until the next map, their unmaps race the kernels they hit.
        {FREE, EVICTION, RECLAIM, COPY, AWAY_ALL, UNMAPPED}),
    # A map at a slot whose unmap the thread has not made yet does not wait
    # for it: cuMemMap over a mapped range.
    "map-ignores-an-unmap-in-flight": (
        STREAMS, "    if (in_the_way(r)) ticket = std::max(ticket, r.unmap_ticket);",
        "    // MUTATION", {UNMAP_THREAD},
        # Any map at a slot whose unmap the thread has been released to make
        # fails when it overtakes that unmap: which do depends on the run.
        ANY),
    # Unmaps handed over are made at once, not after the caller's next map:
    # that map waits behind them in the driver.
    "unmaps-not-held": (
        UNMAPPER, "      queue_.push_back(request);  // the thread is woken by a release\n",
        "      queue_.push_back(request);  // MUTATION\n"
        "      released_through_ = request.ticket;\n      queued_cv_.notify_one();\n",
        {UNMAP_THREAD, HELD}),
    # A free of a tensor whose eviction's device mapping is still retired
    # (its last kernel queued) takes that mapping as done: unmapped under
    # the kernel still writing it.
    "freed-eviction-unmapped-at-once": (
        MEMORY, "  const bool polled = !retired_.empty();\n  LMS_RETURN_IF_ERROR(UnmapRetired());\n",
        "  const bool polled = !retired_.empty();\n"
        "  for (Retired& r : retired_) {  // MUTATION\n"
        "    if (Overlaps(r, address, count)) r.mark = 0;\n"
        "  }\n"
        "  LMS_RETURN_IF_ERROR(UnmapRetired());\n",
        {FREED_DEFERRED, FREED_UNMAPPED, HELD_COPY},
        # It frees a tensor just evicted (CompleteAnEpoch): caught when the
        # unmap thread unmaps it before the work its epoch covers has run.
        {PEER}),
    # A free run whose last copy waits on the GPU for a kernel (an eviction
    # copy after its unit's last use, the unit freed) is released as if it
    # waited for copies only: the host waits for that kernel.
    "release-ignores-the-copys-epoch": (
        MEMORY, "  if (after != 0) {\n", "  if (false && after != 0) {  // MUTATION\n",
        {HELD_COPY}),
    # The epoch the copy stream waited for is not kept with a ticket's
    # event: the same release, once the ticket's event is recorded.
    "ticket-forgets-the-copys-epoch": (
        STREAMS, "copy_event_after_[copy_ticket_ % kCopyRing] = copy_stream_after_;",
        "copy_event_after_[copy_ticket_ % kCopyRing] = 0;  // MUTATION",
        {HELD_COPY}),
    # Past the epoch ring's end, a wait takes whatever newer epoch holds
    # its mark's slot: the host waits for kernels queued long after the mark.
    "ring-wrap-takes-the-marks-slot": (
        STREAMS, "  if (ring_epoch_[*slot] != mark || mark == 0) *slot = OldestHeldFrom(mark);",
        "  if (ring_epoch_[*slot] == 0) *slot = OldestHeldFrom(mark);  // MUTATION",
        {RING_WRAP}),
    # A fenced stream is unregistered without waiting for its queued work:
    # marks taken while it was fenced then read done, and an eviction copies
    # (and unmaps) under a kernel it queued.
    "removed-stream-not-waited-for": (
        STREAMS, "      if (in_stream_context.status().ok()) driver_->cuStreamSynchronize(stream);\n",
        "      (void)in_stream_context;  // MUTATION\n", {REMOVED}),
    # A copy into a granule whose retired mapping still has queued work does
    # not wait for it: the page-in lands before the freed buffer's kernel.
    "copies-ignore-retired": (
        STREAMS, "  return mark > epoch_done_ ? CopyStreamAfter(mark) : Status::Ok();",
        "  return Status::Ok();  // MUTATION", {PAGE_IN_FREED}),
    # The host's own copy into such a granule does not wait either.
    "host-copy-ignores-retired": (
        MEMORY, "    if (!EpochDone(busy)) LMS_RETURN_IF_ERROR(HostWaitForEpoch(busy));\n",
        "    // MUTATION\n", {DEFRAG}),
    # A refused pin's unit left with its eviction's remap pending: the kernel
    # reading it in place reads the device memory it gave back.
    "refused-pin-not-settled": (
        ENGINE, "        backend_->SettleMapping(SlotAddress(arena_.chunk(c).start), r.granules);",
        "        Status::Ok();  // MUTATION", {IN_PLACE}),
    # The fenced streams never wait for a remap batch's copies: the pinning
    # kernel reads the device granules before a page-in's bytes land, and
    # the kernel that gets an eviction's device granules writes them before
    # its copy has read them.
    "batch-without-stream-wait": (
        STREAMS, "driver_->cuStreamWaitEvent(fenced.stream, done, 0)",
        "cu::CUDA_SUCCESS /* MUTATION */",
        {PAGE_IN_READ, EVICTION_IN_FLIGHT, PIN_ALL, PEER, IN_PLACE},
        # Its page-ins race the copies the mutation leaves unordered: it
        # fails when a kernel's read overtakes one (most runs, not all).
        {NO_P2P}),
    # A stream fenced after an eviction never waits for its copy.
    "late-stream-not-ordered": (
        STREAMS, "driver_->cuStreamWaitEvent(stream, queued, 0)",
        "cu::CUDA_SUCCESS /* MUTATION */", {LATE_STREAM}),
    # A remap batch remaps without waiting for the last uses of what it
    # remaps: cuMemUnmap under a running kernel or copy.
    # A page-in remaps without waiting for its unit's last use: the host
    # mapping goes under TensorFlow's copy still writing it.
    "batch-without-host-wait": (
        MEMORY, "    LMS_RETURN_IF_ERROR(HostWaitForEpoch(batch_mark_));\n",
        "    // MUTATION\n", {PAGE_IN_QUEUED, RING_WRAP}),
    # An eviction that leaves the address unmapped (Note [Evicted tensors
    # unmapped]) unmaps at once, not after the unit's last use: cuMemUnmap
    # under the kernel still writing it.
    "unmapped-eviction-ignores-last-use": (
        RECLAIM_SRC, "            : UnmapEvicted(v.id, v.host.data(), mark);\n",
        "            : UnmapEvicted(v.id, v.host.data(), 0);  // MUTATION\n",
        {UNMAPPED, FREED_UNMAPPED}),
    # An eviction's old device mapping retired as if its epoch were done.
    "eviction-retired-as-done": (
        STREAMS, "Retire(at, length, batch_mark_)", "Retire(at, length, 0) /* MUTATION */",
        # (Its device memory is still not cut: the eviction's copy waits for
        # the same kernel.)
        {EVICTION, RECLAIM, COPY, IN_PLACE, FREED_DEFERRED, HELD_COPY}),
    # A stream fenced where none was leaves the open epoch open, though it
    # counts every mark so far as done (Note [Epochs of use]): a mark taken
    # after the fence reads as done before the stream's kernel has run.
    "first-fence-keeps-the-epoch-open": (
        STREAMS, "    done_before_fence_ = epoch_;\n    ++epoch_;\n",
        "    done_before_fence_ = epoch_;  // MUTATION\n",
        {AWAY, AWAY_ALL, PAGE_IN_QUEUED, RING_WRAP, HANDED_OVER, DEFRAG, NOT_CUT,
         NOT_RELEASABLE}),
    # A fenced stream's event made in this device's context, not the
    # stream's: cuEventRecord fails on another GPU's stream (Note [Access to
    # mapped memory]).
    "fence-event-in-the-backends-context": (
        STREAMS,
        "ScopedCudaContext in_stream_context(*driver_, stream_context);\n"
        "  LMS_RETURN_IF_ERROR(in_stream_context.status());",
        "ScopedCudaContext in_stream_context(*driver_, context_);  // MUTATION\n"
        "  LMS_RETURN_IF_ERROR(in_stream_context.status());",
        # (The test without P2P fences another GPU's stream only after its
        # tensors' last uses: since a first fence ends the open epoch, no
        # move of them records an event on it.)
        {OTHER_GPU_STREAM, PEER}),
    # Host memory taken at the first location the attributes allow, without
    # creating any (Note [Where host memory is made]).
    "host-location-not-probed": (
        SETUP, "      r = d.cuMemCreate(&h, granule, &prop, 0);\n",
        "      r = cu::CUDA_SUCCESS;  // MUTATION\n", {HOST_LOCATION, *NO_PROBE}),
    # The process's host budget the largest GPU's share again, not their sum.
    "host-budget-largest-share": (
        BUDGET, "    limit_ += bytes;\n",
        "    limit_ = std::max(limit_, bytes);  // MUTATION\n",
        {"EachGpuEvictsItsShareOfOneHostBudget"}),
    # New pieces granted one by one again, though they adjoin in the window.
    "pieces-granted-one-by-one": (
        MEMORY, "if (!made.empty() && first != end) break;",
        "if (!made.empty()) break;  // MUTATION", {"AHostRunIsOnePieceMadeMappedAndReleasedWhole"}),
    # A Map naming part of a host run let through to the driver.
    "part-of-a-run-mapped": (
        MEMORY, "if (!whole) {", "if (false) {  // MUTATION",
        {"AHostRunIsOnePieceMadeMappedAndReleasedWhole", BROKEN_RELEASE}),
    # Peers never granted: a peer GPU's copy into an LMS tensor faults. (The
    # peer test fences the peer's stream, so the fence mutations fail it too.)
    "peers-not-granted": (
        SETUP, "    access_.push_back({{cu::CU_MEM_LOCATION_TYPE_DEVICE, device}, rw});\n",
        "    // MUTATION\n", {PEER, NO_P2P}),
    # Every peer TensorFlow names granted, whether or not it can reach this
    # GPU: cuMemSetAccess refuses the pair, so every Map fails.
    "peers-not-filtered": (
        SETUP, "    if (can_access == 0) {\n", "    if (false) {  // MUTATION\n",
        {NO_P2P}),
}


TEST_SOURCE = Path("tests/cc/cuda_backend_test.cc")
# TEST(name) and TEST_F(fixture, name), in the order the binary runs them.
TEST_NAME = re.compile(r"^TEST(?:_F)?\((?:\w+,\s*)?(\w+)\)", re.M)


def reported(lines: list[str]) -> dict[str, bool]:
    """Each test the harness reported in `lines`, and whether it failed."""
    return {line[7:].strip(): line.startswith("[FAIL]") for line in lines
            if line.startswith(("[ OK ] ", "[FAIL] "))}


def run_tests(binary: Path, fake: str) -> tuple[set[str], list[str]]:
    """The tests of `binary` that fail over the fake driver, and their output.

    A test that crashes the process (a mutation may make the backend
    dereference what it freed) fails, and every test after it runs again in a
    process of its own, so that none is left out. Example:
        failed, lines = run_tests(Path("build/mutation/cuda_backend_test_x"), fake)
    """
    env = {**os.environ, "TF_LMS_CUDA_DRIVER_PATH": fake}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(binary), *args], capture_output=True, text=True,
                              timeout=300, env=env)

    first = run()
    lines = first.stdout.splitlines()
    results = reported(lines)
    if first.returncode in (0, 1) and any(" passed, " in line for line in lines):
        return {name for name, bad in results.items() if bad}, lines
    rest = [name for name in TEST_NAME.findall(TEST_SOURCE.read_text())
            if name not in results]
    for k, name in enumerate(rest):
        if k == 0:
            code = first.returncode  # the test running when the process ended
        else:
            alone = run(name)  # a substring filter: only `name`'s result counts
            alone_lines = alone.stdout.splitlines()
            lines += [line for line in alone_lines
                      if not line.startswith(("[ OK ] ", "[FAIL] ")) or
                      line[7:].strip() == name]
            code = alone.returncode
            verdicts = reported(alone_lines)
            if name in verdicts:
                results[name] = verdicts[name]
                continue
        results[name] = True
        lines.append(f"[FAIL] {name} (the test process ended with exit {code})")
    return {name for name, bad in results.items() if bad}, lines


def main() -> int:
    build, cxx, fake = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    only = set(sys.argv[4:]) or set(MUTATIONS)
    unknown = only - set(MUTATIONS)
    if unknown:
        print(f"no such mutation: {', '.join(sorted(unknown))}; known: {', '.join(MUTATIONS)}")
        return 2
    build.mkdir(parents=True, exist_ok=True)
    engine = [str(p) for p in sorted((SRC / "engine").glob("*.cc"))]
    ok = True
    for name, (source, find, replace, must_fail, *rest) in MUTATIONS.items():
        if name not in only:
            continue
        may_fail = rest[0] if rest else set()
        original = source.read_text()
        if original.count(find) != 1:
            print(f"{name}: the text to mutate is not in {source} once; update this check")
            return 1
        sources = [p for p in engine + [str(q) for q in sorted((SRC / "backends").glob("*.cc"))]
                   if p != str(source)]
        includes = [f"-I{SRC}"]
        if source.suffix == ".h":
            # A header: its mutated copy found first by every includer.
            root = build / f"mutated_{name}"
            mutated = root / source.relative_to(SRC)
            mutated.parent.mkdir(parents=True, exist_ok=True)
            includes.insert(0, f"-I{root}")
        else:
            mutated = build / f"{source.stem}_{name}.cc"
            sources.append(str(mutated))
        mutated.write_text(original.replace(find, replace))
        binary = build / f"cuda_backend_test_{name}"
        subprocess.run([cxx, "-std=c++17", "-O1", "-g", *includes, "-Itests/cc", "-Itests",
                        "-pthread", *sources, "tests/cc/cuda_backend_test.cc",
                        "-ldl", "-o", str(binary)], check=True)
        failed, lines = run_tests(binary, fake)
        expected = must_fail <= failed and (may_fail is ANY or
                                            failed <= must_fail | may_fail | {FUZZ})
        verdict = "as expected" if expected else "NOT AS EXPECTED"
        ok &= expected
        print(f"== mutation {name}: failed {sorted(failed)} ({verdict}; "
              f"expected {sorted(must_fail)}" +
              (f", maybe also {sorted(may_fail)})" if may_fail else ")"))
        # Failed expectations and the fake's violations, not the passing noise.
        for line in lines:
            if not line.startswith("[ OK ]") and "message:" not in line and \
                    not line.startswith("  driver ") and "passed," not in line:
                print("   ", line[:300])
        print("   ", f"{len(failed)} failed")
    print("mutation check:", "PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
