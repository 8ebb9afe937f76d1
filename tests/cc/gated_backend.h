// A POSIX backend whose copies wait at a gate the test opens: the engine's
// copies outside its lock (Note [Copies outside the lock] in engine/engine.h)
// then stay in flight for as long as the test needs to act beside them.
// Every other call is the POSIX backend's own.
//
//   GatedBackend* gate;
//   std::unique_ptr<Engine> e = MakeGatedEngine(16, 64, kGranule, &gate);
//   std::thread evictor([&] { e->Allocate(...); });  // its eviction copies
//   gate->AwaitCopy();   // ... and is held there, the lock free
//   ...                  // pin, free, allocate beside it
//   gate->Open();
#ifndef TENSORFLOW_LMS_ALLOCATOR_TESTS_CC_GATED_BACKEND_H_
#define TENSORFLOW_LMS_ALLOCATOR_TESTS_CC_GATED_BACKEND_H_

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>

#include "backends/backend_factory.h"
#include "engine/backend.h"
#include "engine/engine.h"

namespace lms_test {

class GatedBackend : public lms::Backend {
 public:
  explicit GatedBackend(std::unique_ptr<lms::Backend> posix) : b_(std::move(posix)) {}

  // Blocks until `copies` copies wait at the closed gate; false after `timeout`.
  bool AwaitCopy(int copies = 1, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [this, copies] { return waiting_ >= copies; });
  }
  // Lets every copy through, now and from now on.
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  // Holds the next copies again.
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = false;
  }

  lms::Status CopyGranules(lms::PoolKind dst_pool, const lms::GranuleId* dst,
                           lms::PoolKind src_pool, const lms::GranuleId* src,
                           size_t bytes) override {
    Gate();
    return b_->CopyGranules(dst_pool, dst, src_pool, src, bytes);
  }

  lms::Status CopyRanges(lms::PoolKind dst_pool, lms::GranuleId dst, lms::PoolKind src_pool,
                         lms::GranuleId src, const lms::ByteRange* ranges,
                         size_t count) override {
    Gate();
    return b_->CopyRanges(dst_pool, dst, src_pool, src, ranges, count);
  }

  const char* Name() const override { return "gated posix"; }
  size_t granule_bytes() const override { return b_->granule_bytes(); }
  lms::Status ReserveAddressRange(size_t bytes, uintptr_t* base) override {
    return b_->ReserveAddressRange(bytes, base);
  }
  void ReleaseAddressRange(uintptr_t base, size_t bytes) override {
    b_->ReleaseAddressRange(base, bytes);
  }
  lms::Status CreatePool(lms::PoolKind pool, size_t granules) override {
    return b_->CreatePool(pool, granules);
  }
  lms::Status Map(uintptr_t address, lms::PoolKind pool, const lms::GranuleId* ids,
                  size_t count, lms::Access access) override {
    return b_->Map(address, pool, ids, count, access);
  }
  lms::Status Unmap(uintptr_t address, size_t count) override {
    return b_->Unmap(address, count);
  }
  lms::Status CopiesAfterUse(uint64_t mark) override { return b_->CopiesAfterUse(mark); }
  lms::Status WaitForCopies() override { return b_->WaitForCopies(); }
  bool CopiesMayRunUnlocked() const override { return b_->CopiesMayRunUnlocked(); }
  lms::BackendStatistics GetStatistics() const override { return b_->GetStatistics(); }
  void PrepareFork() override { b_->PrepareFork(); }
  void AfterForkInParent() override { b_->AfterForkInParent(); }
  void AfterForkInChild() override { b_->AfterForkInChild(); }

 private:
  // Waits, counted, until the gate opens.
  void Gate() {
    std::unique_lock<std::mutex> lock(mu_);
    ++waiting_;
    cv_.notify_all();
    cv_.wait(lock, [this] { return open_; });
    --waiting_;
  }

  const std::unique_ptr<lms::Backend> b_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  int waiting_ = 0;
};

// An engine over a gated POSIX backend (closed), with defragmentation on.
inline std::unique_ptr<lms::Engine> MakeGatedEngine(size_t device_granules,
                                                    size_t host_granules, size_t granule,
                                                    GatedBackend** gate) {
  lms::BackendSpec spec;
  spec.kind = lms::BackendKind::kPosix;
  spec.granule_bytes = granule;
  std::unique_ptr<lms::Backend> posix;
  if (!lms::CreateBackend(spec, &posix).ok()) std::abort();
  auto gated = std::make_unique<GatedBackend>(std::move(posix));
  *gate = gated.get();
  lms::EngineOptions o;
  o.device_bytes = device_granules * granule;
  o.host_bytes = host_granules * granule;
  o.policy = lms::PolicyKind::kLru;  // the tests name their victims by order of use
  std::unique_ptr<lms::Engine> e;
  if (!lms::Engine::Create(o, std::move(gated), &e).ok()) std::abort();
  return e;
}

}  // namespace lms_test

#endif  // TENSORFLOW_LMS_ALLOCATOR_TESTS_CC_GATED_BACKEND_H_
