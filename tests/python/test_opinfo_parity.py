"""openreg equals CPU over PyTorch's operator database (tests/opinfo_parity.py):
every op at float32, with the fallback inline (plus one backward sample per
op) and queued; every other dtype on a rotating share of the ops, so each op
also runs at one other dtype; inline and queued, every pair where
CUDA's dtypes differ from CPU's (--cuda-dtypes: Note [Dtype policy]); and
the ops op_db declares for sparse layouts on their sparse samples, every
layout at float32 and float64 (--sparse: Note [Sparse tensors]); and at float32, inline and queued, the
samples with 4-D/5-D tensors as they are and channels-last, forward and backward: results and input
gradients laid out as on CPU (--memory-formats: Note [Memory format of results]). The known failures below, each with its
reason, must still fail where they run: a fixed one is noticed here and taken
off the list. The full sweep is run by hand:
python3 tests/opinfo_parity.py --dtypes all --backward (and --busy), and
python3 tests/opinfo_parity.py --sparse --dtypes all (and --busy)."""

import os
import re

import pytest

from _openreg_util import check_known_failures, clean_env, run_sweep

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "opinfo_parity.py")

# Keyed by "dtype op.variant"; a key without a dtype applies to every dtype.
ACCELERATOR_ACC_POLICY = (
    "acc_policy='auto' accumulates float16/bfloat16 in float32 on CPU only; on an accelerator "
    "(CUDA, MPS, openreg) it computes in the input dtype (torch/nn/modules/linear_cross_entropy_options.py); "
    "PyTorch's own CPU-vs-MPS comparison skips these samples for that reason"
)
THREE_D_ATTENTION = (
    "the backward of 3-D (batch, sequence, feature) attention: CPU runs its flash kernel; openreg, like "
    "CUDA (whose fused kernels take 4-D inputs only), runs the math path (cpp/frontends/attention.cpp), "
    "whose float16/bfloat16 rounding differs; 4-D attention equals CPU (test_attention.py)"
)
KNOWN_FAILURES = {
    **{
        f"{dtype} nn.functional.linear_cross_entropy.{variant}": ACCELERATOR_ACC_POLICY
        for dtype in ("float16", "bfloat16")
        for variant in ("chunked", "chunked_none")
    },
    **{f"{dtype} nn.functional.scaled_dot_product_attention.": THREE_D_ATTENTION for dtype in ("float16", "bfloat16")},
    "sparse.mm.reduce": (
        "refused as CUDA refuses it: aten::_sparse_mm_reduce_impl has a SparseCsrCPU kernel and no SparseCsrCUDA one "
        "in torch 2.15's dispatcher (cpp/ops/sparse_kernels.cpp), although op_db declares CUDA dtypes for the OpInfo"),
}

CUDA_ONLY_FAILURES = {}
CPU_ONLY_FAILURES = {}

OTHER_DTYPES = "float64,float16,bfloat16,complex64,complex128,int64,int32,uint8,bool"


def known_failure(label: str):
    dtype, op = label.split()
    return KNOWN_FAILURES.get(f"{dtype} {op}") or KNOWN_FAILURES.get(op)


def known_dtype_failure(label: str):
    dtype, pair = label.split()
    return (CUDA_ONLY_FAILURES.get(f"{dtype} {pair}") or CUDA_ONLY_FAILURES.get(pair)
            or CPU_ONLY_FAILURES.get(f"{dtype} {pair}"))


def sweep(*args, env=None):
    report = run_sweep(SCRIPT, *args, env=env)
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


@pytest.mark.subprocess
def test_split_kernels_equal_cpu():
    """Queued, with chunks of 16 elements: op_db's samples split (Note
    [Split kernels]) and must still equal CPU."""
    sweep("--dtypes", "float32", "--busy", env=clean_env(OPENREG_SPLIT_ELEMENTS="16"))


@pytest.mark.subprocess
@pytest.mark.parametrize("args", [[], ["--busy"]], ids=["inline", "queued"])
def test_dtypes_as_cuda(args):
    report = run_sweep(SCRIPT, "--cuda-dtypes", *args)
    check_known_failures(report, known_dtype_failure, "dtype pairs")
    cuda_only = sum(1 for label in report.passed if "cuda-only:" in label)
    cpu_only = sum(1 for label in report.passed if "cpu-only:" in label)
    print(f"CUDA-only pairs computed as CUDA: {cuda_only}; CPU-only pairs refused as CUDA: {cpu_only}")
    assert cuda_only and cpu_only


@pytest.mark.subprocess
def test_sparse_layouts_equal_cpu():
    """Every (op, sparse layout, dtype) op_db declares, at float32 and
    float64 (about 60 s on 2 cores): openreg's results have CPU's layout and
    members. No known failures: a difference is a bug."""
    report = run_sweep(SCRIPT, "--sparse", "--dtypes", "float32,float64")
    print("\n".join(line for line in report.stdout.splitlines() if line.startswith("-- ")))
    differing = {**report.failed, **report.unsupported}
    assert not differing, "(op, layout) pairs that differ from CPU:\n" + "\n".join(
        f"{label}: {why}" for label, why in sorted(differing.items()))
    for layout in ("sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc"):
        assert any(f" {layout}:" in label for label in report.passed), f"no {layout} pair ran"


# Keyed by "op.variant": where openreg, as CUDA, lays a result out otherwise than CPU.
CUDNN_3D = (
    "CPU's 3-D convolutions of a batch of one with small kernels run its slow kernels, whose results are "
    "contiguous whatever the input's format (determine_backend_memory_format in "
    "aten/src/ATen/native/Convolution.cpp: Slow3d and SlowTranspose3d; oneDNN, taken otherwise, keeps "
    "channels_last_3d); CUDA's cuDNN gives channels_last_3d when the input or the weight is "
    "(cudnn_conv_suggest_memory_format in aten/src/ATen/native/ConvUtils.h), as openreg does "
    "(Note [Memory format of results])"
)
MEMORY_FORMAT_KNOWN_FAILURES = {"nn.functional.conv_transpose3d.": CUDNN_3D}


# About 30 s inline, 25 s queued, on two idle cores.
@pytest.mark.subprocess
@pytest.mark.parametrize("args", [[], ["--busy"]], ids=["inline", "queued"])
def test_memory_formats_equal_cpu(args):
    report = run_sweep(SCRIPT, "--memory-formats", *args)
    check_known_failures(report, lambda label: MEMORY_FORMAT_KNOWN_FAILURES.get(label.split()[1]), "ops")
    counts = re.search(r"^-- memory formats: (\d+) of \d+ ops have 4-D/5-D samples; (\d+) ", report.stdout, re.MULTILINE)
    print(counts and counts.group(0))
    assert counts and int(counts.group(1)) >= 100 and int(counts.group(2)) >= 700, report.stdout[-2000:]
