#!/usr/bin/env bash
# Builds a TensorFlow v2.21.0 wheel with the Large Model Support patch series.
#
#   build_scripts/build_tensorflow_wheel.sh [--cuda] [--workdir DIR] [--jobs N] [--no-install]
#
# Steps: check the requirements below (before anything starts), clone v2.21.0
# into WORKDIR/tensorflow, check out commit a481b102..., `git am` the series
# of patches/v2.21.0/, build //tensorflow/tools/pip_package:wheel with
# bazelisk (CPU-only, or CUDA with --cuda), then `pip install` the wheel into
# the Python that runs this script (unless --no-install).
#
# Requirements (checked first; each missing one is named with what to do):
#   - Linux x86-64, git, Python 3.11 with pip, bazelisk on PATH (it fetches the
#     Bazel version TensorFlow pins in .bazelversion);
#   - clang 18 or newer (TensorFlow 2.21 builds with clang);
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
# was checked there is in patches/README.md.
set -euo pipefail

TF_TAG=v2.21.0
TF_COMMIT=a481b10260dfdf833a1b16007eead49c1d7febf3
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SERIES="$ROOT/patches/v2.21.0"
WORKDIR="$PWD/tensorflow-lms-build"
CUDA=0
JOBS=""
INSTALL=1
MIN_DISK_GIB=50
MIN_MEMORY_GIB=16

usage() {
  sed -n '2,27p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --cuda) CUDA=1 ;;
    --workdir) WORKDIR="${2:?--workdir needs a directory}"; shift ;;
    --jobs) JOBS="${2:?--jobs needs a number}"; shift ;;
    --no-install) INSTALL=0 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [[ -n "$JOBS" && ! "$JOBS" =~ ^[1-9][0-9]*$ ]]; then
  echo "error: --jobs must be a positive number, not '$JOBS'" >&2
  exit 2
fi

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
need_command python3.11 "install Python 3.11 (the wheel is built for it)"
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
mkdir -p "$WORKDIR"
free_gib=$(( $(df -Pk "$WORKDIR" | awk 'NR == 2 {print $4}') / 1024 / 1024 ))
(( free_gib >= MIN_DISK_GIB )) ||
  missing+=("$WORKDIR has $free_gib GiB free: the build needs $MIN_DISK_GIB GiB (--workdir)")
memory_gib=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 1024 ))
(( memory_gib >= MIN_MEMORY_GIB )) ||
  missing+=("this machine has $memory_gib GiB of memory: the build needs $MIN_MEMORY_GIB GiB")
if command -v git > /dev/null 2>&1 &&
   ! timeout 30 git ls-remote --exit-code https://github.com/tensorflow/tensorflow \
       "refs/tags/$TF_TAG" > /dev/null 2>&1; then
  missing+=("github.com is not reachable (git ls-remote of tensorflow/tensorflow $TF_TAG)")
fi
ls "$SERIES"/*.patch > /dev/null 2>&1 ||
  missing+=("no patches in $SERIES: run \`make patches\` in $ROOT")

if [[ ${#missing[@]} -gt 0 ]]; then
  echo "error: cannot build TensorFlow $TF_TAG with LMS here:" >&2
  printf '  - %s\n' "${missing[@]}" >&2
  echo "(requirements: build_scripts/build_tensorflow_wheel.sh --help)" >&2
  exit 1
fi

step() { echo "== [$(date +%H:%M:%S)] $*"; }

cd "$WORKDIR"
if [[ ! -d tensorflow/.git ]]; then
  step "Cloning TensorFlow $TF_TAG"
  git clone --branch "$TF_TAG" --depth 1 https://github.com/tensorflow/tensorflow.git
fi
cd tensorflow
if [[ "$(git rev-parse HEAD)" != "$TF_COMMIT" ]]; then
  echo "error: $WORKDIR/tensorflow is at $(git rev-parse HEAD), not $TF_TAG ($TF_COMMIT);" \
       "remove it or pass another --workdir" >&2
  exit 1
fi
step "Applying the LMS series ($(ls "$SERIES"/*.patch | wc -l) patches)"
git -c user.name="LMS build" -c user.email="lms@invalid" am --3way "$SERIES"/*.patch

step "Building //tensorflow/tools/pip_package:wheel ($([[ $CUDA -eq 1 ]] && echo CUDA || echo CPU-only))"
bazel_args=(build //tensorflow/tools/pip_package:wheel --repo_env=WHEEL_NAME=tensorflow
            --config=opt)
[[ $CUDA -eq 1 ]] && bazel_args+=(--config=cuda_wheel)
[[ -n "$JOBS" ]] && bazel_args+=(--jobs="$JOBS")
export CC=clang BAZEL_COMPILER=clang
bazelisk "${bazel_args[@]}"

wheel="$(ls -t bazel-bin/tensorflow/tools/pip_package/wheel_house/*.whl | head -n1)"
step "Built $wheel"
if [[ $INSTALL -eq 1 ]]; then
  step "Installing it into $(command -v python3.11)"
  python3.11 -m pip install --force-reinstall "$wheel"
  python3.11 -c "import tensorflow as tf; tf.config.experimental.set_lms_enabled(True);
print('LMS:', tf.config.experimental.get_lms_enabled())"
fi
