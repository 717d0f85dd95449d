"""openreg against CPU over PyTorch's own operator database (op_db).

Each op runs in a forked child (tests/parity_harness.py), so a crash or a
hang is one op's counted failure, not the end of the sweep. For every sample
of the op at a dtype, the op runs on CPU and on openreg and the results must
be equal (torch.testing.assert_close defaults; shape and dtype only for
random ops).
With --busy, each sample on openreg runs behind a queued kernel, so the
fallback takes its queued route (results planned by Meta kernels, Note
[Meta results]) instead of running inline.

  python3 tests/opinfo_parity.py                       # every op, float32
  python3 tests/opinfo_parity.py --dtypes all --busy   # the full sweep
  python3 tests/opinfo_parity.py --ops sin,conj --dtypes complex64 -v
  python3 tests/opinfo_parity.py --dtypes all --backward   # with one backward sample per op
  python3 tests/opinfo_parity.py --cuda-dtypes [--busy]    # where CUDA's dtypes differ from CPU's
  python3 tests/opinfo_parity.py --sparse --dtypes float32,float64   # sparse layouts

With --sparse, the sweep covers the ops op_db declares for sparse layouts
(supports_sparse, supports_sparse_csr/_csc/_bsr/_bsc), each (op, layout,
dtype) in a fork, with sparse samples drawn as PyTorch's own tests draw
them: the op's sparse sample function (OpInfo.sample_inputs_sparse, as
test_sparse.py's TestSparseAny), and its dense samples in the layout (COO:
the input's to_sparse(), as test_sparse.py's TestSparseUnaryUfuncs;
compressed layouts: test_sparse_csr.py's test_consistency conversion), each
checked by validate_sample_input_sparse (torch.testing._internal.opinfo.
definitions.sparse). Every sample CPU accepts runs on CPU and, moved with
.to("openreg"), on openreg; a sparse result must have CPU's layout and
members (assert_close compares sparse tensors member by member), a dense one
CPU's values.

With --cuda-dtypes, the sweep covers the (op, dtype) pairs where op_db's
CUDA dtypes (as on a current GPU: torch_openreg/_op_db.py) differ from its
CPU dtypes (Note [Dtype policy] in cpp/ops/dtype_policy.h): at a dtype only CUDA
supports, every sample runs on openreg and equals CPU computing in the
nearest wider dtype it supports, cast back; at a dtype only CPU supports,
every sample CPU accepts raises CUDA's NotImplementedError ("... not
implemented for '<Dtype>'") on openreg and leaves the arguments unchanged
(unless op_db's samples there are those of a dtype CUDA declares:
declared_as).
Elsewhere a sweep covers the dtypes both support.

The parent never touches the openreg device (a fork of an initialized process
is refused, as with CUDA); children do. Prints one line per failing op (and per
op that raises openreg's documented "not supported on openreg" error, for
sparse layouts) and a closing 'N passed, N failed, N unsupported' line;
exits 1 if any op failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "1")

import torch  # noqa: E402
import torch._prims_common  # noqa: E402
import torch_openreg  # noqa: E402,F401
from torch_openreg._op_db import c10_name, cpu_dtypes, cuda_dtypes, load_op_db, sparse_layout_samples  # noqa: E402

op_db = load_op_db()

from parity_harness import Tally, Unsupported, in_fork  # noqa: E402
from attention_reference import HOST_RESULTS, REFERENCE_TOLERANCES, REFERENCES as CUDA_ONLY_REFERENCES  # noqa: E402

DEV = "openreg"
DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
# Ops whose values are random (openreg draws from its own generator) or
# uninitialized: their results are compared by dtype and shape only.
VALUE_AGNOSTIC_OPS = (
    "bernoulli", "normal", "rand", "randn", "randint", "multinomial", "poisson", "uniform", "exponential",
    "geometric", "log_normal", "cauchy", "random", "dropout", "rrelu", "randperm", "fractional_max_pool",
    "pca_lowrank", "svd_lowrank", "empty", "new_empty",
)
SAMPLES_PER_OP = 8
OP_TIMEOUT_S = 60


def values_compared(name: str, kwargs: dict) -> bool:
    """Whether a sample's values are deterministic (attention with dropout,
    or in training mode, is not)."""
    dropout = kwargs.get("dropout_p", 0.0) or ("attention" in name and kwargs.get("training", False))
    return not any(r in name for r in VALUE_AGNOSTIC_OPS) and not dropout


def to_device(value, placement=None):
    """A sample's tensors, and its `device=` arguments, on openreg.

    `placement` is the same sample generated for the meta device: a tensor
    the sample generator kept on the host there (a CPU index tensor, as
    tensor_split's) stays on the host here, as in PyTorch's own device
    tests. A view keeps its storage: the whole storage moves and the view is
    rebuilt with the same geometry, so ops that read outside the view
    (as_strided on a partial view) see the same elements as on CPU."""
    if isinstance(value, torch.Tensor):
        if placement is not None and isinstance(placement, torch.Tensor) and placement.device.type == "cpu":
            return value
        return tensor_to_device(value)
    if isinstance(value, (list, tuple)):
        places = placement if isinstance(placement, (list, tuple)) and len(placement) == len(value) else [None] * len(value)
        return type(value)(to_device(v, p) for v, p in zip(value, places))
    if isinstance(value, dict):
        places = placement if isinstance(placement, dict) else {}
        return {k: (DEV if k == "device" else to_device(v, places.get(k))) for k, v in value.items()}
    if isinstance(value, torch.device) and value.type == "cpu" or value == "cpu":
        return DEV
    return value


def tensor_to_device(t: torch.Tensor) -> torch.Tensor:
    is_view = t.layout == torch.strided and (t.storage_offset() != 0 or not t.is_contiguous())
    if not is_view or t.is_conj() or t.is_neg() or t.dtype in (torch.complex32,):
        return t.detach().to(DEV).requires_grad_(t.requires_grad)
    whole = t.detach().as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)
    moved = whole.to(DEV).as_strided(t.shape, t.stride(), t.storage_offset())
    return moved.requires_grad_(t.requires_grad)


def meta_samples(op, dtype, requires_grad: bool):
    """The op's samples generated for the meta device, or Nones where that
    generation fails (placement unknown: every tensor moves)."""
    try:
        yield from op.sample_inputs("meta", dtype, requires_grad=requires_grad)
    except Exception:
        pass
    while True:
        yield None


def to_host(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(to_host(v) for v in value)
    return value


def comparable(got, want):
    """assert_close knows no complex bfloat16 (torch 2.15's bcomplex32, stft's
    result at bfloat16 on CUDA): such results are compared by their real and
    imaginary parts, at bfloat16's tolerances."""
    if want.dtype != torch.bcomplex32:
        return got, want
    return tuple(torch.view_as_real(t.to(torch.complex64)).to(torch.bfloat16) for t in (got, want))


def compare(got, want, exact_values: bool, tolerance=None):
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"got {type(got).__name__}, want a tensor"
        assert got.device.type == DEV, f"result on {got.device}"
        got = got.detach().cpu()
        assert got.dtype == want.dtype, f"dtype {got.dtype}, want {want.dtype}"
        assert got.shape == want.shape, f"shape {tuple(got.shape)}, want {tuple(want.shape)}"
        if exact_values:
            torch.testing.assert_close(*comparable(got, want.detach()), equal_nan=True, **(tolerance or {}))
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), "result structure differs"
        for g, w in zip(got, want):
            compare(g, w, exact_values, tolerance)
    elif isinstance(want, (int, float, complex, bool)) and exact_values:
        torch.testing.assert_close(got, want, equal_nan=True)


