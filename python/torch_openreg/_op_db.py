"""PyTorch's operator database (op_db, in the torch wheel's testing package)
with each op's CUDA dtypes as PyTorch's CI sees them on a current GPU.

op_db declares per OpInfo the dtypes an op supports on CPU and on CUDA;
some CUDA declarations depend on the GPU (`SM53OrLater`, `SM80OrLater`...),
and evaluated on a machine without one they deny, for instance, bfloat16
matmul. openreg follows CUDA as on a GPU of compute capability
GPU_CAPABILITY (an H100), which torch.openreg.get_device_capability()
reports under OPENREG_DTYPES=cuda (Note [Dtype policy] in
cpp/ops/dtype_policy.h).
"""

from __future__ import annotations

import re
import sys

GPU_CAPABILITY = (9, 0)

_OP_DB_MODULE = "torch.testing._internal.common_methods_invocations"


def load_op_db() -> list:
    """op_db, its GPU-dependent CUDA dtypes evaluated at GPU_CAPABILITY.
    Must come before anything else imports PyTorch's OpInfo database: the
    conditions are read when it is built."""
    if _OP_DB_MODULE not in sys.modules:
        import torch.testing._internal.common_cuda as common_cuda

        for name in dir(common_cuda):
            match = re.fullmatch(r"SM(\d+)(\d)OrLater", name)
            if match:
                setattr(common_cuda, name, GPU_CAPABILITY >= (int(match[1]), int(match[2])))
    elif not _evaluated_at_capability():
        raise RuntimeError(f"{_OP_DB_MODULE} was imported before torch_openreg._op_db.load_op_db()")
    from torch.testing._internal.common_methods_invocations import op_db

    return op_db


def _evaluated_at_capability() -> bool:
    import torch.testing._internal.common_cuda as common_cuda

    return common_cuda.SM90OrLater is (GPU_CAPABILITY >= (9, 0))


def cuda_dtypes(op) -> set:
    return set(op.supported_dtypes("cuda"))


def cpu_dtypes(op) -> set:
    return set(op.supported_dtypes("cpu"))


def c10_name(dtype) -> str:
    """c10's name of a dtype ('Long' for torch.int64): what messages such as
    '"mm_openreg" not implemented for 'Long'' say."""
    import torch

    return _c10_names(torch)[dtype]


def _c10_names(torch) -> dict:
    return {
        torch.uint8: "Byte", torch.int8: "Char", torch.int16: "Short", torch.int32: "Int", torch.int64: "Long",
        torch.float16: "Half", torch.float32: "Float", torch.float64: "Double", torch.complex32: "ComplexHalf",
        torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble", torch.bool: "Bool",
        torch.bfloat16: "BFloat16", torch.float8_e5m2: "Float8_e5m2", torch.float8_e4m3fn: "Float8_e4m3fn",
        torch.float8_e5m2fnuz: "Float8_e5m2fnuz", torch.float8_e4m3fnuz: "Float8_e4m3fnuz",
        torch.uint16: "UInt16", torch.uint32: "UInt32", torch.uint64: "UInt64",
        torch.float8_e8m0fnu: "Float8_e8m0fnu", torch.bcomplex32: "BComplex32",
    }


# Per (op, layout, dtype) and per way of drawing them (declared, converted).
SPARSE_SAMPLES_PER_KIND = 24


def _declared_sparse_samples(op, layout, dtype, device):
    """The op's own sparse samples for the layout (OpInfo.sample_inputs_sparse,
    already validated by its sample function); none where op_db declares the
    layout without a sample function for it."""
    import unittest

    try:
        yield from op.sample_inputs_sparse(layout, device, dtype)
    except NotImplementedError as e:
        if "no sample function specified" not in str(e):
            raise
    except unittest.SkipTest:  # "NO SAMPLES!"
        pass


def _smallest_divisor(n: int) -> int:
    for i in range(2, int(n ** 0.5) + 1):
        if n % i == 0:
            return i
    return n


def _converted_sparse_samples(op, layout, dtype, device):
    """The op's dense samples in the layout, as PyTorch's consistency tests
    make them: COO, the input's to_sparse() (test_sparse.py,
    TestSparseUnaryUfuncs); compressed layouts, every tensor of the input's
    dimensionality (BSR/BSC: with two more, block-divisible) converted with
    dense_dim = ndim - 2 and the smallest divisors as blocksize
    (test_sparse_csr.py, test_consistency). Samples validate_sample_input_sparse
    turns into error inputs are left out."""
    import torch
    from torch.testing._internal.opinfo.core import SampleInput
    from torch.testing._internal.opinfo.definitions.sparse import validate_sample_input_sparse

    for sample in op.sample_inputs(device, dtype):
        if not isinstance(sample.input, torch.Tensor):
            continue
        if layout is torch.sparse_coo:
            sparse_sample = SampleInput(
                sample.input.clone().to_sparse(), args=sample.args, kwargs=sample.kwargs
            )
        else:
            if sample.input.ndim < 2:
                continue
            ndim = sample.input.ndim
            dense_dim = ndim - 2
            blocked = layout in (torch.sparse_bsr, torch.sparse_bsc)
            blocksize = tuple(map(_smallest_divisor, sample.input.shape[:2])) if blocked else None

            def to_sparse(x, ndim=ndim, dense_dim=dense_dim, blocksize=blocksize):
                if not isinstance(x, torch.Tensor):
                    return x
                if blocksize is None:
                    if x.ndim != ndim:
                        return x
                elif x.ndim != ndim + 2 or x.shape[-3] % blocksize[0] or x.shape[-2] % blocksize[1]:
                    return x
                return x.clone().to_sparse(layout=layout, blocksize=blocksize, dense_dim=dense_dim)

            sparse_sample = sample.transform(to_sparse)
        if validate_sample_input_sparse(op, sparse_sample, check_validate=False) is not sparse_sample:
            continue
        yield sparse_sample


def sparse_layout_samples(op, layout, dtype, device="cpu"):
    """('declared' | 'converted', index, sample) for each of the op's sparse
    samples in `layout` at `dtype`, made on `device`: the samples the sparse
    sweep (tests/opinfo_parity.py --sparse) compares (made on the CPU) and
    the dtype table's generator (scripts/generate_dtype_table.py) records
    (made on openreg: PyTorch's sparse sample functions leave out some
    samples on the CPU only, such as a bool mul, which CUDA computes)."""
    import itertools

    for kind, samples in (
        ("declared", _declared_sparse_samples(op, layout, dtype, device)),
        ("converted", _converted_sparse_samples(op, layout, dtype, device)),
    ):
        for i, sample in enumerate(itertools.islice(samples, SPARSE_SAMPLES_PER_KIND)):
            yield kind, i, sample
