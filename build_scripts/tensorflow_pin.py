"""The wheel's version and TensorFlow pins, from the TensorFlow it is built against.

A dynamic-metadata provider for scikit-build-core (pyproject.toml,
[[tool.dynamic-metadata]]). The package's binaries link one TensorFlow
version's C++ ABI, so each wheel is for one version, and says so:

- its version carries the TensorFlow version as a local label
  (0.1.0+tf2.18.1), so the six wheels of `make wheels` have six file names;
- its extras pin that version: `[gpu]` tensorflow==V, `[and-cuda]`
  tensorflow[and-cuda]==V, `[cpu]` tensorflow-cpu==V. The plain install pins
  nothing, since tensorflow and tensorflow-cpu are two distributions of one
  module and a requirement cannot say "either"; the import then refuses a
  mismatch (tensorflow_lms_allocator/overlay/activation.py).

The TensorFlow version is read from the installed distributions' metadata,
without importing TensorFlow (the build needs it installed: --no-build-isolation).

Example:
    >>> dynamic_metadata({}, {"name": "tensorflow-lms-allocator"})  # doctest: +SKIP
    {'version': '0.1.0+tf2.18.1', 'optional-dependencies': {'cpu': ['tensorflow-cpu==2.18.1'],
     'gpu': ['tensorflow==2.18.1'], 'and-cuda': ['tensorflow[and-cuda]==2.18.1'], ...}}
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PACKAGE_INIT = Path(__file__).resolve().parents[1] / "tensorflow_lms_allocator" / "__init__.py"
# The extras every build has, whatever the TensorFlow.
TEST_EXTRAS = ["pytest", "hypothesis", "numpy"]


def package_version() -> str:
    """The package's own version, `__version__` in tensorflow_lms_allocator/__init__.py."""
    match = re.search(r'^__version__ = "([^"]+)"$', PACKAGE_INIT.read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"no __version__ = \"...\" line in {PACKAGE_INIT}")
    return match.group(1)


def tensorflow_version() -> str:
    """The version of the TensorFlow installed in the building Python."""
    names = importlib.metadata.packages_distributions().get("tensorflow", [])
    versions = sorted({importlib.metadata.version(name) for name in names})
    if not versions:
        raise RuntimeError(
            "tensorflow_lms_allocator builds against the installed TensorFlow, and none is "
            "installed in this Python: install tensorflow or tensorflow-cpu (2.16.2 to 2.21.0) "
            "first, then build with `pip install --no-build-isolation`")
    if len(versions) > 1:
        raise RuntimeError(
            f"several TensorFlow versions are installed ({', '.join(versions)}, from "
            f"{', '.join(sorted(names))}): keep one, then build again")
    return versions[0]


def dynamic_metadata(settings: Mapping[str, Any], project: Mapping[str, Any]) -> dict[str, Any]:
    """The version and extras of a build against the installed TensorFlow."""
    del settings, project  # no settings; nothing else in the project changes them
    tf = tensorflow_version()
    return {
        "version": f"{package_version()}+tf{tf}",
        "optional-dependencies": {
            "cpu": [f"tensorflow-cpu=={tf}"],
            "gpu": [f"tensorflow=={tf}"],
            "and-cuda": [f"tensorflow[and-cuda]=={tf}"],
            "test": TEST_EXTRAS,
        },
    }