def moved_sample(sample, placement):
    if placement is None:
        return to_device(sample.input), to_device(sample.args), to_device(sample.kwargs)
    return (
        to_device(sample.input, placement.input),
        to_device(sample.args, placement.args),
        to_device(sample.kwargs, placement.kwargs),
    )


def call_on_device(op, *args, **kwargs):
    try:
        return op(*args, **kwargs)
    except NotImplementedError as e:
        if "not supported on openreg" in str(e):
            raise Unsupported(str(e).splitlines()[0]) from None
        raise


def run_op(op, dtype, busy: bool) -> None:
    """Raises on the first sample where openreg differs from CPU."""
    samples = op.sample_inputs("cpu", dtype, requires_grad=False)
    for i, (sample, placement) in enumerate(zip(samples, meta_samples(op, dtype, False))):
        if i >= SAMPLES_PER_OP:
            break
        try:
            want = op(sample.input, *sample.args, **sample.kwargs)
        except Exception:
            continue  # CPU itself rejects the sample
        dev_input, dev_args, dev_kwargs = moved_sample(sample, placement)
        if busy:
            torch.openreg._sleep(1)
        got = call_on_device(op, dev_input, *dev_args, **dev_kwargs)
        try:
            compare(got, want, values_compared(op.name, sample.kwargs))
        except AssertionError as e:
            raise AssertionError(f"sample {i}: {str(e).splitlines()[0]}") from None


def differentiable_outputs(value):
    return [t for t in flatten(value) if isinstance(t, torch.Tensor) and t.requires_grad]


def flatten(value):
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in flatten(v)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in flatten(v)]
    return [value]


