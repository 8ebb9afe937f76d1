"""Prints which LMS wheel in a directory is for which TensorFlow, and how to install it.

Usage: python build_scripts/wheel_info.py DIST_DIR [TF_VERSION ...]

With no version: the newest wheel in DIST_DIR and the TensorFlow it was built
for. With versions (`make wheels`): the newest wheel for each, and exit 1 if
one has none.

Example:
    $ python build_scripts/wheel_info.py dist
    Built dist/tensorflow_lms_allocator-0.1.0+tf2.21.0-cp311-cp311-linux_x86_64.whl
    for TensorFlow 2.21.0: install it into an environment with tensorflow or
    tensorflow-cpu 2.21.0: pip install "<wheel>[gpu]" (or [cpu], [and-cuda]).
"""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path


def built_for(wheel: Path) -> str:
    """The TensorFlow version the wheel's binaries were built against."""
    with zipfile.ZipFile(wheel) as archive:
        info = json.loads(archive.read("tensorflow_lms_allocator/build_info.json"))
    return info["tensorflow_version"]


def install_hint(version: str) -> str:
    return (f"for TensorFlow {version}: install it into an environment with tensorflow or "
            f"tensorflow-cpu {version}: pip install \"<wheel>[gpu]\" (or [cpu], [and-cuda]).")


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    wheels = sorted(Path(argv[1]).glob("tensorflow_lms_allocator-*.whl"),
                    key=lambda path: path.stat().st_mtime)
    if not wheels:
        print(f"no tensorflow_lms_allocator wheel in {argv[1]}: run `make wheel`",
              file=sys.stderr)
        return 1
    versions = argv[2:]
    if not versions:
        print(f"Built {wheels[-1]}\n{install_hint(built_for(wheels[-1]))}")
        return 0
    newest = {built_for(wheel): wheel for wheel in wheels}  # the last one wins
    missing = [v for v in versions if v not in newest]
    for version in versions:
        if version in newest:
            print(f"TensorFlow {version:8} {newest[version]}")
    print("Install the one for your TensorFlow: pip install \"<wheel>[gpu]\" "
          "(or [cpu] for tensorflow-cpu, [and-cuda] for tensorflow[and-cuda]).")
    if missing:
        print(f"no wheel for TensorFlow {', '.join(missing)} in {argv[1]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
