// Pins for the copies TensorFlow makes outside kernels on a GPU.
//
// Note [TensorFlow's own copies]
// ==============================
// A GPU device moves tensors outside any kernel through GPUUtil:
// device-to-host (.numpy(), a send to another host, a fetch from
// tf.function), host-to-device (the input of a step, a constant), within one
// GPU, and between GPUs (DeviceToDeviceCopy, which TensorFlow registers as
// its GPU-to-GPU CopyTensor function). Each holds its tensors by reference,
// never pins them, and only enqueues: the copy runs later on one of the
// device context's streams, and `done` runs once it has completed. Without
// pins, such a copy of an LMS tensor could be enqueued between the host wait
// that precedes an eviction's remap and the remap itself (the gap of Note
// [Stream protocol] in backends/cuda_backend.h), and then run on no mapping
// at all: an illegal-address fault that ends the CUDA context.
//
// So each of these copies runs pinned (PinnedCopy):
//   1. the device context's streams are handed to the LMS device of each
//      buffer first (DeviceRegistry::NoteDeviceContext), so that the page-in
//      in step 2 makes them wait for its copy, as for a kernel's streams;
//   2. the LMS buffers of the copy are pinned, paging an evicted one in, as
//      a kernel pins its inputs (waiting for other kernels to release memory
//      when the device is full: KernelPins::PinForCopy; on TensorFlow's
//      event threads, where nothing waits, the copy is handed to a thread
//      that may: Note [Copies from event threads] in tensorflow_copies.cc);
//      a buffer that cannot be pinned fails the copy's done;
//   3. only then is the copy enqueued (the original GPUUtil function), with
//      a `done` that unpins before it calls TensorFlow's.
// Why this closes the gap: the enqueue happens while the buffer is pinned,
// so no eviction can be between its host wait and its remap (a unit is chosen
// for eviction only unpinned), and no remap happens until `done`, which
// runs after the copy completed on its stream. A page-in at the pin is
// before the enqueue, and the stream waits for the page-in's copy (step 1).
// If a buffer cannot be paged in (the device is full of memory pinned by
// kernels that do not finish), the copy is not enqueued and `done` receives
// ResourceExhaustedError naming the buffer and the device, as TensorFlow's
// own allocator fails a copy whose destination it cannot allocate.
//
// What remains approximate: a DeviceToDeviceCopy runs on the sending
// device's stream. If the destination lives on another LMS GPU and was
// evicted at the pin, its page-in is ordered for the destination device's
// streams only; TensorFlow allocates a copy's destination right before the
// copy (resident unless the device was full), so this needs a destination
// born evicted and paged in by the copy itself. Never run on a GPU.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_TENSORFLOW_COPIES_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_TENSORFLOW_COPIES_H_

#include "tensorflow/core/framework/device.h"
#include "tensorflow/core/framework/device_base.h"
#include "tensorflow/core/framework/tensor.h"
#include "tf_adapter/tf_compat.h"
#include LMS_TSL_ALLOCATOR_H  // tf_compat.h: where this TensorFlow has it

namespace lms {

// GPUUtil's functions, as TensorFlow 2.21 declares them
// (tensorflow/core/common_runtime/gpu/gpu_util.h): what `original` is.
using GpuToCpuFn = void (*)(tensorflow::Device*, const tensorflow::DeviceContext*,
                            const tensorflow::Tensor*, tensorflow::Tensor*,
                            tensorflow::StatusCallback);
using CpuToGpuFn = void (*)(const tensorflow::Tensor*, const tensorflow::DeviceContext*,
                            tensorflow::Device*, tensorflow::Tensor*,
                            tensorflow::StatusCallback, bool);
using SameGpuFn = GpuToCpuFn;
using DeviceToDeviceFn = void (*)(tensorflow::DeviceContext*, tensorflow::DeviceContext*,
                                  tensorflow::Device*, tensorflow::Device*,
                                  tsl::AllocatorAttributes, tsl::AllocatorAttributes,
                                  const tensorflow::Tensor*, tensorflow::Tensor*, int,
                                  tensorflow::StatusCallback);

// The AllocatorAttributes the interposer passes as the 64-bit integer that
// carries them in one register (DeviceToDeviceCopy's hook).
tsl::AllocatorAttributes AllocatorAttributesFromBits(unsigned long long bits);

// tensorflow::GPUUtil's copies, pinned: each takes GPUUtil's own arguments
// and, as `unpinned`, GPUUtil's function (the interposer's original, or in a
// patched TensorFlow its body kept under another name), and runs it as
// PinnedCopy says, with the buffers the process's LMS devices own
// (Runtime's DeviceRegistry), handing `done` the copy's status.
void PinnedCopyGpuTensorToCpu(GpuToCpuFn unpinned, tensorflow::Device* gpu_device,
                              const tensorflow::DeviceContext* device_context,
                              const tensorflow::Tensor* gpu_tensor,
                              tensorflow::Tensor* cpu_tensor, tensorflow::StatusCallback done);
void PinnedCopyCpuTensorToGpu(CpuToGpuFn unpinned, const tensorflow::Tensor* cpu_tensor,
                              const tensorflow::DeviceContext* device_context,
                              tensorflow::Device* gpu_device, tensorflow::Tensor* gpu_tensor,
                              tensorflow::StatusCallback done, bool sync_dst_compute);
void PinnedCopyGpuTensorToSameGpu(SameGpuFn unpinned, tensorflow::Device* gpu_device,
                                  const tensorflow::DeviceContext* device_context,
                                  const tensorflow::Tensor* src_gpu_tensor,
                                  tensorflow::Tensor* dst_gpu_tensor,
                                  tensorflow::StatusCallback done);
void PinnedDeviceToDeviceCopy(DeviceToDeviceFn unpinned,
                              tensorflow::DeviceContext* send_dev_context,
                              tensorflow::DeviceContext* recv_dev_context,
                              tensorflow::Device* src, tensorflow::Device* dst,
                              tsl::AllocatorAttributes src_alloc_attr,
                              tsl::AllocatorAttributes dst_alloc_attr,
                              const tensorflow::Tensor* input, tensorflow::Tensor* output,
                              int dev_to_dev_stream_index, tensorflow::StatusCallback done);

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_TENSORFLOW_COPIES_H_
