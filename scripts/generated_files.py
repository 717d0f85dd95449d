"""Writing a generated source file, or checking that it is up to date: one
rule for the scripts that derive tables from the installed torch."""

from __future__ import annotations

import difflib
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_or_check(path: str, text: str, check: bool, script: str) -> int:
    """Writes `text` to `path`; with `check`, compares instead and prints a
    diff and the command to run when they differ. Returns the exit status."""
    name = os.path.relpath(path, ROOT)
    if check:
        current = open(path).read() if os.path.exists(path) else ""
        if current != text:
            sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), text.splitlines(True), name, "regenerated"))
            print(f"{name} is stale: run python3 {os.path.relpath(script, ROOT)}")
            return 1
        print(f"{name} is up to date")
        return 0
    with open(path, "w") as f:
        f.write(text)
    print(f"wrote {name}")
    return 0
