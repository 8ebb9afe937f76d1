"""One source for TensorFlow 2.16 to 2.21 (issue 23, docs/tensorflow-versions.md).

What CI can check without six TensorFlow downloads: the symbol check passes on
the build in .venv (2.21.0); the interposer's mangled names follow the absl
namespace and version they are compiled for (tf_symbols.h), with the
namespaces and destructors the other versions' wheels really have (measured
on each: `make test-tf-matrix`); the adapter's compatibility header picks the
header paths of each version; and the Makefile refuses versions outside the
range. The matrix itself (each version built and tested) runs outside CI.

Example:
    $ .venv/bin/python -m pytest -q tests/test_tensorflow_versions.py
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CC = ROOT / "tensorflow_lms_allocator" / "cc"


def interposed_symbols(tmp_path: Path, absl_namespace: str, minor: int) -> set[str]:
    """The C++ symbols interposer.c exports when built for TensorFlow 2.`minor`
    whose absl/base/options.h names `absl_namespace` (a stand-in header)."""
    include = tmp_path / f"include-{absl_namespace}-{minor}"
    (include / "absl" / "base").mkdir(parents=True)
    (include / "absl" / "base" / "options.h").write_text(
        f"#define ABSL_OPTION_INLINE_NAMESPACE_NAME {absl_namespace}\n")
    library = tmp_path / f"interposer-{absl_namespace}-{minor}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wall", "-Werror", f"-I{include}",
                    "-DLMS_TF_MAJOR_VERSION=2", f"-DLMS_TF_MINOR_VERSION={minor}",
                    str(CC / "interposer" / "interposer.c"), "-ldl", "-o", str(library)],
                   check=True, capture_output=True, text=True)
    out = subprocess.run(["nm", "-D", "--defined-only", str(library)], check=True,
                         capture_output=True, text=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.split()[-1].startswith("_Z")}


def test_the_symbol_check_passes_on_the_build_in_this_environment():
    """Every symbol the built interposer exports is exported and dynamically bound
    by the installed TensorFlow, and the adapter's TensorFlow symbols all resolve."""
    done = subprocess.run([sys.executable, str(ROOT / "build_scripts" / "check_wheel_symbols.py")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "interposer: 14 of 14 symbols exported" in done.stdout, done.stdout
    assert "interposer: 10 of 10 functions bound" in done.stdout, done.stdout
    assert "TensorFlow 2.21.0" in done.stdout.splitlines()[0]


@pytest.mark.parametrize("absl_namespace, minor, has_d0", [
    ("lts_20230802", 16, False),  # 2.16-2.19: non-virtual ~OpKernelContext
    ("lts_20230802", 19, False),
    ("lts_20250127", 20, True),   # 2.20: virtual, so a deleting destructor
    ("lts_20250814", 21, True),
])
def test_the_interposer_names_follow_absl_and_the_version_it_is_built_for(
        tmp_path, absl_namespace, minor, has_d0):
    symbols = interposed_symbols(tmp_path, absl_namespace, minor)
    gpu_util = {s for s in symbols if "GPUUtil" in s}
    assert len(gpu_util) == 4, sorted(symbols)
    for symbol in gpu_util:
        assert f"N4absl12{absl_namespace}6StatusE" in symbol, symbol
    assert ("_ZN10tensorflow15OpKernelContextD0Ev" in symbols) == has_d0
    assert len(symbols) == (14 if has_d0 else 13)


def test_the_names_for_this_wheel_are_the_ones_it_exports(tmp_path):
    """Built from the real options.h of .venv's TensorFlow (2.21.0), the names are
    exactly those the package's own interposer exports (which the symbol check
    finds in TensorFlow)."""
    import tensorflow_lms_allocator.overlay.activation as activation

    tensorflow = importlib.util.find_spec("tensorflow")  # found, not imported
    tf_include = Path(list(tensorflow.submodule_search_locations)[0]) / "include"
    options = (tf_include / "absl" / "base" / "options.h").read_text()
    namespace = next(line.split()[-1] for line in options.splitlines()
                     if line.startswith("#define ABSL_OPTION_INLINE_NAMESPACE_NAME"))
    built = activation._library_dir() / "libtf_lms_interposer.so"
    out = subprocess.run(["nm", "-D", "--defined-only", str(built)], check=True,
                         capture_output=True, text=True).stdout
    exported = {line.split()[-1] for line in out.splitlines()
                if line.split()[-1].startswith("_Z")}
    assert interposed_symbols(tmp_path, namespace, 21) == exported


def test_a_namespace_that_is_not_an_lts_name_stops_the_build(tmp_path):
    with pytest.raises(subprocess.CalledProcessError) as error:
        interposed_symbols(tmp_path, "head", 21)
    assert "not an LTS name" in error.value.stderr


@pytest.mark.parametrize("minor, header", [
    (16, '"tsl/framework/allocator.h"'),
    (17, '"tsl/framework/allocator.h"'),
    (18, '"xla/tsl/framework/allocator.h"'),
    (21, '"xla/tsl/framework/allocator.h"'),
    (None, '"xla/tsl/framework/allocator.h"'),  # the source patch: the 2.21 tree
])
def test_the_adapter_takes_tsl_headers_from_where_each_version_has_them(minor, header):
    defines = [] if minor is None else ["-DLMS_TF_MAJOR_VERSION=2",
                                        f"-DLMS_TF_MINOR_VERSION={minor}"]
    done = subprocess.run(["g++", "-std=c++17", "-E", "-dM", f"-I{CC}", *defines, "-x", "c++",
                           str(CC / "tf_adapter" / "tf_compat.h")],
                          check=True, capture_output=True, text=True)
    assert f"#define LMS_TSL_ALLOCATOR_H {header}" in done.stdout


def test_make_refuses_a_version_outside_the_supported_range():
    done = subprocess.run(["make", "--no-print-directory", "test-tf", "VERSION=2.15.1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "VERSION=2.15.1 is not a TensorFlow version LMS builds for" in done.stderr
    assert "2.16.2 2.17.1 2.18.1 2.19.1 2.20.0 2.21.0" in done.stderr
