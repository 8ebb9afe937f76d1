"""The wheel build script (build_scripts/build_tensorflow_wheel.sh), checked
against TensorFlow's own configuration rather than from memory.

`--dry-run` prints what a real run executes, through the same `run` helper:
"env NAME=value" for each variable a command is given, then "run DIR: COMMAND
ARG...". These tests parse that for a CPU and a `--cuda` build and check it
against v2.21.0's `.bazelrc` and `configure.py` (TF_SOURCE_DIR; by default the
test data in ../shared/tensorflow-source/pre-v2.21.0), and run that
`configure.py` with the script's environment, to see that it asks nothing and
defines every `--config` the build passes:
- every `--config=X` is a `build:X`/`common:X` of `.bazelrc`, or of the
  `.tf_configure.bazelrc` that the configure step, run first, writes;
- every variable the script sets is one `configure.py`, `.bazelrc` or the
  Bazel rules read;
- `--cuda` turns CUDA on (TF_NEED_CUDA=1 and `:enable_cuda` in the expanded
  flags), with the 2.21.0 wheel's CUDA 12.5.1 and cuDNN 9.3.0; a CPU build does not;
- hermetic Python is pinned to 3.11, and the wheel is installed into python3.11;
- the series is the one mbox, applied with plain `git am`;
- the final import runs in a directory outside the source tree.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.patches

ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = ROOT / "build_scripts" / "build_tensorflow_wheel.sh"
SERIES = ROOT / "patches" / "tensorflow_v2.21.0_large_model_support.patch"
TF_SOURCE = Path(os.environ.get("TF_SOURCE_DIR")
                 or ROOT.parent / "shared" / "tensorflow-source" / "pre-v2.21.0")
needs_tf_source = pytest.mark.skipif(
    not (TF_SOURCE / ".bazelrc").is_file() or not (TF_SOURCE / "configure.py").is_file(),
    reason=f"no TensorFlow .bazelrc/configure.py in {TF_SOURCE}: set TF_SOURCE_DIR to a "
           "TensorFlow v2.21.0 checkout")

# Variables read by Bazel rules whose sources are neither .bazelrc nor configure.py
# (so not in the test data): @local_xla//third_party/py/python_repo.bzl, the
# `python_repository` rule, declares environ = ["TF_PYTHON_VERSION",
# "HERMETIC_PYTHON_VERSION", "WHEEL_NAME", "WHEEL_COLLAB", "USE_PYWRAP_RULES"] and
# reads HERMETIC_PYTHON_VERSION (the hermetic interpreter) and WHEEL_NAME.
RULE_ENV_NAMES = {"HERMETIC_PYTHON_VERSION", "WHEEL_NAME"}


@dataclass
class Command:
    """One command of the plan: where it runs, what it is given, what it is."""

    directory: Path
    env: dict[str, str]
    argv: list[str]


@dataclass
class Plan:
    """What one `--dry-run` printed, parsed."""

    workdir: Path
    commands: list[Command]
    stderr: str

    def index(self, first_word: str) -> int:
        """The position of the one command whose program is named `first_word`."""
        found = [i for i, command in enumerate(self.commands)
                 if Path(command.argv[0]).name == first_word]
        assert len(found) == 1, f"{len(found)} '{first_word}' commands in {self.commands}"
        return found[0]

    def find(self, first_word: str) -> Command:
        """The one command whose program is named `first_word`."""
        return self.commands[self.index(first_word)]


def parse_plan(workdir: Path, stdout: str, stderr: str) -> Plan:
    """The "env ..." and "run DIR: ..." lines of a dry run, as Commands."""
    commands, env = [], {}
    for line in stdout.splitlines():
        if line.startswith("env "):
            name, _, value = shlex.split(line[len("env "):])[0].partition("=")
            env[name] = value
        elif line.startswith("run "):
            directory, _, command = line[len("run "):].partition(": ")
            commands.append(Command(Path(directory), env, shlex.split(command)))
            env = {}
    return Plan(workdir, commands, stderr)


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bin folder with python3.11 (this Python), and stand-ins for clang 18
    and bazelisk, so that the printed paths are the same on every machine."""
    bin_dir = tmp_path_factory.mktemp("bin")
    (bin_dir / "python3.11").symlink_to(sys.executable)
    stubs = {"clang": 'case "$1" in -dumpversion) echo 18.1.8 ;; '
                      '*) echo "clang version 18.1.8" ;; esac',
             "bazelisk": 'echo "bazel 7.4.1"'}
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


def tools_env(tools: Path) -> dict[str, str]:
    """A plain environment whose PATH finds `tools` first."""
    return {"PATH": f"{tools}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"),
            "TMPDIR": os.environ.get("TMPDIR", "/tmp")}


