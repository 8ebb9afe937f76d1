/* The interposer: definitions of the few TensorFlow functions LMS needs,
 * loaded into the global symbol scope before TensorFlow, so that the dynamic
 * linker binds TensorFlow's own calls to them (docs/design.md, "Facts
 * measured on tensorflow-cpu 2.21.0").
 * Each resolves the original in libtensorflow_framework.so.2, calls it, and
 * forwards to the adapter's hooks. No logic lives here: everything that needs
 * thinking is in the adapter, where tests reach it.
 *
 * It links only libc and libdl: it must not pull TensorFlow (or its bundled
 * BoringSSL) into the global scope, and it must have no undefined C++ symbol,
 * or ctypes.CDLL(..., RTLD_GLOBAL) refuses it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "lms_hooks.h"
#include "tf_symbols.h"

static const TfLmsHooks* volatile g_hooks;

int tf_lms_register_hooks(const TfLmsHooks* hooks) {
  __atomic_store_n(&g_hooks, hooks, __ATOMIC_RELEASE);
  return 0;
}

static const TfLmsHooks* Hooks(void) {
  return __atomic_load_n(&g_hooks, __ATOMIC_ACQUIRE);
}

/* The original definition of `symbol`, which TensorFlow has loaded by the
 * time any of these run. Failing to find it means this is not the TensorFlow
 * the interposer was built for: continuing would call garbage. */
static void* Original(const char* symbol) {
  void* framework = dlopen("libtensorflow_framework.so.2", RTLD_NOW | RTLD_NOLOAD);
  void* fn = framework != NULL ? dlsym(framework, symbol) : NULL;
  if (fn == NULL) {
    fprintf(stderr,
            "tensorflow_lms_allocator: cannot find TensorFlow's %s (%s); this "
            "TensorFlow is not the %d.%d the package was built for\n",
            symbol, dlerror(), LMS_TF_MAJOR_VERSION, LMS_TF_MINOR_VERSION);
    abort();
  }
  return fn;
}

#define RESOLVE(type, var, symbol)                                  \
  static type var;                                                  \
  if (__atomic_load_n(&var, __ATOMIC_ACQUIRE) == NULL) {            \
    __atomic_store_n(&var, (type)Original(symbol), __ATOMIC_RELEASE); \
  }

typedef void (*CtorFn)(void*, void*);
typedef void (*CtorOutputsFn)(void*, void*, int);
typedef void (*DtorFn)(void*);

static void ContextCreated(void* context, void* params) {
  const TfLmsHooks* h = Hooks();
  if (h != NULL && h->on_context_created != NULL) h->on_context_created(context, params);
}

static void ContextDestroyed(void* context) {
  const TfLmsHooks* h = Hooks();
  if (h != NULL && h->on_context_destroyed != NULL) h->on_context_destroyed(context);
}

/* tensorflow::OpKernelContext::OpKernelContext(Params*) */
void _ZN10tensorflow15OpKernelContextC1EPNS0_6ParamsE(void* self, void* params) {
  RESOLVE(CtorFn, original, "_ZN10tensorflow15OpKernelContextC1EPNS0_6ParamsE");
  original(self, params);
  ContextCreated(self, params);
}

void _ZN10tensorflow15OpKernelContextC2EPNS0_6ParamsE(void* self, void* params) {
  RESOLVE(CtorFn, original, "_ZN10tensorflow15OpKernelContextC2EPNS0_6ParamsE");
  original(self, params);
  ContextCreated(self, params);
}

/* tensorflow::OpKernelContext::OpKernelContext(Params*, int num_outputs) */
void _ZN10tensorflow15OpKernelContextC1EPNS0_6ParamsEi(void* self, void* params,
                                                       int num_outputs) {
  RESOLVE(CtorOutputsFn, original, "_ZN10tensorflow15OpKernelContextC1EPNS0_6ParamsEi");
  original(self, params, num_outputs);
  ContextCreated(self, params);
}

void _ZN10tensorflow15OpKernelContextC2EPNS0_6ParamsEi(void* self, void* params,
                                                       int num_outputs) {
  RESOLVE(CtorOutputsFn, original, "_ZN10tensorflow15OpKernelContextC2EPNS0_6ParamsEi");
  original(self, params, num_outputs);
  ContextCreated(self, params);
}

/* tensorflow::OpKernelContext::~OpKernelContext(): D1 complete, D2 base, D0
 * deleting (a virtual destructor's, from TensorFlow 2.20). The hook runs
 * first, while the context is still whole. */
