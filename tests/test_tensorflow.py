"""LMS inside the real TensorFlow 2.21 wheel, training real Keras models on the
emulated device (TF_LMS_CPU_DEVICE_MEMORY_MB). Every configuration runs in a
subprocess of its own (tf_helpers.run_program): TensorFlow creates its devices
once per process.

The model (tests/tf_programs/train.py) peaks at about 230 MiB at batch 32 on
TensorFlow's Eigen CPU kernels; the cap is 128 MiB.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tf_helpers import PROGRAMS, describe, log_severity, run_program

pytestmark = [pytest.mark.tensorflow, pytest.mark.gpu_wheel]

MIB = 1 << 20

ROOT = Path(__file__).resolve().parents[1]

CAP_MIB = 128
LMS_ON = {"TF_LMS_CPU_DEVICE_MEMORY_MB": str(CAP_MIB), "TF_LMS_ENABLED": "1"}
LMS_OFF = {"TF_LMS_CPU_DEVICE_MEMORY_MB": str(CAP_MIB), "TF_LMS_ENABLED": "0"}
STOCK = {"LMS_TEST_STOCK": "1"}  # the package is not even imported
MODES = ["fit", "loop", "eager", "session"]


@pytest.fixture(scope="module")
def stock_losses() -> dict[str, list[float]]:
    """Losses of each training mode on stock TensorFlow, uncapped."""
    losses = {}
    for mode in MODES:
        run = run_program("train.py", mode, env=STOCK)
        assert run.result and run.result["error"] is None, describe(run)
        losses[mode] = run.result["losses"]
    return losses


@pytest.mark.parametrize("mode", MODES)
def test_training_over_the_cap_fails_with_oom_without_lms(mode):
    run = run_program("train.py", mode, env=LMS_OFF)
    assert run.returncode == 0 and run.result, describe(run)  # an error, not a crash
    error = run.result["error"]
    assert error and error["type"] == "ResourceExhaustedError", describe(run)
    assert "OOM when allocating tensor" in error["message"]
    assert "LMS is off" in error["message"]  # the allocator says why


@pytest.mark.parametrize("mode", MODES)
def test_training_over_the_cap_completes_with_lms_and_identical_losses(mode, stock_losses):
    run = run_program("train.py", mode, env=LMS_ON)
    assert run.result and run.result["error"] is None, describe(run)
    stats = run.result["stats"]
    assert stats["bytes_limit"] == CAP_MIB << 20
    assert stats["peak_bytes_in_use"] > stats["bytes_limit"]  # it needed more than the device
    assert stats["peak_bytes_reserved"] <= stats["bytes_limit"]
    assert stats["bytes_reclaimed"] > 0
    assert stats["num_single_reclaims"] + stats["num_full_reclaims"] > 0
    assert stats["num_page_ins"] > 0
    # Bit-identical to stock TensorFlow with op determinism on.
    assert run.result["losses"] == stock_losses[mode]


def test_lru_trains_with_identical_losses_and_learns_nothing(stock_losses):
    """TF_LMS_POLICY=lru: least recently used first, the default until 2026-11-28."""
    run = run_program("train.py", "fit", env={**LMS_ON, "TF_LMS_POLICY": "lru"})
    assert run.result and run.result["error"] is None, describe(run)
    stats = run.result["stats"]
    assert stats["bytes_reclaimed"] > 0 and stats["num_page_ins"] > 0
    assert stats["num_learned_reclaims"] == 0 and stats["num_predictions"] == 0
    assert run.result["losses"] == stock_losses["fit"]


def test_the_learned_policy_trains_with_identical_losses(stock_losses):
    """The default policy (no TF_LMS_POLICY), with prefetching on."""
    run = run_program("train.py", "fit", env={**LMS_ON, "TF_LMS_PREFETCH": "1"})
    assert run.result and run.result["error"] is None, describe(run)
    stats = run.result["stats"]
    assert stats["bytes_reclaimed"] > 0 and stats["num_page_ins"] > 0
    # Its predictions were made, checked and used (Note [Learned eviction]),
    # and its helper thread paged tensors in ahead of their kernels.
    assert stats["num_learned_reclaims"] > 0 and stats["num_predictions"] > 0
    assert stats["num_prefetches"] > 0
    assert run.result["losses"] == stock_losses["fit"]


def test_the_learned_policy_switched_to_lrus_order_mid_run_trains_with_identical_losses(
        stock_losses):
    """benchmarks/policy.py sets the two orders side by side in one process."""
    run = run_program("train.py", "fit", env={**LMS_ON, "LMS_TEST_LRU_ORDER_FROM": "2"})
    assert run.result and run.result["error"] is None, describe(run)
    at_switch, end = run.result["at_switch"], run.result["stats"]
    assert at_switch["num_learned_reclaims"] > 0
    # From the switch on, reclaims went on in LRU's order, none in the learned one's,
    # while the policy kept checking its predictions.
    assert end["num_evictions"] > at_switch["num_evictions"]
    assert end["num_learned_reclaims"] == at_switch["num_learned_reclaims"]
    assert end["num_predictions"] > at_switch["num_predictions"]
    assert run.result["losses"] == stock_losses["fit"]


def test_a_larger_granule_trains_with_identical_losses(stock_losses):
    """TF_LMS_GRANULE_MB=8: every allocation of 8 MiB or more in whole 8 MiB
    granules, smaller ones in 8 MiB small-object pages, evicted and paged in."""
    run = run_program("train.py", "fit", env={**LMS_ON, "TF_LMS_GRANULE_MB": "8"})
    assert run.result and run.result["error"] is None, describe(run)
    stats = run.result["stats"]
    assert stats["bytes_limit"] == CAP_MIB << 20
    assert stats["peak_bytes_reserved"] % (8 << 20) == 0  # whole 8 MiB granules
    assert stats["bytes_reclaimed"] > 0 and stats["num_page_ins"] > 0
    assert run.result["losses"] == stock_losses["fit"]


def test_strict_mode_finds_no_unpinned_touch_in_training():
    """Every tensor a training step reads goes through a kernel's pin."""
    run = run_program("train.py", "fit", env={**LMS_ON, "TF_LMS_STRICT": "1"})
    assert run.result and run.result["error"] is None, describe(run)
    assert run.result["stats"]["num_evictions"] > 0
    assert run.result["touches"] == []


