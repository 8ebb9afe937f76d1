"""The documents say what the code does: settings, statistics, and the README's bars.

Every variable LMS reads is parsed in one module, `cc/engine/env_options.{h,cc}`
(Note [One place for settings]), whose table `kSettings` lists each with its
default; the engine's Python binding reads that table (`settings_table`) and
parses this process's environment exactly as TensorFlow's LMS devices do
(`settings_from_env`). These tests hold the documents and the front ends to it.
The statistics are listed for users once, in docs/observing.md, and checked
against the engine's own list (statistics.h, through the binding); no document
cites a run by its number.

Example:
    $ .venv/bin/python -m pytest -q tests/test_documents.py
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tensorflow_lms_allocator import _engine
from tensorflow_lms_allocator import lms
from tensorflow_lms_allocator.engine import STATISTICS, AllocationStateError, Engine

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
TABLE = _engine.settings_table()


def readme_defaults() -> dict[str, str]:
    """{variable: its Default cell} from the README's settings table.

    The table is the one whose header has a `Default` column; a row's first
    cell starts with the variable in backticks.
    """
    lines = (ROOT / "README.md").read_text().splitlines()
    rows: dict[str, str] = {}
    column = None
    for line in lines:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|"):
            column = None
        elif "Default" in cells:
            column = cells.index("Default")
        elif column is not None and (name := re.match(r"`(TF_[A-Z0-9_]+)", cells[0])):
            rows[name.group(1)] = cells[column]
    return rows


def test_the_readme_table_lists_every_users_setting_with_the_codes_default():
    documented = readme_defaults()
    expected = {name: default for name, default, in_readme in TABLE if in_readme}
    assert set(documented) == set(expected), set(documented) ^ set(expected)
    # The cell's first word is the default; words after it may explain it.
    wrong = {name: (documented[name], default) for name, default in expected.items()
             if documented[name].split()[0].strip("`,") != default}
    assert not wrong, f"README default vs code: {wrong}"


def test_docs_settings_names_every_variable_lms_reads():
    text = (ROOT / "docs" / "settings.md").read_text()
    missing = [name for name, _, _ in TABLE if f"`{name}" not in text]
    assert not missing, missing


@pytest.fixture
def clean_environment(monkeypatch):
    """This process's environment without any variable LMS reads."""
    for name, _, _ in TABLE:
        monkeypatch.delenv(name, raising=False)


