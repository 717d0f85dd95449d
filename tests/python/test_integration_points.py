"""docs/integration-points.md stays true: what its tables name exists.

For every row of every table (columns: integration point, PyTorch header /
module, openreg file, test, conformance check):
- each repository path in backticks in the last three columns exists;
- a `path::name` reference names a function defined in that file (`def
  name` in Python, `fn name` in Rust, a function `name(` in C++);
- each header in the second column exists under the installed torch's
  include/ directory, and each module there can be found, without importing
  it (only its parent packages' locations are looked up, so neither
  torch._dynamo nor Inductor nor a training library is imported).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(REPO, "docs", "integration-points.md")
TORCH_INCLUDE = os.path.join(os.path.dirname(torch.__file__), "include")
COLUMNS = ["Integration point", "PyTorch header / module", "openreg file", "Test", "Conformance check"]
NONE = "—"


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _rows() -> list[list[str]]:
    """The body rows of every table whose header is COLUMNS."""
    rows = []
    in_table = False
    with open(DOC, encoding="utf-8") as f:
        for line in f:
            if not line.startswith("|"):
                in_table = False
                continue
            cells = _cells(line)
            if cells == COLUMNS:
                in_table = True
            elif in_table and not all(set(c) <= set("-: ") for c in cells):
                rows.append(cells)
    return rows


def _quoted(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _label(cell: str) -> str:
    """A row's integration point, short enough for a failure message."""
    return cell if len(cell) <= 70 else cell[:67] + "..."


ROWS = _rows()
# (row label, column, reference) for the repository columns.
REPO_REFERENCES = [
    (_label(row[0]), COLUMNS[c], ref) for row in ROWS if len(row) == 5 for c in (2, 3, 4) for ref in _quoted(row[c])
]
PYTORCH_REFERENCES = sorted({ref for row in ROWS if len(row) == 5 for ref in _quoted(row[1])})


def _id(reference: tuple[str, str, str]) -> str:
    return reference[2]


def test_tables_are_well_formed():
    assert len(ROWS) >= 30, f"only {len(ROWS)} rows parsed from {DOC}"
    for row in ROWS:
        assert len(row) == 5, f"row with {len(row)} cells, not 5: {row}"
        label, header, _, test, conformance = row
        label = _label(label)
        assert _quoted(header), f"{label!r}: no PyTorch header or module"
        assert _quoted(test), f"{label!r}: no test"
        assert _quoted(conformance) or conformance == NONE, f"{label!r}: conformance is neither a reference nor {NONE}"


@pytest.mark.parametrize("reference", REPO_REFERENCES, ids=_id)
def test_repository_path_exists(reference):
    label, column, ref = reference
    path = ref.split("::")[0]
    assert os.path.exists(os.path.join(REPO, path)), f"{label!r}, column {column!r}: {path} does not exist"


def _definition_pattern(path: str, name: str) -> str:
    n = re.escape(name)
    if path.endswith(".py"):
        return rf"^\s*(?:async\s+)?def\s+{n}\s*\("
    if path.endswith(".rs"):
        return rf"\bfn\s+{n}\b"
    if path.endswith((".cpp", ".cc", ".h", ".hpp")):
        # A definition at the start of a line: `void test_hooks() {`.
        return rf"^(?:static\s+|inline\s+)*[\w:<>]+[\s\*&]+{n}\s*\([^;]*$"
    raise AssertionError(f"{path}: no rule for finding a function in this kind of file")


@pytest.mark.parametrize("reference", [r for r in REPO_REFERENCES if "::" in r[2]], ids=_id)
def test_named_function_is_defined(reference):
    label, column, ref = reference
    path, name = ref.split("::", 1)
    full = os.path.join(REPO, path)
    if not os.path.isfile(full):
        pytest.fail(f"{label!r}, column {column!r}: {path} does not exist")
    with open(full, encoding="utf-8") as f:
        text = f.read()
    defined = re.search(_definition_pattern(path, name), text, re.MULTILINE) is not None
    assert defined, f"{label!r}, column {column!r}: {path} defines no function {name}"


def _find_module(name: str):
    """The module's spec, found as importlib.util.find_spec would, but
    without importing its parent packages: each part is looked up in the
    previous part's search locations."""
    parts = name.split(".")
    spec = importlib.util.find_spec(parts[0])  # imports nothing for a top-level name
    for i in range(1, len(parts)):
        if spec is None or spec.submodule_search_locations is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), list(spec.submodule_search_locations))
    return spec


@pytest.mark.parametrize("reference", PYTORCH_REFERENCES)
def test_pytorch_header_or_module_exists(reference):
    if reference.endswith(".h"):
        assert os.path.isfile(os.path.join(TORCH_INCLUDE, reference)), f"{reference} is not under {TORCH_INCLUDE}"
        return
    assert re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", reference), f"{reference!r} is neither a header nor a module"
    top = reference.split(".")[0]
    if top != "torch" and top not in sys.stdlib_module_names and importlib.util.find_spec(top) is None:
        pytest.skip(f"{top} is not installed (an optional training library)")
    before = set(sys.modules)
    spec = _find_module(reference)
    assert spec is not None, f"module {reference} cannot be found"
    # Finding must stay cheap: nothing is imported by it.
    assert not {m for m in set(sys.modules) - before if m.split(".")[0] == top}, f"finding {reference} imported modules"
