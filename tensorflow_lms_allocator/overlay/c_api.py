"""ctypes signatures of the adapter's C API, read from its header.

The C API is declared once, in ``cc/overlay/c_api.h`` and the
``statistics_c_api.h`` it includes (both installed next to the adapter
library). This module reads every ``TF_LMS_EXPORT`` prototype from those headers and gives ctypes the matching ``argtypes``/``restype``, so Python
never keeps a second copy of the signatures that could drift from the C side.
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path
from typing import Any

# C type (spaces normalised) -> ctypes type.
_C_TYPES: dict[str, Any] = {
    "void": None,
    "int": ctypes.c_int,
    "size_t": ctypes.c_size_t,
    "int64_t": ctypes.c_int64,
    "uint64_t": ctypes.c_uint64,
    "const char*": ctypes.c_char_p,
    # A mutable buffer: the caller's message buffer (a ctypes string buffer),
    # or a string the callee returns and the caller frees with
    # tf_lms_free_string. Either way a raw pointer, never converted to bytes.
    "char*": ctypes.c_void_p,
    "void*": ctypes.c_void_p,
    "const void*": ctypes.c_void_p,
    "void**": ctypes.POINTER(ctypes.c_void_p),
    "int*": ctypes.POINTER(ctypes.c_int),
    "int64_t*": ctypes.POINTER(ctypes.c_int64),
    "size_t*": ctypes.POINTER(ctypes.c_size_t),
    "uint64_t*": ctypes.POINTER(ctypes.c_uint64),
}

# A C API header including another: installed, they sit side by side; in the
# sources, under cc/ in the folder the #include names.
_INCLUDE = re.compile(r'^#include "(tf_adapter/(\w+\.h))"$', re.M)
_PROTOTYPE = re.compile(r"TF_LMS_EXPORT\s+([^;{]*?)\b(tf_lms_\w+)\s*\(([^)]*)\)\s*;", re.S)


def _normalise(c_type: str) -> str:
    c_type = re.sub(r"\s+", " ", c_type).strip()
    return re.sub(r"\s*\*\s*", "*", c_type)


def _parameter_type(parameter: str) -> str:
    # "const char* tf_version" -> "const char*"; "void" -> "void".
    parameter = _normalise(parameter)
    if parameter == "void":
        return parameter
    match = re.fullmatch(r"(.*?[\s*])(\w+)", parameter)
    if match is None:
        raise ImportError(f"cannot read the C API parameter '{parameter}'")
    return _normalise(match.group(1))


def read_prototypes(header: str) -> dict[str, tuple[str, list[str]]]:
    """Every exported function of the header: name -> (return type, parameter types).

    Example:
        >>> read_prototypes("TF_LMS_EXPORT int tf_lms_f(const char* s, size_t n);")
        {'tf_lms_f': ('int', ['const char*', 'size_t'])}
    """
    header = re.sub(r"//[^\n]*", "", header)
    prototypes = {}
    for return_type, name, parameters in _PROTOTYPE.findall(header):
        types = [_parameter_type(p) for p in parameters.split(",")]
        prototypes[name] = (_normalise(return_type), [t for t in types if t != "void"])
    return prototypes


def read_header(header_path: Path) -> str:
    """The header's text, each adapter header it includes put in place of its #include.

    Raises OSError if it or an included header cannot be read.

    Example:
        >>> "tf_lms_get_statistics" in read_header(Path("c_api.h"))  # doctest: +SKIP
        True
    """
    text = header_path.read_text()

    def included(match: re.Match) -> str:
        beside = header_path.parent / match.group(2)
        return read_header(beside if beside.exists()
                           else header_path.parent.parent / match.group(1))

    return _INCLUDE.sub(included, text)


def declare(lib: ctypes.CDLL, header_path: Path) -> None:
    """Gives every function of `lib` declared in `header_path` its ctypes signature.

    Raises ImportError if the header is missing, declares a type this module
    cannot map, or declares a function the library does not export (a build
    out of step with its sources: rebuild with `make build`).

    Example:
        >>> lib = ctypes.CDLL("libtf_lms_adapter.so")  # doctest: +SKIP
        >>> declare(lib, Path("c_api.h"))  # doctest: +SKIP
    """
    try:
        text = read_header(header_path)
    except OSError as e:
        raise ImportError(f"the C API header {header_path} or one it includes cannot be "
                          f"read ({e}); "
                          "rebuild tensorflow_lms_allocator with `make build`") from e
    prototypes = read_prototypes(text)
    if not prototypes:
        raise ImportError(f"{header_path} declares no TF_LMS_EXPORT function")
    for name, (return_type, parameter_types) in prototypes.items():
        unknown = [t for t in [return_type, *parameter_types] if t not in _C_TYPES]
        if unknown:
            raise ImportError(f"{header_path}: {name} uses C type(s) {unknown} that "
                              "tensorflow_lms_allocator.overlay.c_api cannot map to ctypes")
        try:
            function = getattr(lib, name)
        except AttributeError as e:
            raise ImportError(f"{lib._name} does not export {name}, which {header_path} "
                              "declares; rebuild with `make build`") from e
        function.restype = _C_TYPES[return_type]
        function.argtypes = [_C_TYPES[t] for t in parameter_types]
