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