def dry_run(tools: Path, workdir: Path, *options: str, script: Path = BUILD_SCRIPT) -> Plan:
    """Runs the script with --dry-run and parses what it prints."""
    done = subprocess.run(["bash", str(script), "--dry-run", "--workdir", str(workdir),
                           *options], capture_output=True, text=True, timeout=60,
                          env=tools_env(tools))
    assert done.returncode == 0, done.stdout + done.stderr
    return parse_plan(workdir, done.stdout, done.stderr)


@pytest.fixture(scope="module")
def plans(tools: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Plan]:
    """The dry runs of a CPU build and a --cuda build."""
    workdir = tmp_path_factory.mktemp("build") / "work"
    return {"cpu": dry_run(tools, workdir), "cuda": dry_run(tools, workdir, "--cuda")}


def rc_lines(text: str) -> dict[str, list[str]]:
    """The options of each `build:NAME`/`common:NAME` config of an rc file, and
    under "" those of the plain `build`/`common` lines, in order."""
    configs: dict[str, list[str]] = {}
    for line in text.splitlines():
        match = re.match(r"(?:build|common)(?::([\w-]+))?\s+(.*)", line)
        if match:
            configs.setdefault(match[1] or "", []).extend(shlex.split(match[2], comments=True))
    return configs


def merged(*texts: str) -> dict[str, list[str]]:
    """rc_lines of several rc files, as Bazel reads them one after the other."""
    configs: dict[str, list[str]] = {}
    for text in texts:
        for name, options in rc_lines(text).items():
            configs.setdefault(name, []).extend(options)
    return configs


def expand(options: list[str], configs: dict[str, list[str]]) -> list[str]:
    """`options` with each --config=NAME replaced by that config's options."""
    flat = []
    for option in options:
        if option.startswith("--config="):
            name = option.split("=", 1)[1]
            assert name in configs, f"--config={name} is not defined"
            flat += expand(configs[name], configs)
        else:
            flat.append(option)
    return flat


def env_settings(options: list[str]) -> dict[str, str]:
    """The --repo_env/--action_env NAME=value settings of `options`, last one winning."""
    settings = {}
    for i, option in enumerate(options):
        if option in ("--repo_env", "--action_env") and i + 1 < len(options):
            setting = options[i + 1]
        elif option.startswith(("--repo_env=", "--action_env=")):
            setting = option.split("=", 1)[1]
        else:
            continue
        name, _, value = setting.partition("=")
        settings[name] = value
    return settings


def configure_reads(text: str) -> set[str]:
    """The environment variables configure.py reads."""
    patterns = [r"environ_cp\.get\(\s*'(\w+)'",
                r"os\.environ\.get\(\s*'(\w+)'",
                r"(?:get_var|get_from_env_or_user_or_default|set_action_env_var)"
                r"\(\s*environ_cp,\s*'(\w+)'",
                r"var_name='(\w+)'",
                r"set_cuda_local_path\(\s*environ_cp,\s*'\w+',\s*'(\w+)'\)"]
    return {name for pattern in patterns for name in re.findall(pattern, text)}


def tf_file(name: str) -> str:
    """A file of the TensorFlow tree the tests check against."""
    return (TF_SOURCE / name).read_text()


