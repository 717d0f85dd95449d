"""Errors raised where CUDA raises them (Note [Errors at the call] in
cpp/ops/fallback.cpp).

A check that depends on metadata (shapes, dtypes, devices, memory overlap) or
on argument values raises at the call, before anything is queued, with the
error type and message CPU and CUDA give, whether the stream is idle or busy,
and leaves nothing parked on the stream. PyTorch's OpInfos carry such inputs
(``error_inputs``); every one of them runs here, as PyTorch's own
TestCommon.test_errors runs them, idle and behind queued work.

Only a check of tensor contents (an index out of range, which CUDA reports
through a device-side assert) may be reported later: at the next
synchronizing call, naming the op whose kernel failed."""

import re

import pytest
import torch
import torch.nn as nn
from torch.testing._internal.common_methods_invocations import op_db

from _openreg_util import busy

pytestmark = pytest.mark.filterwarnings("ignore")

OPS = [op for op in op_db if op.error_inputs_func is not None]


def fails_on_cuda_by_design(op) -> bool:
    """op_db marks test_errors as an expected failure on every device or on
    CUDA: error inputs CUDA does not reject as written (clamp_max's), or an
    op CUDA lacks altogether (histogramdd)."""
    for info in op.decorators:
        if getattr(info, "test_name", None) != "test_errors":
            continue  # a plain decorator, or a DecorateInfo of another test
        devices = info.device_type if isinstance(info.device_type, tuple) else (info.device_type,)
        expected_failure = any(getattr(d, "__name__", "") == "expectedFailure" for d in info.decorators)
        if expected_failure and (None in devices or "cuda" in devices):
            return True
    return False


def call_error_input(op, error_input):
    """The error input's call; returns the exception it raised, or None. An
    op returning NotImplemented (a Python-number dunder) refuses, as
    test_errors counts it."""
    sample = error_input.sample_input
    try:
        out = op(sample.input, *sample.args, **sample.kwargs)
    except Exception as e:  # noqa: BLE001 - the error is what is checked
        return e
    return TypeError("returned NotImplemented") if out is NotImplemented else None


@pytest.mark.parametrize("queued", [False, True], ids=["idle", "busy"])
@pytest.mark.parametrize("op", OPS, ids=[f"{op.name}.{op.variant_test_name}".rstrip(".") for op in OPS])
def test_error_inputs_raise_at_the_call(op, queued):
    torch.manual_seed(0)
    torch.openreg.synchronize()
    stream = torch.openreg.current_stream()
    for i, error_input in enumerate(op.error_inputs("openreg")):
        if queued:
            busy(stream, 20)
        raised = call_error_input(op, error_input)
        late = None
        try:
            torch.openreg.synchronize()
        except Exception as e:  # noqa: BLE001
            late = e
        where = f"{op.name} error input {i}"
        assert late is None, f"{where}: the stream has a parked failure after the call: {late}"
        if fails_on_cuda_by_design(op):
            continue
        assert raised is not None, f"{where}: no error at the call; expected {error_input.error_type.__name__}"
        assert isinstance(raised, error_input.error_type) and re.search(error_input.error_regex, str(raised)), (
            f"{where}: expected {error_input.error_type.__name__} matching {error_input.error_regex!r}, "
            f"got {type(raised).__name__}: {raised}"
        )


def test_every_op_with_error_inputs_is_walked():
    """op_db's error inputs as this wheel has them (226 ops in torch 2.15):
    the parametrization above is all of them."""
    assert len(OPS) >= 200


# ------------------------------------------------------- overlap of written memory


OVERLAPS = {
    # TensorIterator's checks (in-place and out= of pointwise ops).
    "in-place partial overlap": (lambda x: x[1:].add_(x[:-1]), "some elements of the input tensor and the written-to"),
    "in-place into an expanded tensor": (lambda x: x[:1].expand(4).mul_(2), "more than one element of the written-to"),
    "out= partial overlap": (lambda x: torch.sin(x[:-1], out=x[1:]), "some elements of the input tensor and the written-to"),
    # The non-TensorIterator kernels' own checks.
    "index_select out= is the input": (
        lambda x: torch.index_select(x, 0, torch.tensor([0, 1], device=x.device), out=x[:2]),
        "some elements of the input tensor and the written-to",
    ),
    "cat out= is an input": (lambda x: torch.cat([x[:2], x[2:]], out=x), "some elements of the input tensor and the written-to"),
    "take into an expanded out=": (
        lambda x: torch.take(x, torch.tensor([0, 1], device=x.device), out=torch.empty(1, device=x.device).expand(2)),
        "more than one element of the written-to",
    ),
}


@pytest.mark.parametrize("queued", [False, True], ids=["idle", "busy"])
@pytest.mark.parametrize("case", OVERLAPS, ids=list(OVERLAPS))
def test_overlapping_writes_raise_at_the_call_as_on_cpu(case, queued):
    """The CPU kernel sees the memory openreg tensors share: its views of one
    call share one CPU storage per device storage and one view per tensor."""
    fn, message = OVERLAPS[case]
    x = torch.arange(4.0, device="openreg")
    with pytest.raises(RuntimeError, match=message):
        fn(torch.arange(4.0))
    if queued:
        busy(torch.openreg.current_stream(), 20)
    with pytest.raises(RuntimeError, match=message):
        fn(x)
    torch.openreg.synchronize()
    assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_full_overlap_is_allowed_where_cpu_allows_it():
    """Pointwise kernels accept an out= that is the input itself (an
    in-place op by another name), as on CPU and CUDA."""
    x = torch.arange(4.0, device="openreg")
    busy(torch.openreg.current_stream(), 20)
    torch.add(x, x, out=x)
    x.mul_(x)
    assert x.cpu().tolist() == [0.0, 4.0, 16.0, 36.0]