def as_documented(parsed: dict) -> dict[str, str]:
    """The parsed settings written as the table writes defaults."""
    on_off = {True: "on", False: "off"}
    machine = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    memory = min(machine, _engine.cgroup_memory_limit() or machine)
    host_mib = parsed["host_bytes"] // MIB
    # TensorFlow's 64 GiB, or the machine's or the cgroup's memory where less.
    host = "65536" if host_mib == min(65536, memory // (2 * MIB) * 2) else str(host_mib)
    return {
        "TF_LMS_ENABLED": on_off[parsed["lms_enabled"]],
        "TF_LMS_DEFRAG_ENABLED": on_off[parsed["defrag_enabled"]],
        "TF_LMS_CPU_DEVICE_MEMORY_MB": str(parsed["device_bytes"] // MIB or "unset"),
        "TF_GPU_HOST_MEM_LIMIT_IN_MB": host,
        "TF_LMS_POLICY": parsed["policy"],
        "TF_LMS_PREFETCH": on_off[parsed["prefetch"]],
        "TF_LMS_HOST_AHEAD_MB": str(parsed["host_ahead_bytes"] // MIB),
        "TF_LMS_GRANULE_MB": str(parsed["granule_bytes"] // MIB),
        "TF_LMS_HUGE_PAGES": parsed["huge_pages"],
        "TF_LMS_STRICT": on_off[parsed["strict"]],
        "TF_LMS_UNMAP_EVICTED": on_off[parsed["unmap_evicted"]],
        "TF_LMS_CUDA_DRIVER_PATH": parsed["cuda_driver_path"],
        "TF_GPU_ALLOCATOR": parsed["tensorflow_gpu_allocator"] or "unset",
    }


def test_an_empty_environment_gives_the_tables_defaults(clean_environment):
    parsed = as_documented(_engine.settings_from_env())
    expected = {name: default for name, default, _ in TABLE if name in parsed}
    assert parsed == expected
    # TF_FORCE_GPU_ALLOW_GROWTH is TensorFlow's, read only with a GPU's options.
    assert {name for name, _, _ in TABLE} - set(parsed) == {"TF_FORCE_GPU_ALLOW_GROWTH"}


def test_each_setting_is_parsed_into_its_typed_option(clean_environment, monkeypatch):
    for name, value in [("TF_LMS_ENABLED", "TRUE"), ("TF_LMS_DEFRAG_ENABLED", "0"),
                        ("TF_LMS_POLICY", "lru"), ("TF_LMS_PREFETCH", "1"),
                        ("TF_LMS_HOST_AHEAD_MB", "0"),
                        ("TF_LMS_GRANULE_MB", "8"), ("TF_LMS_HUGE_PAGES", "off"),
                        ("TF_LMS_CPU_DEVICE_MEMORY_MB", "100"),
                        ("TF_GPU_HOST_MEM_LIMIT_IN_MB", "1024"), ("TF_LMS_STRICT", "true"),
                        ("TF_LMS_UNMAP_EVICTED", "1"),
                        ("TF_GPU_ALLOCATOR", "cuda_malloc_async")]:
        monkeypatch.setenv(name, value)
    parsed = _engine.settings_from_env()
    assert as_documented(parsed) | {"TF_LMS_CPU_DEVICE_MEMORY_MB": "96"} == {
        "TF_LMS_ENABLED": "on", "TF_LMS_DEFRAG_ENABLED": "off",
        "TF_LMS_CPU_DEVICE_MEMORY_MB": "96", "TF_GPU_HOST_MEM_LIMIT_IN_MB": "1024",
        "TF_LMS_POLICY": "lru", "TF_LMS_PREFETCH": "on", "TF_LMS_HOST_AHEAD_MB": "0",
        "TF_LMS_GRANULE_MB": "8",
        "TF_LMS_HUGE_PAGES": "off", "TF_LMS_STRICT": "on", "TF_LMS_UNMAP_EVICTED": "on",
        "TF_LMS_CUDA_DRIVER_PATH": "libcuda.so.1", "TF_GPU_ALLOCATOR": "cuda_malloc_async"}
    # 100 MiB is not a whole number of 8 MiB granules: 96, said in a note;
    # prefetching does nothing without the learned policy, said too.
    assert parsed["device_bytes"] == 96 * MIB
    assert any("TF_LMS_CPU_DEVICE_MEMORY_MB=100 is not a whole number of 8 MiB granules: "
               "using 96 MiB" in note for note in parsed["notes"]), parsed["notes"]
    assert any("TF_LMS_PREFETCH=1 has no effect with TF_LMS_POLICY=lru" in note
               for note in parsed["notes"]), parsed["notes"]
    assert any("TF_LMS_UNMAP_EVICTED=1 has no effect with TF_LMS_STRICT=1" in note
               for note in parsed["notes"]), parsed["notes"]


def test_a_bad_value_is_a_value_error_naming_the_variable(clean_environment, monkeypatch):
    monkeypatch.setenv("TF_LMS_POLICY", "fifo")
    with pytest.raises(ValueError, match="TF_LMS_POLICY='fifo' is not a policy"):
        _engine.settings_from_env()
    monkeypatch.delenv("TF_LMS_POLICY")
    # 0 turns making host memory ahead off; any other size is checked as one.
    monkeypatch.setenv("TF_LMS_HOST_AHEAD_MB", "0")
    assert _engine.settings_from_env()["host_ahead_bytes"] == 0
    monkeypatch.setenv("TF_LMS_HOST_AHEAD_MB", "1")
    with pytest.raises(ValueError, match="TF_LMS_HOST_AHEAD_MB='1' is less than one granule"):
        _engine.settings_from_env()
    monkeypatch.setenv("TF_LMS_HOST_AHEAD_MB", "lots")
    with pytest.raises(ValueError, match="TF_LMS_HOST_AHEAD_MB='lots' is not a whole number"):
        _engine.settings_from_env()


def test_an_engine_made_directly_takes_the_same_policy_default_as_tensorflow(
        clean_environment):
    assert dict((name, default) for name, default, _ in TABLE)["TF_LMS_POLICY"] == "learned"
    engine = Engine(8 * MIB, host_bytes=16 * MIB)
    engine.set_learned_order(False)  # only the learned policy has an order to set
    with pytest.raises(AllocationStateError):
        Engine(8 * MIB, host_bytes=16 * MIB, policy="lru").set_learned_order(False)


def test_the_statistics_are_listed_once_with_the_engines_meanings_and_the_api():
    """docs/observing.md's table: one row per statistic, statistics.h's meaning,
    and the tf.config.experimental function that reads it (if any)."""
    rows = {}
    for line in (ROOT / "docs" / "observing.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 3:
            rows[cells[0].strip("`")] = (cells[1].strip("`"), cells[2])
    assert set(rows) == set(STATISTICS), set(rows) ^ set(STATISTICS)
    functions = {name: function for function, name in lms.STATISTICS.items()}
    wrong = {name: rows[name] for name, meaning in STATISTICS.items()
             if rows[name] != (functions.get(name, ""), meaning)}
    assert not wrong, wrong
    # The other documents point there instead of listing them again.
    for document in ("README.md", "docs/design.md"):
        text = (ROOT / document).read_text()
        listed = [name for name in STATISTICS if f"`{name}`" in text]
        assert len(listed) < 5, (document, listed)


def test_the_readme_is_short_and_no_document_cites_a_run_number():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250
    assert [len(line) for line in lines if len(line) > 200] == []
    assert len((ROOT / "benchmarks" / "README.md").read_text().splitlines()) <= 220
    found = subprocess.run(["git", "grep", "-n", "-i", "-E", r"\bstop [0-9]", "--", ".",
                            ":!tests/test_documents.py"],
                           cwd=ROOT, capture_output=True, text=True)
    assert found.returncode == 1 and found.stdout == "", found.stdout + found.stderr
