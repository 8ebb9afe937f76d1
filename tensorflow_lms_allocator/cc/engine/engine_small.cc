// Small objects: packing them into pages, freeing them, creating and
// releasing pages (Note [Residency units] in engine.h, small_pages.h).
//
// Invariants kept here:
//   - an object's bytes are counted active iff its page is pinned;
//   - a page's segment is available to new objects iff the page is resident;
//   - a page with no object is released as soon as nothing pins it.
#include <algorithm>
#include <string>

#include "engine/engine.h"

namespace lms {

void* Engine::AllocateSmall(size_t bytes, Hold hold, bool optional, Status* status,
                            uint64_t* unit_id) {
  const bool pin = hold == Hold::kPin;
  const bool writer = hold == Hold::kWriter;
  int size_class = small_.ClassOf(bytes, writer);
  const uint64_t units = (bytes + SmallPages::kUnit - 1) / SmallPages::kUnit;
  ChunkId o = PlaceObject(size_class, units, writer, /*anywhere=*/false);
  if (o == kNoChunk && size_class == SmallPages::kKernelClass) {
    // The room left in writers' pages (Note [Writer pages]).
    o = PlaceObject(SmallPages::kWriterClass, units, writer, /*anywhere=*/false);
    if (o != kNoChunk) size_class = SmallPages::kWriterClass;
  }
  if (o == kNoChunk) {
    uint64_t segment = 0;
    *status = NewSmallPage(hold, size_class, &segment, optional);
    if (status->ok()) {
      // Placed in the new page, available or not (born evicted): room that
      // frees elsewhere while NewSmallPage evicts without the lock must not
      // leave the new page empty.
      o = small_.arena(size_class).AllocateInEmptySegment(segment, units);
    } else {
      // No page to be had: a resident page of another class with room takes
      // it (Note [Size classes]), a writer's object within the bound (Note
      // [Writer pages]).
      const int wanted = size_class;
      for (int k = 0; o == kNoChunk && k < SmallPages::kNumClasses; ++k) {
        if (k == wanted) continue;
        o = PlaceObject(k, units, writer, /*anywhere=*/true);
        if (o != kNoChunk) size_class = k;
      }
      if (o == kNoChunk) return nullptr;
      *status = Status::Ok();
    }
  }
  BestFitArena* arena = &small_.arena(size_class);
  BestFitArena::Chunk& object = arena->chunk(o);
  const uint64_t segment = arena->SegmentOf(object.start);
  SmallPages::Page& page = small_.page(segment);
  // Its user writes the object at once, maybe unpinned: an eviction of the
  // page copying meanwhile is abandoned (Note [Copies outside the lock]).
  residency_.AbandonEviction(page.unit);
  object.requested_bytes = bytes;
  object.allocation_id = next_allocation_id_++;
  object.unclaimed = writer;
  object.made_by_writer = writer;
  const int64_t allocated = static_cast<int64_t>(units * SmallPages::kUnit);
  ++page.objects;
  if (!writer) ++page.kernel_objects;
  page.bytes += allocated;
  stats_.bytes_in_use += allocated;
  (residency_.record(page.unit).pin_count > 0 ? stats_.bytes_active
                                              : stats_.bytes_inactive) += allocated;
  stats_.largest_alloc_size = std::max(stats_.largest_alloc_size, allocated);
  if (learning_) {
    learned_.ObjectBorn(page.unit, page.size_class, o,
                        LearnedPolicy::Key(StrictMonitor::ThreadLabel(), bytes,
                                           StrictMonitor::CountLabelledAllocation(bytes)),
                        pin);
  }
  // Recency is per page: a new object makes its page the most recently used.
  // One written outside any kernel keeps the page off the LRU list until it
  // is claimed (Note [Writers outside kernels]).
  if (pin) {
    PinUnit(page.unit);
  } else if (object.unclaimed) {
    residency_.AddUnclaimed(page.unit);
    stats_.bytes_unclaimed += allocated;
    FollowHolders(page.unit);  // a page born evicted for it
  } else {
    residency_.Touch(page.unit);
  }
  const BestFitArena::Chunk& unit = arena_.chunk(page.unit);
  *unit_id = unit.allocation_id;
  return reinterpret_cast<void*>(
      SlotAddress(unit.start) +
      (object.start - segment * small_.units_per_page()) * SmallPages::kUnit);
}

ChunkId Engine::PlaceObject(int size_class, uint64_t units, bool writer, bool anywhere) {
  BestFitArena& arena = small_.arena(size_class);
  const ChunkId o = arena.Allocate(units);
  if (o == kNoChunk || size_class == SmallPages::kTinyClass) return o;
  const SmallPages::Page& page = small_.page(arena.SegmentOf(arena.chunk(o).start));
  const bool holds_unclaimed = residency_.record(page.unit).unclaimed > 0;
  // Note [Writer pages].
  const bool fits = writer ? (anywhere || page.kernel_objects == 0) &&
                                 (holds_unclaimed || WriterMayEvict(1))
                           : anywhere || !holds_unclaimed;
  if (fits) return o;
  arena.Free(o);
  return kNoChunk;
}

ChunkId Engine::SmallObjectAt(ChunkId page, const void* ptr) const {
  const uintptr_t offset = reinterpret_cast<uintptr_t>(ptr) -
                           SlotAddress(arena_.chunk(page).start);
  if (offset % SmallPages::kUnit != 0) return kNoChunk;
  const uint64_t segment = residency_.record(page).segment;
  return small_.arena_of(segment).ChunkAt(segment * small_.units_per_page() +
                                          offset / SmallPages::kUnit);
}

std::vector<ByteRange> Engine::LiveRanges(ChunkId page) const {
  // Note [Live bytes only].
  const size_t gap = granule_ / kCopyGapsPerGranule;
  const uint64_t segment = residency_.record(page).segment;
  const uint64_t first = segment * small_.units_per_page();
  std::vector<ByteRange> ranges;
  small_.ForEachObject(segment, [&](const BestFitArena::Chunk& object) {
    const size_t offset = (object.start - first) * SmallPages::kUnit;
    const size_t end = offset + object.size * SmallPages::kUnit;
    if (!ranges.empty() && offset - (ranges.back().offset + ranges.back().bytes) < gap) {
      ranges.back().bytes = end - ranges.back().offset;
    } else {
      ranges.push_back(ByteRange{offset, end - offset});
    }
  });
  return ranges;
}

int64_t Engine::UnclaimedBytes(ChunkId id) const {
  const Residency::Record& r = residency_.record(id);
  if (r.unclaimed == 0) return 0;
  if (!residency_.IsPage(id)) return static_cast<int64_t>(r.granules * granule_);
  int64_t bytes = 0;
  small_.ForEachObject(r.segment, [&](const BestFitArena::Chunk& object) {
    if (object.unclaimed) bytes += static_cast<int64_t>(object.size * SmallPages::kUnit);
  });
  return bytes;
}

Engine::CopyPlan Engine::PlanCopy(ChunkId id) const {
  CopyPlan plan;
  if (!residency_.IsPage(id)) {
    plan.bytes = arena_.chunk(id).requested_bytes;
    return plan;
  }
  plan.ranges_only = true;
  plan.ranges = LiveRanges(id);
  for (const ByteRange& r : plan.ranges) plan.bytes += r.bytes;
  return plan;
}

Status Engine::CopyUnit(const CopyPlan& plan, PoolKind dst_pool, const GranuleId* dst,
                        PoolKind src_pool, const GranuleId* src) {
  if (!plan.ranges_only) return backend_->CopyGranules(dst_pool, dst, src_pool, src, plan.bytes);
  if (plan.ranges.empty()) return Status::Ok();
  return backend_->CopyRanges(dst_pool, dst[0], src_pool, src[0], plan.ranges.data(),
                              plan.ranges.size());
}

Status Engine::FreeSmall(ChunkId page_unit, const void* ptr) {
  const ChunkId o = SmallObjectAt(page_unit, ptr);
  if (o == kNoChunk) {
    return NotFound("free of " + FormatAddress(ptr) +
                    ": no live allocation starts there (never allocated, "
                    "or already freed)");
  }
  const Residency::Record& r = residency_.record(page_unit);
  SmallPages::Page& page = small_.page(r.segment);
  BestFitArena::Chunk& object = small_.arena_of(r.segment).chunk(o);
  const int64_t allocated = static_cast<int64_t>(object.size * SmallPages::kUnit);
  if (object.unclaimed) {
    object.unclaimed = false;
    NoteUse(page_unit);  // its writer queued its work before the free
    residency_.RemoveUnclaimed(page_unit);
    stats_.bytes_unclaimed -= allocated;
  }
  --page.objects;
  if (!object.made_by_writer) --page.kernel_objects;
  page.bytes -= allocated;
  stats_.bytes_in_use -= allocated;
  (r.pin_count > 0 ? stats_.bytes_active : stats_.bytes_inactive) -= allocated;
  if (learning_) learned_.ObjectReleased(page.size_class, o);
  small_.arena_of(r.segment).Free(o);
  if (page.objects == 0 && r.pin_count == 0) {
    ReleaseSmallPage(r.segment);
  } else {
    FollowHolders(page_unit);
  }
  return Status::Ok();
}

Status Engine::NewSmallPage(Hold hold, int size_class, uint64_t* segment,
                            bool optional) {
  // A page for a writer's object evicts nothing: it takes free device memory
  // or is born evicted (Note [Writer pages]); one for an optional request
  // evicts within its step's allowance (Note [Optional requests]).
  const bool may_evict = optional ? OptionalMayEvict(1) : hold != Hold::kWriter;
  if (may_evict && !optional) MakeRoomUnlocked(1);
  if (!small_.TakeSegment(segment)) {
    return ResourceExhausted("the small-object region has no room for another "
                             "page (" + std::to_string(small_.live_pages()) +
                             " pages of " + FormatBytes(granule_) + " live)");
  }
  Status s;
  // Tracked unheld: the object placed in it next holds it as `hold` says.
  const ChunkId c =
      optional && may_evict
          ? PlaceOptionalUnit(1, Hold::kNone, &s)
          : PlaceUnit(1, Hold::kNone, may_evict,
                      /*may_be_born_evicted=*/!optional && hold != Hold::kPin, &s);
  if (c == kNoChunk) {
    small_.ReturnSegment(*segment);
    return s;
  }
  BestFitArena::Chunk& unit = arena_.chunk(c);
  unit.requested_bytes = granule_;  // its extent; a move copies its objects only
  residency_.SetSegment(c, *segment);
  if (learning_) learned_.MarkPage(c);
  small_.page(*segment).unit = c;
  small_.page(*segment).size_class = size_class;
  if (!residency_.record(c).evicted) NoteResidencyChange(c, /*resident=*/true);
  return Status::Ok();
}

void Engine::ReleaseSmallPage(uint64_t segment) {
  const ChunkId c = small_.page(segment).unit;
  if (!residency_.record(c).evicted) NoteResidencyChange(c, /*resident=*/false);
  small_.ReturnSegment(segment);
  ReleaseUnit(c);
}

void Engine::NoteResidencyChange(ChunkId c, bool resident) {
  const uint64_t segment = residency_.record(c).segment;
  if (segment == Residency::kNoSegment) return;
  small_.arena_of(segment).SetSegmentAvailable(segment, resident);
  small_.AddResident(resident ? 1 : -1);
}

}  // namespace lms
