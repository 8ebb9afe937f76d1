"""Generates the LMS patch series for TensorFlow v2.21.0, deterministically.

The series is made from this project's own sources and a base tree built at
run time from TensorFlow's own files, none of which this repository holds:

  - the installed 2.21.0 wheel's exact files (config.py, context.py with the
    one line the wheel build rewrites put back, the op_kernel.h header);
  - every other file from a TensorFlow source directory, TF_SOURCE_DIR, by
    default ../shared/tensorflow-source/pre-v2.21.0 next to this project
    (patches/README.md says which tree each file was checked against).

  0001  the engine, backends and TensorFlow adapter sources, byte for byte the
        files the overlay builds and tests, under tensorflow/core/common_runtime/lms/
        with their BUILD file;
  0002  config.proto: GPUOptions.Experimental.lms_enabled = 20 and
        lms_defrag_enabled = 21, and the v1 API golden file of GPUOptions;
  0003  the Python API (patch_python_api.py): set_lms_enabled / get_lms_enabled /
        set_lms_defrag_enabled / get_lms_defrag_enabled in tf.config.experimental
        (and tf.experimental, IBM's names), kept by the eager context and written
        into those two fields of the ConfigProto, and the statistics functions,
        which read LMS's C entry points (tf_adapter/statistics_c_api.h); the API
        golden files list them;
  0004  the hooks: an OpKernelContext observer (op_kernel.h/.cc) that LMS installs
        to pin kernels' tensors, GPUProcessState asking LMS first for a GPU's
        allocator (gpu_process_state.cc, the gpu BUILD file), and GPUUtil's copies
        pinned (gpu_util.cc).

Each part is a commit with a fixed author and date on top of the base tree;
`git format-patch --zero-commit --no-signature` writes them into one mbox,
patches/tensorflow_v2.21.0_large_model_support.patch, which `git am` applies
as four commits; regenerating gives the same bytes (`make test-patches`).
Each edit is anchored on lines that read the same in the trees bracketing the
tag (pre-v2.21.0 and the post-v2.21.0 excerpts), so that the hunks apply to both.

Usage:
  python build_scripts/make_patches.py              # rewrite the series
  python build_scripts/make_patches.py --check      # exit 1 if it is stale
  python build_scripts/make_patches.py --out FILE   # write it elsewhere
  python build_scripts/make_patches.py --split DIR  # also one file per patch

Example:
  $ TF_SOURCE_DIR=~/src/tensorflow python build_scripts/make_patches.py --check
  patches/tensorflow_v2.21.0_large_model_support.patch: 4 patches, up to date
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from patch_python_api import golden_files, patch_config_py, patch_context_py, patch_golden
from patch_text import insert_after, insert_before, replace_once

ROOT = Path(__file__).resolve().parent.parent
CC = ROOT / "tensorflow_lms_allocator" / "cc"
# The whole series as one mbox (docs/design.md's name): `git am` takes it as it is.
SERIES = ROOT / "patches" / "tensorflow_v2.21.0_large_model_support.patch"
TF_COMMIT = "a481b10260dfdf833a1b16007eead49c1d7febf3"  # v2.21.0
LMS_DIR = "tensorflow/core/common_runtime/lms"
# The real TensorFlow texts that bracket the tag (its README says what they are).
SHARED_SOURCES = ROOT.parent / "shared" / "tensorflow-source"
POST_EXCERPTS = SHARED_SOURCES / "post-v2.21.0-excerpts"

# Files the series changes whose exact v2.21.0 text the wheel holds: path in
# the tree -> path in the installed `tensorflow` package.
FROM_WHEEL = {
    "tensorflow/python/framework/config.py": "python/framework/config.py",
    "tensorflow/python/eager/context.py": "python/eager/context.py",
    "tensorflow/core/framework/op_kernel.h": "include/tensorflow/core/framework/op_kernel.h",
}
# Lines the wheel build rewrites (docs/design.md, "Facts about the source patch"):
# path -> {line number: (wheel text, source text)}.
REWRITTEN = {
    "tensorflow/python/eager/context.py": {
        29: ("from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2",
             "from xla.tsl.protobuf import coordination_config_pb2"),
    },
}
GPU_OPTIONS_GOLDEN = "tensorflow/tools/api/golden/v1/tensorflow.-g-p-u-options.pbtxt"
# Files the series changes that only a TensorFlow source tree has.
FROM_SOURCE = [
    "tensorflow/core/protobuf/config.proto",
    "tensorflow/core/framework/op_kernel.cc",
    "tensorflow/core/common_runtime/gpu/gpu_process_state.cc",
    "tensorflow/core/common_runtime/gpu/gpu_util.cc",
    "tensorflow/core/common_runtime/gpu/BUILD",
    GPU_OPTIONS_GOLDEN,
    *golden_files(),
]
IDENTITY = {"GIT_AUTHOR_NAME": "TensorFlow LMS", "GIT_AUTHOR_EMAIL": "lms@invalid",
            "GIT_COMMITTER_NAME": "TensorFlow LMS", "GIT_COMMITTER_EMAIL": "lms@invalid",
            "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000",
            "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000"}
# The folders the series ships, whole: the engine, its backends, the
# TensorFlow-facing runtime both ways in share, and the entry points only a
# patched TensorFlow builds (patch/: they use the observer 0004 adds to
# op_kernel.h). The overlay's own glue (cc/overlay/, cc/interposer/) and the
# tests' entry points (cc/tf_testing/) stay out.
SHIPPED_DIRS = ("engine", "backends", "tf_adapter", "patch")


def new_sources() -> list[Path]:
    """The project's files that the series adds to TensorFlow, relative to cc/."""
    files = [p for d in SHIPPED_DIRS for p in sorted((CC / d).iterdir())
             if p.suffix in (".h", ".cc")]
    return [p.relative_to(CC) for p in files]