def test_training_with_evicted_tensors_unmapped_is_bit_identical(stock_losses):
    """TF_LMS_UNMAP_EVICTED=1: an evicted tensor's address maps nothing until a
    kernel's pin pages it in, so a touch without a pin would kill the process;
    training evicts and pages in, and its losses are stock TensorFlow's, bit for
    bit (Note [Evicted tensors unmapped])."""
    run = run_program("train.py", "fit", env={**LMS_ON, "TF_LMS_UNMAP_EVICTED": "1"})
    assert run.result and run.result["error"] is None, describe(run)
    stats = run.result["stats"]
    assert stats["num_evictions"] > 0 and stats["num_page_ins"] > 0
    assert run.result["losses"] == stock_losses["fit"]


def test_strict_mode_reports_numpy_reading_an_evicted_tensor():
    """EagerTensor.numpy() reads the buffer in place with no kernel: on a GPU
    that read would cross the bus. Strict mode names the allocation, with no op
    ("-") because no kernel runs; the bytes read are still right."""
    run = run_program("probes.py", "strict_numpy",
                      env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "96", "TF_LMS_ENABLED": "1",
                           "TF_LMS_STRICT": "1"})
    assert run.result, describe(run)
    assert run.result["evictions"] > 0
    assert run.result["intact"]
    touches = run.result["touches"]
    assert touches, "the unpinned read was not reported"
    assert {t["allocation_bytes"] for t in touches} == {16 << 20}
    assert {t["op"] for t in touches} == {"-"}
    assert len({t["allocation_id"] for t in touches}) == 1


