"""The source patch for TensorFlow v2.21.0 (patches/, build_scripts/make_patches.py).

The series is checked against real TensorFlow texts, never against copies in
this repository: the installed 2.21.0 wheel's exact files, a source tree
(TF_SOURCE_DIR, by default ../shared/tensorflow-source/pre-v2.21.0: the 2.21
development line just before the tag) and excerpts from just after the tag
(../shared/tensorflow-source/post-v2.21.0-excerpts). What is checked:
- the committed series is what the generator makes now (never stale);
- plain `git am` (no --3way, no fuzz) applies it to the base tree, and the new
  files it adds are byte for byte the sources the overlay builds and tests;
- every pre-image in the series is the wheel's file or the source tree's;
- every hunk on a file the post-tag excerpts also have finds its context
  lines there, and no hunk's context holds an excerpt's omission marker;
- every label the series' BUILD files name is a target of the tree's BUILD
  files, or an external repository the wheel was built with;
- every new C++ file compiles against the wheel's headers (with the patched
  op_kernel.h in front), laid out as in the TensorFlow tree, with the flags
  tf_copts() gives on Linux (-fno-exceptions included); the code the series adds
  to TensorFlow's .cc files compiles against the wheel's declarations;
- on a copy of the installed `tensorflow` package with the patched Python
  files and a config_pb2 whose descriptor has fields 20/21, the Python API sets
  `gpu_options.experimental.lms_enabled`, the ConfigProto round-trips through
  serialization and text format, and a tf.compat.v1.Session runs with it; the
  patched statistics functions read a real LMS device (the overlay's emulated
  one) through the shared C entry points;
- every API golden file the series changes (tf.config.experimental and
  tf.experimental, v1 and v2, and v1 GPUOptions) is what TensorFlow's writer
  prints for the patched API.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "build_scripts"))
import api_goldens  # noqa: E402
import make_patches  # noqa: E402


def _load_config_proto():  # importing the package imports no TensorFlow
    from tensorflow_lms_allocator.overlay import config_proto

    return config_proto


# The patched config.proto's fields in a config_pb2.py, as the overlay adds them.
with_lms_fields = _load_config_proto().with_lms_fields

WHEEL = make_patches.wheel_dir()
SOURCE = make_patches.source_dir()
POST = make_patches.POST_EXCERPTS
# The excerpts mark what they leave out with lines like this one.
OMISSION = re.compile(r"^[#/]+ -+ \(rest of the file not reproduced\)")

needs_source = pytest.mark.skipif(
    not (SOURCE / "tensorflow/core/common_runtime/gpu/gpu_util.cc").is_file(),
    reason=f"no TensorFlow source tree at {SOURCE}: set TF_SOURCE_DIR to a v2.21.0 "
           "checkout (git clone --branch v2.21.0 https://github.com/tensorflow/tensorflow)")
needs_post = pytest.mark.skipif(
    not POST.is_dir(), reason=f"no post-v2.21.0 excerpts at {POST} "
                              "(../shared/tensorflow-source, see its README)")
# What needs TensorFlow's texts says so (@needs_source); the series' own
# sources are checked on every clone.
pytestmark = pytest.mark.patches


def git(cwd: Path, *args: str, stdin: bytes | None = None) -> str:
    env = {**os.environ, **make_patches.IDENTITY, "GIT_CONFIG_GLOBAL": os.devnull,
           "GIT_CONFIG_NOSYSTEM": "1"}
    done = subprocess.run(["git", *args], cwd=cwd, env=env, input=stdin,
                          capture_output=True, check=False)
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr.decode()}"
    return done.stdout.decode()


def blob_hash(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@pytest.fixture(scope="module")
def applied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The base tree with the committed series applied by plain `git am`."""
    tree = tmp_path_factory.mktemp("tf") / "tensorflow"
    make_patches.base_checkout(tree)
    git(tree, "am", "--quiet", str(make_patches.SERIES))
    return tree


