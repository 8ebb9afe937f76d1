// The part of the CUDA driver API the CUDA backend uses, declared here from
// the documented ABI so that building needs no CUDA toolkit.
//
// Every function is reached through a pointer the backend obtains with
// cuGetProcAddress from its own dlopen handle (never by global symbol lookup:
// TensorFlow's GPU wheel exports ~600 cu* stubs of its own). The pointers are
// requested for kCudaAbiVersion, so a CUDA 13 driver hands out the CUDA 12
// ABI of each function (cuStreamDestroy gives cuStreamDestroy_v2, and so on).
//
// The fake driver of the tests (tests/fake_cuda) implements exactly this list,
// and tests/cc/cuda_abi_test.cc checks every value, layout and function type
// below against the toolkit's cuda.h and cudaTypedefs.h (`make test` needs the
// CUDA headers for that one test, not to build anything).
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_CUDA_DRIVER_API_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_CUDA_DRIVER_API_H_

#include <cstddef>
#include <cstdint>

namespace lms {
namespace cu {

// The ABI version every function pointer is requested at: CUDA 12.0, the
// oldest driver line with host-located VMM memory (HOST_NUMA).
constexpr int kCudaAbiVersion = 12000;

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUmemGenericAllocationHandle = unsigned long long;
// Declared here, not through `struct CUctx_st*` in the aliases: that form
// names ::CUctx_st when a cuda.h was included first, so two translation
// units could disagree on these types (and on every signature using them).
struct CUctx_st;
struct CUstream_st;
struct CUevent_st;
using CUcontext = CUctx_st*;
using CUstream = CUstream_st*;
using CUevent = CUevent_st*;
using CUhostFn = void (*)(void* user_data);

// CUresult values.
constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
constexpr CUresult CUDA_ERROR_NOT_INITIALIZED = 3;
constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
constexpr CUresult CUDA_ERROR_INVALID_DEVICE = 101;
constexpr CUresult CUDA_ERROR_INVALID_CONTEXT = 201;
constexpr CUresult CUDA_ERROR_INVALID_HANDLE = 400;
constexpr CUresult CUDA_ERROR_NOT_FOUND = 500;
constexpr CUresult CUDA_ERROR_NOT_READY = 600;
constexpr CUresult CUDA_ERROR_ILLEGAL_ADDRESS = 700;
constexpr CUresult CUDA_ERROR_NOT_PERMITTED = 800;
constexpr CUresult CUDA_ERROR_NOT_SUPPORTED = 801;
constexpr CUresult CUDA_ERROR_UNKNOWN = 999;

// CUdevice_attribute values.
constexpr int CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41;
constexpr int CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102;
constexpr int CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID = 134;
constexpr int CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 141;
constexpr int CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 145;

// CUmemLocationType values.
constexpr int CU_MEM_LOCATION_TYPE_INVALID = 0;
constexpr int CU_MEM_LOCATION_TYPE_DEVICE = 1;
constexpr int CU_MEM_LOCATION_TYPE_HOST = 2;
constexpr int CU_MEM_LOCATION_TYPE_HOST_NUMA = 3;

// CUmemAllocationType, CUmemAllocationHandleType, CUmemAccess_flags and
// CUmemAllocationGranularity_flags values.
constexpr int CU_MEM_ALLOCATION_TYPE_PINNED = 1;
constexpr int CU_MEM_HANDLE_TYPE_NONE = 0;
constexpr int CU_MEM_ACCESS_FLAGS_PROT_NONE = 0;
constexpr int CU_MEM_ACCESS_FLAGS_PROT_READ = 1;
constexpr int CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3;
constexpr int CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0;
constexpr int CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1;

// Stream and event creation flags.
constexpr unsigned CU_STREAM_NON_BLOCKING = 0x1;
constexpr unsigned CU_EVENT_DISABLE_TIMING = 0x2;

// cuGetProcAddress flags and results.
constexpr unsigned long long CU_GET_PROC_ADDRESS_DEFAULT = 0;
constexpr int CU_GET_PROC_ADDRESS_SUCCESS = 0;
constexpr int CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1;
constexpr int CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2;

struct CUmemLocation {
  int type;  // CU_MEM_LOCATION_TYPE_*
  int id;    // device ordinal, or host NUMA node for HOST_NUMA
};

struct CUmemAllocationProp {
  int type;                  // CU_MEM_ALLOCATION_TYPE_PINNED
  int requestedHandleTypes;  // CU_MEM_HANDLE_TYPE_NONE
  CUmemLocation location;
  void* win32HandleMetaData;  // must be null on Linux
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
};

struct CUmemAccessDesc {
  CUmemLocation location;
  int flags;  // CU_MEM_ACCESS_FLAGS_PROT_*
};

// The bootstrap: the only symbols looked up by name in the driver's handle.
// "cuGetProcAddress_v2" (CUDA >= 12.0) is preferred; "cuGetProcAddress" is
// the CUDA 11.3 form without the status argument.
using PFN_cuGetProcAddress_v2 = CUresult (*)(const char* symbol, void** pfn,
                                             int cuda_version,
                                             unsigned long long flags,
                                             int* symbol_status);
using PFN_cuGetProcAddress = CUresult (*)(const char* symbol, void** pfn,
                                          int cuda_version,
                                          unsigned long long flags);

// X(name, return type, parameter list): every driver function the backend
// calls, by its base name as cuGetProcAddress takes it.
// cuDeviceCanAccessPeer(&can, dev, peerDev) answers whether `dev` can access
// memory located on `peerDev` (cuda.h: "dev - Device from which allocations
// on peerDev are to be directly accessed"), 0 for a device and itself.
#define LMS_CUDA_DRIVER_FUNCTIONS(X)                                          \
  X(cuInit, CUresult, (unsigned int flags))                                  \
  X(cuDriverGetVersion, CUresult, (int* version))                            \
  X(cuGetErrorName, CUresult, (CUresult error, const char** name))           \
  X(cuGetErrorString, CUresult, (CUresult error, const char** text))         \
  X(cuDeviceGet, CUresult, (CUdevice * device, int ordinal))                 \
  X(cuDeviceGetCount, CUresult, (int* count))                                \
  X(cuDeviceGetName, CUresult, (char* name, int len, CUdevice device))       \
  X(cuDeviceGetAttribute, CUresult,                                          \
    (int* value, int attribute, CUdevice device))                            \
  X(cuDeviceCanAccessPeer, CUresult,                                         \
    (int* canAccessPeer, CUdevice dev, CUdevice peerDev))                    \
  X(cuDevicePrimaryCtxRetain, CUresult, (CUcontext * context, CUdevice dev)) \
  X(cuDevicePrimaryCtxRelease, CUresult, (CUdevice device))                  \
  X(cuCtxGetCurrent, CUresult, (CUcontext * context))                        \
  X(cuCtxSetCurrent, CUresult, (CUcontext context))                          \
  X(cuMemGetAllocationGranularity, CUresult,                                 \
    (size_t * granularity, const CUmemAllocationProp* prop, int option))     \
  X(cuMemAddressReserve, CUresult,                                           \
    (CUdeviceptr * ptr, size_t size, size_t alignment, CUdeviceptr addr,     \
     unsigned long long flags))                                              \
  X(cuMemAddressFree, CUresult, (CUdeviceptr ptr, size_t size))              \
  X(cuMemCreate, CUresult,                                                   \
    (CUmemGenericAllocationHandle * handle, size_t size,                     \
     const CUmemAllocationProp* prop, unsigned long long flags))             \
  X(cuMemRelease, CUresult, (CUmemGenericAllocationHandle handle))           \
  X(cuMemMap, CUresult,                                                      \
    (CUdeviceptr ptr, size_t size, size_t offset,                            \
     CUmemGenericAllocationHandle handle, unsigned long long flags))         \
  X(cuMemUnmap, CUresult, (CUdeviceptr ptr, size_t size))                    \
  X(cuMemSetAccess, CUresult,                                                \
    (CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,              \
     size_t count))                                                          \
  X(cuMemcpyAsync, CUresult,                                                 \
    (CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream))       \
  X(cuMemcpyHtoD, CUresult,                                                  \
    (CUdeviceptr dst, const void* src, size_t bytes))                        \
  X(cuMemcpyDtoH, CUresult, (void* dst, CUdeviceptr src, size_t bytes))      \
  X(cuStreamCreate, CUresult, (CUstream * stream, unsigned int flags))       \
  X(cuStreamDestroy, CUresult, (CUstream stream))                            \
  X(cuStreamSynchronize, CUresult, (CUstream stream))                        \
  X(cuStreamGetCtx, CUresult, (CUstream stream, CUcontext * context))       \
  X(cuStreamWaitEvent, CUresult,                                             \
    (CUstream stream, CUevent event, unsigned int flags))                    \
  X(cuLaunchHostFunc, CUresult,                                              \
    (CUstream stream, CUhostFn fn, void* user_data))                         \
  X(cuEventCreate, CUresult, (CUevent * event, unsigned int flags))          \
  X(cuEventDestroy, CUresult, (CUevent event))                               \
  X(cuEventRecord, CUresult, (CUevent event, CUstream stream))               \
  X(cuEventQuery, CUresult, (CUevent event))                                 \
  X(cuEventSynchronize, CUresult, (CUevent event))

#define LMS_CUDA_DECLARE_PFN(name, ret, params) using PFN_##name = ret(*) params;
LMS_CUDA_DRIVER_FUNCTIONS(LMS_CUDA_DECLARE_PFN)
#undef LMS_CUDA_DECLARE_PFN

}  // namespace cu
}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_CUDA_DRIVER_API_H_
