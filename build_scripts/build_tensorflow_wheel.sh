#!/usr/bin/env bash
# Builds a TensorFlow v2.21.0 wheel with the Large Model Support patch series.
#
#   build_scripts/build_tensorflow_wheel.sh [--cuda] [--workdir DIR] [--jobs N] [--no-install]
#                                           [--dry-run]
#
# Steps: check the requirements below (before anything starts), clone v2.21.0
# into WORKDIR/tensorflow, check out commit a481b102..., `git am` the series
# patches/tensorflow_v2.21.0_large_model_support.patch (one mbox), run
# ./configure non-interactively (the environment configure.py reads: Python
# 3.11, clang, CC_OPT_FLAGS for --config=opt (default -Wno-sign-compare, or
# yours), and with --cuda hermetic CUDA 12.5.1 and cuDNN 9.3.0 compiled with
# clang, as the 2.21.0 wheel was), build //tensorflow/tools/pip_package:wheel
# with bazelisk for hermetic Python 3.11 (CPU-only, or with --cuda
# --config=cuda_clang --config=cuda_wheel), then `pip install` the wheel into
# python3.11 and import it from a new temporary directory, outside the source
# tree (unless --no-install).
#
# Each command is printed before it runs, one item a line: "env NAME=value" for
# each variable it is given (configure's), then "run DIR: COMMAND ARG..." (the
# directory it runs in). --dry-run prints the same lines and runs nothing: it
# clones nothing, skips the network and disk checks and reports the other
# missing requirements without stopping.
#
# Requirements (checked first; each missing one is named with what to do):
#   - Linux x86-64, git, Python 3.11 with pip, bazelisk on PATH (it fetches the
#     Bazel version TensorFlow pins in .bazelversion);
#   - clang 18 or newer: configure.py records its path (the C++ compiler is the
#     hermetic toolchain's that TensorFlow's .bazelrc selects);
#   - network access to github.com and the Bazel mirrors;
#   - disk: 50 GiB free in WORKDIR (sources, Bazel cache, wheel);
#   - memory: 16 GiB or more (with less, lower --jobs);
#   - time: 2-6 hours on 8-16 cores for a CPU-only build, more with CUDA;
#   - --cuda: CUDA toolkit 12.5 or newer (nvcc) and cuDNN 9.3 or newer
#     (TensorFlow's hermetic CUDA downloads its own, but a local driver for
#     running the result is yours), an NVIDIA driver for CUDA 12.5+.
#
# It has never run on the machines this project is developed on: they have no
# TensorFlow sources, no network beyond package registries and 2 cores. What
# was checked there is in patches/README.md; tests/test_build_script.py checks
# the --dry-run commands against TensorFlow's .bazelrc and configure.py.
set -euo pipefail

TF_TAG=v2.21.0
TF_COMMIT=a481b10260dfdf833a1b16007eead49c1d7febf3
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SERIES="$ROOT/patches/tensorflow_v2.21.0_large_model_support.patch"
WORKDIR="$PWD/tensorflow-lms-build"
CUDA=0
JOBS=""
INSTALL=1
DRY_RUN=0
MIN_DISK_GIB=50
MIN_MEMORY_GIB=16
# What the 2.21.0 wheel was built with (.bazelrc: build:cuda_version, build:cuda_clang).
HERMETIC_CUDA_VERSION=12.5.1
HERMETIC_CUDNN_VERSION=9.3.0
CUDA_COMPUTE_CAPABILITIES=sm_60,sm_70,sm_80,sm_89,compute_90
PYTHON_VERSION=3.11

usage() {  # the header comment above, without its first line
  awk 'NR == 1 {next} /^#/ {sub(/^# ?/, ""); print; next} {exit}' "${BASH_SOURCE[0]}"
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --cuda) CUDA=1 ;;
    --workdir) WORKDIR="${2:?--workdir needs a directory}"; shift ;;
    --jobs) JOBS="${2:?--jobs needs a number}"; shift ;;
    --no-install) INSTALL=0 ;;
    --dry-run) DRY_RUN=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [[ -n "$JOBS" && ! "$JOBS" =~ ^[1-9][0-9]*$ ]]; then
  echo "error: --jobs must be a positive number, not '$JOBS'" >&2
  exit 2