@pytest.mark.parametrize("defrag", ["0", "1"])
def test_defragmentation_serves_scattered_free_memory_without_evicting(defrag):
    run = run_program("probes.py", "fragment",
                      env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "56", "TF_LMS_ENABLED": "1",
                           "TF_LMS_DEFRAG_ENABLED": defrag})
    assert run.result and run.result["values_ok"], describe(run)
    stats = run.result["stats"]
    if defrag == "1":
        assert stats["num_defragmentations"] >= 1 and stats["bytes_defragged"] > 0
        assert stats["num_evictions"] == 0
    else:
        assert stats["num_defragmentations"] == 0
        assert stats["num_evictions"] > 0  # live tensors paid for the holes


def test_host_swap_exhausted_is_an_oom_naming_the_setting_and_the_process_goes_on():
    run = run_program("probes.py", "host_exhausted",
                      env={**LMS_ON, "TF_GPU_HOST_MEM_LIMIT_IN_MB": "64"})
    assert run.result, describe(run)
    assert "OOM when allocating tensor" in run.result["first"]
    assert "TF_GPU_HOST_MEM_LIMIT_IN_MB" in run.result["first"]
    assert run.result["after"] == [float(i * 4 * 2**20) for i in range(4)]


def test_api_is_on_tf_config_experimental_and_checks_its_arguments():
    run = run_program("probes.py", "api", env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "64"})
    assert run.result, describe(run)
    r = run.result
    assert r["ibm_names"]
    assert r["before"] == {"lms": False, "defrag": True}
    assert r["after"] == {"lms": True, "defrag": False}
    errors = r["errors"]
    assert errors["late_enable"][0] == "RuntimeError" and "TF_LMS_ENABLED" in errors["late_enable"][1]
    assert errors["late_defrag"][0] == "RuntimeError"
    assert errors["gpu_device"][0] == "ValueError" and "GPU" in errors["gpu_device"][1]
    assert errors["bad_index"][0] == "ValueError"
    assert errors["bad_type"][0] == "TypeError"
    assert errors["bad_flag"][0] == "TypeError"
    assert r["same_value_ok"]
    assert set(r["stats"].values()) == {64 << 20}


def test_every_statistic_of_the_design_is_exposed():
    from tensorflow_lms_allocator.lms import PUBLIC, STATISTICS

    assert set(STATISTICS) == {
        "get_num_allocs", "get_bytes_in_use", "get_peak_bytes_in_use",
        "get_largest_alloc_size", "get_bytes_limit", "get_bytes_reserved",
        "get_peak_bytes_reserved", "get_bytes_reservable_limit", "get_bytes_inactive",
        "get_bytes_active", "get_peak_bytes_active", "get_bytes_reclaimed",
        "get_current_bytes_reclaimed", "get_peak_bytes_reclaimed",
        "get_num_single_reclaims", "get_num_full_reclaims", "get_num_defragmentations",
        "get_bytes_defragged", "get_gpu_host_bytes_in_use",
        "get_gpu_host_peak_bytes_in_use"}
    import tensorflow as tf

    for name in PUBLIC:
        assert callable(getattr(tf.config.experimental, name)), name


def test_imported_after_tensorflow_the_tools_work_and_the_api_says_what_to_do():
    """The engine, traces and replay need no TensorFlow (issue 21): after it they
    import; LMS itself cannot be had, and every API function says why."""
    run = run_program("probes.py", "late_import")
    assert run.result and run.result["error"] is None, describe(run)
    assert run.result["engine_allocates"] is True
    assert run.result["tools"] == ["tensorflow_lms_allocator.trace",
                                   "tensorflow_lms_allocator.replay"]
    for name in ("package", "tf_config", "statistics"):
        message = run.result[name]
        assert message and message.startswith("LMS is not active in this process"), name
        assert "must be imported before TensorFlow" in message, message
        assert "Put `import tensorflow_lms_allocator` first" in message, message


def test_importing_after_tensorflow_with_lms_settings_is_an_import_error_naming_them():
    run = run_program("probes.py", "late_import", env={"TF_LMS_ENABLED": "1"})
    assert run.result, describe(run)
    assert "must be imported before TensorFlow" in run.result["error"]
    assert "The environment sets TF_LMS_ENABLED" in run.result["error"]


