"""The adapter's C API is declared once, in c_api.h (and the statistics_c_api.h it
includes), and Python reads it from there."""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path

import pytest

from tensorflow_lms_allocator.overlay import activation, c_api

pytestmark = [pytest.mark.quick, pytest.mark.tensorflow, pytest.mark.gpu_wheel]

CC = Path(__file__).parents[1] / "tensorflow_lms_allocator/cc"
HEADER = CC / "overlay" / "c_api.h"
# Each header of the C API Python reads, where it lives in the sources.
HEADERS = {"c_api.h": HEADER, "statistics_c_api.h": CC / "tf_adapter" / "statistics_c_api.h"}


def test_every_exported_function_of_the_header_is_read_with_its_types() -> None:
    prototypes = c_api.read_prototypes(c_api.read_header(HEADER))
    assert prototypes["tf_lms_get_flag"] == ("int", ["const char*", "int*", "char*", "size_t"])
    assert prototypes["tf_lms_unpinned_touches"] == ("char*", [])
    # From statistics_c_api.h, which c_api.h includes.
    assert prototypes["tf_lms_num_statistics"] == ("int", [])
    assert prototypes["tf_lms_free_string"] == ("void", ["char*"])
    declared = sum(path.read_text().count("TF_LMS_EXPORT ") for path in HEADERS.values())
    assert len(prototypes) == declared - 1  # minus the #define


def test_the_installed_headers_are_the_source_headers() -> None:
    for name, source in HEADERS.items():
        installed = activation._library_dir() / name
        assert installed.read_bytes() == source.read_bytes(), name


def test_the_built_adapter_exports_every_declared_function(tmp_path: Path) -> None:
    # Loading the adapter needs TensorFlow's framework library; its rpath finds it.
    lib = ctypes.CDLL(str(activation._library_dir() / "libtf_lms_adapter.so"))
    c_api.declare(lib, activation._library_dir() / "c_api.h")
    assert lib.tf_lms_code_name.restype is ctypes.c_char_p
    assert lib.tf_lms_code_name(8) == b"RESOURCE_EXHAUSTED"
    assert lib.tf_lms_get_statistics.argtypes[1]._type_ is ctypes.c_int64


def test_a_function_the_library_lacks_is_an_import_error(tmp_path: Path) -> None:
    header = tmp_path / "c_api.h"
    header.write_text("TF_LMS_EXPORT int tf_lms_no_such_function(int x);\n")
    with pytest.raises(ImportError, match="tf_lms_no_such_function.*make build"):
        c_api.declare(ctypes.CDLL(None), header)


def test_an_unknown_c_type_is_an_import_error_naming_it(tmp_path: Path) -> None:
    header = tmp_path / "c_api.h"
    header.write_text("TF_LMS_EXPORT int tf_lms_f(struct Foo* foo);\n")
    with pytest.raises(ImportError, match=r"struct Foo\*"):
        c_api.declare(ctypes.CDLL(None), header)


def test_a_missing_header_is_an_import_error(tmp_path: Path) -> None:
    with pytest.raises(ImportError, match="cannot be read.*make build"):
        c_api.declare(ctypes.CDLL(None), tmp_path / "missing.h")


def test_a_missing_included_header_is_an_import_error(tmp_path: Path) -> None:
    header = tmp_path / "c_api.h"
    header.write_text('#include "tf_adapter/statistics_c_api.h"\n'
                      "TF_LMS_EXPORT int tf_lms_f(int x);\n")
    with pytest.raises(ImportError, match="or one it includes cannot be read.*"
                       "statistics_c_api.h.*make build"):
        c_api.declare(ctypes.CDLL(None), header)


def test_a_tensorflow_built_with_the_lms_patch_refuses_the_overlay(tmp_path: Path) -> None:
    # A framework library that exports the patch's C entry points, loaded.
    source = tmp_path / "framework.c"
    source.write_text("int tf_lms_get_statistics(void) { return 0; }\n")
    patched = tmp_path / "libtensorflow_framework.so.2"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(patched), str(source)], check=True)
    ctypes.CDLL(str(patched))
    with pytest.raises(ImportError, match="built with the LMS patch series.*Do not import "
                       "tensorflow_lms_allocator.*set_lms_enabled"):
        activation._check_not_patched(patched)
    # The stock wheel's framework, which this process runs on, is not patched.
    import tensorflow as tf

    stock = Path(tf.sysconfig.get_lib()) / "libtensorflow_framework.so.2"
    assert hasattr(ctypes.CDLL(str(stock), mode=os.RTLD_NOLOAD | os.RTLD_LAZY), "TF_NewStatus")
    activation._check_not_patched(stock)
    # A library that is not loaded is not looked into.
    activation._check_not_patched(tmp_path / "not_loaded.so")


def test_the_reclaim_order_from_a_build_without_test_entry_points_says_what_to_do(
        monkeypatch) -> None:
    class Wheel:  # an adapter as a wheel builds it: the C API, no tf_lms_test_ functions
        pass

    monkeypatch.setattr(activation, "_ADAPTER", Wheel())
    with pytest.raises(RuntimeError, match="test entry point.*`make build`"):
        activation.set_learned_order("CPU:0", False)
