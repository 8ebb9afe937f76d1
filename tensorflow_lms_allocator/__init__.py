"""TensorFlow Large Model Support (LMS): an address-stable swapping allocator.

Training a model that does not fit in GPU memory normally stops with
``ResourceExhaustedError``. LMS keeps every tensor at one virtual address for
its whole life and swaps only the physical memory behind it: inactive tensors
move to host memory when the device runs out and come back when a kernel needs
them.

Import this package before TensorFlow; it adds the LMS API to
``tf.config.experimental``. Without TF_LMS_* settings in the environment it
waits for TensorFlow's import (so its tools, ``engine``, ``trace``,
``replay``, never import TensorFlow themselves). Imported after TensorFlow
(or without it), the package gives its tools and its API raises
RuntimeError saying why LMS is not active:

Example:
    >>> import tensorflow_lms_allocator  # first
    >>> import tensorflow as tf
    >>> tf.config.experimental.set_lms_enabled(True)  # doctest: +SKIP

Without a GPU, ``TF_LMS_CPU_DEVICE_MEMORY_MB=<MiB>`` makes TensorFlow's CPU
device an emulated GPU with that much memory. The engine alone is in
``tensorflow_lms_allocator.engine``.
"""

from __future__ import annotations

from tensorflow_lms_allocator.overlay import activation
from tensorflow_lms_allocator.lms import (
    UnpinnedTouch,
    clear_unpinned_touches,
    device_names,
    get_lms_defrag_enabled,
    get_lms_enabled,
    get_statistics,
    hold_device_memory,
    record_trace,
    set_lms_defrag_enabled,
    set_lms_enabled,
    unpinned_touches,
)
from tensorflow_lms_allocator import lms as _lms

__version__ = "0.1.0"

# Now, or when TensorFlow is imported (Note [Activation] in overlay/activation.py);
# imported after TensorFlow or without it, the package is its tools only and
# the API raises why.
activation.install_or_explain(_lms.activate)

__all__ = [
    "UnpinnedTouch",
    "clear_unpinned_touches",
    "device_names",
    "get_lms_defrag_enabled",
    "get_lms_enabled",
    "get_statistics",
    "hold_device_memory",
    "record_trace",
    "set_lms_defrag_enabled",
    "set_lms_enabled",
    "unpinned_touches",
]
