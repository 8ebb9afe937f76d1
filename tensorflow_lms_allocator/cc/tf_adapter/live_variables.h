// LiveVariables: the variable buffers that running XLA kernels hold, so that
// a free of one the variable still holds is refused.
//
// Note [XLA frees live variables on its error path]
// ==================================================
// A tf.function(jit_compile=True) (Keras `jit_compile=True`) runs as one
// kernel (StatefulPartitionedCall with _XlaMustCompile, XlaLaunch) that
// reads and updates the model's variables in place. When its execution fails
// (measured: "Out of memory while trying to allocate 60.13MiB" for the XLA
// step's temporaries on a 50 MiB emulated device, LMS off), TensorFlow 2.21
// frees the variables' buffers inside that kernel while the tf.Variables
// still hold them. The memory then goes to the next tensors, so the weights
// change under unrelated tf.fill calls, a later step fails with garbage
// shapes, and each such variable is freed a second time at exit (NOT_FOUND
// frees in LMS's log). It is TensorFlow's bug, not LMS's:
// stock TensorFlow with its own BFC allocator capping the CPU device
// (TF_CPU_ALLOCATOR_USE_BFC=true, TF_CPU_BFC_MEM_LIMIT_IN_MB=50) aborts in
// the second free ("bfc_allocator.cc:711 Check failed: h !=
// kInvalidChunkHandle", from Tensor::~Tensor). Nothing in the guard is
// specific to the CPU device, but it has run only on the emulated device.
//
// The guard: while an XLA kernel runs, the buffers of the variables it
// reaches through its resource inputs are registered here (KernelPins pins
// them anyway, Note [Variables reached through handles]). A free of such a
// buffer is deferred until the kernel ends. Then, if the variable still
// holds the buffer, the free was premature and is dropped: the memory stays
// the variable's, its bytes intact, and the variable's own Tensor frees it
// later, once. If the variable let go of it (a successful step gave it a new
// buffer), the free happens then. The decision cannot be made at the free
// itself: a successful step frees the old buffer from inside Tensor's
// assignment, while the variable's Tensor still points at it. The variable's
// tensor is read without its lock (the failed launch may still hold it when
// its context ends): a concurrent assign elsewhere would race with the XLA
// kernel in TensorFlow itself.
//
// Thread-safety: thread-safe. The check on every free is one relaxed atomic
// load while no XLA kernel holds a variable.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_LIVE_VARIABLES_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_LIVE_VARIABLES_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "engine/thread_annotations.h"

namespace tensorflow {
class OpKernel;
class Var;
}  // namespace tensorflow

namespace lms {

class LiveVariables {
 public:
  // Whether `kernel` runs XLA: an XlaLaunch/_XlaRun op, or a function call
  // compiled as a whole (_XlaMustCompile).
  static bool IsXlaKernel(const tensorflow::OpKernel& kernel);

  // `data` is `variable`'s buffer, held by a running XLA kernel: registered
  // (with a reference on the variable) until the matching Remove.
  void Add(const void* data, tensorflow::Var* variable);
  // Ends one registration. Returns true if a free of `data` was deferred and
  // is due now (the variable no longer holds it): the caller frees it.
  bool Remove(const void* data, tensorflow::Var* variable);

  // True if `data` is registered: its free is deferred to the last Remove.
  // Cheap when nothing is registered.
  bool DeferFree(const void* data) {
    if (registered_.load(std::memory_order_relaxed) == 0) return false;
    return DeferFreeSlow(data);
  }

  // Frees dropped because the variable still held the buffer (for tests).
  int64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  struct Held {
    std::vector<tensorflow::Var*> variables;  // one reference each
    bool free_deferred = false;
  };

  bool DeferFreeSlow(const void* data);

  std::atomic<int64_t> registered_{0};
  std::atomic<int64_t> dropped_{0};
  std::mutex mu_;
  std::unordered_map<const void*, Held> held_ LMS_GUARDED_BY(mu_);
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_LIVE_VARIABLES_H_
