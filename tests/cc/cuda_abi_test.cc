// Checks cuda_driver_api.h, the backend's own declarations of the CUDA driver
// ABI, against the toolkit's cuda.h and cudaTypedefs.h: every constant, the
// size, alignment and field offsets of every struct, and the type of every
// function pointer in LMS_CUDA_DRIVER_FUNCTIONS against the version of that
// function cuGetProcAddress hands out for kCudaAbiVersion (CUDA 12.0). All
// checks are static_asserts: the test fails by not compiling.
//
// The two sides spell some types differently without differing in the ABI:
// the toolkit passes enums (CUresult, CUdevice_attribute, ...) where the
// backend passes int, and its opaque handles are ::CUctx_st* where ours are
// lms::cu::CUctx_st*. Canonical<> maps both spellings to one type (enums of
// int size to int, 64-bit integers to long long, our structs and opaque
// handles to the toolkit's), so is_same compares everything else exactly: an
// unsigned instead of an int, a 32-bit size, a missing parameter or pointer
// level all fail.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstddef>
#include <cstdio>
#include <type_traits>

#include "backends/cuda_driver_api.h"

namespace {

namespace ours = ::lms::cu;

// Enums of int size are int; 64-bit integers are long long of their
// signedness (cuuint64_t is unsigned long, the contract says unsigned long
// long: one ABI on LP64); everything else is itself.
template <typename T, bool kIsIntegral = std::is_integral<T>::value>
struct Is64BitInteger : std::false_type {};
template <typename T>
struct Is64BitInteger<T, true> : std::integral_constant<bool, sizeof(T) == 8> {};

template <typename T, bool kIsEnum = std::is_enum<T>::value,
          bool kIs64 = Is64BitInteger<T>::value>
struct CanonicalScalar {
  using type = T;
};
template <typename T, bool kIs64>
struct CanonicalScalar<T, true, kIs64> {
  static_assert(sizeof(T) == sizeof(int), "an enum the ABI passes as int");
  using type = int;
};
template <typename T>
struct CanonicalScalar<T, false, true> {
  using type = std::conditional_t<std::is_signed<T>::value, long long, unsigned long long>;
};

template <typename T>
struct Canonical {
  using type = typename CanonicalScalar<T>::type;
};
template <typename T>
struct Canonical<const T> {
  using type = const typename Canonical<T>::type;
};
template <typename T>
struct Canonical<T*> {
  using type = typename Canonical<T>::type*;
};
template <typename R, typename... Args>
struct Canonical<R (*)(Args...)> {
  using type = typename Canonical<R>::type (*)(typename Canonical<Args>::type...);
};
template <>
struct Canonical<ours::CUctx_st> {
  using type = ::CUctx_st;
};
template <>
struct Canonical<ours::CUstream_st> {
  using type = ::CUstream_st;
};
template <>
struct Canonical<ours::CUevent_st> {
  using type = ::CUevent_st;
};
// Our structs stand for the toolkit's (their layouts are checked below).
template <>
struct Canonical<ours::CUmemLocation> {
  using type = ::CUmemLocation;
};
template <>
struct Canonical<ours::CUmemAllocationProp> {
  using type = ::CUmemAllocationProp;
};
template <>
struct Canonical<ours::CUmemAccessDesc> {
  using type = ::CUmemAccessDesc;
};

template <typename A, typename B>
constexpr bool kSameAbi =
    std::is_same<typename Canonical<A>::type, typename Canonical<B>::type>::value;

// --- Scalar types -----------------------------------------------------------------
static_assert(std::is_same<ours::CUdevice, ::CUdevice>::value, "CUdevice");
static_assert(std::is_same<ours::CUdeviceptr, ::CUdeviceptr>::value, "CUdeviceptr");
static_assert(std::is_same<ours::CUmemGenericAllocationHandle,
                           ::CUmemGenericAllocationHandle>::value,
              "CUmemGenericAllocationHandle");
static_assert(sizeof(ours::CUresult) == sizeof(::CUresult), "CUresult");
static_assert(kSameAbi<ours::CUcontext, ::CUcontext>, "CUcontext");
static_assert(kSameAbi<ours::CUstream, ::CUstream>, "CUstream");
static_assert(kSameAbi<ours::CUevent, ::CUevent>, "CUevent");
static_assert(kSameAbi<ours::CUhostFn, ::CUhostFn>, "CUhostFn");

// --- Constants ----------------------------------------------------------------------
#define LMS_SAME_CONSTANT(name) \
  static_assert(static_cast<long long>(ours::name) == static_cast<long long>(::name), #name);
LMS_SAME_CONSTANT(CUDA_SUCCESS)
LMS_SAME_CONSTANT(CUDA_ERROR_INVALID_VALUE)
LMS_SAME_CONSTANT(CUDA_ERROR_OUT_OF_MEMORY)
LMS_SAME_CONSTANT(CUDA_ERROR_NOT_INITIALIZED)
LMS_SAME_CONSTANT(CUDA_ERROR_NO_DEVICE)
LMS_SAME_CONSTANT(CUDA_ERROR_INVALID_DEVICE)
LMS_SAME_CONSTANT(CUDA_ERROR_INVALID_CONTEXT)
LMS_SAME_CONSTANT(CUDA_ERROR_INVALID_HANDLE)
LMS_SAME_CONSTANT(CUDA_ERROR_NOT_FOUND)
LMS_SAME_CONSTANT(CUDA_ERROR_NOT_READY)
LMS_SAME_CONSTANT(CUDA_ERROR_ILLEGAL_ADDRESS)
LMS_SAME_CONSTANT(CUDA_ERROR_NOT_PERMITTED)
LMS_SAME_CONSTANT(CUDA_ERROR_NOT_SUPPORTED)
LMS_SAME_CONSTANT(CUDA_ERROR_UNKNOWN)
LMS_SAME_CONSTANT(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)
LMS_SAME_CONSTANT(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)
LMS_SAME_CONSTANT(CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID)
LMS_SAME_CONSTANT(CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)
LMS_SAME_CONSTANT(CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)
LMS_SAME_CONSTANT(CU_MEM_LOCATION_TYPE_INVALID)
LMS_SAME_CONSTANT(CU_MEM_LOCATION_TYPE_DEVICE)
LMS_SAME_CONSTANT(CU_MEM_LOCATION_TYPE_HOST)
LMS_SAME_CONSTANT(CU_MEM_LOCATION_TYPE_HOST_NUMA)
LMS_SAME_CONSTANT(CU_MEM_ALLOCATION_TYPE_PINNED)
LMS_SAME_CONSTANT(CU_MEM_HANDLE_TYPE_NONE)
LMS_SAME_CONSTANT(CU_MEM_ACCESS_FLAGS_PROT_NONE)
LMS_SAME_CONSTANT(CU_MEM_ACCESS_FLAGS_PROT_READ)
LMS_SAME_CONSTANT(CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
LMS_SAME_CONSTANT(CU_MEM_ALLOC_GRANULARITY_MINIMUM)
LMS_SAME_CONSTANT(CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
LMS_SAME_CONSTANT(CU_STREAM_NON_BLOCKING)
LMS_SAME_CONSTANT(CU_EVENT_DISABLE_TIMING)
LMS_SAME_CONSTANT(CU_GET_PROC_ADDRESS_DEFAULT)
LMS_SAME_CONSTANT(CU_GET_PROC_ADDRESS_SUCCESS)
LMS_SAME_CONSTANT(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)
LMS_SAME_CONSTANT(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
#undef LMS_SAME_CONSTANT

// --- Struct layouts -------------------------------------------------------------------
#define LMS_SAME_LAYOUT(type)                                            \
  static_assert(sizeof(ours::type) == sizeof(::type), #type " size");   \
  static_assert(alignof(ours::type) == alignof(::type), #type " alignment");
#define LMS_SAME_FIELD(type, field)                                          \
  static_assert(offsetof(ours::type, field) == offsetof(::type, field),     \
                #type "." #field " offset");                                 \
  static_assert(sizeof(ours::type::field) == sizeof(::type::field),         \
                #type "." #field " size");
LMS_SAME_LAYOUT(CUmemLocation)
LMS_SAME_FIELD(CUmemLocation, type)
LMS_SAME_FIELD(CUmemLocation, id)
LMS_SAME_LAYOUT(CUmemAllocationProp)
LMS_SAME_FIELD(CUmemAllocationProp, type)
LMS_SAME_FIELD(CUmemAllocationProp, requestedHandleTypes)
LMS_SAME_FIELD(CUmemAllocationProp, location)
LMS_SAME_FIELD(CUmemAllocationProp, win32HandleMetaData)
LMS_SAME_FIELD(CUmemAllocationProp, allocFlags)
LMS_SAME_LAYOUT(CUmemAccessDesc)
LMS_SAME_FIELD(CUmemAccessDesc, location)
LMS_SAME_FIELD(CUmemAccessDesc, flags)
#undef LMS_SAME_FIELD
#undef LMS_SAME_LAYOUT
// allocFlags' members (an anonymous struct, so offsets within it).
using OurFlags = decltype(ours::CUmemAllocationProp::allocFlags);
using TheirFlags = decltype(::CUmemAllocationProp::allocFlags);
static_assert(sizeof(OurFlags) == sizeof(TheirFlags), "allocFlags size");
static_assert(offsetof(OurFlags, compressionType) == offsetof(TheirFlags, compressionType),
              "allocFlags.compressionType");
static_assert(offsetof(OurFlags, gpuDirectRDMACapable) ==
                  offsetof(TheirFlags, gpuDirectRDMACapable),
              "allocFlags.gpuDirectRDMACapable");
static_assert(offsetof(OurFlags, usage) == offsetof(TheirFlags, usage), "allocFlags.usage");
static_assert(offsetof(OurFlags, reserved) == offsetof(TheirFlags, reserved),
              "allocFlags.reserved");
static_assert(sizeof(OurFlags::reserved) == sizeof(TheirFlags::reserved),
              "allocFlags.reserved size");

// --- Function pointer types ---------------------------------------------------------
// The version of each function cuGetProcAddress returns for CUDA 12.0: the
// newest cudaTypedefs.h PFN_<name>_v<N> with N <= 12000 (cuStreamDestroy_v2
// is PFN_cuStreamDestroy_v4000, cuMemcpyHtoD_v2 is PFN_cuMemcpyHtoD_v3020).
// A function added to LMS_CUDA_DRIVER_FUNCTIONS without a line here does not
// compile.
using PFN_cuInit_cuda12 = ::PFN_cuInit_v2000;
using PFN_cuDriverGetVersion_cuda12 = ::PFN_cuDriverGetVersion_v2020;
using PFN_cuGetErrorName_cuda12 = ::PFN_cuGetErrorName_v6000;
using PFN_cuGetErrorString_cuda12 = ::PFN_cuGetErrorString_v6000;
using PFN_cuDeviceGet_cuda12 = ::PFN_cuDeviceGet_v2000;
using PFN_cuDeviceGetCount_cuda12 = ::PFN_cuDeviceGetCount_v2000;
using PFN_cuDeviceGetName_cuda12 = ::PFN_cuDeviceGetName_v2000;
using PFN_cuDeviceGetAttribute_cuda12 = ::PFN_cuDeviceGetAttribute_v2000;
using PFN_cuDeviceCanAccessPeer_cuda12 = ::PFN_cuDeviceCanAccessPeer_v4000;
using PFN_cuDevicePrimaryCtxRetain_cuda12 = ::PFN_cuDevicePrimaryCtxRetain_v7000;
using PFN_cuDevicePrimaryCtxRelease_cuda12 = ::PFN_cuDevicePrimaryCtxRelease_v11000;
using PFN_cuCtxGetCurrent_cuda12 = ::PFN_cuCtxGetCurrent_v4000;
using PFN_cuCtxSetCurrent_cuda12 = ::PFN_cuCtxSetCurrent_v4000;
using PFN_cuMemGetAllocationGranularity_cuda12 = ::PFN_cuMemGetAllocationGranularity_v10020;
using PFN_cuMemAddressReserve_cuda12 = ::PFN_cuMemAddressReserve_v10020;
using PFN_cuMemAddressFree_cuda12 = ::PFN_cuMemAddressFree_v10020;
using PFN_cuMemCreate_cuda12 = ::PFN_cuMemCreate_v10020;
using PFN_cuMemRelease_cuda12 = ::PFN_cuMemRelease_v10020;
using PFN_cuMemMap_cuda12 = ::PFN_cuMemMap_v10020;
using PFN_cuMemUnmap_cuda12 = ::PFN_cuMemUnmap_v10020;
using PFN_cuMemSetAccess_cuda12 = ::PFN_cuMemSetAccess_v10020;
using PFN_cuMemcpyAsync_cuda12 = ::PFN_cuMemcpyAsync_v4000;
using PFN_cuMemcpyHtoD_cuda12 = ::PFN_cuMemcpyHtoD_v3020;
using PFN_cuMemcpyDtoH_cuda12 = ::PFN_cuMemcpyDtoH_v3020;
using PFN_cuStreamCreate_cuda12 = ::PFN_cuStreamCreate_v2000;
using PFN_cuStreamDestroy_cuda12 = ::PFN_cuStreamDestroy_v4000;
using PFN_cuStreamSynchronize_cuda12 = ::PFN_cuStreamSynchronize_v2000;
using PFN_cuStreamGetCtx_cuda12 = ::PFN_cuStreamGetCtx_v9020;
using PFN_cuStreamWaitEvent_cuda12 = ::PFN_cuStreamWaitEvent_v3020;
using PFN_cuLaunchHostFunc_cuda12 = ::PFN_cuLaunchHostFunc_v10000;
using PFN_cuEventCreate_cuda12 = ::PFN_cuEventCreate_v2000;
using PFN_cuEventDestroy_cuda12 = ::PFN_cuEventDestroy_v4000;
using PFN_cuEventRecord_cuda12 = ::PFN_cuEventRecord_v2000;
using PFN_cuEventQuery_cuda12 = ::PFN_cuEventQuery_v2000;
using PFN_cuEventSynchronize_cuda12 = ::PFN_cuEventSynchronize_v2000;

// Each contract PFN against that version, and against the prototype cuda.h
// declares under the name (cuda.h maps cuStreamDestroy to cuStreamDestroy_v2
// and so on, so `&name` below is the versioned function).
#define LMS_SAME_FUNCTION(name, ret, params)                                   \
  static_assert(kSameAbi<ours::PFN_##name, PFN_##name##_cuda12>,               \
                #name ": the contract's type differs from the CUDA 12 ABI");    \
  static_assert(kSameAbi<ours::PFN_##name, decltype(&name)>,                   \
                #name ": the contract's type differs from cuda.h's prototype");
LMS_CUDA_DRIVER_FUNCTIONS(LMS_SAME_FUNCTION)
#undef LMS_SAME_FUNCTION

// The versioned names the contract relies on, spelled out.
static_assert(kSameAbi<ours::PFN_cuStreamDestroy, decltype(&::cuStreamDestroy_v2)>, "");
static_assert(kSameAbi<ours::PFN_cuEventDestroy, decltype(&::cuEventDestroy_v2)>, "");
static_assert(kSameAbi<ours::PFN_cuDevicePrimaryCtxRelease,
                       decltype(&::cuDevicePrimaryCtxRelease_v2)>,
              "");
static_assert(kSameAbi<ours::PFN_cuMemcpyHtoD, decltype(&::cuMemcpyHtoD_v2)>, "");
static_assert(kSameAbi<ours::PFN_cuMemcpyDtoH, decltype(&::cuMemcpyDtoH_v2)>, "");

// The bootstrap.
static_assert(kSameAbi<ours::PFN_cuGetProcAddress_v2, decltype(&::cuGetProcAddress_v2)>,
              "cuGetProcAddress_v2");
static_assert(kSameAbi<ours::PFN_cuGetProcAddress_v2, ::PFN_cuGetProcAddress_v12000>,
              "cuGetProcAddress_v2");
static_assert(kSameAbi<ours::PFN_cuGetProcAddress, ::PFN_cuGetProcAddress_v11030>,
              "cuGetProcAddress (CUDA 11.3 form)");

}  // namespace

int main() {
  std::printf("cuda_driver_api.h matches cuda.h of CUDA %d.%d\n", CUDA_VERSION / 1000,
              CUDA_VERSION % 1000 / 10);
  return 0;
}
