"""The README and the pages under docs/ stay true to the code.

- Every ```python block runs as written, in a fresh process, and exits with
  status 0, unless the line before its fence marks it as a fragment:
  ``<!-- fragment: why it cannot run alone -->``.
- Every relative link points to a file that exists (and, for ``page.md#anchor``,
  to a heading of that page).
- The README stays short: at most 300 lines; the rest belongs in docs/.

Blocks that another test also runs (the graph example in test_graphs.py, the
sanitizer example in test_sanitizer_corpus.py, several times each there) run
here once.
"""

import glob
import os
import re

import pytest

from _openreg_util import clean_env, script

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
README = os.path.join(ROOT, "README.md")
DOCS = [README] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
README_MAX_LINES = 300

FRAGMENT = re.compile(r"^\s*<!-- fragment: (.+?) -->\s*$")
FENCE = re.compile(r"^\s*```")
PYTHON_FENCE = re.compile(r"^\s*```python\s*$")


def _name(path: str) -> str:
    return os.path.relpath(path, ROOT)


def python_blocks(path: str) -> list[tuple[int, str, str | None]]:
    """(line of the fence, code, fragment reason or None) for each ```python
    block of a markdown file."""
    lines = open(path).read().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        if PYTHON_FENCE.match(lines[i]):
            start = i
            i += 1
            while i < len(lines) and not FENCE.match(lines[i]):
                i += 1
            assert i < len(lines), f"{_name(path)}:{start + 1}: unclosed ```python block"
            marker = FRAGMENT.match(lines[start - 1]) if start > 0 else None
            code = "\n".join(lines[start + 1 : i]) + "\n"
            blocks.append((start + 1, code, marker.group(1) if marker else None))
        i += 1
    return blocks


BLOCKS = [(f"{_name(path)}:{line}", code, fragment) for path in DOCS for line, code, fragment in python_blocks(path)]
RUNNABLE = {where: code for where, code, fragment in BLOCKS if fragment is None}

# Declared at import: conftest starts them in the background, two at a time.
RUNS = {
    where: script("docs_" + re.sub(r"\W", "_", where), code, env=clean_env(), timeout=180)
    for where, code in RUNNABLE.items()
}


def test_the_docs_have_python_blocks():
    # The parser found what the pages hold: the README's tour and the pages' examples.
    assert any(where.startswith("README.md:") for where in RUNNABLE), BLOCKS
    assert len(RUNNABLE) >= 3, sorted(RUNNABLE)


def test_fragments_say_why():
    fragments = {where: fragment for where, _, fragment in BLOCKS if fragment is not None}
    assert all(reason.strip() for reason in fragments.values()), fragments


@pytest.mark.subprocess
@pytest.mark.parametrize("where", sorted(RUNS))
def test_python_block_runs_as_written(where):
    """The block, exactly as the page shows it, in a fresh process in an empty
    directory: no error, no hang, exit status 0."""
    result = RUNS[where].result()
    assert not result.timed_out, f"{where}: the example hung\n{result.describe()}"
    assert result.returncode == 0, f"{where}: the example failed\n{result.describe()}"


def _without_code(text: str) -> str:
    """The text with fenced code blocks and code spans blanked (links there are
    not links)."""
    out, in_fence = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            in_fence = not in_fence
            out.append("")
        else:
            out.append("" if in_fence else re.sub(r"`[^`]*`", "``", line))
    return "\n".join(out)


def _anchors_of(path: str) -> set[str]:
    """GitHub's anchors for the headings of a markdown file (duplicates aside)."""
    anchors = set()
    in_fence = False
    for line in open(path).read().split("\n"):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        m = None if in_fence else re.match(r"^#{1,6} (.*)$", line)
        if m:
            anchors.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return anchors


def broken_links(path: str) -> list[str]:
    broken = []
    text = _without_code(open(path).read())
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        if not os.path.exists(resolved):
            broken.append(f"{target}: no such file")
        elif anchor and resolved.endswith(".md") and anchor not in _anchors_of(resolved):
            broken.append(f"{target}: no heading #{anchor} in {_name(resolved)}")
    return broken


@pytest.mark.parametrize("path", DOCS, ids=_name)
def test_relative_links_point_to_existing_files(path):
    broken = broken_links(path)
    assert not broken, f"{_name(path)}: {broken}"


def test_readme_is_at_most_300_lines():
    count = len(open(README).read().splitlines())
    assert count <= README_MAX_LINES, f"README.md has {count} lines; move detail to a page under docs/"