@pytest.mark.parametrize("env, warned", [
    ({"TF_LMS_ENABLED": "1"}, True),
    ({"TF_LMS_ENABLED": "0"}, False),
    ({"TF_LMS_ENABLED": "1", "TF_LMS_CPU_DEVICE_MEMORY_MB": "64"}, False),
], ids=["enabled_no_device", "disabled", "enabled_emulated"])
def test_lms_enabled_but_serving_no_device_says_so_once(env, warned):
    """With no GPU and no TF_LMS_CPU_DEVICE_MEMORY_MB, LMS on serves nothing:
    one warning at the first op says so and what to set (there was none, even
    at log level 0)."""
    run = run_program("probes.py", "serves", env={**env, "TF_CPP_MIN_LOG_LEVEL": "0"})
    assert run.result and run.result["value"] == 2048.0, describe(run)
    lines = [x for x in run.stderr.splitlines() if "LMS is enabled but serves no device" in x]
    assert len(lines) == (1 if warned else 0), run.stderr[-3000:]
    if warned:
        assert log_severity(lines[0]) == "W", lines[0]
        assert "set TF_LMS_CPU_DEVICE_MEMORY_MB=<MiB>" in lines[0].replace("Set", "set")
        assert run.result["enabled"] is True and run.result["names"] == []


def test_every_logical_cpu_device_answers_with_the_shared_emulated_device():
    """The CPU split into logical devices shares one emulated device: CPU:1
    trains under its cap and answers get_statistics with the shared figures;
    an unknown name is an error naming what LMS serves (it suggested GPU:0 on
    a machine with none, and CPU:1 was unknown)."""
    run = run_program("probes.py", "logical_cpus",
                      env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "64", "TF_LMS_ENABLED": "1"})
    assert run.result, describe(run)
    r = run.result
    assert len(r["logical"]) == 2 and r["names"] == ["CPU:0"]
    assert r["sums"] == [float(i) * 4 * MIB for i in range(6)]  # 96 MiB on 64
    shared = r["stats"]["CPU:0"]
    assert shared["num_evictions"] > 0
    for name, stats in r["stats"].items():
        assert stats["bytes_limit"] == 64 * MIB and stats["num_allocs"] >= shared["num_allocs"], name
    assert "unknown device 'CPU:2'" in r["CPU:2"]
    assert "LMS serves CPU:0 (also as CPU:1: logical devices of the CPU share" in r["CPU:2"]
    assert "GPU:0 has no LMS allocator" in r["GPU:0"] and "LMS serves CPU:0" in r["GPU:0"]


def test_reset_memory_stats_resets_lms_peaks_and_keeps_its_counts():
    """As docs/observing.md says: TensorFlow's reset_memory_stats reaches LMS's peaks
    (each to its current value); counts and cumulative bytes stay."""
    run = run_program("probes.py", "reset_peaks",
                      env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "64", "TF_LMS_ENABLED": "1"})
    assert run.result, describe(run)
    before, after = run.result["before"], run.result["after"]
    assert before["peak_bytes_in_use"] > before["bytes_in_use"]
    for peak, current in (("peak_bytes_in_use", "bytes_in_use"),
                          ("peak_bytes_reserved", "bytes_reserved"),
                          ("peak_bytes_active", "bytes_active"),
                          ("peak_bytes_reclaimed", "current_bytes_reclaimed"),
                          ("host_peak_bytes_in_use", "host_bytes_in_use")):
        assert after[peak] == after[current], peak
    for kept in ("num_allocs", "num_evictions", "bytes_reclaimed", "bytes_copied_out"):
        assert after[kept] == before[kept], kept


def test_importing_after_tensorflow_with_lms_turned_off_asks_for_nothing():
    """TF_LMS_ENABLED=0 (and the other settings set to off) ask for no LMS: the
    package imports after TensorFlow for its tools, as with no setting."""
    run = run_program("probes.py", "late_import",
                      env={"TF_LMS_ENABLED": "0", "TF_LMS_STRICT": "false"})
    assert run.result and run.result["error"] is None, describe(run)
    assert run.result["engine_allocates"] is True
    assert run.result["package"].startswith("LMS is not active in this process")


