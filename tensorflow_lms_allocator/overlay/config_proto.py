"""``GPUOptions.Experimental.lms_enabled`` on the stock TensorFlow wheel.

The source patch adds two fields to ``GPUOptions.Experimental`` in
``config.proto``: ``bool lms_enabled = 20;`` and ``bool lms_defrag_enabled =
21;``. Users of ``tf.compat.v1`` configure sessions with them. On the stock
wheel this module makes Python's ``ConfigProto`` know them too: before
TensorFlow is imported, ``install()`` puts an import hook in front of
``tensorflow.core.protobuf.config_pb2`` that runs the wheel's own generated
module with the two fields added to its serialized descriptor (nothing else
in it changes). A ``ConfigProto`` with ``lms_enabled`` set then serializes
field 20; TensorFlow's C++ runtime, whose descriptor lacks the field, keeps it
as an unknown field of the ``GPUOptions`` it hands to its GPU allocator
factory, where LMS reads it (``ReadLmsGpuOptions`` in
``cc/tf_adapter/gpu_devices.h``). proto3 serializes only ``true``: setting a
field to ``False`` leaves the environment's or ``set_lms_enabled``'s choice.

Example:
    >>> import tensorflow_lms_allocator  # before tensorflow: installs the hook
    >>> import tensorflow as tf
    >>> config = tf.compat.v1.ConfigProto()
    >>> config.gpu_options.experimental.lms_enabled = True
    >>> session = tf.compat.v1.Session(config=config)  # doctest: +SKIP
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import re
import sys
import warnings
from pathlib import Path
from types import ModuleType

MODULE = "tensorflow.core.protobuf.config_pb2"
# (name, number), as the patch's config.proto declares them. No json_name:
# protoc leaves it out of the descriptors it serializes into *_pb2.py (the
# wheel's other fields have none), and the GPUOptions API golden file prints
# the descriptor as generated.
LMS_FIELDS = (("lms_enabled", 20), ("lms_defrag_enabled", 21))
_SERIALIZED = re.compile(r"AddSerializedFile\((b'.*?')\)\n")


def with_lms_fields(source: str) -> str:
    """The source of config_pb2.py with LMS's fields in its serialized descriptor.

    Raises ValueError if the source has no serialized descriptor, no
    ``GPUOptions.Experimental``, or already uses the fields' numbers (another
    TensorFlow than 2.21).

    Example:
        >>> text = Path(config_pb2_file).read_text()  # doctest: +SKIP
        >>> "lms_enabled" in with_lms_fields(text)  # doctest: +SKIP
    """
    from google.protobuf import descriptor_pb2

    match = _SERIALIZED.search(source)
    if match is None:
        raise ValueError("config_pb2.py has no serialized descriptor")
    proto = descriptor_pb2.FileDescriptorProto.FromString(ast.literal_eval(match.group(1)))
    experimental = [nested for message in proto.message_type if message.name == "GPUOptions"
                    for nested in message.nested_type if nested.name == "Experimental"]
    if len(experimental) != 1:
        raise ValueError("config.proto has no GPUOptions.Experimental")
    taken = {field.number for field in experimental[0].field}
    if taken & {number for _, number in LMS_FIELDS}:
        raise ValueError(f"GPUOptions.Experimental already uses field numbers {sorted(taken)}")
    for name, number in LMS_FIELDS:
        experimental[0].field.add(name=name, number=number,
                                  type=descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
                                  label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    return source.replace(match.group(1), repr(proto.SerializeToString()), 1)


class _Loader(importlib.abc.Loader):
    def __init__(self, origin: str) -> None:
        self._origin = origin

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module

    def exec_module(self, module: ModuleType) -> None:
        uninstall()
        source = Path(self._origin).read_text()
        try:
            # The pure-Python protobuf runtime slices the serialized file by
            # offsets generated for the original bytes: only the C runtimes
            # (upb, cpp) build descriptors from the bytes alone.
            from google.protobuf.internal import api_implementation

            if api_implementation.Type() == "python":
                raise ValueError("the pure-Python protobuf runtime is in use "
                                 "(PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python)")
            source = with_lms_fields(source)
        except ValueError as error:
            warnings.warn(f"tensorflow_lms_allocator: ConfigProto will not know "
                          f"gpu_options.experimental.lms_enabled ({error}); use "
                          "tf.config.experimental.set_lms_enabled(True) or TF_LMS_ENABLED=1",
                          stacklevel=2)
        exec(compile(source, self._origin, "exec"), module.__dict__)  # noqa: S102


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)  # type: ignore[arg-type]
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            return spec
        spec.loader = _Loader(spec.origin)
        return spec


_FINDER = _Finder()


def install() -> None:
    """Extends config_pb2 when TensorFlow imports it; TensorFlow must not be imported yet."""
    if MODULE not in sys.modules and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
