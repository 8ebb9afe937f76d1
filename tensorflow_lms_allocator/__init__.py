"""TensorFlow Large Model Support (LMS): an address-stable swapping allocator.

Training a model that does not fit in GPU memory normally stops with
``ResourceExhaustedError``. LMS keeps every tensor at one virtual address for
its whole life and swaps only the physical memory behind it: inactive tensors
move to host memory when the device runs out and come back when a kernel pins
them.

This release ships the engine (``tensorflow_lms_allocator.engine``), usable on
its own over emulated device memory. The TensorFlow wiring
(``tf.config.experimental.set_lms_enabled``) comes with the runtime overlay.

Example:
    >>> from tensorflow_lms_allocator.engine import Engine
    >>> engine = Engine(device_bytes=64 << 20, host_bytes=256 << 20)
    >>> address = engine.allocate(8 << 20)
    >>> engine.free(address)
"""

from __future__ import annotations

__version__ = "0.1.0"
