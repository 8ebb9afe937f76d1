// The bootstrap the CUDA backend looks up by name: cuGetProcAddress_v2 (and
// the CUDA 11.3 form without the status), handing out every function of
// LMS_CUDA_DRIVER_FUNCTIONS. The table is generated from the contract, so a
// function added there and not implemented here fails the link. What it
// hands out counts its calls (fake_cuda_call_count) before it runs the fake's
// function: what one remap or one device creation costs in driver calls.
#include <atomic>
#include <cstdint>
#include <cstring>

#include "entry_points.h"
#include "fake_cuda.h"
#include "knobs.h"

namespace lms {
namespace cu {
namespace fake {
namespace {

CUresult GetProcAddressV2(const char* symbol, void** pfn, int cuda_version,
                          unsigned long long flags, int* symbol_status);
CUresult GetProcAddressV1(const char* symbol, void** pfn, int cuda_version,
                          unsigned long long flags);

struct Entry {
  const char* name;
  void* fn;
};

// One index per contract function, in table order.
enum : int {
#define FAKE_CUDA_INDEX(name, ret, params) k_##name,
  LMS_CUDA_DRIVER_FUNCTIONS(FAKE_CUDA_INDEX)
#undef FAKE_CUDA_INDEX
  kFunctions
};
std::atomic<uint64_t> g_calls[kFunctions];

// Counted<&f, i>::Call has f's signature: counts, then calls f.
template <auto Fn, int Index>
struct Counted;
template <typename R, typename... Args, R (*Fn)(Args...), int Index>
struct Counted<Fn, Index> {
  static R Call(Args... args) noexcept {
    g_calls[Index].fetch_add(1, std::memory_order_relaxed);
    return Fn(args...);
  }
};

#define FAKE_CUDA_TABLE_ENTRY(name, ret, params)                                    \
  {#name, reinterpret_cast<void*>(                                                  \
              static_cast<PFN_##name>(&Counted<static_cast<PFN_##name>(&name),      \
                                               k_##name>::Call))},
const Entry kEntries[] = {LMS_CUDA_DRIVER_FUNCTIONS(FAKE_CUDA_TABLE_ENTRY)};
#undef FAKE_CUDA_TABLE_ENTRY

// The CUDA version that introduced `name` (requests for older ABIs are
// VERSION_NOT_SUFFICIENT, as in the real driver).
int IntroducedIn(const char* name) {
  if (std::strncmp(name, "cuMem", 5) == 0 && std::strcmp(name, "cuMemcpyAsync") != 0 &&
      std::strcmp(name, "cuMemcpyHtoD") != 0 && std::strcmp(name, "cuMemcpyDtoH") != 0) {
    return 10020;  // the VMM API
  }
  if (std::strcmp(name, "cuLaunchHostFunc") == 0) return 10000;
  if (std::strcmp(name, "cuDeviceCanAccessPeer") == 0) return 4000;
  if (std::strcmp(name, "cuStreamGetCtx") == 0) return 9020;
  if (std::strncmp(name, "cuDevicePrimaryCtx", 18) == 0) return 7000;
  return 2000;
}

CUresult Lookup(const char* symbol, void** pfn, int cuda_version,
                unsigned long long flags, int* status) {
  *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  // DEFAULT, LEGACY_STREAM (1) or PER_THREAD_DEFAULT_STREAM (2): the fake
  // has no default stream, so they hand out the same functions.
  if ((flags & ~3ull) != 0) return CUDA_ERROR_INVALID_VALUE;
  void* fn = nullptr;
  int introduced = 11030;
  if (std::strcmp(symbol, "cuGetProcAddress") == 0) {
    fn = cuda_version >= 12000 ? reinterpret_cast<void*>(&GetProcAddressV2)
                               : reinterpret_cast<void*>(&GetProcAddressV1);
  } else {
    for (const Entry& e : kEntries) {
      if (std::strcmp(e.name, symbol) == 0) {
        fn = e.fn;
        introduced = IntroducedIn(e.name);
      }
    }
  }
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  if (cuda_version > GetKnobs().driver_version || cuda_version < introduced) {
    *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    return CUDA_ERROR_NOT_FOUND;
  }
  *status = CU_GET_PROC_ADDRESS_SUCCESS;
  *pfn = fn;
  return CUDA_SUCCESS;
}

CUresult GetProcAddressV2(const char* symbol, void** pfn, int cuda_version,
                          unsigned long long flags, int* symbol_status) {
  int status = 0;
  const CUresult r = Lookup(symbol, pfn, cuda_version, flags, &status);
  if (symbol_status != nullptr) *symbol_status = status;
  return r;
}

CUresult GetProcAddressV1(const char* symbol, void** pfn, int cuda_version,
                          unsigned long long flags) {
  int status = 0;
  return Lookup(symbol, pfn, cuda_version, flags, &status);
}

}  // namespace

void ResetCallCounts() {
  for (auto& count : g_calls) count.store(0, std::memory_order_relaxed);
}

}  // namespace fake
}  // namespace cu
}  // namespace lms

FAKE_CUDA_EXPORT unsigned long long fake_cuda_call_count(const char* name) noexcept {
  namespace fake = lms::cu::fake;
  unsigned long long total = 0;
  for (int i = 0; i < fake::kFunctions; ++i) {
    if (name == nullptr || std::strcmp(name, fake::kEntries[i].name) == 0) {
      total += fake::g_calls[i].load(std::memory_order_relaxed);
    }
  }
  return total;
}

FAKE_CUDA_EXPORT void fake_cuda_reset_call_counts(void) noexcept {
  lms::cu::fake::ResetCallCounts();
}

// Like every real driver, cuGetProcAddress answers before cuInit.
FAKE_CUDA_EXPORT lms::cu::CUresult cuGetProcAddress_v2(const char* symbol, void** pfn,
                                                       int cuda_version,
                                                       unsigned long long flags,
                                                       int* symbol_status) noexcept {
  return lms::cu::fake::GetProcAddressV2(symbol, pfn, cuda_version, flags,
                                         symbol_status);
}

FAKE_CUDA_EXPORT lms::cu::CUresult cuGetProcAddress(const char* symbol, void** pfn,
                                                    int cuda_version,
                                                    unsigned long long flags) noexcept {
  return lms::cu::fake::GetProcAddressV1(symbol, pfn, cuda_version, flags);
}
