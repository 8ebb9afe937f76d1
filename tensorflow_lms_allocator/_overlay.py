"""Wiring LMS into a stock TensorFlow wheel at import time.

Order matters (DESIGN.md, "Two ways in"): the interposer must be in the
process's global symbol scope before TensorFlow's libraries load, so that the
dynamic linker binds TensorFlow's calls to it; the adapter links TensorFlow and
loads after it.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

_ADAPTER: ctypes.CDLL | None = None


def _library_dir() -> Path:
    # The compiled libraries sit next to the _engine extension, which (in an
    # editable install) is not necessarily next to this file.
    spec = importlib.util.find_spec("tensorflow_lms_allocator._engine")
    if spec is None or spec.origin is None:
        raise ImportError(
            "tensorflow_lms_allocator is not built: run `make build` in the "
            "repository (or `pip install .`)")
    return Path(spec.origin).parent


def _check_tensorflow_not_loaded() -> None:
    if "tensorflow" in sys.modules or "keras" in sys.modules:
        raise ImportError(
            "tensorflow_lms_allocator must be imported before TensorFlow: LMS "
            "replaces TensorFlow's allocator when TensorFlow's libraries load, "
            "and they are already loaded. Put `import tensorflow_lms_allocator` "
            "first, before `import tensorflow` and `import keras`.")


def install() -> ModuleType:
    """Loads the interposer, imports TensorFlow, loads and configures the adapter.

    Returns the tensorflow module. Raises ImportError if TensorFlow was
    imported first, ValueError for a bad environment setting (naming it).
    """
    global _ADAPTER
    import tensorflow_lms_allocator._engine  # noqa: F401  (the build is present)

    _check_tensorflow_not_loaded()
    libs = _library_dir()
    ctypes.CDLL(str(libs / "libtf_lms_interposer.so"), mode=ctypes.RTLD_GLOBAL)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    if os.environ.get("TF_LMS_CPU_DEVICE_MEMORY_MB"):
        # TensorFlow's oneDNN CPU kernels crash (MklConvOp::Compute after a
        # failed temporary allocation in mkl_util.h) instead of raising OOM;
        # its Eigen kernels raise ResourceExhaustedError as GPU kernels do.
        # An explicit TF_ENABLE_ONEDNN_OPTS=1 still wins.
        os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    import tensorflow as tf

    adapter = ctypes.CDLL(str(libs / "libtf_lms_adapter.so"))
    adapter.tf_lms_configure.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    adapter.tf_lms_set_flag.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                                        ctypes.c_size_t]
    adapter.tf_lms_statistic_name.restype = ctypes.c_char_p
    adapter.tf_lms_device_error.restype = ctypes.c_char_p
    adapter.tf_lms_get_statistics.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int]
    adapter.tf_lms_unpinned_touches.restype = ctypes.c_void_p
    adapter.tf_lms_free_string.argtypes = [ctypes.c_void_p]
    error = ctypes.create_string_buffer(1024)
    if adapter.tf_lms_configure(tf.__version__.encode(), error, len(error)) != 0:
        message = error.value.decode()
        if "TF_" in message and "=" in message:
            raise ValueError(message)
        raise ImportError(message)
    _ADAPTER = adapter
    return tf


def adapter() -> ctypes.CDLL:
    """The loaded adapter library (install() must have run)."""
    if _ADAPTER is None:
        raise RuntimeError("tensorflow_lms_allocator's TensorFlow overlay is not installed")
    return _ADAPTER
