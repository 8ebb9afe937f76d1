"""The runtime overlay's Python side: what wires LMS into a stock TensorFlow wheel.

A TensorFlow built with the patch series (patches/README.md) has LMS inside
and uses none of this; the package's tools (``engine``, ``trace``,
``replay``) do not either. The modules:

- ``activation``: loading the interposer before TensorFlow and the adapter
  after it, when LMS is asked for (Note [Activation]);
- ``after_import``: running a function right after TensorFlow's import;
- ``c_api``: the adapter's C API for ctypes, declared from its header;
- ``config_proto``: ``GPUOptions.Experimental.lms_enabled`` on the stock wheel;
- ``keras_jit``: Keras's ``jit_compile="auto"`` under LMS (Note [XLA under LMS]).

Example:
    >>> import tensorflow_lms_allocator  # runs overlay.activation
    >>> from tensorflow_lms_allocator.overlay import activation
    >>> activation.active()  # doctest: +SKIP
    True
"""