void _ZN10tensorflow15OpKernelContextD1Ev(void* self) {
  RESOLVE(DtorFn, original, "_ZN10tensorflow15OpKernelContextD1Ev");
  ContextDestroyed(self);
  original(self);
}

void _ZN10tensorflow15OpKernelContextD2Ev(void* self) {
  RESOLVE(DtorFn, original, "_ZN10tensorflow15OpKernelContextD2Ev");
  ContextDestroyed(self);
  original(self);
}

#if LMS_TF_HAS_VIRTUAL_CONTEXT_DTOR
void _ZN10tensorflow15OpKernelContextD0Ev(void* self) {
  RESOLVE(DtorFn, original, "_ZN10tensorflow15OpKernelContextD0Ev");
  ContextDestroyed(self);
  original(self);
}
#endif

/* tsl::Allocator* tensorflow::ProcessState::GetCPUAllocator(int numa_node) */
typedef void* (*GetCpuFn)(void*, int);
void* _ZN10tensorflow12ProcessState15GetCPUAllocatorEi(void* self, int numa_node) {
  RESOLVE(GetCpuFn, original, "_ZN10tensorflow12ProcessState15GetCPUAllocatorEi");
  void* allocator = original(self, numa_node);
  const TfLmsHooks* h = Hooks();
  if (h != NULL && h->cpu_allocator != NULL) return h->cpu_allocator(allocator, numa_node);
  return allocator;
}

/* tsl::Allocator* tensorflow::GPUProcessState::GetGPUAllocator(
 *     const GPUOptions&, TfDeviceId, size_t total_bytes,
 *     const std::vector<TfDeviceId>& peer_gpu_ids)
 * TfDeviceId is a trivially copyable wrapper of one int: passed as an int. */
typedef void* (*GetGpuFn)(void*, const void*, int, size_t, const void*);
void* _ZN10tensorflow15GPUProcessState15GetGPUAllocatorERKNS_10GPUOptionsEN3tsl3gtl7IntTypeINS4_15TfDeviceId_tag_EiEEmRKSt6vectorIS8_SaIS8_EE(
    void* self, const void* options, int tf_device_id, size_t total_bytes,
    const void* peer_gpu_ids) {
  RESOLVE(GetGpuFn, original,
          "_ZN10tensorflow15GPUProcessState15GetGPUAllocatorERKNS_10GPUOptionsEN3tsl3gtl7IntTypeINS4_15TfDeviceId_tag_EiEEmRKSt6vectorIS8_SaIS8_EE");
  const TfLmsHooks* h = Hooks();
  if (h != NULL && h->gpu_allocator != NULL) {
    return h->gpu_allocator((void*)original, self, options, tf_device_id, total_bytes,
                            peer_gpu_ids);
  }
  return original(self, options, tf_device_id, total_bytes, peer_gpu_ids);
}

/* tensorflow::GPUUtil's copies (GPU wheels only; never called on the CPU
 * wheel). Each is static and returns void; its StatusCallback `done` is a
 * std::function, which the Itanium C++ ABI passes by invisible reference (a
 * pointer here), as it does every parameter with a non-trivial copy
 * constructor or destructor. TensorFlow calls them through the PLT (and
 * DeviceToDeviceCopy through the pointer it registers as its GPU-to-GPU
 * copy function, a GLOB_DAT relocation), so these definitions win. Their
 * mangled names hold absl's inline namespace, which differs between
 * TensorFlow versions: each is declared with an asm label naming it as
 * tf_symbols.h spells it for the TensorFlow built against. */
typedef void (*GpuToCpuFn)(void*, const void*, const void*, void*, void*);
void LmsCopyGpuTensorToCpu(
    void* gpu_device, const void* device_context, const void* gpu_tensor, void* cpu_tensor,
    void* done) __asm__(LMS_GPU_TO_CPU);
void LmsCopyGpuTensorToCpu(
    void* gpu_device, const void* device_context, const void* gpu_tensor, void* cpu_tensor,
    void* done) {
  RESOLVE(GpuToCpuFn, original, LMS_GPU_TO_CPU);
  const TfLmsHooks* h = Hooks();
  if (h != NULL && h->copy_gpu_to_cpu != NULL) {
    h->copy_gpu_to_cpu((void*)original, gpu_device, device_context, gpu_tensor, cpu_tensor,
                       done);
    return;
  }
  original(gpu_device, device_context, gpu_tensor, cpu_tensor, done);
}

typedef void (*CpuToGpuFn)(const void*, const void*, void*, void*, void*, _Bool);
void LmsCopyCpuTensorToGpu(
    const void* cpu_tensor, const void* device_context, void* gpu_device, void* gpu_tensor,
    void* done, _Bool sync_dst_compute) __asm__(LMS_CPU_TO_GPU);