def gradients(op, sample_input, args, kwargs, process, grad_seed: int):
    """The gradients of the sample's inputs that require grad, for output
    gradients drawn on the CPU from `grad_seed`; None where unused."""
    out = process(op(sample_input, *args, **kwargs))
    outs = differentiable_outputs(out)
    leaves = [t for t in flatten([sample_input, args, kwargs]) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not outs or not leaves:
        return None
    generator = torch.Generator().manual_seed(grad_seed)
    grad_outputs = [torch.randn(o.shape, dtype=o.dtype, generator=generator).to(o.device) for o in outs]
    return torch.autograd.grad(outs, leaves, grad_outputs, allow_unused=True)


def run_backward(op, dtype) -> None:
    """The first differentiable sample's input gradients equal CPU's."""
    differentiable = dtype.is_floating_point or dtype.is_complex
    if not differentiable or not op.supports_autograd or not values_compared(op.name, {}):
        return
    samples = op.sample_inputs("cpu", dtype, requires_grad=True)
    for i, (sample, placement) in enumerate(zip(samples, meta_samples(op, dtype, True))):
        if i >= SAMPLES_PER_OP:
            return
        process = sample.output_process_fn_grad
        try:
            want = gradients(op, sample.input, sample.args, sample.kwargs, process, grad_seed=i)
        except Exception:
            continue  # CPU rejects the sample or its backward
        if want is None or not values_compared(op.name, sample.kwargs):
            continue
        dev_input, dev_args, dev_kwargs = moved_sample(sample, placement)
        got = gradients(
            lambda *a, **k: call_on_device(op, *a, **k), dev_input, dev_args, dev_kwargs, process, grad_seed=i
        )
        try:
            assert got is not None, "no differentiable output on openreg"
            for g, w in zip(got, want):
                assert (g is None) == (w is None), "a gradient is missing on one side"
                if w is not None:
                    compare(g, w, exact_values=True)
        except AssertionError as e:
            raise AssertionError(f"backward sample {i}: {str(e).splitlines()[0]}") from None
        return


# The dtypes CPU computes a dtype it lacks in, nearest first: the reference
# of a dtype only CUDA supports (chosen here independently of the table).
WIDER = {
    torch.bool: (torch.uint8, torch.int64),
    **{t: (torch.int64, torch.float64) for t in (torch.uint8, torch.int8, torch.int16, torch.int32)},
    torch.int64: (torch.float64,),
    **{t: (torch.float32, torch.float64) for t in (torch.float16, torch.bfloat16, torch.float8_e5m2,
                                                   torch.float8_e4m3fn, torch.float8_e5m2fnuz, torch.float8_e4m3fnuz)},
    torch.float32: (torch.float64,),
    torch.complex32: (torch.complex64, torch.complex128),
    torch.complex64: (torch.complex128,),
}


def narrowed(computed, narrow, wide):
    """A result's dtype when `wide` stood in for `narrow`: wide and its
    complex or real kin become narrow's."""
    if computed == wide:
        return narrow
    if wide.is_complex and narrow.is_complex and computed == wide.to_real():
        return narrow.to_real()
    if wide.is_floating_point and narrow.is_floating_point and computed == wide.to_complex():
        return narrow.to_complex()
    return computed


def map_tensors(value, fn):
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    return value


def promoted_on_cuda(op, dtype) -> bool:
    """Whether CUDA computes the op at `dtype` in a wider dtype and returns
    the wider results: torch.fft's transforms promote bfloat16 to float32
    on CUDA (promote_type_fft in aten/src/ATen/native/SpectralOps.cpp;
    torch/_refs/fft.py says why), returning float32 / complex64."""
    return dtype == torch.bfloat16 and op.name.startswith("fft.")


def nan_zeroed(x):
    return torch.where(x.isnan(), 0, x)


# CUDA's kernel, as a formula of ops CPU has, for an op whose CPU kernel
# refuses every dtype of a kind: CPU's nansum refuses complex inputs (by
# device); CUDA's leaves out an element either part of which is NaN (Note
# [Complex nansum] in cpp/ops/nansum.cpp), and nanmean divides that
# sum by the count of the others.
COMPLEX_FORMULAS = {
    "nansum": lambda x, dim=None, keepdim=False, dtype=None: nan_zeroed(x).sum(dim, keepdim, dtype=dtype),
    "nanmean": lambda x, dim=None, keepdim=False, dtype=None: (
        nan_zeroed(x).sum(dim, keepdim, dtype=dtype) / (~x.isnan()).sum(dim, keepdim)),
}


def cpu_reference(op, sample, dtype):
    """The op on CPU at `dtype`, else in the nearest wider dtype CPU runs,
    its results cast back (unless promoted_on_cuda); raises when CPU runs
    neither."""
    host = map_tensors((sample.input, sample.args, sample.kwargs), lambda t: t.detach().cpu())
    if op.name in CUDA_ONLY_REFERENCES:  # no CPU kernel at any dtype: CUDA's kernel as a formula
        inp, args, kwargs = host
        return CUDA_ONLY_REFERENCES[op.name](inp, *args, **kwargs)
    failure = None
    for wide in (dtype, *WIDER.get(dtype, ())):
        def widen(t):
            return t.to(wide) if t.dtype == dtype else t
        present = set()
        map_tensors(host, lambda t: present.add(t.dtype))
        inp, args, kwargs = map_tensors(host, widen)
        kwargs = {k: (wide if isinstance(v, torch.dtype) and v == dtype else v) for k, v in kwargs.items()}
        compute = COMPLEX_FORMULAS.get(op.name, op) if dtype.is_complex else op
        try:
            out = compute(inp, *args, **kwargs)
        except Exception as e:
            failure = failure or e
            continue
        if promoted_on_cuda(op, dtype):
            return out
        return map_tensors(out, lambda t: t if t.dtype in present else t.to(narrowed(t.dtype, dtype, wide)))
    raise failure


# A sample CUDA's kernel refuses by a rule beyond the dtype, which openreg
# mirrors: cuFFT transforms in half precision (and bfloat16) only signals
# whose sizes are powers of two (Note [Half-precision FFTs]).
CUFFT_SIZES = "cuFFT only supports dimensions whose sizes are powers of two"


def refused_as_cuda(error: Exception) -> bool:
    """Whether `error` is cuFFT's refusal of a signal size it names that is
    not a power of two."""
    message = str(error)
    if CUFFT_SIZES not in message:
        return False
    sizes = [int(n) for n in message.rsplit("[", 1)[-1].rstrip("]").split(",") if n.strip()]
    return any(size & (size - 1) for size in sizes)


def check_cuda_only(op, dtype, busy: bool) -> str:
    """Every sample at a dtype only CUDA supports equals CPU's reference, or
    is refused as CUDA's kernel refuses it (refused_as_cuda); one must be
    computed."""
    compared = refused = 0
    for i, sample in enumerate(op.sample_inputs(DEV, dtype, requires_grad=False)):
        want = cpu_reference(op, sample, dtype)
        if busy:
            torch.openreg._sleep(1)
        try:
            got = call_on_device(op, sample.input, *sample.args, **sample.kwargs)
        except RuntimeError as e:
            if not refused_as_cuda(e):
                raise
            refused += 1
            continue
        for r in HOST_RESULTS.get(op.name, ()):  # results CUDA keeps on the host
            assert got[r].device.type == "cpu", f"result {r} on {got[r].device}, want the host"
            got = (*got[:r], got[r].to(DEV), *got[r + 1:])
        try:
            compare(got, want, values_compared(op.name, sample.kwargs), REFERENCE_TOLERANCES.get((op.name, dtype)))
        except AssertionError as e:
            raise AssertionError(f"sample {i}: {str(e).splitlines()[0]}") from None
        compared += 1
    torch.openreg.synchronize()
    assert compared, f"every sample refused ({refused})"
    return f"{compared} samples" + (f", {refused} refused as cuFFT refuses them" if refused else "")


def sample_dtypes(op, dtype) -> list:
    """The dtypes in each of op_db's samples of `op` at `dtype`: its tensors'
    and its dtype arguments', in order."""
    return [
        tuple(v.dtype if isinstance(v, torch.Tensor) else v for v in flatten([sample.input, sample.args, sample.kwargs])
              if isinstance(v, (torch.Tensor, torch.dtype)))
        for sample in op.sample_inputs("cpu", dtype, requires_grad=False)
    ]


def declared_as(op, dtype):
    """A dtype CUDA declares whose samples have exactly the dtypes of those at
    `dtype`, or None: op_db's samples of the op are then not parametrized on
    dtype, and CUDA, which computes its declared dtype's samples, computes
    these too, so op_db mis-declares the pair. The one case in op_db: the
    float8 matmuls, whose samples are float8_e4m3fn (and, for _scaled_mm,
    float8_e5m2) matrices whatever the dtype ("this dtype only names the
    generated test id", op_db says; PyTorch skips their test_dtypes, "Sample
    inputs isn't really parametrized on dtype"); CUDA declares
    float8_e4m3fn, and refuses only two float8_e5m2 matrices
    (aten/src/ATen/native/cuda/ScaledBlas.cpp, Note [Float8 matmul dtypes]),
    which no sample has."""
    at_dtype = sample_dtypes(op, dtype)
    return next((d for d in sorted(cuda_dtypes(op), key=str) if sample_dtypes(op, d) == at_dtype), None)


def check_cpu_only(op, dtype, busy: bool) -> str:
    """At a dtype CUDA refuses, the samples CPU accepts are refused with
    CUDA's error, their arguments unchanged, where they reach a kernel CUDA
    lacks; the others (a scalar `inner` is a `mul`) equal CPU, as on CUDA.
    PyTorch calls a dtype unsupported when any sample fails: one must be
    refused, unless the samples are those of a dtype CUDA declares
    (declared_as), which CUDA computes, as openreg must then, equal to CPU
    (a refusal of them would fail at the declared dtype's own sweep)."""
    expected = f"not implemented for '{c10_name(dtype)}'"
    refused = accepted = 0
    samples = op.sample_inputs("cpu", dtype, requires_grad=False)
    for i, (sample, placement) in enumerate(zip(samples, meta_samples(op, dtype, False))):
        try:
            want = op(sample.input, *sample.args, **sample.kwargs)
        except Exception:
            continue  # CPU itself rejects the sample
        moved = moved_sample(sample, placement)
        before = map_tensors(moved, lambda t: t.detach().cpu().clone())
        if busy:
            torch.openreg._sleep(1)
        try:
            got = op(moved[0], *moved[1], **moved[2])
        except NotImplementedError as e:
            if expected not in str(e):
                raise AssertionError(f"sample {i}: refused with {str(e).splitlines()[0]!r}") from None
            torch.openreg.synchronize()
            assert_unchanged(before, map_tensors(moved, lambda t: t.detach().cpu()), i)
            refused += 1
            continue
        try:
            compare(got, want, values_compared(op.name, sample.kwargs))
        except AssertionError as e:
            raise AssertionError(f"sample {i} (accepted): {str(e).splitlines()[0]}") from None
        accepted += 1
    if refused:
        return f"{refused} samples refused, {accepted} accepted"
    declared = declared_as(op, dtype)
    assert declared and accepted, f"no sample refused (CUDA refuses {dtype}); {accepted} accepted"
    return f"op_db's samples are {declared}'s, which CUDA declares: {accepted} accepted, equal to CPU"


def assert_unchanged(before, after, i):
    for b, a in zip(flatten(list(before)), flatten(list(after))):
        if isinstance(b, torch.Tensor):
            same = torch.equal(b.reshape(-1).view(torch.uint8), a.reshape(-1).view(torch.uint8))
            assert same, f"sample {i}: a refused call changed an argument"


def check_op(op, dtype, busy: bool, backward: bool) -> None:
    """The op's samples (and with `backward`, its backward sample) equal CPU's."""
    run_op(op, dtype, busy)
    if backward:
        run_backward(op, dtype)
    torch.openreg.synchronize()


# ------------------------------------------------------------- memory formats

# The memory format a 4-D (5-D) tensor is given with --memory-formats.
CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}
MEMORY_FORMATS = ("as-is", "channels-last")


