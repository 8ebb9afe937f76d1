"""TensorFlow Large Model Support (LMS): an address-stable swapping allocator.

Training a model that does not fit in GPU memory normally stops with
``ResourceExhaustedError``. LMS keeps every tensor at one virtual address for
its whole life and swaps only the physical memory behind it: inactive tensors
move to host memory when the device runs out and come back when a kernel needs
them.

Import this package before TensorFlow; it adds the LMS API to
``tf.config.experimental``. Imported after TensorFlow (or without it), the
package gives its tools (``engine``, ``trace``, ``replay``) and its API
raises RuntimeError saying why LMS is not active:

Example:
    >>> import tensorflow_lms_allocator  # first
    >>> import tensorflow as tf
    >>> tf.config.experimental.set_lms_enabled(True)  # doctest: +SKIP

Without a GPU, ``TF_LMS_CPU_DEVICE_MEMORY_MB=<MiB>`` makes TensorFlow's CPU
device an emulated GPU with that much memory. The engine alone is in
``tensorflow_lms_allocator.engine``.
"""

from __future__ import annotations

from tensorflow_lms_allocator import _overlay

__version__ = "0.1.0"

# None without TensorFlow; imported after TensorFlow, the package is its tools
# only and the API raises why (_overlay.install_or_explain).
_tf = _overlay.install_or_explain()

from tensorflow_lms_allocator.lms import (  # noqa: E402
    UnpinnedTouch,
    clear_unpinned_touches,
    device_names,
    get_lms_defrag_enabled,
    get_lms_enabled,
    get_statistics,
    record_trace,
    set_lms_defrag_enabled,
    set_lms_enabled,
    unpinned_touches,
)
from tensorflow_lms_allocator import lms as _lms  # noqa: E402

if _tf is not None:
    _lms.attach(_tf)
if _overlay.active():
    from tensorflow_lms_allocator import _keras

    _keras.install(get_lms_enabled)  # jit_compile="auto" under LMS: Note [XLA under LMS]
    if get_lms_enabled():
        _lms.check_gpus(_tf)  # TF_LMS_ENABLED=1 with a GPU LMS cannot serve: say so now
del _tf

__all__ = [
    "UnpinnedTouch",
    "clear_unpinned_touches",
    "device_names",
    "get_lms_defrag_enabled",
    "get_lms_enabled",
    "get_statistics",
    "record_trace",
    "set_lms_defrag_enabled",
    "set_lms_enabled",
    "unpinned_touches",
]