BUILD_FILE = '''\
# Large Model Support (LMS): an address-stable swapping GPU allocator.
# The same sources as the tensorflow-lms-allocator project's runtime overlay
# (generated by its build_scripts/make_patches.py; do not edit here).

load("//tensorflow:tensorflow.bzl", "tf_copts")

package(
    default_visibility = ["//tensorflow:internal"],
    licenses = ["notice"],
)

# The engine and its backends: C++17 and the OS (libdl: the CUDA backend
# loads the driver at run time, so nothing here links CUDA). Like the
# adapter, it throws no exceptions (tf_copts: -fno-exceptions).
cc_library(
    name = "engine",
    srcs = glob(["engine/*.cc", "backends/*.cc"]),
    hdrs = glob(["engine/*.h", "backends/*.h"]),
    copts = tf_copts(),
    includes = ["."],
    linkopts = ["-ldl"],
)

# The TensorFlow adapter: tsl::Allocator over the engine, kernel pins, GPU
# device wiring, the entry point GPUProcessState calls
# (patch/patched_tensorflow.h), and the C entry points Python reads the
# statistics from (tf_adapter/statistics_c_api.h). Nothing in TensorFlow's
# C++ calls those (tf.config.experimental finds them with ctypes), hence
# alwayslink: the linker keeps them where the GPU runtime is linked.
cc_library(
    name = "tf_adapter",
    srcs = glob(["tf_adapter/*.cc", "patch/*.cc"]),
    hdrs = glob(["tf_adapter/*.h", "patch/*.h"]),
    copts = tf_copts(),
    includes = ["."],
    alwayslink = True,
    deps = [
        ":engine",
        "//tensorflow/core:framework",
        "//tensorflow/core:protos_all_cc",
        "//tensorflow/core/common_runtime:dma_helper",
        "//tensorflow/core/common_runtime:gpu_device_context",
        "//tensorflow/core/common_runtime:threadpool_device",
        "//tensorflow/core/common_runtime/gpu:gpu_id",
        "@com_google_absl//absl/status",
        "@com_google_absl//absl/strings",
        "@com_google_protobuf//:protobuf",
        "@tsl//tsl/platform:logging",
        "@tsl//tsl/profiler/lib:scoped_annotation",
        "@tsl//tsl/profiler/lib:scoped_memory_debug_annotation",
        "@tsl//tsl/profiler/lib:traceme",
        "@tsl//tsl/profiler/lib:traceme_encode",
        "@xla//xla/stream_executor:stream",
        "@xla//xla/tsl/framework:allocator",
        "@xla//xla/tsl/framework:device_id",
    ],
)
'''

# --------------------------------------------------------------------------
# Part 0002: the ConfigProto fields.

