"""cpp/generated/dtype_table.h is what scripts/generate_dtype_table.py derives
from the installed torch's op_db (Note [Dtype policy] in
cpp/ops/dtype_policy.h): a new torch, or a changed kernel, that changes the
table fails here until the table is regenerated."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


# A subprocess of a few minutes: every op_db sample, forward and backward.
@pytest.mark.subprocess
def test_the_dtype_table_is_generated_from_the_installed_torch():
    run = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "generate_dtype_table.py"), "--check"],
        capture_output=True, text=True, timeout=1200,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert "cpp/generated/dtype_table.h is up to date" in run.stdout