# Ops whose CPU kernel's values are undefined for some channels-last sample:
# there only strides are compared.
CHANNELS_LAST_VALUES_UNDEFINED = {
    # Its first sample (causal, 3 queries against 6 keys) with channels_last
    # query, key and value gives values that differ from call to call on the
    # CPU (by up to 1e34: memory read before it is written), where its
    # contiguous form is deterministic.
    "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu",
}


def has_image_tensor(sample) -> bool:
    """Whether a sample has a 4-D or 5-D strided tensor."""
    return any(isinstance(t, torch.Tensor) and t.layout == torch.strided and t.dim() in CHANNELS_LAST
               for t in flatten([sample.input, sample.args, sample.kwargs]))


def in_memory_format(sample, memory_format: str):
    """The sample's (input, args, kwargs), with every 4-D (5-D) strided
    tensor made channels_last (channels_last_3d) for "channels-last": new
    leaves with the same requires_grad."""
    def convert(t):
        if memory_format == "as-is" or t.layout != torch.strided or t.dim() not in CHANNELS_LAST:
            return t
        return t.detach().to(memory_format=CHANNELS_LAST[t.dim()]).requires_grad_(t.requires_grad)
    return map_tensors((sample.input, sample.args, sample.kwargs), convert)


def layout_strides(t: torch.Tensor) -> tuple:
    """The strides that define a tensor's layout: those of its dimensions of
    more than one element (any stride describes a dimension of one)."""
    return tuple((d, stride) for d, (size, stride) in enumerate(zip(t.shape, t.stride())) if size > 1)


