// Engine::CheckInvariants: every accounting equation of the engine,
// recomputed from the arena, the backing map and the residency records.
//
//   device pool in use  == granules of resident units + cached granules +
//                          stranded granules
//   cached granules     == device-mapped slots no unit covers (cached iff free)
//   host pool in use    == granules of evicted units + stranded granules
//   LRU granules        == granules of resident unpinned units with nothing
//                          unclaimed and not moving
//   bytes_unclaimed     == unclaimed large allocations' granules + unclaimed
//                          objects' bytes; a unit's unclaimed count == its
//                          unclaimed allocations
//   unclaimed resident granules == granules of resident units with something
//                          unclaimed
//   bytes_in_use        == large allocations' granules + pages' object bytes
//   bytes_active        == the part of bytes_in_use in pinned units
//   bytes_active + bytes_inactive == bytes_in_use
//   HeldBytes()         == bytes_active + unclaimed resident granules
//                          (published under the lock wherever either changes)
//   current_bytes_reclaimed == evicted units' granules
//   host_bytes_in_use   == host pool in use
//   bytes_reserved      == device pool in use
//   every peak          >= its counter (a free refreshes no peak)
//   each page: objects and bytes == the allocated chunks of its segment;
//              available for new objects iff resident; empty only if pinned
//   pin counts          < 2^31 (an unsigned count that wrapped went negative)
//   strict mode: a settled evicted unit is watched iff it has no pin and
//              nothing unclaimed (Note [Strict access follows holders])
//   a live unit's slots map its granules, all of them; an evicted one's may
//              map nothing only as Note [Evicted tensors unmapped] says
#include <cstdio>
#include <cstdlib>
#include <string>

#include "engine/engine.h"