@pytest.fixture(scope="module")
def configured(plans: dict[str, Plan], tools: Path,
               tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The .tf_configure.bazelrc that each plan's configure command writes when
    it runs, as printed, in a copy of TensorFlow's configure files, with stdin
    closed (a question would take its default and print itself)."""
    if not (TF_SOURCE / "configure.py").is_file():
        pytest.skip(needs_tf_source.kwargs["reason"])
    written = {}
    for mode, plan in plans.items():
        tree = tmp_path_factory.mktemp(f"tensorflow-{mode}")
        (tree / "tools").mkdir()
        for name in ("configure", "configure.py", ".bazelrc", ".bazelversion"):
            shutil.copyfile(TF_SOURCE / name, tree / name)
        (tree / "configure").chmod(0o755)
        configure = plan.find("configure")
        done = subprocess.run(configure.argv, cwd=tree, env={**tools_env(tools), **configure.env},
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        questions = re.findall(r".*(?:\[[yY]/[nN]\]|Please specify|Please input|"
                               r"\[Default is).*", done.stdout)
        assert not questions, f"{mode}: configure.py asked {questions}"
        written[mode] = (tree / ".tf_configure.bazelrc").read_text()
    return written


def test_the_wheel_build_script_says_it_cannot_run_here_in_its_help() -> None:
    """--help is the whole header comment: requirements, --dry-run, and no code."""
    done = subprocess.run(["bash", str(BUILD_SCRIPT), "--help"], capture_output=True,
                          text=True)
    assert done.returncode == 0
    assert "clang 18" in done.stdout and "CUDA toolkit 12.5" in done.stdout
    assert "cuDNN 9.3" in done.stdout and "50 GiB" in done.stdout
    assert "never run" in done.stdout and "--dry-run" in done.stdout
    assert "set -euo pipefail" not in done.stdout and "#!" not in done.stdout
    assert done.stdout.rstrip().endswith("against TensorFlow's .bazelrc and configure.py.")


def test_the_wheel_build_script_names_what_is_missing_before_it_starts(tmp_path: Path) -> None:
    """No bazelisk, no clang on this PATH: the checks stop it before the clone."""
    done = subprocess.run(["bash", str(BUILD_SCRIPT), "--workdir", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.startswith("error: cannot build TensorFlow v2.21.0 with LMS here:")
    assert "bazelisk is not on PATH" in done.stderr
    assert list((tmp_path / "work").iterdir()) == []  # nothing cloned
    bad = subprocess.run(["bash", str(BUILD_SCRIPT), "--jobs", "many"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "--jobs must be a positive number, not 'many'" in bad.stderr


def test_the_requirement_check_looks_for_the_one_series_file(tools: Path, tmp_path: Path,
                                                             plans: dict[str, Plan]) -> None:
    """The series is patches/tensorflow_v2.21.0_large_model_support.patch: a
    copy of the script in a tree without it names it (and runs nothing)."""
    assert "large_model_support.patch" not in plans["cpu"].stderr
    copy = tmp_path / "build_scripts" / BUILD_SCRIPT.name
    copy.parent.mkdir()
    shutil.copy(BUILD_SCRIPT, copy)
    (tmp_path / "patches" / "v2.21.0").mkdir(parents=True)  # the old layout does not count
    (tmp_path / "patches" / "v2.21.0" / "0001-x.patch").write_text("")
    plan = dry_run(tools, tmp_path / "work", script=copy)
    assert plan.stderr.startswith("note: dry run; a real run would stop here, missing:")
    assert f"{tmp_path}/patches/tensorflow_v2.21.0_large_model_support.patch is missing" \
        in plan.stderr
    assert not (tmp_path / "work").exists()


def test_a_dry_run_clones_and_builds_nothing(plans: dict[str, Plan]) -> None:
    """The plan is printed, in order; the work directory is not even made."""
    for plan in plans.values():
        order = [Path(command.argv[0]).name for command in plan.commands]
        assert order == ["git", "git", "configure", "bazelisk", "python3.11", "python3.11"]
        assert plan.commands[0].argv[1] == "clone"
        assert not plan.workdir.exists()


def test_the_series_is_the_one_mbox_applied_with_plain_git_am(plans: dict[str, Plan]) -> None:
    """`git am FILE` in the source tree, before configure and the build."""
    for plan in plans.values():
        (am,) = [command for command in plan.commands if "am" in command.argv]
        assert am.argv[am.argv.index("am"):] == ["am", str(SERIES)]
        assert am.directory == plan.workdir / "tensorflow"
        assert plan.commands.index(am) < plan.index("configure") < plan.index("bazelisk")
    assert SERIES.is_file()


@needs_tf_source
def test_every_config_is_defined_by_bazelrc_or_the_configure_step_run_first(
        plans: dict[str, Plan], configured: dict[str, str]) -> None:
    """Each --config=X is a build:X/common:X of .bazelrc, or of the
    .tf_configure.bazelrc that configure (run first, in the same tree) writes;
    --config=opt is the latter, made of CC_OPT_FLAGS."""
    bazelrc = rc_lines(tf_file(".bazelrc"))
    for mode, plan in plans.items():
        bazel, configure = plan.find("bazelisk"), plan.find("configure")
        assert plan.index("configure") < plan.index("bazelisk")
        assert configure.directory == bazel.directory == plan.workdir / "tensorflow"
        written = rc_lines(configured[mode])
        for option in bazel.argv:
            if option.startswith("--config="):
                name = option.split("=", 1)[1]
                assert name in bazelrc or name in written, f"{mode}: --config={name} undefined"
        assert "--config=opt" in bazel.argv and "opt" not in bazelrc
        assert written["opt"] == ["--copt=-Wno-sign-compare", "--host_copt=-Wno-sign-compare"]
        assert configure.env["CC_OPT_FLAGS"] == "-Wno-sign-compare"


@needs_tf_source
def test_every_variable_set_is_one_that_configure_bazelrc_or_the_rules_read(
        plans: dict[str, Plan]) -> None:
    """configure's environment: names configure.py reads. The bazel command's
    --repo_env/--action_env: names .bazelrc or configure.py set, or
    RULE_ENV_NAMES. Only configure is given variables, and the script exports
    none (an `export CC=clang` reaches no one: the C++ toolchain is hermetic)."""
    configure_py, bazelrc = tf_file("configure.py"), tf_file(".bazelrc")
    read_by_configure = configure_reads(configure_py)
    assert {"TF_NEED_CUDA", "CC_OPT_FLAGS", "PYTHON_BIN_PATH"} <= read_by_configure
    set_by_rc = set(re.findall(r"--(?:repo_env|action_env)[=\s]+(\w+)", bazelrc))
    assert "--repo_env USE_HERMETIC_CC_TOOLCHAIN=1" in bazelrc
    for mode, plan in plans.items():
        for command in plan.commands:
            if Path(command.argv[0]).name == "configure":
                assert set(command.env) <= read_by_configure, (
                    f"{mode}: configure.py never reads {set(command.env) - read_by_configure}")
            else:
                assert command.env == {}, f"{mode}: {command.argv[0]} given {command.env}"
        names = set(env_settings(plan.find("bazelisk").argv))
        unknown = names - set_by_rc - read_by_configure - RULE_ENV_NAMES
        assert not unknown, f"{mode}: nothing reads {unknown}"
    assert not re.search(r"^\s*export\s", BUILD_SCRIPT.read_text(), re.MULTILINE)


@needs_tf_source
def test_the_cuda_build_turns_cuda_on_with_the_wheels_cuda_and_cudnn(
        plans: dict[str, Plan], configured: dict[str, str]) -> None:
    """The flags Bazel ends with (.bazelrc, then .tf_configure.bazelrc, then the
    command line, every --config expanded) have TF_NEED_CUDA=1, :enable_cuda,
    CUDA 12.5.1 and cuDNN 9.3.0 (.bazelrc's build:cuda_version, the 2.21.0
    wheel's) with --cuda, and no CUDA without."""
    bazelrc = tf_file(".bazelrc")
    wheel_versions = env_settings(rc_lines(bazelrc)["cuda_version"])
    assert wheel_versions["HERMETIC_CUDA_VERSION"] == "12.5.1"
    assert wheel_versions["HERMETIC_CUDNN_VERSION"] == "9.3.0"
    for mode, plan in plans.items():
        configs = merged(bazelrc, configured[mode])
        bazel = plan.find("bazelisk")
        flags = expand(configs[""] + [a for a in bazel.argv[2:] if a.startswith("-")], configs)
        settings = env_settings(flags)
        configure = plan.find("configure").env
        if mode == "cuda":
            assert configure["TF_NEED_CUDA"] == "1" and configure["TF_CUDA_CLANG"] == "1"
            assert {"--config=cuda_clang", "--config=cuda_wheel"} <= set(bazel.argv)
            assert settings.get("TF_NEED_CUDA") == "1"
            assert "--@local_config_cuda//:enable_cuda" in flags
            for name in ("HERMETIC_CUDA_VERSION", "HERMETIC_CUDNN_VERSION"):
                assert configure[name] == settings[name] == wheel_versions[name], name
        else:
            assert configure["TF_NEED_CUDA"] == "0"
            assert settings.get("TF_NEED_CUDA", "0") == "0"
            assert "--@local_config_cuda//:enable_cuda" not in flags


def test_python_is_pinned_to_3_11(plans: dict[str, Plan], tools: Path) -> None:
    """Hermetic Python 3.11 for the build; configure, pip and the import use python3.11."""
    for plan in plans.values():
        assert "--repo_env=HERMETIC_PYTHON_VERSION=3.11" in plan.find("bazelisk").argv
        assert plan.find("configure").env["PYTHON_BIN_PATH"] == str(tools / "python3.11")
        pip, check = plan.commands[-2:]
        assert pip.argv[0] == check.argv[0] == str(tools / "python3.11")


def test_the_final_check_imports_the_installed_wheel_from_outside_the_tree(
        plans: dict[str, Plan]) -> None:
    """pip installs the built wheel, then `import tensorflow` runs in a
    directory that is neither in the work directory nor above the sources."""
    for plan in plans.values():
        source = plan.workdir / "tensorflow"
        pip, check = plan.commands[-2:]
        assert pip.argv[1:5] == ["-m", "pip", "install", "--force-reinstall"]
        wheel = Path(pip.argv[-1])
        assert wheel.parent == source / "bazel-bin/tensorflow/tools/pip_package/wheel_house"
        assert check.argv[1] == "-c" and "import sys, tensorflow as tf" in check.argv[2]
        assert check.argv[3:] == [str(source)]  # what the check says it must not import
        assert not check.directory.is_relative_to(plan.workdir)
        assert not source.is_relative_to(check.directory)
