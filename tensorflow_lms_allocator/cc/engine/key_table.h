// KeyTable<Entry>: a hash table from nonzero 64-bit keys to entries that
// never move, for the learned policy's keys (learned_policy.h).
//
// Note [A flat key table]
// =======================
// The learned policy finds a key's entry at every unit's birth (HoldKey),
// and with 100,000 units a step makes 100,000 keys and more, so the lookup
// is a cache miss per memory access it makes. std::unordered_map makes
// three: the bucket, the node before the bucket's first (libstdc++ keeps a
// bucket as a pointer to its predecessor) and the node itself; at 100,000
// units HoldKey was 8% of `make bench-scale`'s step, against 1.6% at 1,000.
// Here the keys sit in one flat array, open addressed with linear probing
// at most half full, each beside a pointer to its entry: a lookup reads one
// line (two at a run's edge) and compares keys there, and only the caller's
// use of the entry touches it. Erasing shifts the run's later keys back
// (no tombstones), so a run stays as short as its keys' collisions make it.
//
// Entries live in slots of a std::deque, whose elements keep their address
// as it grows: a unit holds a pointer to its key's entry for its whole life.
// An erased slot's entry is reset at once (what it held, a vector of
// periods, is freed), and the next insertion reuses the slot. Slots are
// numbered 0..slots() - 1 for good, which is what a CLOCK hand goes round
// (Note [Forgetting keys]): growing the array of keys moves keys, never a
// slot.
//
// Key 0 marks an empty place: it is never a key (LearnedPolicy::kNoKey).
//
// Example:
//   KeyTable<int> t;
//   *t.Insert(42) = 7;
//   int* e = t.Find(42);  // 7; Find(43) is null
//   t.Erase(0);           // slot 0, the first made, holds 42
//
// Thread-compatible: the engine's lock guards every call.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_KEY_TABLE_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_KEY_TABLE_H_

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

namespace lms {

template <typename Entry>
class KeyTable {
 public:
  static constexpr size_t kFirstPlaces = 64;

  KeyTable() = default;
  KeyTable(const KeyTable&) = delete;
  KeyTable& operator=(const KeyTable&) = delete;

  size_t size() const { return size_; }

  // `key`'s entry, or null if it has none.
  Entry* Find(uint64_t key) {
    assert(key != 0);
    if (places_.empty()) return nullptr;
    for (size_t at = Home(key);; at = (at + 1) & mask()) {
      const Place& p = places_[at];
      if (p.key == key) return &p.slot->entry;
      if (p.key == 0) return nullptr;
    }
  }

  // A new entry for `key`, which has none, value-initialized.
  Entry* Insert(uint64_t key) {
    assert(key != 0);
    assert(Find(key) == nullptr);
    if (2 * (size_ + 1) > places_.size()) Grow();
    Slot* slot;
    if (!free_.empty()) {
      slot = &slots_[free_.back()];
      free_.pop_back();
    } else {
      slot = &slots_.emplace_back();
    }
    slot->key = key;
    Put(key, slot);
    ++size_;
    return &slot->entry;
  }

  // Slots, by number: the entry of slot `i` and its key (0: the slot is
  // free). A slot keeps its number and its entry's address until erased.
  size_t slots() const { return slots_.size(); }
  uint64_t key_at(size_t i) const { return slots_[i].key; }
  Entry& entry_at(size_t i) { return slots_[i].entry; }

  // Erases slot `i`'s key (it holds one), resetting its entry.
  void Erase(size_t i) {
    Slot& slot = slots_[i];
    assert(slot.key != 0);
    size_t hole = Home(slot.key);
    while (places_[hole].key != slot.key) hole = (hole + 1) & mask();
    // Shift back each later key of the run that may sit at the hole: one
    // whose home is not cyclically in (hole, at].
    for (size_t at = (hole + 1) & mask(); places_[at].key != 0; at = (at + 1) & mask()) {
      const size_t home = Home(places_[at].key);
      if (((at - home) & mask()) >= ((at - hole) & mask())) {
        places_[hole] = places_[at];
        hole = at;
      }
    }
    places_[hole] = Place();
    slot.key = 0;
    slot.entry = Entry();
    free_.push_back(static_cast<uint32_t>(i));
    --size_;
  }

 private:
  struct Slot {
    Entry entry{};
    uint64_t key = 0;  // 0: free
  };
  struct Place {
    uint64_t key = 0;  // 0: empty
    Slot* slot = nullptr;
  };

  size_t mask() const { return places_.size() - 1; }
  // Where `key`'s run starts: its top bits after a multiplication by 2^64
  // over the golden ratio, so keys that differ only in a few bits spread.
  size_t Home(uint64_t key) const {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  void Put(uint64_t key, Slot* slot) {
    size_t at = Home(key);
    while (places_[at].key != 0) at = (at + 1) & mask();
    places_[at] = {key, slot};
  }
  // Doubles the places (kFirstPlaces at first), placing every key anew.
  void Grow() {
    std::vector<Place> old;
    old.swap(places_);
    const size_t n = old.empty() ? kFirstPlaces : 2 * old.size();
    places_.assign(n, Place());
    shift_ = 64 - static_cast<int>(__builtin_ctzll(n));
    for (const Place& p : old) {
      if (p.key != 0) Put(p.key, p.slot);
    }
  }

  std::vector<Place> places_;  // a power of two, at most half full; or none
  int shift_ = 64;
  std::deque<Slot> slots_;
  std::vector<uint32_t> free_;  // free slots, by number
  size_t size_ = 0;
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_KEY_TABLE_H_