fi
[[ "$WORKDIR" == /* ]] || WORKDIR="$PWD/$WORKDIR"
SRC="$WORKDIR/tensorflow"
PYTHON="$(command -v "python$PYTHON_VERSION" || echo "python$PYTHON_VERSION")"
CLANG="$(command -v clang || echo clang)"

missing=()
need_command() {  # need_command NAME WHAT-TO-DO
  command -v "$1" > /dev/null 2>&1 || missing+=("$1 is not on PATH: $2")
}
version_at_least() {  # version_at_least HAVE WANT: true if HAVE >= WANT
  [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" == "$2" ]]
}

[[ "$(uname -s)-$(uname -m)" == "Linux-x86_64" ]] ||
  missing+=("this is $(uname -s)-$(uname -m): the script supports Linux x86-64 only")
need_command git "install git"
need_command "python$PYTHON_VERSION" "install Python $PYTHON_VERSION (the wheel is built for it)"
need_command bazelisk "install it from https://github.com/bazelbuild/bazelisk/releases"
need_command clang "install clang 18 or newer (e.g. apt-get install clang-18)"
if command -v clang > /dev/null 2>&1; then
  clang_version="$(clang -dumpversion)"
  version_at_least "$clang_version" 18 ||
    missing+=("clang is $clang_version: TensorFlow 2.21 needs clang 18 or newer")
fi
if [[ $CUDA -eq 1 ]]; then
  need_command nvcc "install the CUDA toolkit 12.5 or newer, or drop --cuda"
  if command -v nvcc > /dev/null 2>&1; then
    cuda_version="$(nvcc --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')"
    version_at_least "${cuda_version:-0}" 12.5 ||
      missing+=("CUDA is ${cuda_version:-unknown}: --cuda needs CUDA 12.5 or newer")
  fi
  cudnn_header="$(ls /usr/include/cudnn_version.h /usr/local/cuda/include/cudnn_version.h \
                  2> /dev/null | head -n1 || true)"
  if [[ -z "$cudnn_header" ]]; then
    missing+=("cuDNN not found (cudnn_version.h): --cuda needs cuDNN 9.3 or newer")
  else
    cudnn_version="$(awk '/#define CUDNN_MAJOR/ {a=$3} /#define CUDNN_MINOR/ {b=$3}
                          END {print a "." b}' "$cudnn_header")"
    version_at_least "$cudnn_version" 9.3 ||
      missing+=("cuDNN is $cudnn_version: --cuda needs cuDNN 9.3 or newer")
  fi
fi
memory_gib=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 1024 ))
(( memory_gib >= MIN_MEMORY_GIB )) ||
  missing+=("this machine has $memory_gib GiB of memory: the build needs $MIN_MEMORY_GIB GiB")
[[ -f "$SERIES" ]] ||
  missing+=("the series $SERIES is missing: run \`make patches\` in $ROOT")
if [[ $DRY_RUN -eq 0 ]]; then  # these need the network and WORKDIR
  mkdir -p "$WORKDIR"
  free_gib=$(( $(df -Pk "$WORKDIR" | awk 'NR == 2 {print $4}') / 1024 / 1024 ))
  (( free_gib >= MIN_DISK_GIB )) ||
    missing+=("$WORKDIR has $free_gib GiB free: the build needs $MIN_DISK_GIB GiB (--workdir)")
  if command -v git > /dev/null 2>&1 &&
     ! timeout 30 git ls-remote --exit-code https://github.com/tensorflow/tensorflow \
         "refs/tags/$TF_TAG" > /dev/null 2>&1; then
    missing+=("github.com is not reachable (git ls-remote of tensorflow/tensorflow $TF_TAG)")
  fi
fi

if [[ ${#missing[@]} -gt 0 ]]; then
  if [[ $DRY_RUN -eq 1 ]]; then
    echo "note: dry run; a real run would stop here, missing:" >&2
    printf '  - %s\n' "${missing[@]}" >&2
  else
    echo "error: cannot build TensorFlow $TF_TAG with LMS here:" >&2
    printf '  - %s\n' "${missing[@]}" >&2
    echo "(requirements: build_scripts/build_tensorflow_wheel.sh --help)" >&2
    exit 1
  fi
fi

step() { echo "== [$(date +%H:%M:%S)] $*"; }

quote() {  # quote WORD...: the words on one line, quoted where a shell needs it
  local word quoted=()
  for word in "$@"; do
    if [[ "$word" =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then
      quoted+=("$word")
    else
      quoted+=("'${word//\'/\'\\\'\'}'")
    fi
  done
  echo "${quoted[*]}"
}

# run DIR [NAME=value...] COMMAND [ARG...]: prints "env NAME=value" for each
# variable and "run DIR: COMMAND ARG...", then (unless --dry-run) runs COMMAND in
# DIR with those variables added to the environment and stdin from /dev/null, so
# that nothing can wait for an answer.
run() {
  local dir="$1" assignments=() assignment
  shift
  while [[ $# -gt 0 && "$1" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; do
    assignments+=("$1")
    shift
  done
  for assignment in "${assignments[@]}"; do
    echo "env $(quote "$assignment")"
  done
  echo "run $dir: $(quote "$@")"
  [[ $DRY_RUN -eq 1 ]] && return 0
  (cd "$dir" && env "${assignments[@]}" "$@" < /dev/null)
}

# The environment configure.py reads (every question it would ask, answered).
configure_env() {
  echo "PYTHON_BIN_PATH=$PYTHON"
  echo "USE_DEFAULT_PYTHON_LIB_PATH=1"
  echo "TF_NEED_ROCM=0"
  echo "TF_NEED_CUDA=$CUDA"
  if [[ $CUDA -eq 1 ]]; then
    echo "HERMETIC_CUDA_VERSION=$HERMETIC_CUDA_VERSION"
    echo "HERMETIC_CUDNN_VERSION=$HERMETIC_CUDNN_VERSION"
    echo "HERMETIC_CUDA_COMPUTE_CAPABILITIES=$CUDA_COMPUTE_CAPABILITIES"
    echo "LOCAL_CUDA_PATH="   # empty: the hermetic CUDA, cuDNN and NCCL
    echo "LOCAL_CUDNN_PATH="
    echo "LOCAL_NCCL_PATH="
    echo "TF_CUDA_CLANG=1"
    echo "CLANG_CUDA_COMPILER_PATH=$CLANG"
  else
    echo "TF_NEED_CLANG=1"
    echo "CLANG_COMPILER_PATH=$CLANG"
  fi
  echo "CC_OPT_FLAGS=${CC_OPT_FLAGS:--Wno-sign-compare}"
  echo "TF_SET_ANDROID_WORKSPACE=0"
}

bazel_command() {
  local args=(bazelisk build --config=opt)
  [[ $CUDA -eq 1 ]] && args+=(--config=cuda_clang --config=cuda_wheel)
  args+=(--repo_env=HERMETIC_PYTHON_VERSION="$PYTHON_VERSION" --repo_env=WHEEL_NAME=tensorflow)
  [[ -n "$JOBS" ]] && args+=(--jobs="$JOBS")
  printf '%s\n' "${args[@]}" //tensorflow/tools/pip_package:wheel
}

# The program that checks the installed wheel; its argument is the source tree.
IMPORT_CHECK='import sys, tensorflow as tf; '\
'assert not tf.__file__.startswith(sys.argv[1] + "/"), "imported the sources"; '\
'tf.config.experimental.set_lms_enabled(True); '\
'print("tensorflow", tf.__version__, "from", tf.__file__, '\
'"LMS:", tf.config.experimental.get_lms_enabled())'

if [[ ! -d "$SRC/.git" ]]; then
  step "Cloning TensorFlow $TF_TAG"
  run "$WORKDIR" git clone --branch "$TF_TAG" --depth 1 \
      https://github.com/tensorflow/tensorflow.git "$SRC"
fi
if [[ $DRY_RUN -eq 0 && "$(git -C "$SRC" rev-parse HEAD)" != "$TF_COMMIT" ]]; then
  echo "error: $SRC is at $(git -C "$SRC" rev-parse HEAD), not $TF_TAG ($TF_COMMIT);" \
       "remove it or pass another --workdir" >&2
  exit 1
fi
patch_count="$(grep -c '^From [0-9a-f]\{40\} ' "$SERIES" 2> /dev/null || true)"
step "Applying the LMS series (${patch_count:-no} patches in one mbox)"
run "$SRC" git -c user.name="LMS build" -c user.email="lms@invalid" am "$SERIES"

step "Configuring ($([[ $CUDA -eq 1 ]] && echo CUDA || echo CPU-only))"
mapfile -t environment < <(configure_env)
run "$SRC" "${environment[@]}" ./configure

step "Building //tensorflow/tools/pip_package:wheel"
mapfile -t bazel < <(bazel_command)
run "$SRC" "${bazel[@]}"

wheel_house="$SRC/bazel-bin/tensorflow/tools/pip_package/wheel_house"
wheel="$wheel_house/tensorflow-*.whl"  # what --dry-run prints; a real run names the file
if [[ $DRY_RUN -eq 0 ]]; then
  wheel="$(ls -t "$wheel_house"/tensorflow-*.whl | head -n1)"
  step "Built $wheel"
fi
if [[ $INSTALL -eq 1 ]]; then
  step "Installing it into $PYTHON and importing it from outside $SRC"
  run "$WORKDIR" "$PYTHON" -m pip install --force-reinstall "$wheel"
  import_dir="$(mktemp -d)"
  trap 'rm -rf -- "$import_dir"' EXIT
  run "$import_dir" "$PYTHON" -c "$IMPORT_CHECK" "$SRC"
fi