namespace lms {
namespace {

Status Broken(const std::string& what) {
  return Internal("engine invariant broken: " + what);
}

std::string Eq(const char* what, int64_t got, int64_t want) {
  return std::string(what) + " is " + std::to_string(got) + ", expected " +
         std::to_string(want);
}

}  // namespace

Status Engine::CheckInvariants() const {
  MutexLock lock(mu_);
  return CheckInvariantsLocked();
}

#ifndef NDEBUG
void Engine::DebugCheckInvariants() const {
  const Status s = CheckInvariantsLocked();
  if (!s.ok()) {
    std::fprintf(stderr, "tensorflow_lms_allocator: %s\n", s.ToString().c_str());
    std::abort();
  }
}
#endif

Status Engine::CheckInvariantsLocked() const {
  uint64_t resident = 0, evicted = 0, lru = 0, cached = 0, pages = 0,
           resident_pages = 0, held = 0;
  int64_t in_use = 0, active = 0, unclaimed_bytes = 0;
  std::string bad;
  for (ChunkId c = arena_.FirstChunk(); c != kNoChunk && bad.empty();
       c = arena_.chunk(c).next) {
    const BestFitArena::Chunk& ch = arena_.chunk(c);
    if (ch.free) {
      for (uint64_t s = ch.start; s < ch.start + ch.size; ++s) {
        const BackingMap::Backing& b = backing_.at(s);
        if (b.mapped != backing_.IsCached(s) || (b.mapped && b.pool != PoolKind::kDevice)) {
          bad = "free slot " + std::to_string(s) + " is mapped but not cached, or cached "
                "but not device-mapped";
        }
        cached += b.mapped ? 1 : 0;
      }
      continue;
    }
    const ChunkId id = arena_.ChunkAt(ch.start);
    if (id == kNoChunk || !residency_.tracked(id)) {
      bad = "allocated chunk at slot " + std::to_string(ch.start) + " has no residency record";
      continue;
    }
    const Residency::Record& r = residency_.record(id);
    if (r.granules != ch.size) bad = Eq("a unit's granules", r.granules, ch.size);
    if (r.pin_count >= (1u << 31)) bad = "a pin count went below zero";
    if (r.move == Residency::Move::kPagingIn && (!r.evicted || r.pin_count == 0)) {
      bad = "a unit paging in is not evicted and pinned";
    }
    if (r.move == Residency::Move::kEvicting && r.evicted) bad = "an evicting unit is evicted";
    if (strict_ && r.evicted && r.move == Residency::Move::kNone &&
        strict_->Watched(ch.start) == Residency::Held(r)) {
      bad = "strict mode: an evicted unit at slot " + std::to_string(ch.start) +
            " is watched iff nobody holds it: not so";
    }
    if (r.in_lru != Residency::Evictable(r)) {
      bad = "a unit is on the LRU list iff it is resident, unpinned, not moving and has "
            "nothing unclaimed: not so at slot " + std::to_string(ch.start);
    }
    const PoolKind pool = r.evicted ? PoolKind::kHost : PoolKind::kDevice;
    // Note [Evicted tensors unmapped]: an evicted unit nobody may touch
    // where it is may map nothing at its address (a moving one too: its
    // remap follows its copies), all its slots alike, but still records its
    // host granules.
    const bool may_be_unmapped =
        r.evicted && (r.move != Residency::Move::kNone || !MapsEvictedAtAddress(id));
    for (uint64_t s = ch.start; s < ch.start + ch.size; ++s) {
      const BackingMap::Backing& b = backing_.at(s);
      if ((!b.mapped && !may_be_unmapped) || b.pool != pool || backing_.IsCached(s)) {
        bad = "slot " + std::to_string(s) + " of a live unit is not mapped from its pool";
      }
      if (b.mapped != backing_.at(ch.start).mapped) {
        bad = "a live unit maps some of its slots and not others, from slot " +
              std::to_string(s);
      }
    }
    (r.evicted ? evicted : resident) += ch.size;
    if (r.in_lru) lru += ch.size;
    if (Residency::HeldByWriter(r)) held += ch.size;
    int64_t bytes = static_cast<int64_t>(ch.size * granule_);
    if (r.segment != Residency::kNoSegment) {
      ++pages;
      resident_pages += r.evicted ? 0 : 1;
      const SmallPages::Page& page = small_.page(r.segment);
      uint32_t objects = 0, unclaimed = 0, kernel_objects = 0;
      int64_t object_bytes = 0;
      small_.ForEachObject(r.segment, [&](const BestFitArena::Chunk& object) {
        const int64_t b = static_cast<int64_t>(object.size * SmallPages::kUnit);
        ++objects;
        object_bytes += b;
        if (!object.made_by_writer) ++kernel_objects;
        if (object.unclaimed) {
          ++unclaimed;
          unclaimed_bytes += b;
        }
      });
      if (r.unclaimed != unclaimed) bad = Eq("a page's unclaimed count", r.unclaimed, unclaimed);
      if (page.unit != id) bad = "a page's table entry names another unit";
      if (page.objects != objects) bad = Eq("a page's object count", page.objects, objects);
      if (page.kernel_objects != kernel_objects) {
        bad = Eq("a page's count of objects made in kernels", page.kernel_objects,
                 kernel_objects);
      }
      if (page.bytes != object_bytes) bad = Eq("a page's bytes", page.bytes, object_bytes);
      for (int k = 0; k < SmallPages::kNumClasses; ++k) {
        if (k != page.size_class && (!small_.arena(k).SegmentEmpty(r.segment) ||
                                     small_.arena(k).segment_available(r.segment))) {
          bad = "a page's segment is used in another size class's arena";
        }
      }
      if (small_.arena_of(r.segment).segment_available(r.segment) == r.evicted) {
        bad = "a page is available to new objects iff resident: not so";
      }
      if (objects == 0 && r.pin_count == 0) bad = "an empty unpinned page was not released";
      bytes = page.bytes;
    } else {
      if (r.unclaimed > 1) bad = Eq("a large unit's unclaimed count", r.unclaimed, 1);
      if (r.unclaimed > 0) unclaimed_bytes += bytes;
    }
    in_use += bytes;
    if (r.pin_count > 0) active += bytes;
  }
  if (!bad.empty()) return Broken(bad);
  const int64_t g = static_cast<int64_t>(granule_);
  const struct {
    const char* what;
    int64_t got, want;
  } equations[] = {
      {"device granules in use", static_cast<int64_t>(device_pool_.in_use()),
       static_cast<int64_t>(resident + cached +
                            stranded_granules_[static_cast<int>(PoolKind::kDevice)] +
                            transit_granules_[static_cast<int>(PoolKind::kDevice)])},
      {"cached granules", static_cast<int64_t>(backing_.cached_count()),
       static_cast<int64_t>(cached)},
      {"host granules in use", static_cast<int64_t>(host_pool_.in_use()),
       static_cast<int64_t>(evicted +
                            stranded_granules_[static_cast<int>(PoolKind::kHost)] +
                            transit_granules_[static_cast<int>(PoolKind::kHost)])},
      {"LRU granules", static_cast<int64_t>(residency_.inactive_resident_granules()),
       static_cast<int64_t>(lru)},
      {"unclaimed resident granules",
       static_cast<int64_t>(residency_.unclaimed_resident_granules()),
       static_cast<int64_t>(held)},
      {"live pages", static_cast<int64_t>(small_.live_pages()), static_cast<int64_t>(pages)},
      {"resident pages", static_cast<int64_t>(small_.resident_pages()),
       static_cast<int64_t>(resident_pages)},
      {"bytes_in_use", stats_.bytes_in_use, in_use},
      {"bytes_active", stats_.bytes_active, active},
      {"bytes_inactive", stats_.bytes_inactive, in_use - active},
      {"bytes_unclaimed", stats_.bytes_unclaimed, unclaimed_bytes},
      {"HeldBytes()", publish_held_ ? held_bytes_.load(std::memory_order_relaxed) : 0,
       publish_held_ ? stats_.bytes_active + static_cast<int64_t>(held) * static_cast<int64_t>(g)
                     : 0},
      {"current_bytes_reclaimed", stats_.current_bytes_reclaimed,
       static_cast<int64_t>(evicted) * g},
      {"host_bytes_in_use", stats_.host_bytes_in_use,
       static_cast<int64_t>(host_pool_.in_use()) * g},
      {"bytes_reserved", stats_.bytes_reserved,
       static_cast<int64_t>(device_pool_.in_use()) * g},
  };
  for (const auto& e : equations) {
    if (e.got != e.want) return Broken(Eq(e.what, e.got, e.want));
  }
  const struct {
    const char* what;
    int64_t peak, current;
  } peaks[] = {
      {"peak_bytes_in_use", stats_.peak_bytes_in_use, stats_.bytes_in_use},
      {"peak_bytes_reserved", stats_.peak_bytes_reserved, stats_.bytes_reserved},
      {"peak_bytes_active", stats_.peak_bytes_active, stats_.bytes_active},
      {"peak_bytes_reclaimed", stats_.peak_bytes_reclaimed, stats_.current_bytes_reclaimed},
      {"host_peak_bytes_in_use", stats_.host_peak_bytes_in_use, stats_.host_bytes_in_use},
  };
  for (const auto& p : peaks) {
    if (p.peak < p.current) {
      return Broken(std::string(p.what) + " is " + std::to_string(p.peak) +
                    ", below the current " + std::to_string(p.current));
    }
  }
  return Status::Ok();
}

}  // namespace lms
