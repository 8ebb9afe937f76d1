// KeyTable (engine/key_table.h, Note [A flat key table]): it holds what a
// standard map holds under random insertions and erasures, its entries never
// move, an erased slot is reused with its entry reset, and its slots keep
// their numbers as it grows.
#include "engine/key_table.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <unordered_map>
#include <vector>

#include "harness.h"

namespace lms {
namespace {

TEST(AKeyTableHoldsWhatAStandardMapHoldsUnderRandomChanges) {
  KeyTable<uint64_t> table;
  std::unordered_map<uint64_t, uint64_t> model;       // key -> value
  std::unordered_map<uint64_t, uint64_t*> addresses;  // key -> its entry
  std::mt19937_64 rng(20261207);
  for (int step = 0; step < 200000; ++step) {
    // Few distinct keys, so runs collide, grow and shrink; a few large ones.
    const uint64_t key = rng() % 4 == 0 ? rng() | 1 : 1 + rng() % 3000;
    uint64_t* found = table.Find(key);
    ASSERT_TRUE((found != nullptr) == (model.count(key) == 1));
    if (found != nullptr) {
      EXPECT_EQ(*found, model[key]);
      EXPECT_TRUE(found == addresses[key]);  // it never moved
      if (rng() % 2 == 0) {
        size_t slot = 0;
        while (table.key_at(slot) != key) ++slot;
        EXPECT_TRUE(&table.entry_at(slot) == found);
        table.Erase(slot);
        model.erase(key);
        addresses.erase(key);
      } else {
        *found = rng();
        model[key] = *found;
      }
    } else {
      uint64_t* made = table.Insert(key);
      EXPECT_EQ(*made, uint64_t{0});  // value-initialized, also when reused
      *made = rng();
      model[key] = *made;
      addresses[key] = made;
    }
    ASSERT_TRUE(table.size() == model.size());
  }
  // Every key is found where it was made, and every live slot is one of them.
  size_t live = 0;
  for (size_t slot = 0; slot < table.slots(); ++slot) {
    const uint64_t key = table.key_at(slot);
    if (key == 0) continue;
    ++live;
    ASSERT_TRUE(model.count(key) == 1);
    EXPECT_TRUE(&table.entry_at(slot) == addresses[key]);
    EXPECT_EQ(table.entry_at(slot), model[key]);
  }
  EXPECT_TRUE(live == model.size());
  for (const auto& [key, value] : model) EXPECT_TRUE(table.Find(key) == addresses[key]);
}

TEST(AnErasedSlotIsReusedWithItsEntryResetAndOtherSlotsKeepTheirNumbers) {
  KeyTable<std::vector<uint64_t>> table;
  std::vector<uint64_t>* first = table.Insert(11);
  first->assign(100, 5);
  std::vector<uint64_t>* second = table.Insert(22);
  second->push_back(1);
  ASSERT_TRUE(table.slots() == 2);
  EXPECT_EQ(table.key_at(0), uint64_t{11});
  EXPECT_EQ(table.key_at(1), uint64_t{22});
  table.Erase(0);
  EXPECT_EQ(table.key_at(0), uint64_t{0});
  EXPECT_TRUE(table.entry_at(0).capacity() == 0);  // what it held is freed
  EXPECT_TRUE(table.Find(11) == nullptr);
  std::vector<uint64_t>* third = table.Insert(33);
  EXPECT_TRUE(third == first);  // the free slot, reused
  EXPECT_TRUE(third->empty());
  EXPECT_EQ(table.key_at(0), uint64_t{33});
  EXPECT_TRUE(table.slots() == 2);
  // Growing the places (many keys) moves no slot.
  for (uint64_t k = 100; k < 100 + 10 * KeyTable<int>::kFirstPlaces; ++k) table.Insert(k);
  EXPECT_TRUE(table.Find(22) == second);
  EXPECT_TRUE(table.Find(33) == third);
  EXPECT_EQ(table.key_at(1), uint64_t{22});
  EXPECT_EQ((*table.Find(22))[0], uint64_t{1});
}

TEST(KeysOfOneHomeFormARunThatSurvivesErasuresInAnyOrder) {
  // A key's home among 64 places is the top 6 bits of key * C (C the
  // table's odd multiplier), so the key j * C^-1 (mod 2^64) has home 0 and
  // (j + 63 * 2^58) * C^-1 home 63: runs that collide, wrap round the end
  // and mix, erased from the middle, the front and the back.
  uint64_t inverse = 0x9E3779B97F4A7C15ull;  // Newton's iteration mod 2^64
  for (int i = 0; i < 6; ++i) inverse *= 2 - 0x9E3779B97F4A7C15ull * inverse;
  ASSERT_TRUE(inverse * 0x9E3779B97F4A7C15ull == 1);
  for (int order = 0; order < 3; ++order) {
    KeyTable<int> table;
    std::vector<uint64_t> keys;
    for (uint64_t j = 1; j <= 10; ++j) {
      keys.push_back((j + (uint64_t{63} << 58)) * inverse);
      keys.push_back(j * inverse);
    }
    for (size_t i = 0; i < keys.size(); ++i) *table.Insert(keys[i]) = static_cast<int>(i);
    std::vector<size_t> erase_order;
    for (size_t i = 0; i < keys.size(); ++i) erase_order.push_back(i);
    if (order == 1) std::reverse(erase_order.begin(), erase_order.end());
    if (order == 2) std::shuffle(erase_order.begin(), erase_order.end(), std::mt19937(order));
    std::vector<bool> erased(keys.size(), false);
    for (size_t i : erase_order) {
      table.Erase(i);  // slot i holds keys[i]: made in order, none erased before
      erased[i] = true;
      for (size_t j = 0; j < keys.size(); ++j) {
        int* e = table.Find(keys[j]);
        ASSERT_TRUE((e == nullptr) == erased[j]);
        if (e != nullptr) EXPECT_EQ(*e, static_cast<int>(j));
      }
    }
    EXPECT_TRUE(table.size() == 0);
  }
}

}  // namespace
}  // namespace lms
