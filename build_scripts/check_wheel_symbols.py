#!/usr/bin/env python3
"""Checks that the installed TensorFlow exports every symbol LMS relies on.

The interposer (tensorflow_lms_allocator/cc/interposer/interposer.c) replaces
TensorFlow functions by their mangled names, which it builds for the
TensorFlow it is compiled against (interposer/tf_symbols.h), and the adapter
calls TensorFlow functions it links against. Both are read from the built
libraries of the package installed in this Python, so the check is of what
was built, for whichever TensorFlow version (2.16 to 2.21) is installed (the
one the package was built for). On a wheel where one of them is missing or
renamed, the overlay would silently not hook it (the interposer) or fail to
load (the adapter). This script lists both sets and checks each against the
dynamic symbol tables of the TensorFlow libraries installed in this Python.
An interposed symbol must also be *bound* dynamically by TensorFlow (a PLT
call or a pointer relocation in one of its libraries): a call TensorFlow
made directly, inside its own library, would never reach the interposer.

Usage:
    python build_scripts/check_wheel_symbols.py

Exits 0 if every symbol resolves, 1 (listing the missing ones) otherwise, 2
if a tool or library is missing.

Example:
    $ .venv-gpu-wheel/bin/python build_scripts/check_wheel_symbols.py
    TensorFlow 2.21.0 (tensorflow 2.21.0)
    interposer: 14 of 14 symbols exported by .../tensorflow
    interposer: 10 of 10 functions bound through dynamic relocations
    adapter: 56 of 56 TensorFlow symbols exported
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TF_LIBRARIES = ("libtensorflow_framework.so.2", "libtensorflow_cc.so.2")
TF_NAMESPACES = re.compile(r"10tensorflow|3tsl|3xla|4absl|6google8protobuf")


def fail(message: str, code: int = 2) -> None:
    print(f"check_wheel_symbols: {message}", file=sys.stderr)
    sys.exit(code)


def dynamic_symbols(library: Path, defined: bool) -> set[str]:
    """The dynamic symbols `library` defines (or leaves undefined), without versions."""
    flag = "--defined-only" if defined else "--undefined-only"
    out = subprocess.run(["nm", "-D", flag, str(library)], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def relocated_symbols(library: Path) -> set[str]:
    """The symbols `library` binds through dynamic relocations (PLT calls, pointers)."""
    out = subprocess.run(["readelf", "-rW", str(library)], capture_output=True, text=True,
                         check=True).stdout
    symbols = set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[2].startswith("R_"):
            symbols.add(fields[4].split("@")[0])
    return symbols


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        fail(f"{name} is not installed in {sys.executable}")
    return Path(list(spec.submodule_search_locations)[0])


def built_package_dir() -> Path:
    """Where the package's built libraries are (editable installs keep them
    next to the _engine extension, not in the source tree)."""
    engine = importlib.util.find_spec("tensorflow_lms_allocator._engine")
    if engine is not None and engine.origin is not None:
        return Path(engine.origin).parent
    return package_dir("tensorflow_lms_allocator")


def installed_tensorflow() -> list[tuple[str, str]]:
    """(distribution, version) of every installed distribution of the tensorflow module."""
    names = importlib.metadata.packages_distributions().get("tensorflow", [])
    return sorted({(n, importlib.metadata.version(n)) for n in names})


def main() -> int:
    if shutil.which("nm") is None or shutil.which("readelf") is None:
        fail("nm and readelf (binutils) are needed: install binutils")
    tf_dir = package_dir("tensorflow")
    libraries = [tf_dir / name for name in TF_LIBRARIES if (tf_dir / name).exists()]
    if not libraries:
        fail(f"no TensorFlow library ({', '.join(TF_LIBRARIES)}) in {tf_dir}")
    exported: set[str] = set()
    for library in libraries:
        exported |= dynamic_symbols(library, defined=True)

    package = built_package_dir()
    interposer_lib = package / "libtf_lms_interposer.so"
    adapter_lib = package / "libtf_lms_adapter.so"
    for library in (interposer_lib, adapter_lib):
        if not library.exists():
            fail(f"{library} is not built: run make build")
    built_for = json.loads((package / "build_info.json").read_text())["tensorflow_version"]
    installed = installed_tensorflow()
    if built_for not in {version for _, version in installed}:
        fail(f"the package was built for TensorFlow {built_for}, but this Python has "
             f"{installed or 'none'}: rebuild it here (make test-tf VERSION=...)")
    print(f"TensorFlow {built_for} ({', '.join(f'{n} {v}' for n, v in installed)})")
    interposed = sorted(s for s in dynamic_symbols(interposer_lib, defined=True)
                        if s.startswith("_Z"))
    missing = [s for s in interposed if s not in exported]
    print(f"interposer: {len(interposed) - len(missing)} of {len(interposed)} symbols "
          f"exported by {tf_dir}")
    bound: set[str] = set()
    for library in libraries:
        bound |= relocated_symbols(library)
    # A constructor's or destructor's variants (C1/C2, D0/D1/D2) are one
    # function: TensorFlow binds the ones it calls (C2 and D2 of a class
    # nothing derives from are never called).
    functions: dict[str, list[str]] = {}
    for symbol in interposed:
        functions.setdefault(re.sub(r"([CD])[012](E)", r"\1\2", symbol), []).append(symbol)
    unbound = [name for name, variants in sorted(functions.items())
               if not any(v in bound for v in variants)]
    print(f"interposer: {len(functions) - len(unbound)} of {len(functions)} functions bound "
          "through dynamic relocations")

    # Everything from TensorFlow's namespaces (and the absl and protobuf it
    # bundles): functions, vtables, typeinfo.
    needed = {s for s in dynamic_symbols(adapter_lib, defined=False)
              if s.startswith("_Z") and TF_NAMESPACES.search(s)}
    missing_adapter = sorted(needed - exported)
    print(f"adapter: {len(needed) - len(missing_adapter)} of {len(needed)} TensorFlow "
          "symbols exported")
    for symbol in missing + missing_adapter:
        print(f"  missing: {symbol}", file=sys.stderr)
    for symbol in unbound:
        print(f"  not bound dynamically (TensorFlow's calls would bypass the interposer): "
              f"{symbol}", file=sys.stderr)
    return 1 if missing or missing_adapter or unbound else 0


if __name__ == "__main__":
    sys.exit(main())
