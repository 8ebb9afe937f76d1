"""Keras's compile-time choice that LMS changes: XLA for ``jit_compile="auto"``.

Note [XLA under LMS]
An XLA cluster runs as one kernel: LMS pins its inputs (the variables it
reaches included) while it runs, and what XLA allocates for it (its
temporaries, as one buffer) is that kernel's allocation. LMS swaps tensors
only between kernels, so a cluster's working set must fit in device memory
as a whole. Keras 3 compiles the whole training step as one cluster whenever
it sees a GPU (``jit_compile="auto"``: ``Trainer._resolve_auto_jit_compile``),
which is exactly the step LMS needs to split into kernels. So with LMS on,
``"auto"`` resolves to False (said once per process, with how to force XLA),
and an explicit ``jit_compile=True`` is kept with one warning. Without a GPU
Keras already resolves ``"auto"`` to False; nothing changes there.

Example:
    >>> import tensorflow_lms_allocator  # installs this before Keras compiles
    >>> model.compile(optimizer="sgd", loss="mse")  # doctest: +SKIP
    >>> model.jit_compile  # with LMS on and a GPU visible  # doctest: +SKIP
    False
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any, Callable

_TRAINER = "keras.src.trainers.trainer"
_said: set[str] = set()


def _say_once(key: str, message: str) -> None:
    if key not in _said:
        _said.add(key)
        logging.getLogger("tensorflow").warning(message)


def _patch(trainer_module: Any, lms_enabled: Callable[[], bool]) -> bool:
    """Wraps Trainer's jit_compile resolution and setter; False if Keras lacks them."""
    trainer = getattr(trainer_module, "Trainer", None)
    resolve = getattr(trainer, "_resolve_auto_jit_compile", None)
    prop = getattr(trainer, "jit_compile", None)
    if resolve is None or not isinstance(prop, property) or prop.fset is None:
        return False
    if getattr(resolve, "_lms_patched", False):
        return True

    @functools.wraps(resolve)
    def resolve_auto_jit_compile(self: Any) -> bool:
        resolved = resolve(self)
        if resolved and lms_enabled():
            _say_once("auto", (
                "tensorflow_lms_allocator: jit_compile='auto' resolves to False because LMS "
                "is on: an XLA-compiled training step is one kernel, which LMS cannot swap "
                "tensors within (Note [XLA under LMS]). Pass jit_compile=True to "
                "model.compile() to use XLA anyway; each XLA cluster must then fit in device "
                "memory as a whole."))
            return False
        return resolved

    resolve_auto_jit_compile._lms_patched = True  # type: ignore[attr-defined]

    setter = prop.fset

    @functools.wraps(setter)
    def set_jit_compile(self: Any, value: Any) -> None:
        setter(self, value)
        if value is True and lms_enabled():
            _say_once("explicit", (
                "tensorflow_lms_allocator: jit_compile=True with LMS on: each XLA cluster (in "
                "Keras, the whole training step) runs as one kernel whose inputs, outputs and "
                "temporaries must fit in device memory together; LMS swaps tensors only "
                "between kernels (Note [XLA under LMS]). Use jit_compile=False if the step "
                "runs out of memory."))

    trainer.jit_compile = property(prop.fget, set_jit_compile, prop.fdel, prop.__doc__)
    trainer._resolve_auto_jit_compile = resolve_auto_jit_compile
    return True


def install(lms_enabled: Callable[[], bool]) -> bool:
    """Patches Keras's Trainer if Keras is loaded (TensorFlow 2.21 imports it).

    Returns whether Keras's Trainer was found and patched; a Keras without
    ``_resolve_auto_jit_compile`` is left as it is.

    Example:
        >>> install(get_lms_enabled)  # doctest: +SKIP
        True
    """
    module = sys.modules.get(_TRAINER)
    if module is None:
        try:
            import importlib

            module = importlib.import_module(_TRAINER)
        except ImportError:
            return False
    return _patch(module, lms_enabled)
