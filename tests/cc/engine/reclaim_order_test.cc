// ReclaimOrder (engine/reclaim_order.h, Note [A maintained reclaim order]):
// its walk against ranking every unit by the Note's rules and sorting them,
// over random puts, removals and walks as the clock advances.
#include "engine/reclaim_order.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "harness.h"

namespace lms {
namespace {

constexpr uint64_t kNeverRank = ~uint64_t{0} - 1;

// What the test put, to rank it from scratch.
struct Put {
  int kind;  // 0 never, 1 aged, 2 due
  uint64_t granules, since, due, missed_after, lru_seq;
};

uint64_t RankAt(const Put& p, uint64_t now) {
  switch (p.kind) {
    case 0:
      return kNeverRank;
    case 1:
      return now - p.since;
    default:
      if (now > p.missed_after) return now - p.since;  // missed: its age
      return p.due > now ? p.due - now : 0;
  }
}

std::vector<RankedUnit> Reference(const std::map<ChunkId, Put>& puts, uint64_t now,
                                  const std::vector<RankedUnit>& others) {
  std::vector<RankedUnit> all = others;
  for (const auto& [id, p] : puts) all.push_back(RankedUnit{RankAt(p, now), p.lru_seq, id});
  std::sort(all.begin(), all.end(), TakenBefore);
  return all;
}

bool Same(const RankedUnit& a, const RankedUnit& b) {
  return a.rank == b.rank && a.lru_seq == b.lru_seq && a.id == b.id;
}

TEST(TheOrderWalksUnitsAsRankingThemAllAndSortingThemWould) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 rng(seed);
    ReclaimOrder order;
    std::map<ChunkId, Put> puts;
    uint64_t now = 100, seq = 0;
    for (int round = 0; round < 60; ++round) {
      // Changes: units join (or change class), leave; the clock moves.
      for (int change = 0; change < 40; ++change) {
        const ChunkId id = static_cast<ChunkId>(rng() % 200);
        if (rng() % 4 == 0) {
          order.Remove(id);
          puts.erase(id);
          continue;
        }
        // Sizes around the exact classes' end (64) and in the powers of two.
        const uint64_t granules = rng() % 3 == 0 ? 60 + rng() % 200 : 1 + rng() % 8;
        Put p{static_cast<int>(rng() % 3), granules, now - rng() % 50, 0, 0, ++seq};
        if (p.kind == 0) {
          order.PutNever(id, granules, kNeverRank, p.lru_seq);
        } else if (p.kind == 1) {
          order.PutAged(id, granules, p.since, p.lru_seq);
        } else {
          p.due = p.since + rng() % 80;
          p.missed_after = p.due + 2 + rng() % 10;
          order.PutDue(id, granules, p.since, p.due, p.missed_after, p.lru_seq);
        }
        puts[id] = p;
      }
      now += rng() % 6;  // ties at rank 0 and many equal ages
      std::vector<RankedUnit> pages;
      for (int i = 0; i < 3; ++i) {
        pages.push_back(RankedUnit{rng() % 40, ++seq, static_cast<ChunkId>(1000 + i)});
      }
      std::sort(pages.begin(), pages.end(), TakenBefore);
      const std::vector<RankedUnit> want = Reference(puts, now, pages);
      EXPECT_EQ(order.size(), puts.size());
      order.BeginWalk(now, pages);
      // Part of the walk, then the first unit of at least `granules` when
      // none of the part had that many (as LearnedPolicy asks).
      const size_t part = rng() % (want.size() + 1);
      const uint64_t granules = 2 + rng() % 130;
      bool walked_one = false;
      for (size_t i = 0; i < part; ++i) {
        RankedUnit got;
        ASSERT_TRUE(order.Next(&got));
        if (!Same(got, want[i])) {
          std::printf("seed %u round %d: walk %zu gave unit %u (rank %llu), want %u (rank %llu)\n",
                      seed, round, i, got.id, static_cast<unsigned long long>(got.rank),
                      want[i].id, static_cast<unsigned long long>(want[i].rank));
        }
        ASSERT_TRUE(Same(got, want[i]));
        walked_one |= got.id < 1000 && puts[got.id].granules >= granules;
      }
      if (!walked_one) {
        const RankedUnit* first = nullptr;
        for (const RankedUnit& r : want) {
          if (r.id < 1000 && puts[r.id].granules >= granules) {
            first = &r;
            break;
          }
        }
        RankedUnit got;
        const bool found = order.FirstOfAtLeast(granules, &got);
        EXPECT_EQ(found, first != nullptr);
        if (found && first != nullptr) EXPECT_TRUE(Same(got, *first));
      }
      for (size_t i = part; i < want.size(); ++i) {
        RankedUnit got;
        ASSERT_TRUE(order.Next(&got));
        ASSERT_TRUE(Same(got, want[i]));
      }
      RankedUnit past;
      EXPECT_TRUE(!order.Next(&past));
    }
  }
}

}  // namespace
}  // namespace lms