CONFIG_PROTO_ANCHOR = "    StreamMergeOptions stream_merge_options = 19;\n"
CONFIG_PROTO_ADDITION = '''
    // Large Model Support (LMS): if true, the GPU allocator keeps every
    // tensor at one device address and moves inactive tensors to pinned host
    // memory when device memory runs out, paging them back in when a kernel
    // needs them, so that models larger than the GPU train. Host memory for
    // evicted tensors is limited by TF_GPU_HOST_MEM_LIMIT_IN_MB. Also set by
    // tf.config.experimental.set_lms_enabled and TF_LMS_ENABLED=1.
    bool lms_enabled = 20;

    // With LMS: when a request finds enough free device memory but no free
    // address range large enough, remap free physical memory to where it is
    // needed (no tensor moves) instead of evicting more tensors. Also set by
    // tf.config.experimental.set_lms_defrag_enabled and TF_LMS_DEFRAG_ENABLED.
    bool lms_defrag_enabled = 21;
'''


def patch_config_proto(text: str) -> str:
    return insert_after(text, CONFIG_PROTO_ANCHOR, CONFIG_PROTO_ADDITION,
                        "tensorflow/core/protobuf/config.proto")


# The v1 API golden file of GPUOptions prints its descriptor, nested messages
# included (TensorFlow's api_compatibility_test compares it with the
# generated config_pb2): the two fields follow stream_merge_options.
GPU_OPTIONS_GOLDEN_ANCHOR = """\
        type_name: ".tensorflow.GPUOptions.Experimental.StreamMergeOptions"
      }
"""


def golden_field(name: str, number: int) -> str:
    """A bool field of GPUOptions.Experimental as the golden file prints it."""
    return (f"      field {{\n        name: \"{name}\"\n        number: {number}\n"
            "        label: LABEL_OPTIONAL\n        type: TYPE_BOOL\n      }\n")


def patch_gpu_options_golden(text: str) -> str:
    fields = golden_field("lms_enabled", 20) + golden_field("lms_defrag_enabled", 21)
    return insert_after(text, GPU_OPTIONS_GOLDEN_ANCHOR, fields, GPU_OPTIONS_GOLDEN)


def add_config_fields(tree: Path) -> None:
    edit(tree, "tensorflow/core/protobuf/config.proto", patch_config_proto)
    edit(tree, GPU_OPTIONS_GOLDEN, patch_gpu_options_golden)


# --------------------------------------------------------------------------
# Part 0004: the hooks.

OP_KERNEL_H_ANCHOR = ("template <>\n"
                      "const Eigen::GpuDevice& OpKernelContext::eigen_device() const;\n\n")
OP_KERNEL_H_ADDITION = '''\
// Observes the lifetime of every OpKernelContext, for Large Model Support
// (tensorflow/core/common_runtime/lms), which keeps the tensors a kernel uses
// resident on the device while its context lives. `on_created` runs at the
// end of the constructor and `on_destroyed` at the start of the destructor,
// on the thread that runs them; both must be thread-safe and cannot fail.
struct OpKernelContextObserver {
  void (*on_created)(OpKernelContext* context,
                     OpKernelContext::Params* params);
  void (*on_destroyed)(OpKernelContext* context);
};

// Installs `observer` (static storage) for every context constructed from
// now on. LMS installs one when it makes its first device and never removes
// it, so every context observed when created is observed when destroyed.
void SetOpKernelContextObserver(const OpKernelContextObserver* observer);

'''

OP_KERNEL_CC_STORAGE_ANCHOR = "OpKernelContext::OpKernelContext(Params* params)\n"
OP_KERNEL_CC_STORAGE = '''\
namespace {
// Set once (SetOpKernelContextObserver); acquire/release, so a context that
// sees the pointer sees the observer's functions.
std::atomic<const OpKernelContextObserver*> op_kernel_context_observer{
    nullptr};
}  // namespace

void SetOpKernelContextObserver(const OpKernelContextObserver* observer) {
  op_kernel_context_observer.store(observer, std::memory_order_release);
}

'''
OP_KERNEL_CC_CREATED_ANCHOR = """\
    if (!s.ok()) {
      SetStatus(s);
    }
  }
"""
OP_KERNEL_CC_CREATED = """\
  if (const OpKernelContextObserver* observer =
          op_kernel_context_observer.load(std::memory_order_acquire)) {
    observer->on_created(this, params_);
  }
"""
OP_KERNEL_CC_DESTROYED_ANCHOR = "OpKernelContext::~OpKernelContext() {\n"
OP_KERNEL_CC_DESTROYED = """\
  if (const OpKernelContextObserver* observer =
          op_kernel_context_observer.load(std::memory_order_acquire)) {
    observer->on_destroyed(this);
  }
"""

