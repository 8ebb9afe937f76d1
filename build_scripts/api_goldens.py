r"""TensorFlow's API golden files for the APIs the LMS series changes, as its writer prints them.

TensorFlow's API compatibility test compares the public API with text protos in
tensorflow/tools/api/golden/v{1,2}/; the tool that writes them
(tensorflow/tools/api/lib) is not in the wheel. This module prints the same
format from an installed TensorFlow, by the rules of that tool's
python_object_to_proto_visitor.py: a module's public members (the wheel's
tensorflow/tools/common/public_api.py decides which) in name order, routines as
`member_method` with their argspec and the rest as `member` with their type; a
protocol message class as its descriptor. tests/test_patches.py compares what
it prints for the patched API with the series' golden files, whose base texts
are TensorFlow's own (make_patches.py).

Example (with the wheel's Python):
    >>> from tensorflow.core.protobuf import config_pb2  # doctest: +SKIP
    >>> proto_golden("tensorflow.GPUOptions", config_pb2.GPUOptions)[:30]  # doctest: +SKIP
    'path: "tensorflow.GPUOptions"\ntf'
"""

from __future__ import annotations

# The modules whose golden files the series changes: (API version, path).
MODULES = [("v1", "tensorflow.config.experimental"), ("v1", "tensorflow.experimental"),
           ("v2", "tensorflow.config.experimental"), ("v2", "tensorflow.experimental")]
GOLDEN_DIR = "tensorflow/tools/api/golden"

# The writer's normalisation of Python 3 type names to its Python 2 names.
_NORMALIZE_TYPE = {f"<class '{t}'>": f"<type '{t}'>" for t in (
    "property", "object", "getset_descriptor", "int", "str", "type", "tuple", "module",
    "collections.defaultdict", "set", "dict", "NoneType", "frozenset",
    "member_descriptor")}
_NORMALIZE_TYPE.update({f"<class '{e}'>": f"<type 'exceptions.{e}'>"
                        for e in ("Exception", "RuntimeError")})
_NORMALIZE_TYPE["<class 'abc.ABCMeta'>"] = "<type 'type'>"


def golden_path(version: str, module_path: str) -> str:
    """Where TensorFlow keeps the golden file of `module_path`.

    Example:
        >>> golden_path("v2", "tensorflow.experimental")
        'tensorflow/tools/api/golden/v2/tensorflow.experimental.pbtxt'
    """
    return f"{GOLDEN_DIR}/{version}/{module_path}.pbtxt"


def quote(value: str) -> str:
    r"""A string field as protobuf's text format writes it (C escapes).

    Example:
        >>> print(quote("<type 'type'>"))
        "<type \'type\'>"
    """
    escapes = {"\n": r"\n", "\r": r"\r", "\t": r"\t", '"': r"\"", "'": r"\'", "\\": r"\\"}
    out = []
    for byte in value.encode():
        char = chr(byte)
        if char in escapes:
            out.append(escapes[char])
        elif byte < 32 or byte >= 127:
            out.append(f"\\{byte:03o}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def argspec(function) -> str:
    """The writer's argspec string of a Python function (addresses removed).

    Example:
        >>> argspec(lambda device=0: None)
        "args=['device'], varargs=None, keywords=None, defaults=['0'], "
    """
    from tensorflow.python.util import tf_inspect

    spec = tf_inspect.getargspec(function)
    text = "".join(f"{attr}={getattr(spec, attr)}, " for attr in ("args", "varargs", "keywords"))
    if not spec.defaults:
        return text + "defaults=None"
    defaults = [f"{str(v).split(' at ')[0]} instance>" if " at 0x" in str(v) else str(v)
                for v in spec.defaults]
    return text + f"defaults={defaults}, "


def member_method(name: str, spec: str | None) -> str:
    """One `member_method` block of a golden file."""
    lines = ["  member_method {", f"    name: {quote(name)}"]
    if spec is not None:
        lines.append(f"    argspec: {quote(spec)}")
    return "\n".join(lines + ["  }"]) + "\n"


def module_golden(module_path: str, module) -> str:
    """The golden file of `module`, as the API compatibility test writes it."""
    from tensorflow.python.util import tf_decorator, tf_inspect
    from tensorflow.tools.common import public_api

    children: list = []
    visitor = public_api.PublicAPIVisitor(lambda path, parent, kids: children.extend(kids))
    visitor(module_path.partition(".")[2], module, list(tf_inspect.getmembers(module)))
    members, methods = [], []
    for name, child in children:
        _, child = tf_decorator.unwrap(child)
        if name.startswith("_"):
            continue
        if tf_inspect.isroutine(child):
            methods.append(member_method(name, argspec(child)
                                         if hasattr(child, "__code__") else None))
        else:
            mtype = ("<type 'module'>" if tf_inspect.ismodule(child)
                     else _NORMALIZE_TYPE.get(str(type(child)), str(type(child))))
            members.append(f"  member {{\n    name: {quote(name)}\n"
                           f"    mtype: {quote(mtype)}\n  }}\n")
    return (f"path: {quote(module_path)}\ntf_module {{\n" + "".join(members)
            + "".join(methods) + "}\n")


def proto_golden(api_path: str, message_class) -> str:
    """The golden file of a protocol message class: its descriptor in text format."""
    from google.protobuf import descriptor_pb2, text_format

    descriptor = descriptor_pb2.DescriptorProto()
    message_class.DESCRIPTOR.CopyToProto(descriptor)
    body = "".join(f"    {line}\n" if line else "\n"
                   for line in text_format.MessageToString(descriptor).splitlines())
    return f"path: {quote(api_path)}\ntf_proto {{\n  descriptor {{\n{body}  }}\n}}\n"
