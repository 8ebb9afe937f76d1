"""ConfigProto's gpu_options.experimental.lms_enabled works on the stock wheel.

The source patch adds GPUOptions.Experimental fields lms_enabled = 20 and
lms_defrag_enabled = 21 to config.proto. On the stock wheel the package
extends Python's config_pb2 with them before TensorFlow imports it
(tensorflow_lms_allocator/overlay/config_proto.py), and the GPU allocator hook reads
field 20 from the GPUOptions TensorFlow's C++ runtime parsed (as an unknown
field): the same ConfigProto turns LMS on in both ways in.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tensorflow_lms_allocator.overlay import config_proto
from tf_helpers import describe, run_program

pytestmark = pytest.mark.quick

FAKE_DRIVER = Path(__file__).parents[1] / "build/fake_cuda/libfakecuda.so"


def fake_gpu() -> dict[str, str]:
    if not FAKE_DRIVER.exists():
        pytest.fail(f"{FAKE_DRIVER} is missing: run `make fake-cuda` (make test builds it)")
    return {"TF_LMS_CUDA_DRIVER_PATH": str(FAKE_DRIVER), "FAKE_CUDA_DEVICE_MB": "256",
            "FAKE_CUDA_HOST_MB": "512", "TF_GPU_HOST_MEM_LIMIT_IN_MB": "256"}


def test_pythons_configproto_has_the_fields_and_a_session_runs_with_them():
    run = run_program("config_proto.py", "python")
    assert run.result, describe(run)
    r = run.result
    assert "lms_enabled: true" in r["text"] and "lms_defrag_enabled: true" in r["text"]
    # GPUOptions field 9 (experimental, 6 bytes) holding fields 20 and 21, both true.
    assert r["serialized"] == "4a06a00101a80101"
    assert r["round_trip"] == [True, True] and r["text_round_trip"] is True
    assert r["session"] == [3.0, 6.0]


def test_lms_enabled_in_the_gpu_options_turns_lms_on_for_the_gpu():
    # TF_LMS_ENABLED is not set: only the ConfigProto asks for LMS.
    run = run_program("config_proto.py", "gpu", "set", env=fake_gpu())
    assert run.result, describe(run)
    assert run.result["create"] == ["OK", ""]
    assert run.result["names"] == ["GPU:0"]
    assert run.result["allocated"] == 12 and run.result["placed_in_host_memory"] > 0


def test_without_the_field_tensorflows_own_allocator_serves_the_gpu():
    run = run_program("config_proto.py", "gpu", "unset", env=fake_gpu())
    assert run.result, describe(run)
    code, message = run.result["create"]
    assert code == "FAILED_PRECONDITION" and "LMS is not enabled" in message
    assert run.result["names"] == []


def test_a_descriptor_that_already_uses_the_numbers_is_refused():
    spec = importlib.util.find_spec("tensorflow")
    assert spec is not None and spec.submodule_search_locations
    wheel = Path(list(spec.submodule_search_locations)[0])
    text = (wheel / "core/protobuf/config_pb2.py").read_text()
    extended = config_proto.with_lms_fields(text)
    assert "lms_enabled" not in text and b"lms_enabled" in repr(extended).encode()
    with pytest.raises(ValueError, match="already uses field numbers"):
        config_proto.with_lms_fields(extended)
    with pytest.raises(ValueError, match="no serialized descriptor"):
        config_proto.with_lms_fields("x = 1\n")
