"""Prints the newest LMS wheel in a directory and the TensorFlow it was built for.

Usage: python build_scripts/wheel_info.py DIST_DIR

Example:
    $ python build_scripts/wheel_info.py dist
    Built dist/tensorflow_lms_allocator-0.1.0-cp311-cp311-linux_x86_64.whl
    for TensorFlow 2.21.0: install it into an environment with tensorflow or
    tensorflow-cpu 2.21.0 (`pip install <wheel>`).
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


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    wheels = sorted(Path(argv[1]).glob("tensorflow_lms_allocator-*.whl"),
                    key=lambda path: path.stat().st_mtime)
    if not wheels:
        print(f"no tensorflow_lms_allocator wheel in {argv[1]}: run `make wheel`",
              file=sys.stderr)
        return 1
    version = built_for(wheels[-1])
    print(f"Built {wheels[-1]}\nfor TensorFlow {version}: install it into an environment "
          f"with tensorflow or tensorflow-cpu {version} (`pip install <wheel>`).")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