GPU_PROCESS_STATE_INCLUDE_ANCHOR = '#include "tensorflow/core/common_runtime/gpu/gpu_id_manager.h"\n'
GPU_PROCESS_STATE_INCLUDE = '#include "tensorflow/core/common_runtime/lms/patch/patched_tensorflow.h"\n'
# Before CHECK(process_state_): the lines after it differ across the tag
# (`const string& allocator_type` became `const std::string&`), so a hunk
# there would apply to one side only.
GPU_PROCESS_STATE_ALLOCATOR_ANCHOR = """\
    const std::vector<tsl::TfDeviceId>& peer_gpu_ids) {
"""
GPU_PROCESS_STATE_ALLOCATOR = """\
  // Large Model Support: when it is enabled for this GPU, its allocator
  // serves the GPU, and TensorFlow's below is never made (it would take the
  // GPU's memory).
  if (Allocator* lms_allocator = lms::LmsGpuAllocatorOrNull(
          options, tf_device_id.value(), total_bytes, peer_gpu_ids)) {
    return lms_allocator;
  }
"""
GPU_PROCESS_STATE_HOST_ANCHOR = "\n  CHECK_NE(nullptr, se);\n"
GPU_PROCESS_STATE_HOST = """
  if (se == nullptr) {
    // Large Model Support serves the GPUs, so GetGPUAllocator made no
    // allocator to find an executor through; any GPU's will do.
    se = DeviceIdUtil::ExecutorForTfDeviceId(
             DEVICE_GPU, se::GPUMachineManager(), tsl::TfDeviceId(0))
             .value();
  }"""

# gpu_util.cc: each of GPUUtil's four copies keeps its body under another
# name (the unpinned copy) and becomes a call to LMS's pinned copy with it.
GPU_UTIL_INCLUDE_ANCHOR = '#include "tensorflow/core/common_runtime/gpu_device_context.h"\n'
GPU_UTIL_INCLUDE = '#include "tensorflow/core/common_runtime/lms/patch/patched_tensorflow.h"\n'
PINS_COMMENT = """\
// Large Model Support pins the copy's LMS tensors until `done` (Note
// [TensorFlow's own copies] in lms/tf_adapter/tensorflow_copies.h).
"""


@dataclass
class PinnedCopy:
    """One of GPUUtil's copies: its header in gpu_util.cc and the call that pins."""
    header: str      # "void GPUUtil::Name(" ... ") {\n", as in the file
    unpinned: str    # the name its body keeps
    call: str        # the wrapper's body

    def patched(self) -> str:
        name = self.header[len("void GPUUtil::"):self.header.index("(")]
        params = " ".join(self.header[self.header.index("(") + 1:self.header.rindex(")")]
                          .split())
        signature = wrap(f"static void {self.unpinned}(", params.split(", "), ")")
        return (f"// GPUUtil::{name} without Large Model Support's pins.\n"
                f"{signature};\n\n{PINS_COMMENT}{self.header}{self.call}}}\n\n"
                f"{signature} {{\n")


def wrap(opening: str, params: list[str], closing: str) -> str:
    """`opening`, the parameters and `closing`, aligned after the parenthesis in
    lines of at most 80 columns (with room for the " {" or ";" that follows)."""
    indent = " " * len(opening)
    lines = [opening]
    for i, param in enumerate(params):
        last = i + 1 == len(params)
        piece = param + (closing if last else ", ")
        if len(lines[-1]) > len(indent) and \
                len(lines[-1] + piece.rstrip()) + (2 if last else 0) > 80:
            lines[-1] = lines[-1].rstrip()
            lines.append(indent)
        lines[-1] += piece
    return "\n".join(lines)


