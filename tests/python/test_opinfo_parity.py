"""openreg equals CPU over PyTorch's operator database (tests/opinfo_parity.py):
every op at float32, with the fallback inline (plus one backward sample per
op) and queued; every other dtype on a rotating share of the ops, so each op
also runs at one other dtype. The known failures below, each with its
reason, must still fail where they run: a fixed one is noticed here and taken
off the list. The full sweep is run by hand:
python3 tests/opinfo_parity.py --dtypes all --backward (and --busy)."""

import os

import pytest

from _openreg_util import check_known_failures, run_sweep

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
    report = run_sweep(SCRIPT, *args)
    check_known_failures(report, known_failure, "ops")
    # Only sparse layouts may be refused, with openreg's own message.
    assert all("sparse layouts are not supported on openreg" in why for why in report.unsupported.values()), report.unsupported
    assert report.passed


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
