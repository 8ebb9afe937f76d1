"""The C++ tree shows the two ways in: includes run only downward.

tensorflow_lms_allocator/cc/ holds, bottom up: the engine (C++17 and the OS),
its backends, the TensorFlow-facing runtime both ways in share (tf_adapter/),
and above it the runtime overlay's glue (overlay/, interposer/), the entry
points of a patched TensorFlow (patch/), the tests' probes (tf_testing/) and
the Python binding (python/). A lower folder never includes a higher one, so
the source patch can ship engine/, backends/, tf_adapter/ and patch/ alone.

Example:
    $ .venv/bin/python -m pytest -q tests/test_layout.py
"""

from __future__ import annotations

import re
from pathlib import Path

CC = Path(__file__).resolve().parents[1] / "tensorflow_lms_allocator" / "cc"
# Each folder and the folders its files may include (besides itself).
MAY_INCLUDE = {
    "engine": set(),
    "testing": {"engine"},
    "backends": {"engine"},
    "tf_adapter": {"engine", "backends"},
    "patch": {"engine", "backends", "tf_adapter"},
    "overlay": {"engine", "backends", "tf_adapter", "interposer"},
    "interposer": set(),
    "tf_testing": {"engine", "backends", "tf_adapter"},
    "python": {"engine", "backends", "testing"},
}
INCLUDE = re.compile(r'^#include "(\w+)/[\w./]+"', re.M)


def test_every_folder_is_placed_in_the_layering():
    folders = {p.name for p in CC.iterdir() if p.is_dir()}
    assert folders == set(MAY_INCLUDE), folders ^ set(MAY_INCLUDE)


def test_includes_run_only_downward():
    wrong, across = [], 0
    for folder, allowed in MAY_INCLUDE.items():
        for source in sorted((CC / folder).glob("*.[ch]*")):
            for included in INCLUDE.findall(source.read_text()):
                if included not in MAY_INCLUDE or included == folder:
                    continue
                across += 1
                if included not in allowed:
                    wrong.append(f"{source.relative_to(CC)} includes {included}/")
    assert not wrong, wrong
    assert across > 50  # the check saw the tree's includes between folders


PACKAGE = CC.parent
# The Python side, bottom up: the tools need neither TensorFlow nor the
# overlay; the overlay (a stock wheel's import-time wiring) needs no tool; the
# API (lms.py) stands on both; callbacks on the API; the package's
# __init__ on the API and the overlay.
TOOLS = {"engine", "trace", "replay", "_engine"}
PYTHON_MAY_IMPORT = {
    "engine": TOOLS, "trace": TOOLS, "replay": TOOLS,
    "overlay": {"overlay", "_engine"},
    "lms": TOOLS | {"overlay"},
    "callbacks": TOOLS | {"lms"},
    "__init__": {"lms", "overlay"},
}


def _package_imports(source: Path) -> set[str]:
    """The first component under tensorflow_lms_allocator of each import in `source`."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE.name):
            rest = node.module[len(PACKAGE.name):].lstrip(".")
            found |= {rest.split(".")[0]} if rest else {alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == PACKAGE.name and len(parts) > 1:
                    found.add(parts[1])
    return found


def test_python_modules_import_only_downward():
    """Where each module is placed; nothing imports up (the tools never reach the overlay)."""
    modules = {p.stem for p in PACKAGE.glob("*.py")} | {"overlay"}
    assert modules == set(PYTHON_MAY_IMPORT), modules ^ set(PYTHON_MAY_IMPORT)
    wrong = []
    for name, allowed in PYTHON_MAY_IMPORT.items():
        sources = sorted((PACKAGE / "overlay").glob("*.py")) if name == "overlay" else \
            [PACKAGE / f"{name}.py"]
        for source in sources:
            for imported in _package_imports(source) - allowed - {name}:
                wrong.append(f"{source.relative_to(PACKAGE)} imports {imported}")
    assert not wrong, wrong


def test_the_tools_that_import_beside_another_tensorflow_are_the_layerings_tools():
    """A tools-only import skips the version check (overlay/activation.py):
    exactly the modules placed here as needing neither TensorFlow nor the overlay."""
    from tensorflow_lms_allocator.overlay import activation

    assert activation._TOOLS == TOOLS