def compare_strides(got, want, what: str) -> None:
    """Each tensor of `got` has the layout_strides of `want`'s, where
    `want`'s is a dense (non-overlapping and dense) strided tensor of more
    than one element: there its strides are what the kernel chose. (The
    contiguity of every memory format follows from these strides: dims of
    one element are ignored by is_contiguous too.)"""
    if isinstance(want, torch.Tensor):
        if (want.layout == torch.strided and want.numel() > 1
                and torch._prims_common.is_non_overlapping_and_dense_or_false(want)):
            assert isinstance(got, torch.Tensor) and layout_strides(got) == layout_strides(want), (
                f"{what} strides {tuple(got.stride())}, want {tuple(want.stride())} (shape {tuple(want.shape)})")
    elif isinstance(want, (list, tuple)):
        for i, (g, w) in enumerate(zip(got, want)):
            compare_strides(g, w, f"{what}[{i}]")


def run_with_gradients(op, inp, args, kwargs, process, grad_seed: int, move=None):
    """The op's result, its leaves that require grad and their gradients
    (None where nothing is differentiable), for output gradients drawn on
    the CPU from `grad_seed`, each with its output's strides (as autograd's
    own ones_like); `move` takes them to the op's device."""
    out = op(inp, *args, **kwargs)
    outs = differentiable_outputs(process(out))
    leaves = [t for t in flatten([inp, args, kwargs]) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not outs or not leaves:
        return out, None, None
    generator = torch.Generator().manual_seed(grad_seed)
    grad_outputs = [torch.empty_like(o, device="cpu").copy_(torch.randn(o.shape, dtype=o.dtype, generator=generator))
                    for o in outs]
    if move is not None:
        grad_outputs = move(grad_outputs)
    return out, leaves, torch.autograd.grad(outs, leaves, grad_outputs, allow_unused=True)


def check_memory_formats(op, dtype, busy: bool) -> str:
    """Each of the op's samples that has a 4-D/5-D tensor, as it is and with
    those tensors channels_last (channels_last_3d): the results, and the
    input gradients (output gradients with the strides of the outputs), have
    CPU's strides (compare_strides) and values; so do the results of the
    same call made again (from a plan, where the first call checked one)."""
    differentiable = op.supports_autograd and (dtype.is_floating_point or dtype.is_complex)
    compared = 0
    samples = op.sample_inputs("cpu", dtype, requires_grad=differentiable)
    for i, (sample, placement) in enumerate(zip(samples, meta_samples(op, dtype, differentiable))):
        if i >= SAMPLES_PER_OP:
            break
        if not has_image_tensor(sample):
            continue
        process = sample.output_process_fn_grad
        for memory_format in MEMORY_FORMATS:
            exact = values_compared(op.name, sample.kwargs) and not (
                memory_format == "channels-last" and op.name in CHANNELS_LAST_VALUES_UNDEFINED)
            inp, args, kwargs = in_memory_format(sample, memory_format)
            try:
                want, _, want_grads = run_with_gradients(op, inp, args, kwargs, process, grad_seed=i)
            except Exception:
                continue  # CPU itself rejects the sample (or its backward)
            dev_input, dev_args, dev_kwargs = (
                to_device(inp, placement and placement.input), to_device(args, placement and placement.args),
                to_device(kwargs, placement and placement.kwargs))
            if busy:
                torch.openreg._sleep(1)
            where = f"sample {i} {memory_format}"
            got, _, got_grads = run_with_gradients(
                lambda *a, **k: call_on_device(op, *a, **k), dev_input, dev_args, dev_kwargs, process,
                grad_seed=i, move=to_device)
            with torch.no_grad():  # the same call again takes the plan the first one checked (Note [Meta results])
                again = call_on_device(op, dev_input, *dev_args, **dev_kwargs)
            try:
                compare_strides(got, want, "result")
                compare_strides(again, want, "result (again)")
                compare(got, want, exact)
                assert (got_grads is None) == (want_grads is None), "gradients on one side only"
                for g, w in zip(got_grads or (), want_grads or ()):
                    assert (g is None) == (w is None), "a gradient is missing on one side"
                    if w is not None:
                        compare_strides(g, w, "gradient")
                        compare(g, w, exact)
            except AssertionError as e:
                raise AssertionError(f"{where}: {str(e).splitlines()[0]}") from None
            compared += 1
    torch.openreg.synchronize()
    return f"{compared} samples" if compared else "no 4-D/5-D sample"


def has_image_samples(op, dtype) -> bool:
    """Whether one of the op's first SAMPLES_PER_OP samples has a 4-D/5-D
    tensor (or they cannot be drawn: the op's own check reports it)."""
    try:
        samples = op.sample_inputs("cpu", dtype, requires_grad=False)
        return any(has_image_tensor(sample) for _, sample in zip(range(SAMPLES_PER_OP), samples))
    except Exception:
        return True


def sweep_memory_formats(wanted, busy: bool, tally: Tally) -> int:
    """--memory-formats: at float32, each op with 4-D/5-D samples in a fork.
    One child picks those ops (a fork per op of op_db would cost more than
    the checks; the parent itself must run no kernel before forking, as
    GNU OpenMP's threads do not survive a fork) and returns them as a bit
    mask in hex."""
    start = time.monotonic()
    dtype = torch.float32
    ops = [
        op for op in op_db
        if (wanted is None or op.name in wanted) and op.supports_dtype(dtype, "cpu") and dtype in cuda_dtypes(op)
    ]
    picked = in_fork(lambda: format(sum(1 << i for i, op in enumerate(ops) if has_image_samples(op, dtype)), "x"),
                     OP_TIMEOUT_S)
    assert picked.status == "ok", picked.detail
    image_ops = [op for i, op in enumerate(ops) if int(picked.detail, 16) >> i & 1]
    samples = 0
    for op in image_ops:
        outcome = in_fork(lambda: check_memory_formats(op, dtype, busy), OP_TIMEOUT_S)
        tally.record(f"float32    {op.name}.{op.variant_test_name}", outcome)
        if outcome.status == "ok" and outcome.detail.endswith(" samples"):
            samples += int(outcome.detail.split()[0])
    print(f"-- memory formats: {len(image_ops)} of {len(ops)} ops have 4-D/5-D samples; {samples} (sample, format) "
          f"pairs compared ({time.monotonic() - start:.0f} s)")
    print(tally.summary())
    return 1 if tally.failed else 0


# ------------------------------------------------------------- sparse layouts

SPARSE_LAYOUTS = {
    "sparse_coo": torch.sparse_coo,
    "sparse_csr": torch.sparse_csr,
    "sparse_csc": torch.sparse_csc,
    "sparse_bsr": torch.sparse_bsr,
    "sparse_bsc": torch.sparse_bsc,
}


def sparse_members(t: torch.Tensor) -> list:
    if t.layout == torch.sparse_coo:
        return [t._indices(), t._values()]
    compressed, plain = {
        torch.sparse_csr: (t.crow_indices, t.col_indices),
        torch.sparse_csc: (t.ccol_indices, t.row_indices),
        torch.sparse_bsr: (t.crow_indices, t.col_indices),
        torch.sparse_bsc: (t.ccol_indices, t.row_indices),
    }[t.layout]
    return [compressed(), plain(), t.values()]


def compare_sparse_aware(got, want, exact_values: bool):
    """compare(), for results of any layout: a sparse result has CPU's
    layout, shape, dtype, members on openreg, COO coalesced flag, and
    (assert_close, which compares sparse tensors member by member: indices
    exactly, values as assert_close defaults) CPU's members; without
    `exact_values`, CPU's indices and the values' shape."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"got {type(got).__name__}, want a tensor"
        assert got.device.type == DEV, f"result on {got.device}"
        assert got.layout == want.layout, f"layout {got.layout}, want {want.layout}"
        if want.layout == torch.strided:
            compare(got, want, exact_values)
            return
        members = sparse_members(got)
        assert all(m.device.type == DEV for m in members), f"members on {[str(m.device) for m in members]}"
        got = got.detach().cpu()
        want = want.detach()
        assert got.dtype == want.dtype, f"dtype {got.dtype}, want {want.dtype}"
        assert got.shape == want.shape, f"shape {tuple(got.shape)}, want {tuple(want.shape)}"
        assert got.dense_dim() == want.dense_dim(), f"dense_dim {got.dense_dim()}, want {want.dense_dim()}"
        if want.layout == torch.sparse_coo:
            assert got.is_coalesced() == want.is_coalesced(), (
                f"is_coalesced() {got.is_coalesced()}, want {want.is_coalesced()}")
        if exact_values:
            torch.testing.assert_close(got, want, equal_nan=True)
        else:
            for g, w in zip(sparse_members(got)[:-1], sparse_members(want)[:-1]):
                torch.testing.assert_close(g, w)
            assert sparse_members(got)[-1].shape == sparse_members(want)[-1].shape, "values' shape differs"
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), "result structure differs"
        for g, w in zip(got, want):
            compare_sparse_aware(g, w, exact_values)
    elif isinstance(want, (int, float, complex, bool)) and exact_values:
        torch.testing.assert_close(got, want, equal_nan=True)


def check_sparse(op, layout, dtype, busy: bool) -> str:
    """Every sparse sample CPU accepts equals CPU on openreg. Returns how
    many samples were compared."""
    compared = 0
    for kind, i, sample in sparse_layout_samples(op, layout, dtype):
        try:
            want = op(sample.input, *sample.args, **sample.kwargs)
        except Exception:
            continue  # CPU itself rejects the sample
        dev_input, dev_args, dev_kwargs = to_device(sample.input), to_device(sample.args), to_device(sample.kwargs)
        if busy:
            torch.openreg._sleep(1)
        try:
            got = op(dev_input, *dev_args, **dev_kwargs)
        except Exception as e:
            raise type(e)(f"{kind} sample {i}: {first_line_of(e)}") from None
        try:
            compare_sparse_aware(got, want, values_compared(op.name, sample.kwargs))
        except AssertionError as e:
            raise AssertionError(f"{kind} sample {i}: {first_line_of(e)}") from None
        compared += 1
    torch.openreg.synchronize()
    return f"{compared} samples"


def first_line_of(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def sweep_sparse(wanted, dtype_names, layout_names, busy: bool, tally: Tally) -> int:
    """--sparse: each (op, layout, dtype) op_db declares, in a fork, counted
    per layout."""
    import warnings

    # PyTorch's notices on every sparse tensor made: noise in the report.
    warnings.filterwarnings("ignore", message="Sparse (CSR|CSC|BSR|BSC) tensor support is in beta state")
    warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
    start = time.monotonic()
    counts = {}
    for layout_name in layout_names:
        layout = SPARSE_LAYOUTS[layout_name]
        for name in dtype_names:
            dtype = DTYPES[name]
            ops = [
                op for op in op_db
                if (wanted is None or op.name in wanted)
                and op.supports_sparse_layout(layout)
                and op.supports_dtype(dtype, "cpu")
            ]
            failed_before = tally.failed + tally.unsupported
            for op in ops:
                outcome = in_fork(lambda: check_sparse(op, layout, dtype, busy), OP_TIMEOUT_S)
                tally.record(f"{name:10} {layout_name}:{op.name}.{op.variant_test_name}", outcome)
            failed = tally.failed + tally.unsupported - failed_before
            counts[(layout_name, name)] = (len(ops) - failed, failed)
            print(f"-- {layout_name} {name}: {len(ops) - failed} passed, {failed} failed")
            sys.stdout.flush()
    for layout_name in layout_names:
        passed = sum(p for (l, _), (p, _) in counts.items() if l == layout_name)
        failed = sum(f for (l, _), (_, f) in counts.items() if l == layout_name)
        print(f"-- {layout_name}: {passed} passed, {failed} failed")
    print(f"-- {time.monotonic() - start:.0f} s")
    print(tally.summary())
    return 1 if tally.failed or tally.unsupported else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", default="float32", help="comma-separated, or 'all'")
    parser.add_argument("--ops", default="", help="comma-separated op names (default: all)")
    parser.add_argument("--busy", action="store_true", help="run each openreg sample behind a queued kernel")
    parser.add_argument("--backward", action="store_true", help="also compare one backward sample per op")
    parser.add_argument(
        "--rotate", action="store_true",
        help="a representative subset: the k-th of n dtypes runs every n-th op of op_db from the k-th",
    )
    parser.add_argument(
        "--cuda-dtypes", action="store_true",
        help="the pairs where CUDA's dtypes differ from CPU's (instead of --dtypes)",
    )
    parser.add_argument(
        "--sparse", action="store_true",
        help="the ops op_db declares for sparse layouts, on their sparse samples (instead of dense ones)",
    )
    parser.add_argument("--layouts", default=",".join(SPARSE_LAYOUTS), help="with --sparse: comma-separated")
    parser.add_argument(
        "--memory-formats", action="store_true",
        help="float32 samples with 4-D/5-D tensors, as they are and channels-last: CPU's strides, forward and backward",
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    wanted = set(args.ops.split(",")) if args.ops else None
    tally = Tally(args.verbose)
    if args.cuda_dtypes:
        return sweep_cuda_dtypes(wanted, args.busy, tally)
    if args.memory_formats:
        return sweep_memory_formats(wanted, args.busy, tally)
    dtypes = list(DTYPES) if args.dtypes == "all" else args.dtypes.split(",")
    if args.sparse:
        return sweep_sparse(wanted, dtypes, args.layouts.split(","), args.busy, tally)
    for k, name in enumerate(dtypes):
        dtype = DTYPES[name]
        ops = [
            op for index, op in enumerate(op_db)
            if (wanted is None or op.name in wanted)
            and (not args.rotate or index % len(dtypes) == k)
            and op.supports_dtype(dtype, "cpu")
            and dtype in cuda_dtypes(op)  # a dtype CUDA refuses: --cuda-dtypes
        ]
        start = time.monotonic()
        failed_before = tally.failed
        for op in ops:
            outcome = in_fork(lambda: check_op(op, dtype, args.busy, args.backward), OP_TIMEOUT_S)
            tally.record(f"{name:10} {op.name}.{op.variant_test_name}", outcome)
        dtype_failed = tally.failed - failed_before
        print(f"-- {name}: {len(ops) - dtype_failed} of {len(ops)} ops clean ({time.monotonic() - start:.0f} s)")
        sys.stdout.flush()
    print(tally.summary())
    return 1 if tally.failed else 0


def sweep_cuda_dtypes(wanted, busy: bool, tally: Tally) -> int:
    """--cuda-dtypes: each differing pair in a fork, counted by kind."""
    start = time.monotonic()
    for kind, check in (("cuda-only", check_cuda_only), ("cpu-only", check_cpu_only)):
        failed_before, pairs = tally.failed, 0
        for op in op_db:
            if wanted is not None and op.name not in wanted:
                continue
            cuda, cpu = cuda_dtypes(op), cpu_dtypes(op)
            for dtype in sorted(cuda - cpu if kind == "cuda-only" else cpu - cuda, key=str):
                outcome = in_fork(lambda: check(op, dtype, busy), OP_TIMEOUT_S)
                tally.record(f"{c10_name(dtype):10} {kind}:{op.name}.{op.variant_test_name}", outcome)
                pairs += 1
        print(f"-- {kind}: {pairs - (tally.failed - failed_before)} of {pairs} pairs clean")
    print(f"-- {time.monotonic() - start:.0f} s")
    print(tally.summary())
    return 1 if tally.failed else 0


if __name__ == "__main__":
    sys.exit(main())