PINNED_COPIES = [
    PinnedCopy("""\
void GPUUtil::DeviceToDeviceCopy(
    DeviceContext* send_dev_context, DeviceContext* recv_dev_context,
    Device* src, Device* dst, AllocatorAttributes src_alloc_attr,
    AllocatorAttributes dst_alloc_attr, const Tensor* input, Tensor* output,
    int dev_to_dev_stream_index, StatusCallback done) {
""", "DeviceToDeviceCopyUnpinned", """\
  lms::PinnedDeviceToDeviceCopy(&DeviceToDeviceCopyUnpinned, send_dev_context,
                                recv_dev_context, src, dst, src_alloc_attr,
                                dst_alloc_attr, input, output,
                                dev_to_dev_stream_index, std::move(done));
"""),
    PinnedCopy("""\
void GPUUtil::CopyGPUTensorToCPU(Device* gpu_device,
                                 const DeviceContext* device_context,
                                 const Tensor* gpu_tensor, Tensor* cpu_tensor,
                                 StatusCallback done) {
""", "CopyGPUTensorToCPUUnpinned", """\
  lms::PinnedCopyGpuTensorToCpu(&CopyGPUTensorToCPUUnpinned, gpu_device,
                                device_context, gpu_tensor, cpu_tensor,
                                std::move(done));
"""),
    PinnedCopy("""\
void GPUUtil::CopyCPUTensorToGPU(const Tensor* cpu_tensor,
                                 const DeviceContext* device_context,
                                 Device* gpu_device, Tensor* gpu_tensor,
                                 StatusCallback done, bool sync_dst_compute) {
""", "CopyCPUTensorToGPUUnpinned", """\
  lms::PinnedCopyCpuTensorToGpu(&CopyCPUTensorToGPUUnpinned, cpu_tensor,
                                device_context, gpu_device, gpu_tensor,
                                std::move(done), sync_dst_compute);
"""),
    PinnedCopy("""\
void GPUUtil::CopyGPUTensorToSameGPU(Device* gpu_device,
                                     const DeviceContext* device_context,
                                     const Tensor* src_gpu_tensor,
                                     Tensor* dst_gpu_tensor,
                                     StatusCallback done) {
""", "CopyGPUTensorToSameGPUUnpinned", """\
  lms::PinnedCopyGpuTensorToSameGpu(&CopyGPUTensorToSameGPUUnpinned, gpu_device,
                                    device_context, src_gpu_tensor,
                                    dst_gpu_tensor, std::move(done));
"""),
]


def patch_gpu_util_cc(text: str) -> str:
    path = "tensorflow/core/common_runtime/gpu/gpu_util.cc"
    text = insert_after(text, GPU_UTIL_INCLUDE_ANCHOR, GPU_UTIL_INCLUDE, path)
    for copy in PINNED_COPIES:
        text = replace_once(text, copy.header, copy.patched(), path)
    return text


GPU_BUILD_ANCHOR = '        "//tensorflow/core/common_runtime:node_file_writer",\n'
GPU_BUILD_DEP = '        "//tensorflow/core/common_runtime/lms:tf_adapter",\n'


def patch_op_kernel_h(text: str) -> str:
    return insert_after(text, OP_KERNEL_H_ANCHOR, OP_KERNEL_H_ADDITION,
                        "tensorflow/core/framework/op_kernel.h")


def patch_op_kernel_cc(text: str) -> str:
    path = "tensorflow/core/framework/op_kernel.cc"
    text = insert_before(text, OP_KERNEL_CC_STORAGE_ANCHOR, OP_KERNEL_CC_STORAGE, path)
    text = insert_after(text, OP_KERNEL_CC_CREATED_ANCHOR, OP_KERNEL_CC_CREATED, path)
    return insert_after(text, OP_KERNEL_CC_DESTROYED_ANCHOR, OP_KERNEL_CC_DESTROYED, path)


def patch_gpu_process_state_cc(text: str) -> str:
    path = "tensorflow/core/common_runtime/gpu/gpu_process_state.cc"
    text = insert_after(text, GPU_PROCESS_STATE_INCLUDE_ANCHOR, GPU_PROCESS_STATE_INCLUDE,
                        path)
    text = insert_after(text, GPU_PROCESS_STATE_ALLOCATOR_ANCHOR,
                        GPU_PROCESS_STATE_ALLOCATOR, path)
    return insert_before(text, GPU_PROCESS_STATE_HOST_ANCHOR, GPU_PROCESS_STATE_HOST, path)


