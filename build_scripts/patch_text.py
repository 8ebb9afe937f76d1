r"""Text edits for the patch generator: each finds its anchor exactly once.

A changed base file must fail loudly instead of being patched in the wrong
place, so every edit checks that its anchor occurs once.

Example:
    >>> insert_after("a\nb\n", "a\n", "x\n", "f.txt")
    'a\nx\nb\n'
"""

from __future__ import annotations


def insert_after(text: str, anchor: str, addition: str, path: str) -> str:
    if text.count(anchor) != 1:
        raise SystemExit(f"error: {path}: the anchor {anchor.strip()!r} occurs "
                         f"{text.count(anchor)} times, not once; is the base tree "
                         "v2.21.0? (patches/README.md)")
    return text.replace(anchor, anchor + addition)


def insert_before(text: str, anchor: str, addition: str, path: str) -> str:
    return insert_after(text, anchor, "", path).replace(anchor, addition + anchor)


def replace_once(text: str, old: str, new: str, path: str) -> str:
    insert_after(text, old, "", path)  # checks that `old` occurs exactly once
    return text.replace(old, new)
