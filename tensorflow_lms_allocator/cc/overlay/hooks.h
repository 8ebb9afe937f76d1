// The glue between the interposer (interposer/lms_hooks.h: C, no
// TensorFlow) and the overlay: the functions the interposer calls after
// TensorFlow's own, forwarding to Runtime and KernelPins.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_OVERLAY_HOOKS_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_OVERLAY_HOOKS_H_

#include "engine/status.h"

namespace lms {

// Hands the hooks to the interposer. kFailedPrecondition if the interposer
// is not loaded in the global scope (the package must load it before
// TensorFlow).
Status RegisterOverlayHooks();

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_OVERLAY_HOOKS_H_