def patch_gpu_build(text: str) -> str:
    return insert_after(text, GPU_BUILD_ANCHOR, GPU_BUILD_DEP,
                        "tensorflow/core/common_runtime/gpu/BUILD")


def add_hooks(tree: Path) -> None:
    edit(tree, "tensorflow/core/framework/op_kernel.h", patch_op_kernel_h)
    edit(tree, "tensorflow/core/framework/op_kernel.cc", patch_op_kernel_cc)
    edit(tree, "tensorflow/core/common_runtime/gpu/gpu_process_state.cc",
         patch_gpu_process_state_cc)
    edit(tree, "tensorflow/core/common_runtime/gpu/gpu_util.cc", patch_gpu_util_cc)
    edit(tree, "tensorflow/core/common_runtime/gpu/BUILD", patch_gpu_build)


@dataclass
class Part:
    subject: str
    body: str
    apply: Callable[[Path], None]  # edits the checkout in place


def add_sources(tree: Path) -> None:
    for rel in new_sources():
        target = tree / LMS_DIR / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(CC / rel, target)
    (tree / LMS_DIR / "BUILD").write_text(BUILD_FILE)


def edit(tree: Path, rel: str, change: Callable[[str], str]) -> None:
    path = tree / rel
    path.write_text(change(path.read_text()))


def add_python_api(tree: Path) -> None:
    edit(tree, "tensorflow/python/framework/config.py", patch_config_py)
    edit(tree, "tensorflow/python/eager/context.py", patch_context_py)
    for golden in golden_files():
        edit(tree, golden, patch_golden)


PARTS = [
    Part("Add the Large Model Support allocator sources",
         "The engine (address arena, granule pools, residency, reclaim, remapping\n"
         "defragmentation), its POSIX and CUDA VMM backends, and the TensorFlow\n"
         "adapter, under tensorflow/core/common_runtime/lms/, byte for byte the\n"
         "sources of the tensorflow-lms-allocator runtime overlay. New files only.",
         add_sources),
    Part("Add GPUOptions.Experimental.lms_enabled and lms_defrag_enabled",
         "bool lms_enabled = 20 and bool lms_defrag_enabled = 21 in\n"
         "GPUOptions.Experimental (fields 1-5 and 7-19 are taken, 6 is reserved),\n"
         "which the Python API of the next patch sets and the LMS GPU allocator\n"
         "reads. The v1 API golden file of GPUOptions lists them.",
         add_config_fields),
    Part("Add tf.config.experimental.set_lms_enabled and friends",
         "set_lms_enabled, get_lms_enabled, set_lms_defrag_enabled and\n"
         "get_lms_defrag_enabled in tf.config.experimental and tf.experimental.\n"
         "The eager context keeps them and writes them into\n"
         "GPUOptions.Experimental.lms_enabled / lms_defrag_enabled of its\n"
         "ConfigProto; changing them after initialization is a RuntimeError.\n"
         "The statistics functions (get_bytes_in_use, get_bytes_reclaimed, ...)\n"
         "read an LMS device's statistics through the C entry points of\n"
         "lms/tf_adapter/statistics_c_api.h. The API golden files of\n"
         "tf.config.experimental and tf.experimental (v1, v2) list all 24.",
         add_python_api),
    Part("Call Large Model Support from the kernel contexts and the GPU allocator",
         "OpKernelContext's constructor and destructor call an observer that LMS\n"
         "installs (SetOpKernelContextObserver, op_kernel.h), so that a kernel's\n"
         "tensors stay resident while its context lives. GPUProcessState asks\n"
         "LMS first for each GPU's allocator (lms::LmsGpuAllocatorOrNull: when\n"
         "lms_enabled is set in GPUOptions.Experimental, by set_lms_enabled or\n"
         "TF_LMS_ENABLED=1), and GetGpuHostAllocator finds an executor when LMS\n"
         "serves every GPU. GPUUtil's four copies pin the LMS tensors they read\n"
         "or write until their `done` (lms::PinnedCopy*), so that no eviction can\n"
         "remap a tensor a queued copy still uses.",
         add_hooks),
]


def git(tree: Path, *args: str) -> str:
    env = {**os.environ, **IDENTITY, "GIT_CONFIG_GLOBAL": os.devnull,
           "GIT_CONFIG_NOSYSTEM": "1", "TZ": "UTC", "LC_ALL": "C"}
    done = subprocess.run(["git", "-C", str(tree), *args], env=env, check=True,
                          capture_output=True, text=True)
    return done.stdout


