/* The contract between the interposer (C, no TensorFlow) and the TensorFlow
 * adapter (C++, linked against TensorFlow). The interposer calls TensorFlow's
 * original functions and then these hooks, once the adapter has registered
 * them; every pointer is opaque here. */
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_INTERPOSER_LMS_HOOKS_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_INTERPOSER_LMS_HOOKS_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct TfLmsHooks {
  /* After OpKernelContext's constructor: `context` is the new
   * tensorflow::OpKernelContext*, `params` its OpKernelContext::Params*. */
  void (*on_context_created)(void* context, void* params);
  /* Before OpKernelContext's destructor runs. */
  void (*on_context_destroyed)(void* context);
  /* ProcessState::GetCPUAllocator returned `original` (a tsl::Allocator*);
   * returns the allocator TensorFlow should use instead (or `original`). */
  void* (*cpu_allocator)(void* original, int numa_node);
  /* Instead of GPUProcessState::GetGPUAllocator(options, tf_device_id,
   * total_bytes, peer_gpu_ids) on `self`: returns the allocator TensorFlow
   * should use. `original` is that function; the hook calls it as
   * original(self, options, tf_device_id, total_bytes, peer_gpu_ids) when
   * TensorFlow's own allocator should serve the GPU, and must not call it
   * otherwise (TensorFlow's allocator would take the GPU's memory).
   * `options` is a const tensorflow::GPUOptions*, `total_bytes` the memory
   * TensorFlow budgeted for the device. */
  void* (*gpu_allocator)(void* original, void* self, const void* options,
                         int tf_device_id, size_t total_bytes, const void* peer_gpu_ids);
  /* Instead of ThreadPoolDevice::MakeTensorFromProto (x86-64 only): calls
   * `original` (that function, taking the absl::Status* it returns through
   * first) and returns `status`. `attributes` is tsl::AllocatorAttributes
   * (two 32-bit fields, in one register). */
  void* (*make_tensor_from_proto)(void* original, void* status, void* device,
                                  const void* proto, unsigned long long attributes,
                                  void* tensor);
  /* Instead of tensorflow::GPUUtil's copies (a GPU wheel's TensorFlow moves
   * tensors between host and GPU, and between GPUs, with them): each calls
   * `original` (that function) with the arguments that follow it, which are
   * the function's own. `done` is its StatusCallback (a std::function,
   * passed by invisible reference); `*_attributes` are
   * tsl::AllocatorAttributes (8 bytes, in one register). */
  void (*copy_gpu_to_cpu)(void* original, void* gpu_device, const void* device_context,
                          const void* gpu_tensor, void* cpu_tensor, void* done);
  void (*copy_cpu_to_gpu)(void* original, const void* cpu_tensor, const void* device_context,
                          void* gpu_device, void* gpu_tensor, void* done,
                          int sync_dst_compute);
  void (*copy_gpu_to_same_gpu)(void* original, void* gpu_device, const void* device_context,
                               const void* src_tensor, void* dst_tensor, void* done);
  void (*copy_device_to_device)(void* original, void* send_device_context,
                                void* recv_device_context, void* src_device,
                                void* dst_device, unsigned long long src_attributes,
                                unsigned long long dst_attributes, const void* input,
                                void* output, int stream_index, void* done);
} TfLmsHooks;

/* Installs (or, with NULL, removes) the hooks. Returns 0 on success. */
int tf_lms_register_hooks(const TfLmsHooks* hooks);

#ifdef __cplusplus
}
#endif

#endif /* TENSORFLOW_LMS_ALLOCATOR_CC_INTERPOSER_LMS_HOOKS_H_ */