def file_diffs(series: str) -> dict[str, list[str]]:
    """Path -> the text of each of its diffs in `series`, in order."""
    diffs: dict[str, list[str]] = {}
    for match in re.finditer(r"^diff --git a/(\S+) .*?(?=^diff --git|^-- $|\Z)", series,
                             re.M | re.S):
        diffs.setdefault(match.group(1), []).append(match.group(0))
    return diffs


def hunks(diff: str) -> list[list[str]]:
    """The lines of each hunk of one file's diff (with their ' ', '+', '-')."""
    body = diff[diff.index("\n@@ ") + 1:] if "\n@@ " in diff else ""
    return [[line for line in hunk.split("\n")[1:] if line[:1] in (" ", "+", "-")]
            for hunk in re.split(r"^@@ [^\n]*@@[^\n]*$", body, flags=re.M)[1:]]


SERIES_TEXT = make_patches.SERIES.read_text() if make_patches.SERIES.exists() else ""


def test_patch_0001_holds_the_projects_sources_byte_for_byte():
    """The series' first patch adds our own files under LMS_DIR: checked against
    cc/ on every clone, with or without TensorFlow's texts, so an engine or
    adapter change without `make patches` fails here (the whole series is
    regenerated and compared by the next test, where the texts are)."""
    diffs = file_diffs(SERIES_TEXT)
    added = {path[len(make_patches.LMS_DIR) + 1:]: diff for path, (diff, *_) in diffs.items()
             if path.startswith(make_patches.LMS_DIR + "/") and not path.endswith("/BUILD")}
    ours = {str(rel): (make_patches.CC / rel).read_text() for rel in make_patches.new_sources()}
    assert set(added) == set(ours), set(added) ^ set(ours)
    stale = []
    for rel, text in ours.items():
        assert "\nnew file mode " in added[rel], rel
        # A new file is one hunk of N added lines (the last file of a patch is
        # followed by the next patch's mail, which file_diffs keeps).
        body = added[rel].split("\n@@ -0,0 +1", 1)[1]
        count = int(re.match(r"(?:,(\d+))? @@", body).group(1) or 1)
        lines = body.split("\n")[1:1 + count]
        if "\n".join(line[1:] for line in lines) + "\n" != text:
            stale.append(rel)
    assert not stale, f"patches/ is stale for {stale}: run `make patches`"


