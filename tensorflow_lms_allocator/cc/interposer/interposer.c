/* The interposer: definitions of the few TensorFlow functions LMS needs,
 * loaded into the global symbol scope before TensorFlow, so that the dynamic
 * linker binds TensorFlow's own calls to them (DESIGN.md, "Facts measured").
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
            "TensorFlow is not the 2.21 the package was built for\n",
            symbol, dlerror());
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
 * deleting. The hook runs first, while the context is still whole. */
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

void _ZN10tensorflow15OpKernelContextD0Ev(void* self) {
  RESOLVE(DtorFn, original, "_ZN10tensorflow15OpKernelContextD0Ev");
  ContextDestroyed(self);
  original(self);
}

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