def test_only_settings_that_do_not_turn_lms_off_ask_for_it():
    from tensorflow_lms_allocator.overlay.activation import asking_settings

    assert asking_settings({"TF_LMS_ENABLED": "0", "TF_LMS_DEFRAG_ENABLED": "False",
                            "TF_LMS_PREFETCH": "0", "TF_LMS_STRICT": "",
                            "TF_LMS_HOST_AHEAD_MB": "0", "HOME": "/root"}) == []
    # A value LMS refuses asks for LMS: its import says what is wrong with it.
    assert asking_settings({"TF_LMS_ENABLED": "1", "TF_LMS_POLICY": "lru",
                            "TF_LMS_CPU_DEVICE_MEMORY_MB": "0", "TF_LMS_PREFETCH": " 0",
                            "TF_LMS_STRICT": "maybe", "TF_LMS_HOST_AHEAD_MB": "512"}) == [
        "TF_LMS_CPU_DEVICE_MEMORY_MB", "TF_LMS_ENABLED", "TF_LMS_HOST_AHEAD_MB", "TF_LMS_POLICY",
        "TF_LMS_PREFETCH", "TF_LMS_STRICT"]


@pytest.mark.parametrize("installed, words", [
    ("2.15.1", ["supports TensorFlow 2.16 to 2.21 (Keras 3)", "tensorflow 2.15.1 is installed",
                "TensorFlow 2.15.1 uses Keras 2", "Upgrade TensorFlow to"]),
    ("9.9.9", ["was built for TensorFlow", "but tensorflow 9.9.9 is installed",
               "or rebuild this package against the installed TensorFlow"]),
])
def test_another_installed_tensorflow_is_an_import_error_saying_what_to_do(installed, words):
    """Issue 23: a TensorFlow older than 2.16 is refused as unsupported (Keras 2), any
    other version than the build's with what to install or rebuild. The installed
    distributions are faked: the check reads only their metadata."""
    program = ("from tensorflow_lms_allocator.overlay import activation\n"
               f"activation.installed_tensorflow = lambda: [('tensorflow', '{installed}')]\n"
               "try:\n    activation._check_tensorflow_version()\n"
               "except ImportError as error:\n    print('RESULT', error)\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120)
    assert "RESULT" in done.stdout, done.stdout + done.stderr
    for word in words:
        assert word in done.stdout, done.stdout


def test_without_tensorflow_the_tools_import_and_the_api_says_it_is_missing(tmp_path):
    """A machine with no TensorFlow (sys.modules["tensorflow"] = None makes every
    import of it fail, as if it were not installed) can still replay and plot."""
    program = ("import sys\nsys.modules['tensorflow'] = None\n"
               "from tensorflow_lms_allocator import replay, trace\n"
               "from tensorflow_lms_allocator.engine import Engine\n"
               "import tensorflow_lms_allocator as lms\n"
               "assert sys.modules['tensorflow'] is None and 'keras' not in sys.modules\n"
               "try:\n    lms.get_lms_enabled()\nexcept RuntimeError as error:\n"
               "    print('RESULT', error)\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RESULT TensorFlow is not installed" in done.stdout, done.stdout


def clean_run(program: str, cwd: Path) -> subprocess.CompletedProcess:
    """`program` in a fresh interpreter with no LMS setting in the environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_LMS_")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=env)


def test_the_tools_never_import_tensorflow_and_lms_activates_when_it_is_imported(tmp_path):
    """Issue 21 item 3 (Note [Activation] in overlay/activation.py): with TensorFlow
    installed and no LMS setting, the package, its tools and a stats tool's run
    leave TensorFlow unloaded; importing TensorFlow afterwards activates LMS
    and adds the API, and TensorFlow's module keeps its own loader."""
    program = textwrap.dedent(f"""
        import json, runpy, sys
        from tensorflow_lms_allocator import replay, trace
        from tensorflow_lms_allocator.engine import Engine
        import tensorflow_lms_allocator as lms
        loaded = {{"tools": sorted(m for m in ("tensorflow", "keras") if m in sys.modules)}}
        engine = Engine(8 << 20, host_bytes=64 << 20)
        with trace.record_engine(engine, "t.lmstrace"):
            engine.free(engine.allocate(4 << 20))
        sys.argv = ["lms_replay.py", "t.lmstrace", "--device-mb", "4"]
        try:
            runpy.run_path({str(ROOT / "stats_tools" / "lms_replay.py")!r}, run_name="__main__")
        except SystemExit as done:
            loaded["replay_exit"] = done.code
        loaded["replay"] = sorted(m for m in ("tensorflow", "keras") if m in sys.modules)
        import importlib.util
        assert importlib.util.find_spec("tensorflow")  # finding it is not importing it
        import tensorflow as tf
        tf.config.experimental.set_lms_enabled(True)
        print("RESULT", json.dumps(dict(loaded, active=sys.modules['tensorflow_lms_allocator.overlay.activation'].active(),
              enabled=tf.config.experimental.get_lms_enabled(),
              loader=type(tf.__spec__.loader).__name__, same=tf.__loader__ is tf.__spec__.loader)))
    """)
    done = clean_run(program, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert result == {"tools": [], "replay_exit": 0, "replay": [], "active": True,
                      "enabled": True, "loader": "SourceFileLoader", "same": True}, result


def test_an_lms_call_before_tensorflow_imports_it_and_activates_lms(tmp_path):
    program = textwrap.dedent("""
        import sys
        import tensorflow_lms_allocator as lms
        before = "tensorflow" in sys.modules
        enabled = lms.get_lms_enabled()
        import tensorflow as tf
        print("RESULT", before, enabled, "tensorflow" in sys.modules, sys.modules['tensorflow_lms_allocator.overlay.activation'].active(),
              tf.config.experimental.get_lms_enabled is lms.get_lms_enabled)
    """)
    done = clean_run(program, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RESULT False False True True True" in done.stdout, done.stdout


@pytest.mark.parametrize("variable,value", [("TF_LMS_CPU_DEVICE_MEMORY_MB", "12x"),
                                            ("TF_LMS_ENABLED", "maybe"),
                                            ("TF_LMS_POLICY", "mru"),
                                            ("TF_GPU_HOST_MEM_LIMIT_IN_MB", "-1")])
def test_a_bad_environment_value_is_an_error_naming_it(variable, value):
    run = run_program("probes.py", "api", env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "64",
                                               variable: value})
    assert run.returncode != 0
    assert f"ValueError: {variable}='{value}'" in run.stderr, describe(run)


def test_a_kernel_reading_a_slice_of_an_evicted_tensor_pins_and_pages_it_in():
    """The slice's data pointer lies inside the evicted allocation: the pin
    resolves it, pages the whole allocation in, and strict mode sees no
    unpinned touch."""
    run = run_program("probes.py", "slice_pin",
                      env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "96", "TF_LMS_ENABLED": "1",
                           "TF_LMS_STRICT": "1"})
    assert run.result, describe(run)
    assert run.result["evicted"] > 0 and run.result["page_ins"] >= 1
    assert run.result["total"] == run.result["expected"]
    assert run.result["touches"] == []


def test_the_adapter_refuses_a_tensorflow_version_it_was_not_built_for():
    run = run_program("probes.py", "wrong_version")
    assert run.result and run.result["code"] == "FAILED_PRECONDITION", describe(run)
    assert (f"built for TensorFlow {run.result['built_for']} but TensorFlow "
            f"{run.result['other']}") in run.result["message"]


def machine_huge_pages() -> str:
    """How this machine gives shared memory huge pages, as the log line says
    it (posix_backend.h): shmem_enabled allows them, or MADV_COLLAPSE makes
    a memfd's 2 MiB one huge page (asked here through the C library)."""
    setting = Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
    if setting.exists() and any(f"[{word}]" in setting.read_text()
                                for word in ("always", "within_size", "advise", "force")):
        return "on (shmem_enabled)"
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    huge = 2 << 20
    fd = os.memfd_create("collapse-probe")
    try:
        os.ftruncate(fd, huge)
        os.posix_fallocate(fd, 0, 4096)
        # A 2 MiB-aligned window of the file: reserve twice its size, map at the boundary.
        PROT_NONE = 0
        spare = libc.mmap(None, 2 * huge, PROT_NONE,
                          mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        at = (spare + huge - 1) & ~(huge - 1)
        MAP_FIXED = 0x10
        assert libc.mmap(at, huge, mmap.PROT_READ | mmap.PROT_WRITE,
                         mmap.MAP_SHARED | MAP_FIXED, fd, 0) == at
        MADV_COLLAPSE = 25
        collapsed = libc.madvise(ctypes.c_void_p(at), ctypes.c_size_t(huge), MADV_COLLAPSE) == 0
        libc.munmap(ctypes.c_void_p(spare), ctypes.c_size_t(2 * huge))
    finally:
        os.close(fd)
    return "on (MADV_COLLAPSE)" if collapsed else "off"


def test_users_can_tell_lms_is_on():
    """One log line per device when LMS starts serving it (as TensorFlow logs
    the devices it creates), shown by default: the package no longer raises
    TF_CPP_MIN_LOG_LEVEL. An out-of-memory error names LMS's device and says
    whether anything was left to evict."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TF_LMS_", "TF_GPU_HOST_MEM", "TF_CPP_MIN_LOG_LEVEL"))}
    env.update({"TF_LMS_CPU_DEVICE_MEMORY_MB": "64", "TF_LMS_ENABLED": "1",
                "TF_GPU_HOST_MEM_LIMIT_IN_MB": "16", "TF_ENABLE_ONEDNN_OPTS": "0"})
    proc = subprocess.run([sys.executable, str(PROGRAMS / "probes.py"), "announce"], env=env,
                          capture_output=True, text=True, timeout=300)
    result = json.loads(proc.stdout.split("RESULT ", 1)[1])
    assert result["level"] is None  # left as the user had it
    lines = [x for x in proc.stderr.splitlines() if "LMS serves" in x]
    assert len(lines) == 1, proc.stderr
    assert log_severity(lines[0]) == "I", lines[0]  # TensorFlow's INFO
    for part in ("CPU:0, the emulated device", "device memory 64.0 MiB",
                 "host memory for evicted tensors 16.0 MiB", "LMS on", "policy learned",
                 f"huge pages {machine_huge_pages()}"):
        assert part in lines[0], lines[0]
    assert "by allocator lms_emulated_device" in result["error"]
    assert "LMS is on: too few inactive bytes are left to evict" in result["error"]


def test_an_optional_request_gets_workspace_on_a_full_device_within_its_allowance():
    # cuDNN's autotuning asks for each algorithm's workspace with
    # retry_on_failure off, largest first, and TensorFlow caches the winner
    # for the run. With the device full of inactive tensors such requests
    # may evict up to a sixteenth of the device a step (Note [Optional
    # requests] in engine.h): before, the 8 MiB one was refused (only free
    # memory served them), so autotuning saw 4 MiB where it sees 32 MiB
    # without pressure.
    full = run_program("optional_requests.py", env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "64",
                                                    "TF_LMS_ENABLED": "1"})
    roomy = run_program("optional_requests.py", env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "1024",
                                                     "TF_LMS_ENABLED": "1"})
    for run in (full, roomy):
        assert run.result and run.result["held_sum_right"] and run.result["held_right"], \
            describe(run)
        assert run.result["num_born_evicted"] == 0  # an optional request never is
    served = {mib: r["served"] for mib, r in full.result["requests"].items()}
    # 4 MiB free and 4 MiB (a sixteenth of 64) evicted: 8 MiB, not 16.
    assert served == {"32": False, "16": False, "8": True, "4": True}, full.result
    assert full.result["requests"]["8"]["evicted"] == 4 * MIB
    assert all(r["served"] and r["evicted"] == 0 for r in roomy.result["requests"].values())