# ------------------------------------------------- checks of argument values


@pytest.mark.parametrize("queued", [False, True], ids=["idle", "busy"])
def test_argument_value_checks_raise_at_the_call(queued):
    d = "openreg"
    cases = [
        (lambda: torch.empty(3, device=d).log_normal_(0, 0), "log_normal_ expects std > 0.0, but found std=0"),
        (lambda: torch.empty(3, device=d).normal_(0, -1), "normal expects std >= 0.0"),
        (lambda: torch.empty(3, device=d).exponential_(-1), "exponential_ expects lambda > 0.0"),
        (lambda: torch.empty(3, device=d).uniform_(2, 1), r"uniform_ expects to return a \[from, to\) range"),
        (lambda: torch.multinomial(torch.ones(2, 3, device=d), 2, out=torch.empty(2, 2, device=d)),
         "multinomial expects Long tensor out, got: Float"),
        (lambda: torch.multinomial(torch.ones(3, device=d), 4), "cannot sample n_sample > prob_dist.size"),
        (lambda: torch.ones(3, 4, device=d).narrow_copy(0, 0, -1), r"narrow\(\): length must be non-negative"),
        (lambda: torch.complex(torch.ones(2, device=d), torch.ones(2, device=d, dtype=torch.float64)),
         "Expected object of scalar type Float but got scalar type Double"),
        (lambda: torch.bucketize(torch.ones(2, device=d), torch.ones(2, 2, device=d)), "boundaries tensor must be 1 dimension"),
        (lambda: nn.functional.gelu(torch.ones(2, device=d), approximate="bad"), "approximate argument must be either"),
        (lambda: nn.FractionalMaxPool3d(2, output_size=2, _random_samples=torch.rand(1, 3, 3, device=d))(
            torch.randn(4, 3, 6, 6, 6, device=d)), "no less then input batch size"),
    ]
    for fn, message in cases:
        if queued:
            busy(torch.openreg.current_stream(), 20)
        with pytest.raises(RuntimeError, match=message):
            fn()
        torch.openreg.synchronize()


def test_multinomial_checks_before_reading_the_probabilities():
    """multinomial_out's metadata checks come first, as on CPU and CUDA: a
    float64 out= is refused even when the distribution is also invalid."""
    with pytest.raises(RuntimeError, match="multinomial expects Long tensor out, got: Double"):
        torch.multinomial(torch.zeros(1, 2, device="openreg"), 2, out=torch.empty(1, 2, dtype=torch.float64, device="openreg"))
    with pytest.raises(RuntimeError, match="number of categories cannot exceed 2\\^24"):
        torch.multinomial(torch.empty(1, 2**24 + 1, device="openreg"), 1)


# -------------------------------------------------- checks of tensor contents


CONTENT_CHECKS = {
    "index_select": (lambda x, i: x.index_select(0, i), "aten::index_select", "index out of range in self"),
    "scatter_add": (
        lambda x, i: torch.zeros(30, device=x.device).scatter_add(0, i, torch.ones(2, device=x.device)),
        "aten::scatter_add",
        "index 99 is out of bounds for dimension 0 with size 30",
    ),
    "index": (lambda x, i: x[i], "aten::index", "index 99 is out of bounds for dimension 0 with size 30"),
}


@pytest.mark.parametrize("case", CONTENT_CHECKS)
def test_content_checks_are_reported_at_the_next_synchronize_naming_the_op(case):
    """An index out of range is a check of contents: behind queued work, once
    the call's results are planned, it is reported by the next synchronizing
    call (as CUDA's device-side assert is), naming the op, and only once."""
    fn, op_name, message = CONTENT_CHECKS[case]
    x = torch.randn(30, 4, device="openreg")
    good = torch.tensor([1, 2], device="openreg")
    bad = torch.tensor([1, 99], device="openreg")
    stream = torch.openreg.current_stream()
    for _ in range(2):  # plans the call's results and checks the plan
        busy(stream, 20)
        fn(x, good)
        torch.openreg.synchronize()
    busy(stream, 20)
    fn(x, bad)
    with pytest.raises(RuntimeError, match=re.escape(f'kernel "{op_name}" on openreg stream') + ".*" + re.escape(message)):
        torch.openreg.synchronize()
    torch.openreg.synchronize()


def test_a_content_check_of_a_first_call_is_where_its_kernel_runs():
    """The first call of an op with new argument metadata is checked on
    stand-ins behind queued work (Note [Trial on stand-ins]): zeros pass an
    index check, so an index out of range is reported by the next
    synchronizing call, naming the op, as for a trusted plan. On an idle
    stream the kernel runs at the call, and so does its check."""
    x = torch.randn(7, 3, device="openreg")
    bad = torch.tensor([1, 2, 3, 70], device="openreg")
    with pytest.raises(IndexError, match="index out of range in self"):
        x.index_select(0, bad)
    y = torch.randn(8, 3, device="openreg")
    busy(torch.openreg.current_stream(), 20)
    y.index_select(0, bad)
    with pytest.raises(RuntimeError, match=re.escape('kernel "aten::index_select" on openreg stream') + ".*index out of range"):
        torch.openreg.synchronize()
    torch.openreg.synchronize()
