"""Runs `make test-tf VERSION=V` for each TensorFlow version and writes the table.

Each version's log goes to build/tf-matrix/V.log; the table (result, the
symbol check's counts, the demo's verdict, the tests' summary, wall time), with
the date it ran, replaces the one between the `<!-- tf-matrix -->` markers of
docs/tensorflow-versions.md and of the README.

Usage: python build_scripts/tf_matrix.py VERSION [VERSION ...]

Example:
    $ python build_scripts/tf_matrix.py 2.16.2 2.21.0     # make test-tf-matrix runs all six
    [1/2] TensorFlow 2.16.2: make test-tf VERSION=2.16.2 (log: build/tf-matrix/2.16.2.log)
          passed in 412 s: 13 of 13 interposed, adapter 46 of 46; demo PASS PASS; 51 passed
    ...
"""

from __future__ import annotations

import datetime
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "build" / "tf-matrix"
DOC = ROOT / "docs" / "tensorflow-versions.md"
README = ROOT / "README.md"
BEGIN, END = "<!-- tf-matrix -->", "<!-- /tf-matrix -->"


@dataclass
class Row:
    version: str
    passed: bool
    seconds: float
    symbols: str
    demo: str
    tests: str


def last(pattern: str, text: str, default: str = "-") -> str:
    found = re.findall(pattern, text, re.MULTILINE)
    return found[-1] if found else default


def demo_verdicts(output: str) -> list[tuple[str, str]]:
    """The demo's verdict lines (examples/demo.py): [("PASS", "on"), ("PASS", "off")]."""
    return re.findall(r"^  (PASS|FAIL)  LMS (on|off)", output, re.MULTILINE)


def summarize(version: str, returncode: int, seconds: float, log: str) -> Row:
    """One row from a `make test-tf` log."""
    interposed = last(r"^interposer: (\d+ of \d+) symbols exported", log)
    bound = last(r"^interposer: (\d+ of \d+) functions bound", log)
    adapter = last(r"^adapter: (\d+ of \d+) TensorFlow symbols", log)
    verdicts = demo_verdicts(log)
    demo = " ".join(f"{word} ({mode})" for word, mode in verdicts) or "-"
    tests = last(r"^=*\s*(\d+ (?:passed|failed)[^=\n]*?)\s*=*$", log)
    return Row(version, returncode == 0, seconds,
               f"interposed {interposed} (bound {bound}), adapter {adapter}", demo, tests)


def table(rows: list[Row], when: str) -> str:
    lines = [f"`make test-tf-matrix`, run {when} (tensorflow-cpu wheels, Python "
             f"{sys.version_info.major}.{sys.version_info.minor}, total "
             f"{sum(r.seconds for r in rows) / 60:.0f} min):", "",
             "| TensorFlow | result | symbols | demo | tests | wall time |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.version} | {'passed' if r.passed else '**FAILED**'} | {r.symbols} "
                     f"| {r.demo} | {r.tests} | {r.seconds / 60:.1f} min |")
    return "\n".join(lines) + "\n"


def replace_marked(path: Path, text: str) -> None:
    """Replaces what lies between the markers in `path` by `text`."""
    content = path.read_text()
    if BEGIN not in content or END not in content:
        raise SystemExit(f"{path} has no {BEGIN} ... {END} block for the table")
    head, rest = content.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{text}{END}{tail}")


def write_outputs(rows: list[Row]) -> str:
    text = table(rows, datetime.date.today().isoformat())
    for path in (DOC, README):
        replace_marked(path, text)
    return text


def main(versions: list[str]) -> int:
    if not versions:
        print(__doc__.split("\n\n")[2], file=sys.stderr)
        return 2
    LOGS.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, version in enumerate(versions, 1):
        log_path = LOGS / f"{version}.log"
        print(f"[{i}/{len(versions)}] TensorFlow {version}: make test-tf VERSION={version} "
              f"(log: {log_path.relative_to(ROOT)})", flush=True)
        start = time.monotonic()
        with log_path.open("w") as log:
            done = subprocess.run(["make", "--no-print-directory", "test-tf",
                                   f"VERSION={version}"], cwd=ROOT, stdout=log,
                                  stderr=subprocess.STDOUT)
        row = summarize(version, done.returncode, time.monotonic() - start,
                        log_path.read_text(errors="replace"))
        rows.append(row)
        print(f"      {'passed' if row.passed else 'FAILED'} in {row.seconds:.0f} s: "
              f"{row.symbols}; demo {row.demo}; {row.tests}", flush=True)
    print(write_outputs(rows))
    return 0 if all(r.passed for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