@needs_source
def test_the_committed_series_is_what_the_generator_makes():
    done = subprocess.run([sys.executable, str(ROOT / "build_scripts" / "make_patches.py"),
                           "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "up to date" in done.stdout


@needs_source
def test_git_am_applies_the_series_and_adds_the_overlay_sources_byte_for_byte(applied):
    log = git(applied, "log", "--format=%s").splitlines()
    assert len(log) == len(make_patches.PARTS) + 1
    sources = make_patches.new_sources()
    assert len(sources) > 40
    for rel in sources:
        added = applied / make_patches.LMS_DIR / rel
        assert added.read_bytes() == (make_patches.CC / rel).read_bytes(), rel
    assert (applied / make_patches.LMS_DIR / "BUILD").is_file()
    # The series ships the runtime and the patch-only folder whole, and nothing
    # of the overlay's own folders or the tests'; the overlay never builds patch/.
    lms = applied / make_patches.LMS_DIR
    assert sorted(p.name for p in lms.iterdir()) == ["BUILD", "backends", "engine", "patch",
                                                     "tf_adapter"]
    shipped = {str(rel) for rel in sources}
    for folder in make_patches.SHIPPED_DIRS:
        assert {f"{folder}/{p.name}" for p in (make_patches.CC / folder).iterdir()
                if p.suffix in (".h", ".cc")} <= shipped, folder
    assert (lms / "tf_adapter/runtime.cc").exists() and (lms / "patch/patched_tensorflow.cc").exists()
    assert "patch/" not in (ROOT / "CMakeLists.txt").read_text()


@needs_source
def test_every_pre_image_is_the_wheels_file_or_the_source_trees():
    """The `index <old>..` of each changed file is the git blob of its base: the
    installed wheel's exact text (the rewritten lines put back) or the tree's."""
    pre_images = {path: re.search(r"^index ([0-9a-f]{40})\.\.", diffs[0], re.M).group(1)
                  for path, diffs in file_diffs(SERIES_TEXT).items()}
    modified = {path: old for path, old in pre_images.items() if set(old) != {"0"}}
    assert set(modified) == set(make_patches.FROM_WHEEL) | set(make_patches.FROM_SOURCE)
    for path, old in modified.items():
        base = (make_patches.wheel_text_as_source(path) if path in make_patches.FROM_WHEEL
                else (SOURCE / path).read_bytes())
        assert old == blob_hash(base), path
    context = make_patches.wheel_text_as_source("tensorflow/python/eager/context.py")
    assert context.split(b"\n")[28] == b"from xla.tsl.protobuf import coordination_config_pb2"


def declarations(proto: str, message: str) -> dict[str, tuple[str, int]]:
    """Field name -> (type, number) declared directly in `message` of `proto`'s text."""
    start = re.search(rf"^( *)message {message} {{\n", proto, re.M)
    assert start, message
    indent = start.group(1) + "  "
    body = proto[start.end():proto.index(f"\n{start.group(1)}}}\n", start.end())]
    return {name: (kind, int(number)) for kind, name, number in re.findall(
        rf"^{indent}(?:repeated )?(\w+) (\w+) = (\d+);", body, re.M)}


@needs_source
def test_the_source_trees_config_proto_declares_the_wheels_gpu_options():
    """The messages the patch touches declare exactly the 2.21.0 wheel's fields in
    the source tree's config.proto, and the patched one adds the fields the overlay
    gives the stock wheel's ConfigProto."""
    from tensorflow.core.protobuf import config_pb2

    base = (SOURCE / "tensorflow/core/protobuf/config.proto").read_text()
    lms = {name for name, _ in _load_config_proto().LMS_FIELDS}  # if the overlay added them
    for message, descriptor in (("GPUOptions", config_pb2.GPUOptions.DESCRIPTOR),
                                ("Experimental", config_pb2.GPUOptions.Experimental.DESCRIPTOR)):
        assert {name: number for name, (_, number) in declarations(base, message).items()} \
            == {f.name: f.number for f in descriptor.fields if f.name not in lms}, message
    patched = make_patches.patch_config_proto(base)
    added = {name: decl for name, decl in declarations(patched, "Experimental").items()
             if name not in declarations(base, "Experimental")}
    assert added == {name: ("bool", number)
                     for name, number in _load_config_proto().LMS_FIELDS}


# What tf_copts() (tensorflow/tensorflow.bzl) gives a Linux x86-64 build
# without CUDA: the BUILD file of 0001 compiles the engine and the adapter with it.
TF_COPTS_LINUX = ["-DEIGEN_AVOID_STL_ARRAY", "-Wno-sign-compare", "-ftemplate-depth=900",
                  "-fno-exceptions", "-DTENSORFLOW_USE_XLA=1", "-msse3", "-pthread"]


@needs_source
def test_the_compile_flags_are_the_trees_tf_copts():
    bzl = (SOURCE / "tensorflow/tensorflow.bzl").read_text()
    tf_copts = bzl[bzl.index("\ndef tf_copts("):bzl.index("\ndef ", bzl.index("\ndef tf_copts(") + 1)]
    for flag in TF_COPTS_LINUX:
        assert f'"{flag}"' in tf_copts, flag
    assert 'if_not_windows(["-fno-exceptions"]) if not allow_exceptions' in tf_copts
    assert "copts = tf_copts()" in make_patches.BUILD_FILE


def compile_one(source: Path, *include: Path) -> tuple[Path, str]:
    flags = ["-std=c++17", "-fsyntax-only", "-w", "-D_GLIBCXX_USE_CXX11_ABI=1",
             "-DEIGEN_MAX_ALIGN_BYTES=64", *TF_COPTS_LINUX, *(f"-I{i}" for i in include),
             f"-I{WHEEL / 'include'}"]
    done = subprocess.run(["nice", os.environ.get("CXX", "g++"), *flags, str(source)],
                          capture_output=True, text=True)
    return source, "" if done.returncode == 0 else done.stderr[-3000:]


@needs_source
def test_every_new_cc_file_compiles_against_the_wheels_headers_in_the_tree_layout(applied):
    lms = applied / make_patches.LMS_DIR
    sources = sorted(lms.rglob("*.cc"))
    # Bazel's `includes = ["."]` puts the lms directory on the include path;
    # the tree's root goes before the wheel's headers, for the patched op_kernel.h.
    op_kernel_h = applied / "tensorflow/core/framework/op_kernel.h"
    content = hashlib.sha256(op_kernel_h.read_bytes() + " ".join(TF_COPTS_LINUX).encode())
    for path in sorted(lms.rglob("*.cc")) + sorted(lms.rglob("*.h")):
        content.update(path.read_bytes())
    stamp = ROOT / "build" / "patches" / f"compiled-{content.hexdigest()[:16]}"
    if stamp.exists():  # the same bytes compiled before: a rerun is quick
        return
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        failures = [(s, e) for s, e in pool.map(lambda s: compile_one(s, lms, applied),
                                                 sources) if e]
    assert not failures, "\n".join(f"{s}:\n{e}" for s, e in failures)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps([str(s.relative_to(lms)) for s in sources]))


def added_lines(path: str) -> list[list[str]]:
    """The runs of lines the series adds to `path`, in order."""
    runs: list[list[str]] = []
    for diff in file_diffs(SERIES_TEXT)[path]:
        for hunk in hunks(diff):
            previous = ""
            for line in hunk:
                if line.startswith("+"):
                    if not previous.startswith("+"):
                        runs.append([])
                    runs[-1].append(line[1:])
                previous = line
    return runs


# The code the series adds inside TensorFlow's functions, each hunk in a
# function with the names it uses in scope, as declared by the wheel's headers.
ADDED_CODE_PROGRAM = """\
#include <atomic>
#include <vector>

#include "tensorflow/core/common_runtime/device_id_utils.h"
#include "tensorflow/core/common_runtime/gpu/gpu_process_state.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "patch/patched_tensorflow.h"
#include "xla/stream_executor/gpu/gpu_init.h"

namespace tensorflow {{
{storage}
Allocator* GetGPUAllocator(const GPUOptions& options, tsl::TfDeviceId tf_device_id,
                           size_t total_bytes,
                           const std::vector<tsl::TfDeviceId>& peer_gpu_ids) {{
{allocator}
  return nullptr;
}}

se::StreamExecutor* HostAllocatorExecutor() {{
  se::StreamExecutor* se = nullptr;
{host}
  return se;
}}

struct Context {{
  void Created();
  void Destroyed();
  OpKernelContext* self;
  OpKernelContext::Params* params_;
}};
void Context::Created() {{
{created}
}}
void Context::Destroyed() {{
{destroyed}
}}
}}  // namespace tensorflow
"""


@needs_source
def test_the_code_added_to_tensorflows_cc_files_compiles_against_the_wheels_headers(
        applied, tmp_path):
    storage, created, destroyed = added_lines("tensorflow/core/framework/op_kernel.cc")
    include, allocator, host = added_lines(
        "tensorflow/core/common_runtime/gpu/gpu_process_state.cc")
    assert include == ['#include "tensorflow/core/common_runtime/lms/patch/'
                       'patched_tensorflow.h"']
    assert (applied / make_patches.LMS_DIR / "patch/patched_tensorflow.h").is_file()
    in_member = lambda lines: "\n".join(lines).replace("(this,", "(self,").replace(
        "(this)", "(self)")
    source = tmp_path / "added_code.cc"
    source.write_text(ADDED_CODE_PROGRAM.format(
        storage="\n".join(storage), allocator="\n".join(allocator), host="\n".join(host),
        created=in_member(created), destroyed=in_member(destroyed)))
    _, error = compile_one(source, applied / make_patches.LMS_DIR, applied)
    assert not error, f"{source.read_text()}\n{error}"


PINNED_COPIES_PROGRAM = """\
#include <utility>

#include "tensorflow/core/common_runtime/gpu/gpu_util.h"
#include "patch/patched_tensorflow.h"

namespace tensorflow {{
{code}
}}  // namespace tensorflow
"""


@needs_source
def test_gpuutils_copies_become_lms_pinned_copies_that_compile_against_the_wheel(
        applied, tmp_path):
    """Each of GPUUtil's four copies calls LMS's pinned copy with its own body
    (renamed); the declarations and calls compile against the wheel's gpu_util.h."""
    patched = (applied / "tensorflow/core/common_runtime/gpu/gpu_util.cc").read_text()
    declarations = re.findall(r"^static void \w+Unpinned\([^;{]*\);$", patched, re.M)
    wrappers = re.findall(r"^void GPUUtil::\w+\([^{]*\) \{\n  lms::Pinned\w+\([^;]*\);\n\}$",
                          patched, re.M)
    definitions = re.findall(r"^static void (\w+Unpinned)\([^;{]*\) \{$", patched, re.M)
    assert len(declarations) == len(wrappers) == 4, patched
    assert sorted(definitions) == sorted(
        re.search(r"static void (\w+)\(", d).group(1) for d in declarations)
    for name in ("DeviceToDeviceCopy", "CopyGPUTensorToCPU", "CopyCPUTensorToGPU",
                 "CopyGPUTensorToSameGPU"):
        assert sum(f"GPUUtil::{name}(" in w and f"&{name}Unpinned," in w
                   for w in wrappers) == 1, name
    source = tmp_path / "pinned_copies.cc"
    source.write_text(PINNED_COPIES_PROGRAM.format(code="\n\n".join(declarations + wrappers)))
    _, error = compile_one(source, applied / make_patches.LMS_DIR, applied)
    assert not error, f"{source.read_text()}\n{error}"


def pre_image(hunk: list[str]) -> list[str]:
    """The lines a hunk needs to find in the file: its context and removed lines."""
    return [line[1:] for line in hunk if line[:1] in (" ", "-")]


def contains_run(lines: list[str], run: list[str]) -> bool:
    return any(lines[i:i + len(run)] == run for i in range(len(lines) - len(run) + 1))


@needs_source
@needs_post
def test_every_hunk_finds_its_context_in_the_tree_after_the_tag():
    """The base tree is from before the tag; a hunk whose context lines are also in
    the excerpts from after it applies to the tag itself (git applies a hunk where
    its context matches, at any line number)."""
    checked = 0
    for path, diffs in file_diffs(SERIES_TEXT).items():
        if not (POST / path).is_file():
            continue
        lines = (POST / path).read_text().split("\n")
        for diff in diffs:
            for hunk in hunks(diff):
                assert contains_run(lines, pre_image(hunk)), f"{path}:\n" + "\n".join(hunk)
                checked += 1
    # gpu_util.cc: the include and the four copies; gpu_process_state.cc: the
    # include, GetGPUAllocator and GetGpuHostAllocator; the gpu BUILD file.
    assert checked == 5 + 3 + 1


@needs_source
def test_no_hunk_context_holds_an_excerpts_omission_marker():
    contexts = [line for diffs in file_diffs(SERIES_TEXT).values() for diff in diffs
                for hunk in hunks(diff) for line in pre_image(hunk)]
    assert len(contexts) > 50
    markers = [line for line in contexts if OMISSION.match(line) or "omitted" in line
               or "not reproduced" in line]
    assert not markers, markers


def build_labels(text: str) -> set[str]:
    """Every dependency label in the `deps = [...]` lists of a BUILD text (or in
    `text` itself when it has none: lines added to such a list)."""
    lists = re.findall(r"^\s*deps = \[(.*?)\]", text, re.M | re.S) or [text]
    return {label for deps in lists
            for label in re.findall(r'"((?:@\w+)?//[\w/.-]+(?::[\w.-]+)?|:[\w.-]+)"', deps)}


def package_and_name(label: str) -> tuple[str, str]:
    """"//a/b:c" -> ("a/b", "c"); "//a/b" -> ("a/b", "b"), as Bazel reads them."""
    package, _, name = label.partition("//")[2].partition(":")
    return package, name or package.rsplit("/", 1)[-1]


def target_exists(package: str, name: str) -> bool:
    """Whether SOURCE/package/BUILD declares `name` (or, for X_cc, the proto library X)."""
    build = (SOURCE / package / "BUILD").read_text()
    if re.search(rf'^\s*name = "{re.escape(name)}",', build, re.M):
        return True
    proto = name.removesuffix("_cc")
    return name.endswith("_cc") and re.search(
        rf'tf_proto_library\(\n\s*name = "{re.escape(proto)}",', build) is not None


@needs_source
def test_every_label_in_the_series_build_files_is_a_target_of_the_tree(applied):
    """TensorFlow's own labels name a `name = ...` target of the tree's BUILD file
    of that package; external ones a repository the wheel was built with (its
    libraries embed the source paths external/<name>/... of those)."""
    lms_build = (applied / make_patches.LMS_DIR / "BUILD").read_text()
    gpu_build = [line for run in added_lines("tensorflow/core/common_runtime/gpu/BUILD")
                 for line in run]
    labels = build_labels(lms_build) | build_labels("\n".join(gpu_build))
    assert {label for label in labels if label.startswith(":")} == {":engine"}
    assert "//tensorflow/core/common_runtime/lms:tf_adapter" in labels
    internal = sorted(label for label in labels if label.startswith("//")
                      and not label.startswith(f"//{make_patches.LMS_DIR}:"))
    assert len(internal) >= 6
    missing = [label for label in internal
               if not (SOURCE / package_and_name(label)[0] / "BUILD").is_file()
               or not target_exists(*package_and_name(label))]
    assert not missing, f"not targets of the tree at {SOURCE}: {missing}"
    named = {label[1:label.index("//")] for label in labels if label.startswith("@")}
    assert {"xla", "tsl", "com_google_absl"} <= named
    embedded = set()
    for library in ("libtensorflow_framework.so.2", "libtensorflow_cc.so.2"):
        data = (WHEEL / library).read_bytes()
        embedded |= {m.decode() for m in re.findall(rb"external/(\w+)/", data)}
    assert named <= embedded, sorted(named - embedded)


# --------------------------------------------------------------------------
# The patched Python API on the stock wheel.

def link_tree(source: Path, target: Path, replaced: dict[str, str]) -> None:
    """Mirrors `source` at `target` by symlinks, writing the files in `replaced`."""
    target.mkdir(parents=True)
    for entry in source.iterdir():
        inside = [rel.split("/", 1)[1] for rel in replaced if rel.split("/", 1)[0] == entry.name
                  and "/" in rel]
        if entry.name in replaced:
            (target / entry.name).write_text(replaced[entry.name])
        elif inside:
            link_tree(entry, target / entry.name,
                      {rel: replaced[f"{entry.name}/{rel}"] for rel in inside})
        elif entry.name != "__pycache__":
            (target / entry.name).symlink_to(entry)


PATCHED_API_PROGRAM = r'''
import json
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.protobuf import config_pb2
from tensorflow.python.eager import context
from tensorflow.python.framework import config

assert tf.__file__.startswith(PATCHED), tf.__file__
result = {"before": config.get_lms_enabled()}
config.set_lms_enabled(True)
config.set_lms_defrag_enabled(True)
result["after"] = config.get_lms_enabled()
result["defrag"] = config.get_lms_defrag_enabled()
result["in_config"] = context.context().config.gpu_options.experimental.lms_enabled
proto = config_pb2.ConfigProto()
proto.gpu_options.experimental.lms_enabled = True
result["text"] = text_format.MessageToString(proto)
again = config_pb2.ConfigProto.FromString(proto.SerializeToString())
result["round_trip"] = again.gpu_options.experimental.lms_enabled
result["text_round_trip"] = text_format.Parse(
    result["text"], config_pb2.ConfigProto()).gpu_options.experimental.lms_enabled
tf.constant(1.0) + 1  # initializes the eager context
try:
    config.set_lms_enabled(False)
    result["late"] = None
except RuntimeError as error:
    result["late"] = str(error)
with tf.Graph().as_default():
    total = tf.constant([1.0, 2.0]) * 3
    with tf.compat.v1.Session(config=proto) as session:
        result["session"] = session.run(total).tolist()
# The golden files TensorFlow's API writer makes when the generated modules
# hold the patched functions.
import sys, types
sys.path.insert(0, BUILD_SCRIPTS)
import api_goldens, patch_python_api
result["goldens"] = {}
for version, path in api_goldens.MODULES:
    module = tf.compat.v1 if version == "v1" else tf.compat.v2
    for part in path.split(".")[1:]:
        module = getattr(module, part)
    patched = types.ModuleType(module.__name__)
    patched.__dict__.update(vars(module))
    for name in patch_python_api.lms_functions():
        setattr(patched, name, getattr(config, name))
    result["goldens"][api_goldens.golden_path(version, path)] = (
        api_goldens.module_golden(path, patched))
result["gpu_options_golden"] = api_goldens.proto_golden("tensorflow.GPUOptions",
                                                       config_pb2.GPUOptions)
print("RESULT " + json.dumps(result))
'''


def patched_python(applied: Path) -> dict[str, str]:
    """The series' config.py and context.py, as the wheel would ship them."""
    return {
        "python/framework/config.py":
            (applied / "tensorflow/python/framework/config.py").read_text(),
        # The wheel's own import line, not the source's (make_patches.REWRITTEN).
        "python/eager/context.py":
            (applied / "tensorflow/python/eager/context.py").read_text().replace(
                *reversed(make_patches.REWRITTEN["tensorflow/python/eager/context.py"][29]), 1),
    }


def run_patched(site: Path, program: str, tmp_path: Path, **env: str) -> dict:
    """Runs `program` on the tensorflow package copy in `site`; its RESULT line."""
    env = {**os.environ, "PYTHONPATH": str(site), "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONDONTWRITEBYTECODE": "1", **env}
    program = (f"PATCHED = {str(site)!r}\n"
               f"BUILD_SCRIPTS = {str(ROOT / 'build_scripts')!r}\n" + program)
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(lines[0][len("RESULT "):])


@needs_source
def test_the_patched_python_api_on_the_stock_wheel(applied, tmp_path):
    config_pb2 = (WHEEL / "core" / "protobuf" / "config_pb2.py").read_text()
    patched = {**patched_python(applied),
               "core/protobuf/config_pb2.py": with_lms_fields(config_pb2)}
    site = tmp_path / "site"
    link_tree(WHEEL, site / "tensorflow", patched)
    result = run_patched(site, PATCHED_API_PROGRAM, tmp_path)
    assert result["before"] is False
    assert result["after"] is True and result["defrag"] is True
    assert result["in_config"] is True
    assert "lms_enabled: true" in result["text"]
    assert result["round_trip"] is True and result["text_round_trip"] is True
    assert result["late"] and "before the runtime is initialized" in result["late"]
    assert "set_lms_enabled" in result["late"]
    assert result["session"] == [3.0, 6.0]
    # Every golden file the series changes is what TensorFlow's writer prints for
    # the patched API: the base's text (TensorFlow's own) with the 24 functions
    # and the two fields, exactly where and as the writer puts them.
    assert set(result["goldens"]) == set(make_patches.golden_files())
    for rel, written in result["goldens"].items():
        assert written.count("  member_method {") >= 24 + 8, rel
        expected = without_members(written, {name for name in WHEEL_ONLY_MEMBERS if
                                             f'name: "{name}"' not in (SOURCE / rel).read_text()})
        assert (applied / rel).read_text() == expected, rel
    gpu_options = (applied / make_patches.GPU_OPTIONS_GOLDEN).read_text()
    assert gpu_options == result["gpu_options_golden"]
    assert 'name: "lms_defrag_enabled"\n        number: 21\n' in gpu_options


# Members the 2.21.0 wheel exports that the golden files of the tree before the
# tag lack (added on the 2.21 line after that snapshot): the writer's text for
# the wheel has them, the base files do not.
WHEEL_ONLY_MEMBERS = {"float4_e2m1fn"}


def without_members(golden: str, names: set[str]) -> str:
    """A module's golden text without the `member` blocks of `names`."""
    for name in names:
        golden = re.sub(rf'  member {{\n    name: "{name}"\n    mtype: [^\n]*\n  }}\n', "",
                        golden)
    return golden


PATCHED_STATISTICS_PROGRAM = r"""
import ctypes, json, os
import tensorflow_lms_allocator  # the overlay: an emulated LMS device on CPU:0
import tensorflow as tf
from tensorflow.python.framework import config
from tensorflow_lms_allocator import lms
from tensorflow_lms_allocator.overlay import activation

assert config.__file__.startswith(PATCHED), config.__file__
result = {}
try:
    config.get_bytes_in_use(0)
except RuntimeError as error:
    result["stock"] = str(error)
# The entry points the overlay's adapter exports, into the global scope,
# where the patched functions look last (the stock wheel's libraries lack them).
ctypes.CDLL(str(activation._library_dir() / "libtf_lms_adapter.so"),
            mode=os.RTLD_GLOBAL | os.RTLD_NOLOAD)
# 20 tensors of 16 MiB on a 256 MiB device: LMS evicts, then pages in.
x = tf.random.uniform([2048, 2048])
kept = [x + i for i in range(20)]
float(tf.add_n(kept[:4])[0, 0])
before = tensorflow_lms_allocator.get_statistics("CPU:0")
result["patched"] = {name: getattr(config, name)(0) for name in lms.STATISTICS}
result["overlay"] = {name: before[engine] for name, engine in lms.STATISTICS.items()}
result["unchanged"] = tensorflow_lms_allocator.get_statistics("CPU:0") == before
device = tf.config.list_logical_devices("CPU")[0]
result["by_name"] = [config.get_bytes_in_use(d) for d in
                     ("CPU:0", "/job:localhost/replica:0/task:0/device:CPU:0",
                      "/physical_device:CPU:0", device)]
result["api_names"] = {name: [list(getattr(config, name)._tf_api_names),
                              list(getattr(config, name)._tf_api_names_v1)]
                       for name in lms.STATISTICS}
errors = {}
for bad in (3, "GPU:0", "TPU:0", 1.5):
    try:
        config.get_bytes_reclaimed(bad)
    except ValueError as error:
        errors[repr(bad)] = str(error)
result["errors"] = errors
print("RESULT " + json.dumps(result))
"""


@needs_source
def test_the_patched_statistics_functions_read_an_lms_device(applied, tmp_path):
    site = tmp_path / "site"
    link_tree(WHEEL, site / "tensorflow", patched_python(applied))
    result = run_patched(site, PATCHED_STATISTICS_PROGRAM, tmp_path,
                         TF_LMS_CPU_DEVICE_MEMORY_MB="256", TF_LMS_ENABLED="1")
    # The stock wheel's framework and _pywrap_tensorflow_internal lack them.
    assert "built without Large Model Support" in result["stock"]
    assert "patches/README.md" in result["stock"]
    # Every docs/observing.md statistic, read by the patched function, is the engine's.
    assert len(result["patched"]) == 20
    assert result["unchanged"]
    assert result["patched"] == result["overlay"]
    patched = result["patched"]
    assert patched["get_num_allocs"] >= 22
    assert patched["get_bytes_in_use"] >= 21 * 16 * 2**20  # x and the 20 kept
    assert patched["get_bytes_limit"] == 256 * 2**20
    assert patched["get_bytes_reclaimed"] > 0 and patched["get_gpu_host_bytes_in_use"] > 0
    assert len(set(patched.values())) >= 10  # distinct figures, so a swap would show
    assert result["by_name"] == [result["patched"]["get_bytes_in_use"]] * 4
    for name, (v2, v1) in result["api_names"].items():
        assert v2 == v1 == [f"config.experimental.{name}", f"experimental.{name}"]
    errors = result["errors"]
    assert "No LMS device with index 3; the LMS devices are: CPU:0" in errors["3"]
    assert "set_lms_enabled(True)" in errors["3"]
    assert "GPU:0" in errors["'GPU:0'"]  # the engine's NOT_FOUND, naming the device
    assert "'TPU:0' is not a local device" in errors["'TPU:0'"]
    assert "1.5 is not a local device" in errors["1.5"]