void LmsCopyCpuTensorToGpu(
    const void* cpu_tensor, const void* device_context, void* gpu_device, void* gpu_tensor,
    void* done, _Bool sync_dst_compute) {
  RESOLVE(CpuToGpuFn, original, LMS_CPU_TO_GPU);
  const TfLmsHooks* h = Hooks();
  if (h != NULL && h->copy_cpu_to_gpu != NULL) {
    h->copy_cpu_to_gpu((void*)original, cpu_tensor, device_context, gpu_device, gpu_tensor,
                       done, sync_dst_compute);
    return;
  }
  original(cpu_tensor, device_context, gpu_device, gpu_tensor, done, sync_dst_compute);
}

void LmsCopyGpuTensorToSameGpu(
    void* gpu_device, const void* device_context, const void* src_tensor, void* dst_tensor,
    void* done) __asm__(LMS_GPU_TO_SAME_GPU);
void LmsCopyGpuTensorToSameGpu(
    void* gpu_device, const void* device_context, const void* src_tensor, void* dst_tensor,
    void* done) {
  RESOLVE(GpuToCpuFn, original, LMS_GPU_TO_SAME_GPU);  /* the same parameter list */
  const TfLmsHooks* h = Hooks();
  if (h != NULL && h->copy_gpu_to_same_gpu != NULL) {
    h->copy_gpu_to_same_gpu((void*)original, gpu_device, device_context, src_tensor,
                            dst_tensor, done);
    return;
  }
  original(gpu_device, device_context, src_tensor, dst_tensor, done);
}

typedef void (*DeviceToDeviceFn)(void*, void*, void*, void*, unsigned long long,
                                 unsigned long long, const void*, void*, int, void*);
void LmsDeviceToDeviceCopy(
    void* send_device_context, void* recv_device_context, void* src_device, void* dst_device,
    unsigned long long src_attributes, unsigned long long dst_attributes, const void* input,
    void* output, int stream_index, void* done) __asm__(LMS_DEVICE_TO_DEVICE);
void LmsDeviceToDeviceCopy(
    void* send_device_context, void* recv_device_context, void* src_device, void* dst_device,
    unsigned long long src_attributes, unsigned long long dst_attributes, const void* input,
    void* output, int stream_index, void* done) {
  RESOLVE(DeviceToDeviceFn, original, LMS_DEVICE_TO_DEVICE);
  const TfLmsHooks* h = Hooks();
  if (h != NULL && h->copy_device_to_device != NULL) {
    h->copy_device_to_device((void*)original, send_device_context, recv_device_context,
                             src_device, dst_device, src_attributes, dst_attributes, input,
                             output, stream_index, done);
    return;
  }
  original(send_device_context, recv_device_context, src_device, dst_device, src_attributes,
           dst_attributes, input, output, stream_index, done);
}

#if defined(__x86_64__)
/* absl::Status tensorflow::ThreadPoolDevice::MakeTensorFromProto(
 *     const TensorProto&, tsl::AllocatorAttributes, Tensor*)
 * (a vtable slot, bound by symbol). absl::Status is not trivially copyable,
 * so the x86-64 ABI returns it through a hidden pointer passed first, before
 * `this`, and hands that pointer back in rax; AllocatorAttributes is two
 * 32-bit fields, one register. Other ABIs pass the hidden pointer
 * elsewhere (x8 on AArch64), which C cannot express: there the original
 * runs unhooked. The adapter turns an allocation failure inside it into an
 * OOM error (tf_adapter/outside_kernel.h). */
#define LMS_MAKE_TENSOR_FROM_PROTO \
  "_ZN10tensorflow16ThreadPoolDevice19MakeTensorFromProtoERKNS_11TensorProtoEN3tsl19AllocatorAttributesEPNS_6TensorE"
typedef void* (*MakeTensorFn)(void*, void*, const void*, unsigned long long, void*);
void* _ZN10tensorflow16ThreadPoolDevice19MakeTensorFromProtoERKNS_11TensorProtoEN3tsl19AllocatorAttributesEPNS_6TensorE(
    void* status, void* self, const void* proto, unsigned long long attributes,
    void* tensor) {
  RESOLVE(MakeTensorFn, original, LMS_MAKE_TENSOR_FROM_PROTO);
  const TfLmsHooks* h = Hooks();
  if (h != NULL && h->make_tensor_from_proto != NULL) {
    return h->make_tensor_from_proto((void*)original, status, self, proto, attributes,
                                     tensor);
  }
  return original(status, self, proto, attributes, tensor);
}
#endif