def source_dir() -> Path:
    """The TensorFlow source tree the non-wheel base files come from."""
    return Path(os.environ.get("TF_SOURCE_DIR") or SHARED_SOURCES / "pre-v2.21.0")


def wheel_dir() -> Path:
    """The installed `tensorflow` package, found without importing it."""
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("error: no tensorflow package in this Python: run me with the "
                         "project's .venv/bin/python (make patches)")
    return Path(list(spec.submodule_search_locations)[0])


def wheel_text_as_source(rel: str) -> bytes:
    """The wheel's file with the lines its build rewrote put back as in the source."""
    path = wheel_dir() / FROM_WHEEL[rel]
    lines = path.read_text().split("\n")
    for number, (in_wheel, in_source) in REWRITTEN.get(rel, {}).items():
        if lines[number - 1] != in_wheel:
            raise SystemExit(f"error: {path}:{number} reads {lines[number - 1]!r}, not "
                             f"{in_wheel!r}: is this the tensorflow 2.21.0 wheel?")
        lines[number - 1] = in_source
    return "\n".join(lines).encode()


def base_files() -> dict[str, bytes]:
    """Every file the series changes, as v2.21.0 has it: path -> bytes."""
    source = source_dir()
    missing = [rel for rel in FROM_SOURCE if not (source / rel).is_file()]
    if missing:
        raise SystemExit(
            f"error: TF_SOURCE_DIR={source} lacks {', '.join(missing[:3])}"
            f"{' and more' if len(missing) > 3 else ''}: point TF_SOURCE_DIR at a "
            "TensorFlow v2.21.0 checkout (git clone --branch v2.21.0 "
            "https://github.com/tensorflow/tensorflow)")
    return {**{rel: (source / rel).read_bytes() for rel in FROM_SOURCE},
            **{rel: wheel_text_as_source(rel) for rel in FROM_WHEEL}}


def base_checkout(tree: Path) -> None:
    """A git repository holding the base tree as one commit."""
    for rel, data in base_files().items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_bytes(data)
    git(tree, "init", "-q", "-b", "v2.21.0")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", f"TensorFlow v2.21.0 ({TF_COMMIT}): the files LMS patches")


def generate(out: Path, split: Path | None = None) -> bytes:
    """The series as one mbox, written to `out`; one file per patch in `split`."""
    with tempfile.TemporaryDirectory(prefix="lms-patches-") as tmp:
        tree = Path(tmp) / "tensorflow"
        base_checkout(tree)
        for part in PARTS:
            part.apply(tree)
            git(tree, "add", "-A")
            git(tree, "commit", "-q", "-m", f"{part.subject}\n\n{part.body}")
        patches = Path(tmp) / "series"
        git(tree, "format-patch", "-q", "--zero-commit", "--no-signature",
            "--no-numbered", "--full-index", "--stat=80", "-o", str(patches),
            f"HEAD~{len(PARTS)}")
        written = sorted(patches.glob("*.patch"))
        series = b"".join(p.read_bytes() for p in written)
        if split is not None:
            split.mkdir(parents=True, exist_ok=True)
            for path in written:
                shutil.copyfile(path, split / path.name)
    out.write_bytes(series)
    return series


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="regenerate into a temporary file and exit 1 if "
                             f"{SERIES.relative_to(ROOT)} differs")
    parser.add_argument("--out", type=Path, default=SERIES, help="where to write the series")
    parser.add_argument("--split", type=Path, metavar="DIR",
                        help="also write each patch as its own file into DIR")
    args = parser.parse_args(argv)
    shown = SERIES.relative_to(ROOT)
    if args.check:
        with tempfile.TemporaryDirectory(prefix="lms-series-") as tmp:
            fresh = generate(Path(tmp) / SERIES.name)
        if not SERIES.exists() or SERIES.read_bytes() != fresh:
            print(f"error: {shown} is stale: run `make patches` and commit the result",
                  file=sys.stderr)
            return 1
        print(f"{shown}: {len(PARTS)} patches, up to date")
        return 0
    generate(args.out, args.split)
    print(args.out.relative_to(ROOT) if args.out.resolve().is_relative_to(ROOT) else args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
