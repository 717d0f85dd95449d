"""openreg equals CPU over PyTorch's operator database (tests/opinfo_parity.py):
every op at float32, with the fallback inline (plus one backward sample per
op) and queued; every other dtype on a rotating share of the ops, so each op
also runs at one other dtype. The known failures below, each with its
reason, must still fail where they run: a fixed one is noticed here and taken
off the list. The full sweep is run by hand:
python3 tests/opinfo_parity.py --dtypes all --backward (and --busy)."""

import os
import re
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "opinfo_parity.py")

# Keyed by "dtype op.variant"; a key without a dtype applies to every dtype.
ACCELERATOR_ACC_POLICY = (
    "acc_policy='auto' accumulates float16/bfloat16 in float32 on CPU only; on an accelerator "
    "(CUDA, MPS, openreg) it computes in the input dtype (torch/nn/modules/linear_cross_entropy_options.py); "
    "PyTorch's own CPU-vs-MPS comparison skips these samples for that reason"
)
THREE_D_ATTENTION = (
    "the backward of 3-D (batch, sequence, feature) attention: CPU runs its flash kernel; openreg, like "
    "CUDA (whose fused kernels take 4-D inputs only), runs the math path (cpp/attention.cpp), whose "
    "float16/bfloat16 rounding differs; 4-D attention equals CPU (test_attention.py)"
)
KNOWN_FAILURES = {
    **{
        f"{dtype} nn.functional.linear_cross_entropy.{variant}": ACCELERATOR_ACC_POLICY
        for dtype in ("float16", "bfloat16")
        for variant in ("chunked", "chunked_none")
    },
    **{f"{dtype} nn.functional.scaled_dot_product_attention.": THREE_D_ATTENTION for dtype in ("float16", "bfloat16")},
}

OTHER_DTYPES = "float64,float16,bfloat16,complex64,complex128,int64,int32,uint8,bool"


def known_failure(label: str):
    dtype, op = label.split()
    return KNOWN_FAILURES.get(f"{dtype} {op}") or KNOWN_FAILURES.get(op)


def sweep(*args):
    run = subprocess.run(
        [sys.executable, SCRIPT, "-v", *args], capture_output=True, text=True, timeout=1800
    )
    summary = re.search(r"^(\d+) passed, (\d+) failed, (\d+) unsupported on openreg$", run.stdout, re.MULTILINE)
    assert summary, run.stdout[-2000:] + run.stderr[-2000:]
    failed = dict(re.findall(r"^FAIL (\S+\s+\S+): (.*)$", run.stdout, re.MULTILINE))
    passed = set(re.findall(r"^ok   (\S+\s+\S+)$", run.stdout, re.MULTILINE))
    unsupported = dict(re.findall(r"^UNSUPPORTED (\S+\s+\S+): (.*)$", run.stdout, re.MULTILINE))
    unexpected = {label: why for label, why in failed.items() if not known_failure(label)}
    fixed = sorted(label for label in passed if known_failure(label))
    assert not unexpected, f"ops that differ from CPU: {unexpected}"
    assert not fixed, f"known failures that now pass (take them off the list): {fixed}"
    # Only sparse layouts may be refused, with openreg's own message.
    assert all("sparse layouts are not supported on openreg" in why for why in unsupported.values()), unsupported
    assert int(summary.group(1)) > 0


# Each sweep is a subprocess of a few minutes (more while the suite's
# background scripts run): the subprocess tests' hang limit applies.
@pytest.mark.subprocess
@pytest.mark.parametrize(
    "args",
    [
        ["--dtypes", "float32", "--backward"],
        ["--dtypes", "float32", "--busy"],
        ["--dtypes", OTHER_DTYPES, "--rotate"],
    ],
    ids=["float32-inline-backward", "float32-queued", "other-dtypes-rotating"],
)
def test_ops_equal_cpu(args):
    sweep(*args)
