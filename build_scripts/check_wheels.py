"""Installs each wheel of `make wheels` into a fresh environment and runs the demo there.

For each TensorFlow version: a new virtual environment under
build/wheel-check/V, `pip install "<the wheel for V>[cpu]"` (which pins
tensorflow-cpu==V through the wheel's metadata), then examples/demo.py run
from outside the checkout, so the package comes from the wheel: ResNet-50
must train under the emulated cap with LMS and stop with a clean OOM without.

Usage: python build_scripts/check_wheels.py DIST_DIR VERSION [VERSION ...]

Example:
    $ python build_scripts/check_wheels.py dist 2.16.2 2.21.0    # make test-wheels: all six
    [1/2] TensorFlow 2.16.2: dist/tensorflow_lms_allocator-0.1.0+tf2.16.2-...whl
          installed with tensorflow-cpu 2.16.2; demo PASS (on) PASS (off) in 52 s
    ...
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tf_matrix import demo_verdicts  # noqa: E402  (sibling scripts)
from wheel_info import built_for  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ENVS = ROOT / "build" / "wheel-check"


def run(args: list[str], cwd: Path | None = None, timeout: int = 1800) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {done.returncode}:\n"
                           f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def check(wheel: Path, version: str) -> str:
    """Installs `wheel` into a fresh environment and runs the demo; returns a summary."""
    env = ENVS / version
    shutil.rmtree(env, ignore_errors=True)
    venv.EnvBuilder(with_pip=True).create(env)
    python = str(env / "bin" / "python")
    run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         f"{wheel}[cpu]"])
    installed = run([python, "-c", "import importlib.metadata as m; "
                     "print(m.version('tensorflow-cpu'))"]).strip()
    if installed != version:
        raise RuntimeError(f"the wheel's [cpu] extra installed tensorflow-cpu {installed}, "
                           f"not {version}")
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as outside:  # not the checkout: the wheel's package
        out = run([python, str(ROOT / "examples" / "demo.py")], cwd=Path(outside))
    verdicts = demo_verdicts(out)
    if [word for word, _ in verdicts] != ["PASS", "PASS"]:
        raise RuntimeError(f"the demo did not pass:\n{out[-3000:]}")
    return (f"installed with tensorflow-cpu {installed}; demo "
            f"{' '.join(f'{w} ({m})' for w, m in verdicts)} in "
            f"{time.monotonic() - start:.0f} s")


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__.split("\n\n")[2], file=sys.stderr)
        return 2
    wheels = {built_for(w): w for w in sorted(Path(argv[1]).glob("tensorflow_lms_allocator-*.whl"),
                                              key=lambda path: path.stat().st_mtime)}
    failed = []
    for i, version in enumerate(argv[2:], 1):
        wheel = wheels.get(version)
        print(f"[{i}/{len(argv) - 2}] TensorFlow {version}: {wheel or 'no wheel'}", flush=True)
        try:
            if wheel is None:
                raise RuntimeError(f"no wheel for TensorFlow {version} in {argv[1]}: "
                                   "run make wheels")
            print(f"      {check(wheel, version)}", flush=True)
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            print(f"      FAILED: {error}", flush=True)
            failed.append(version)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
