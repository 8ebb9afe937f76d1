"""Installing LMS into a user's own environment (README, Install).

A user has an environment with the stock TensorFlow wheel and installs this
project's wheel (`make wheel`) into it with one `pip install`. These tests do
exactly that in a fresh virtual environment: the wheel built from this
checkout, `tensorflow-cpu==2.21.0` from the package registry, then a real
training run under a cap; and the clear refusal when the environment's
TensorFlow is another version than the one the wheel was built for.
"""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from tf_helpers import describe, run_program

# A wheel built, a fresh environment made and TensorFlow installed into it twice.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
CAP_MIB = 128  # tests/tf_programs/train.py peaks at about 230 MiB


def pip(python: Path, *args: str) -> None:
    proc = subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check",
                           "--quiet", *args], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"pip {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout's wheel, built as `make wheel` builds it."""
    out = tmp_path_factory.mktemp("dist")
    pip(Path(sys.executable), "wheel", "--no-build-isolation", "--no-deps", "-w", str(out),
        str(ROOT))
    (built,) = out.glob("tensorflow_lms_allocator-*.whl")
    return built


@pytest.fixture(scope="module")
def user_env(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    """A fresh virtual environment with the stock wheel and LMS: its python."""
    root = tmp_path_factory.mktemp("user-env")
    venv.EnvBuilder(with_pip=True).create(root)
    python = root / "bin" / "python"
    pip(python, "install", "tensorflow-cpu==2.21.0", str(wheel))
    return python


def test_the_wheel_says_which_tensorflow_it_was_built_for(wheel):
    proc = subprocess.run([sys.executable, str(ROOT / "build_scripts" / "wheel_info.py"),
                           str(wheel.parent)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert f"Built {wheel}" in proc.stdout
    assert "for TensorFlow 2.21.0" in proc.stdout


def test_the_wheels_name_and_metadata_pin_its_tensorflow(wheel):
    """Issue 23 item 3: the version carries the TensorFlow (one file name per
    version in dist/), and the extras pin exactly that TensorFlow."""
    assert wheel.name.startswith("tensorflow_lms_allocator-0.1.0+tf2.21.0-")
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        text = archive.read(metadata).decode()
    assert "Version: 0.1.0+tf2.21.0" in text
    for requirement in ('tensorflow-cpu==2.21.0; extra == "cpu"',
                        'tensorflow==2.21.0; extra == "gpu"',
                        'tensorflow[and-cuda]==2.21.0; extra == "and-cuda"'):
        assert f"Requires-Dist: {requirement}" in text, text


def test_pip_refuses_the_wheel_beside_another_tensorflow_version(wheel, tmp_path):
    """With its [cpu] extra and another tensorflow-cpu asked for in the same
    install, pip's resolver stops before installing anything."""
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run",
                           "--disable-pip-version-check", "--target", str(tmp_path),
                           f"{wheel}[cpu]", "tensorflow-cpu==2.20.0"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0, proc.stdout
    assert "ResolutionImpossible" in proc.stderr, proc.stderr
    # pip's "The conflict is caused by:" names the wheel's pin.
    assert "depends on tensorflow-cpu==2.21.0" in proc.stdout, proc.stdout


TEST_ENTRY_POINTS = ("tf_lms_test_", "tf_lms_kernel_contexts", "tf_lms_turns")


def exported(library: Path) -> set[str]:
    """The functions a shared library exports (nm -D --defined-only)."""
    done = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True,
                          text=True, check=True)
    return {line.split()[-1] for line in done.stdout.splitlines() if " T " in line}


def test_the_wheel_ships_no_test_entry_point_and_the_test_build_has_them(wheel, tmp_path):
    """cc/tf_testing/ is built only for the tests (make build); a user's wheel
    exports the C API and nothing of the tests'."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (adapter,) = [n for n in names if n.endswith("libtf_lms_adapter.so")]
        archive.extract(adapter, tmp_path)
    assert not any(n.endswith("c_api_testing.h") for n in names)
    shipped = exported(tmp_path / adapter)
    assert {"tf_lms_configure", "tf_lms_get_statistics", "tf_lms_inspect"} <= shipped
    assert not [name for name in shipped if name.startswith(TEST_ENTRY_POINTS)]
    import tensorflow_lms_allocator._engine as engine_module

    built = exported(Path(engine_module.__file__).parent / "libtf_lms_adapter.so")
    assert len([name for name in built if name.startswith(TEST_ENTRY_POINTS)]) == 12


def test_the_installed_wheel_trains_over_the_cap_in_a_fresh_environment(user_env):
    location = subprocess.run(
        [str(user_env), "-c", "import importlib.util as u; "
         "print(u.find_spec('tensorflow_lms_allocator').origin)"],
        capture_output=True, text=True, check=True, cwd=user_env.parent).stdout
    assert str(user_env.parent.parent) in location  # the installed copy, not the checkout
    run = run_program("train.py", "fit", python=str(user_env),
                      env={"TF_LMS_CPU_DEVICE_MEMORY_MB": str(CAP_MIB), "TF_LMS_ENABLED": "1"})
    assert run.result and run.result["error"] is None, describe(run)
    stats = run.result["stats"]
    assert stats["peak_bytes_in_use"] > CAP_MIB << 20  # it needed more than the device
    assert stats["bytes_reclaimed"] > 0 and stats["num_page_ins"] > 0


def test_another_tensorflow_version_is_refused_with_what_to_do(user_env):
    pip(user_env, "install", "tensorflow-cpu==2.20.0")
    proc = subprocess.run([str(user_env), "-c", "import tensorflow_lms_allocator"],
                          capture_output=True, text=True, timeout=300, cwd=user_env.parent)
    assert proc.returncode != 0
    assert "ImportError: tensorflow_lms_allocator was built for TensorFlow 2.21.0, " \
           "but tensorflow_cpu 2.20.0 is installed" in proc.stderr, proc.stderr
    assert "--no-build-isolation --force-reinstall" in proc.stderr
    # Refused before TensorFlow or the adapter loaded: nothing crashed.
    assert "Segmentation fault" not in proc.stderr and "undefined symbol" not in proc.stderr
    # The tools need no TensorFlow and load beside any version; LMS's API says why
    # it is not active.
    tools = subprocess.run(
        [str(user_env), "-c", "import tensorflow_lms_allocator.engine as e; "
         "from tensorflow_lms_allocator import replay, trace; "
         "print(e.Engine(8 << 20, host_bytes=16 << 20).stats()['bytes_in_use'], "
         "replay.__name__, trace.__name__)"],
        capture_output=True, text=True, timeout=300, cwd=user_env.parent)
    assert tools.returncode == 0, tools.stderr
    assert tools.stdout.split() == ["0", "tensorflow_lms_allocator.replay",
                                    "tensorflow_lms_allocator.trace"]
    api = subprocess.run(
        [str(user_env), "-c", "from tensorflow_lms_allocator import replay; "
         "import tensorflow as tf; tf.config.experimental.get_lms_enabled()"],
        capture_output=True, text=True, timeout=300, cwd=user_env.parent)
    assert "RuntimeError: LMS is not active in this process: tensorflow_lms_allocator was " \
           "built for TensorFlow 2.21.0, but tensorflow_cpu 2.20.0 is installed" in api.stderr, \
        api.stderr
