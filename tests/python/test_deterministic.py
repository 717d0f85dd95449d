"""Deterministic mode as on CUDA (Note [Deterministic alerts] in
cpp/ops/deterministic_alerts.cpp, Note [Uninitialized memory in deterministic
mode] in cpp/ops/ops.cpp): under torch.use_deterministic_algorithms(True) an
op alerts on openreg wherever CUDA's kernel calls alertNotDeterministic (a
RuntimeError, or a UserWarning under warn_only=True), at the call and naming
openreg, and nowhere else; the ops CUDA switches to a deterministic algorithm
run without alert and equal CPU; new memory is filled as CUDA fills it."""

import re
import warnings

import pytest
import torch
import torch.nn.functional as F

from _openreg_util import busy

DEV = "openreg:0"

ALERT = " does not have a deterministic implementation, but you set 'torch.use_deterministic_algorithms(True{})'"


@pytest.fixture(autouse=True)
def restore_deterministic_mode():
    """Each test leaves the global mode, warn_only and the fill flag as it
    found them."""
    mode = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    yield
    torch.use_deterministic_algorithms(mode, warn_only=warn_only)
    torch.utils.deterministic.fill_uninitialized_memory = fill


def gen():
    return torch.Generator().manual_seed(0)


def randn(*shape, device, requires_grad=False, dtype=torch.float32):
    t = torch.randn(*shape, generator=gen(), dtype=dtype).to(device)
    return t.requires_grad_(requires_grad)


def backward_of(forward, *shape, **kw):
    """A program whose alerting step is the backward of `forward` applied to
    an input of `shape`; the forward runs when the program is built (outside
    deterministic mode), as CUDA's alerting backward kernels need."""

    def program(device):
        x = randn(*shape, device=device, requires_grad=True, **kw)
        return gradient_step(forward(x), x)

    return program


def gradient_step(out, leaf):
    """The alerting step of a backward program: `out`'s backward (the graph
    kept, so the step runs again), returning `leaf`'s gradient."""
    grad = torch.ones_like(out)

    def step():
        out.backward(grad, retain_graph=True)
        g = leaf.grad.clone()
        leaf.grad = None
        return g

    return step


def call_of(fn):
    """A program whose alerting step is `fn(device)`."""
    return lambda device: (lambda: fn(device))


def max_unpool(dims):
    def fn(device):
        x = randn(1, 1, *([7] * dims), device=device)
        indices = torch.zeros_like(x, dtype=torch.long)
        module = {1: torch.nn.MaxUnpool1d, 2: torch.nn.MaxUnpool2d, 3: torch.nn.MaxUnpool3d}[dims](3, 1)
        return module(x, indices)

    return fn


def put(accumulate, inplace):
    def fn(device):
        a = torch.zeros(10, device=device)
        index = torch.tensor([0, 0, 3], device=device)
        values = torch.tensor([1.0, 2.0, 3.0], device=device)
        return a.put_(index, values, accumulate=accumulate) if inplace else a.put(index, values, accumulate=accumulate)

    return fn


def median_out(device):
    a = randn(10, device=device)
    values, indices = torch.empty((), device=device), torch.empty((), dtype=torch.long, device=device)
    torch.median(a, 0, out=(values, indices))
    return values, indices


def nll_loss_2d(reduction):
    def fn(device):
        x = randn(2, 3, 5, 5, device=device)
        target = (torch.rand(2, 5, 5, generator=gen()) * 3).floor().long().to(device)
        return F.nll_loss(x, target, reduction=reduction)

    return fn


def ctc_loss_program(device):
    logits = randn(50, 3, 15, device=device, requires_grad=True)
    targets = torch.randint(1, 15, (3, 30), generator=gen()).to(device)
    loss = F.ctc_loss(logits.log_softmax(2), targets, [50, 50, 50], [30, 25, 20])
    return gradient_step(loss, logits)


def embedding_bag_program(mode):
    def program(device):
        weight = randn(4, 3, device=device, requires_grad=True)
        indices = torch.randint(0, 3, (4, 3), generator=gen()).to(device)
        return gradient_step(F.embedding_bag(indices, weight, mode=mode), weight)

    return program


def grid_sample_program(dims):
    def program(device):
        x = randn(1, 1, *([2] * dims), device=device, requires_grad=True)
        grid = randn(1, 1, *([1] * (dims - 1)), dims, device=device) * 0.5
        return gradient_step(F.grid_sample(x, grid, align_corners=False), x)

    return program


def scatter_reduce(reduce, index_size=3):
    def fn(device):
        a = torch.arange(1.0, 6.0, device=device)
        index = torch.tensor([0, 0, 2][:index_size], device=device)
        src = torch.tensor([2.0, 3.0, 4.0][:index_size], device=device)
        return a.scatter_reduce(0, index, src, reduce)

    return fn


def scatter_with_reduce(reduce):
    def fn(device):
        a = torch.arange(1.0, 6.0, device=device)
        index = torch.tensor([0, 0, 2], device=device)
        src = torch.tensor([2.0, 3.0, 4.0], device=device)
        return a.scatter(0, index, src, reduce=reduce)

    return fn


def index_reduce(reduce):
    def fn(device):
        a = torch.arange(1.0, 6.0, device=device)
        index = torch.tensor([0, 0, 2], device=device)
        src = torch.tensor([2.0, 3.0, 4.0], device=device)
        return a.index_reduce(0, index, src, reduce)

    return fn


def interpolate(mode, dims, **kw):
    return backward_of(lambda x: F.interpolate(x, size=12, mode=mode, align_corners=False, **kw), 1, 2, *([4] * dims))


# (id, openreg's caller, program): each program alerts on CUDA in this
# wheel (libtorch_cuda.so's alertNotDeterministic calls); the caller is
# CUDA's with its device word spelled "openreg".
ALERTS = [
    ("AvgPool3d", "avg_pool3d_backward_openreg", backward_of(torch.nn.AvgPool3d(3), 2, 3, 3, 3)),
    ("AdaptiveAvgPool2d", "adaptive_avg_pool2d_backward_openreg", backward_of(torch.nn.AdaptiveAvgPool2d(3), 2, 3, 3)),
    ("AdaptiveAvgPool3d", "adaptive_avg_pool3d_backward_openreg", backward_of(torch.nn.AdaptiveAvgPool3d(3), 2, 3, 3, 3)),
    ("AdaptiveMaxPool2d", "adaptive_max_pool2d_backward_openreg", backward_of(torch.nn.AdaptiveMaxPool2d(3), 2, 3, 3)),
    (
        "FractionalMaxPool2d",
        "fractional_max_pool2d_backward_openreg",
        backward_of(lambda x: F.fractional_max_pool2d(x, 2, output_ratio=(0.5, 0.5), _random_samples=torch.full((2, 3, 2), 0.5, device=x.device)), 2, 3, 3, 3),
    ),
    (
        "FractionalMaxPool3d",
        "fractional_max_pool3d_backward_openreg",
        backward_of(lambda x: F.fractional_max_pool3d(x, 2, output_ratio=(0.5, 0.5, 0.5), _random_samples=torch.full((2, 3, 3), 0.5, device=x.device)), 2, 3, 3, 3, 3),
    ),
    ("MaxUnpool1d", "max_unpooling2d_forward_out", call_of(max_unpool(1))),
    ("MaxUnpool2d", "max_unpooling2d_forward_out", call_of(max_unpool(2))),
    ("MaxUnpool3d", "max_unpooling3d_forward_out", call_of(max_unpool(3))),
    ("interpolate_linear", "upsample_linear1d_backward_out_openreg", interpolate("linear", 1)),
    ("interpolate_bilinear", "upsample_bilinear2d_backward_out_openreg", interpolate("bilinear", 2)),
    ("interpolate_bicubic", "upsample_bicubic2d_backward_out_openreg", interpolate("bicubic", 2)),
    ("interpolate_trilinear", "upsample_trilinear3d_backward_out_openreg", interpolate("trilinear", 3)),
    ("interpolate_bilinear_aa", "upsample_bilinear2d_aa_backward_out_openreg", interpolate("bilinear", 2, antialias=True)),
    ("interpolate_bicubic_aa", "upsample_bicubic2d_aa_backward_out_openreg", interpolate("bicubic", 2, antialias=True)),
    ("ReflectionPad1d", "reflection_pad1d_backward_out_openreg", backward_of(torch.nn.ReflectionPad1d((1, 2)), 2, 3, 8)),
    ("ReflectionPad3d", "reflection_pad3d_backward_out_openreg", backward_of(torch.nn.ReflectionPad3d((1, 2, 3, 4, 5, 6)), 2, 3, 8, 8, 8)),
    ("NLLLoss2d", "nll_loss2d_forward_out_openreg_template", call_of(nll_loss_2d("mean"))),
    ("NLLLoss2d_sum", "nll_loss2d_forward_out_openreg_template", call_of(nll_loss_2d("sum"))),
    (
        "NLLLoss_3d_input",
        "nll_loss2d_forward_out_openreg_template",
        call_of(lambda d: F.nll_loss(randn(2, 3, 5, device=d), torch.tensor([[0, 1, 2, 1, 0], [2, 2, 1, 0, 0]], device=d))),
    ),
    ("CTCLoss", "ctc_loss_backward_openreg", ctc_loss_program),
    ("EmbeddingBag_max", "embedding_bag_backward_openreg_max", embedding_bag_program("max")),
    ("put_", "put_", call_of(put(accumulate=False, inplace=True))),
    ("put", "put_", call_of(put(accumulate=False, inplace=False))),
    ("put_accumulate", "put_", call_of(put(accumulate=True, inplace=True))),
    ("histc", "_histc_openreg with floating point input", call_of(lambda d: torch.histc(randn(10, device=d), 4))),
    ("histc_out", "_histc_openreg with floating point input", call_of(lambda d: torch.histc(randn(10, device=d), 4, out=torch.empty(4, device=d)))),
    (
        "bincount_weights",
        "_bincount_openreg",
        call_of(lambda d: torch.bincount(torch.tensor([1, 2, 2], device=d), torch.ones(3, device=d))),
    ),
    ("median_dim", "median openreg with indices output", call_of(lambda d: randn(10, device=d).median(0))),
    ("median_out", "median openreg with indices output", call_of(median_out)),
    ("nanmedian_dim", "median openreg with indices output", call_of(lambda d: randn(10, device=d).nanmedian(0))),
    ("grid_sample_2d", "grid_sampler_2d_backward_openreg", grid_sample_program(2)),
    ("grid_sample_3d", "grid_sampler_3d_backward_openreg", grid_sample_program(3)),
    ("scatter_reduce_prod", "scatter_reduce_openreg_prod_", call_of(scatter_reduce("prod"))),
    ("scatter_multiply", "scatter_reduce_openreg_kernel", call_of(scatter_with_reduce("multiply"))),
    ("index_reduce_prod", "index_reduce_openreg", call_of(index_reduce("prod"))),
    ("index_reduce_amax", "index_reduce_openreg", call_of(index_reduce("amax"))),
]

def histc_of_integers(device):
    """CUDA's histc of integers (the CPU kernel refuses them: its counts
    computed in float)."""
    x = torch.tensor([1, 2, 3, 3])
    if device == "cpu":
        return torch.histc(x.float(), 4, min=0, max=4).long()
    return torch.histc(x.to(device), 4, min=0, max=4)


# Programs near those that do not alert on CUDA in deterministic mode.
QUIET = [
    ("histc_int", call_of(lambda d: histc_of_integers(d))),
    ("bincount", call_of(lambda d: torch.bincount(torch.tensor([1, 2, 2], device=d)))),
    ("median", call_of(lambda d: randn(10, device=d).median())),
    ("kthvalue", call_of(lambda d: randn(10, device=d).kthvalue(3))),
    ("NLLLoss2d_none", call_of(nll_loss_2d("none"))),
    ("NLLLoss_1d", call_of(lambda d: F.nll_loss(randn(4, 3, device=d), torch.tensor([0, 2, 1, 1], device=d)))),
    ("EmbeddingBag_sum", embedding_bag_program("sum")),
    ("ReflectionPad2d", backward_of(torch.nn.ReflectionPad2d((1, 2, 3, 4)), 2, 3, 8, 8)),
    ("scatter_reduce_sum", call_of(scatter_reduce("sum"))),
    ("scatter_reduce_mean", call_of(scatter_reduce("mean"))),
    ("scatter_reduce_amax", call_of(scatter_reduce("amax"))),
    ("scatter_reduce_prod_empty_index", call_of(scatter_reduce("prod", index_size=0))),
    ("scatter_add_reduce", call_of(scatter_with_reduce("add"))),
]


def getitem_backward(device):
    x = randn(5, 3, device=device, requires_grad=True)
    index = torch.tensor([0, 0, 4], device=device)
    x[index].sum().backward()
    return x.grad


def index_put(accumulate):
    def fn(device):
        a = torch.zeros(5, device=device)
        index = torch.tensor([1, 1, 3], device=device)
        return a.index_put_((index,), torch.tensor([1.0, 2.0, 3.0], device=device), accumulate=accumulate)

    return fn


def gather_backward(device):
    x = randn(6, device=device, requires_grad=True)
    torch.gather(x, 0, torch.tensor([0, 0, 5, 5, 2], device=device)).sum().backward()
    return x.grad


def index_select_backward(device):
    x = randn(6, 2, device=device, requires_grad=True)
    torch.index_select(x, 0, torch.tensor([0, 0, 5], device=device)).sum().backward()
    return x.grad


def repeat_interleave_backward(device):
    x = randn(4, device=device, requires_grad=True)
    torch.repeat_interleave(x, 3).sum().backward()
    return x.grad


def embedding_backward(device):
    weight = randn(5, 3, device=device, requires_grad=True)
    F.embedding(torch.tensor([0, 0, 4, 2], device=device), weight).sum().backward()
    return weight.grad


def sparse_bmm(device):
    a = torch.zeros(2, 3, 4)
    a[0, 1, 2], a[1, 0, 3] = 1.0, 2.0
    return torch.bmm(a.to_sparse().to(device), randn(2, 4, 5, device=device))


def conv_backward(conv, *shape):
    def fn(device):
        module = conv.to(device)
        x = randn(*shape, device=device, requires_grad=True)
        module(x).sum().backward()
        grads = (x.grad, *(p.grad for p in module.parameters()))
        module.zero_grad()
        return grads

    return fn


def conv_module(cls, *args):
    torch.manual_seed(0)
    return cls(*args)


# The documentation's "act deterministically when mode=True" entries for
# CUDA (and the CPU-only ones openreg also runs): no alert, CPU's result.
DETERMINISTIC = [
    ("Conv1d", call_of(conv_backward(conv_module(torch.nn.Conv1d, 2, 3, 3), 1, 2, 8))),
    ("Conv2d", call_of(conv_backward(conv_module(torch.nn.Conv2d, 2, 3, 3), 1, 2, 6, 6))),
    ("Conv3d", call_of(conv_backward(conv_module(torch.nn.Conv3d, 2, 3, 3), 1, 2, 5, 5, 5))),
    ("ConvTranspose1d", call_of(conv_backward(conv_module(torch.nn.ConvTranspose1d, 2, 3, 3), 1, 2, 8))),
    ("ConvTranspose2d", call_of(conv_backward(conv_module(torch.nn.ConvTranspose2d, 2, 3, 3), 1, 2, 6, 6))),
    ("ConvTranspose3d", call_of(conv_backward(conv_module(torch.nn.ConvTranspose3d, 2, 3, 3), 1, 2, 4, 4, 4))),
    ("ReplicationPad1d", backward_of(torch.nn.ReplicationPad1d((1, 2)), 2, 3, 4)),
    ("ReplicationPad2d", backward_of(torch.nn.ReplicationPad2d((1, 2, 3, 4)), 2, 3, 4, 4)),
    ("ReplicationPad3d", backward_of(torch.nn.ReplicationPad3d((1, 2, 3, 4, 5, 6)), 2, 3, 4, 4, 4)),
    ("bmm_sparse_dense", call_of(sparse_bmm)),
    ("cumsum", call_of(lambda d: randn(100, device=d).cumsum(0))),
    ("cumsum_complex", call_of(lambda d: randn(100, device=d, dtype=torch.complex64).cumsum(0))),
    ("getitem_backward", call_of(getitem_backward)),
    ("index_put", call_of(index_put(accumulate=False))),
    ("index_put_accumulate", call_of(index_put(accumulate=True))),
    ("scatter_add_", call_of(lambda d: torch.zeros(5, device=d).scatter_add_(0, torch.tensor([1, 1], device=d), torch.ones(2, device=d)))),
    ("gather_backward", call_of(gather_backward)),
    ("index_add", call_of(lambda d: torch.zeros(5, device=d).index_add_(0, torch.tensor([1, 1], device=d), torch.ones(2, device=d)))),
    ("index_select_backward", call_of(index_select_backward)),
    ("repeat_interleave_backward", call_of(repeat_interleave_backward)),
    ("index_copy", call_of(lambda d: torch.zeros(5, device=d).index_copy_(0, torch.tensor([1, 3], device=d), torch.ones(2, device=d)))),
    ("scatter", call_of(lambda d: torch.zeros(5, device=d).scatter_(0, torch.tensor([1, 1, 3], device=d), torch.ones(3, device=d)))),
    ("scatter_reduce_sum", call_of(scatter_reduce("sum"))),
    ("scatter_reduce_mean", call_of(scatter_reduce("mean"))),
    ("MaxPool3d", backward_of(torch.nn.MaxPool3d(3), 2, 3, 3, 3)),
    ("Embedding", call_of(embedding_backward)),
    # bilinear, bicubic and trilinear run torch's decomposition on a
    # non-CPU input in deterministic mode, forward included (F.interpolate).
    ("interpolate_bilinear_forward_too", call_of(lambda d: interpolate("bilinear", 2)(d)())),
    ("interpolate_bicubic_forward_too", call_of(lambda d: interpolate("bicubic", 2)(d)())),
    ("interpolate_trilinear_forward_too", call_of(lambda d: interpolate("trilinear", 3)(d)())),
]


def alert_pattern(caller, warn_only=False):
    return "^" + re.escape(caller + ALERT.format(", warn_only=True" if warn_only else ""))


def alert_warnings(fn):
    """Runs `fn`, returning its result and the deterministic alerts it warned."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [str(w.message) for w in caught if "deterministic implementation" in str(w.message)]


def assert_same(actual, expected):
    torch.testing.assert_close(
        torch.utils._pytree.tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, actual), expected
    )


@pytest.mark.parametrize("busy_stream", [False, True], ids=["idle", "busy"])
@pytest.mark.parametrize("caller,program", [case[1:] for case in ALERTS], ids=[case[0] for case in ALERTS])
def test_alert_raises_at_the_call(caller, program, busy_stream):
    step = program(DEV)
    torch.use_deterministic_algorithms(True)
    if busy_stream:
        busy(torch.openreg.current_stream(), 300)
    with pytest.raises(RuntimeError, match=alert_pattern(caller)):
        step()
    torch.openreg.synchronize()  # nothing parked: the alert was the call's only error


@pytest.mark.parametrize("busy_stream", [False, True], ids=["idle", "busy"])
@pytest.mark.parametrize("caller,program", [case[1:] for case in ALERTS], ids=[case[0] for case in ALERTS])
def test_alert_warns_once_under_warn_only_and_computes_as_cpu(caller, program, busy_stream, one_cpu_thread):
    expected = program("cpu")()
    step = program(DEV)
    torch.use_deterministic_algorithms(True, warn_only=True)
    if busy_stream:
        busy(torch.openreg.current_stream(), 300)
    result, alerts = alert_warnings(step)
    assert len(alerts) == 1 and re.match(alert_pattern(caller, warn_only=True), alerts[0]), alerts
    torch.openreg.synchronize()
    assert_same(result, expected)


@pytest.mark.parametrize("program", [case[2] for case in ALERTS], ids=[case[0] for case in ALERTS])
def test_no_alert_with_deterministic_mode_off(program):
    step = program(DEV)
    torch.use_deterministic_algorithms(False)
    _, alerts = alert_warnings(step)
    assert alerts == []


@pytest.mark.parametrize("program", [case[1] for case in QUIET + DETERMINISTIC], ids=[case[0] for case in QUIET + DETERMINISTIC])
def test_no_alert_where_cuda_has_none_and_equal_to_cpu(program, one_cpu_thread):
    expected = program("cpu")()
    step = program(DEV)
    torch.use_deterministic_algorithms(True)
    result, alerts = alert_warnings(step)  # an alert would raise here
    assert alerts == []
    assert_same(result, expected)


def test_backward_alerts_only_when_its_forward_ran_outside_deterministic_mode_for_interpolate():
    """F.interpolate's bilinear forward in deterministic mode takes torch's
    decomposition on openreg as on CUDA (its backward is index_put's): only a
    graph recorded outside the mode reaches the alerting backward kernel."""
    torch.use_deterministic_algorithms(True)
    x = randn(1, 2, 4, 4, device=DEV, requires_grad=True)
    F.interpolate(x, size=12, mode="bilinear", align_corners=False).sum().backward()
    torch.use_deterministic_algorithms(False)
    out = F.interpolate(x, size=12, mode="bilinear", align_corners=False)
    torch.use_deterministic_algorithms(True)
    with pytest.raises(RuntimeError, match=alert_pattern("upsample_bilinear2d_backward_out_openreg")):
        out.sum().backward()


def documented_cuda_entries(header):
    """The bullet entries of torch.use_deterministic_algorithms' documentation
    in the list after `header` (a regex) that name CUDA or no device."""
    doc = torch.use_deterministic_algorithms.__doc__
    entries = []
    for line in doc[re.search(header, doc).end() :].splitlines()[1:]:
        indent = len(line) - len(line.lstrip())
        if line.strip().startswith("* "):
            entries.append(line.strip()[2:])
        elif entries and line.strip() and indent > 8:
            entries[-1] += " " + line.strip()
        elif entries and line.strip():
            break  # the paragraph after the list
    return [e for e in entries if "CUDA" in e or not re.search(r"\b(CPU|MPS)\b", e)]


# Each CUDA (or device-free) "throws" entry of the documentation: the ALERTS
# (or QUIET, where this wheel's CUDA kernel has no alert) ids covering it.
DOCUMENTED_ALERTS = {
    "AvgPool3d": ["AvgPool3d"],
    "AdaptiveAvgPool2d": ["AdaptiveAvgPool2d"],
    "AdaptiveAvgPool3d": ["AdaptiveAvgPool3d"],
    "AdaptiveMaxPool2d": ["AdaptiveMaxPool2d"],
    "FractionalMaxPool2d": ["FractionalMaxPool2d"],
    "FractionalMaxPool3d": ["FractionalMaxPool3d"],
    "MaxUnpool1d": ["MaxUnpool1d"],
    "MaxUnpool2d": ["MaxUnpool2d"],
    "MaxUnpool3d": ["MaxUnpool3d"],
    "interpolate": ["interpolate_linear", "interpolate_bilinear", "interpolate_bicubic", "interpolate_trilinear"],
    "ReflectionPad1d": ["ReflectionPad1d"],
    "ReflectionPad2d": ["ReflectionPad2d"],  # QUIET: reflection_pad2d_backward_cuda has no alert in this wheel
    "ReflectionPad3d": ["ReflectionPad3d"],
    "NLLLoss": ["NLLLoss2d"],
    "CTCLoss": ["CTCLoss"],
    "EmbeddingBag": ["EmbeddingBag_max"],
    "put_` when ``accumulate=False": ["put_", "put"],
    "put_` when ``accumulate=True": ["put_accumulate"],
    "histc": ["histc"],
    "bincount": ["bincount_weights"],
    "median": ["median_dim", "median_out"],
    "grid_sample": ["grid_sample_2d", "grid_sample_3d"],
    "scatter_reduce": ["scatter_reduce_prod"],
    "resize_": [],  # quantized tensors: a QuantizedCPU kernel's alert, no CUDA one
}

DOCUMENTED_DETERMINISTIC = {
    "Conv1d": ["Conv1d"],
    "Conv2d": ["Conv2d"],
    "Conv3d": ["Conv3d"],
    "ConvTranspose1d": ["ConvTranspose1d"],
    "ConvTranspose2d": ["ConvTranspose2d"],
    "ConvTranspose3d": ["ConvTranspose3d"],
    "ReplicationPad1d": ["ReplicationPad1d"],
    "ReplicationPad2d": ["ReplicationPad2d"],
    "ReplicationPad3d": ["ReplicationPad3d"],
    "bmm": ["bmm_sparse_dense"],
    "cumsum": ["cumsum", "cumsum_complex"],
    "index_put` with ``accumulate=False": ["index_put"],
    "scatter_add_": ["scatter_add_"],
    "gather": ["gather_backward"],
    "index_add": ["index_add"],
    "index_select": ["index_select_backward"],
    "repeat_interleave": ["repeat_interleave_backward"],
    "index_copy": ["index_copy"],
    "scatter` when": ["scatter"],
    "scatter_reduce": ["scatter_reduce_sum", "scatter_reduce_mean"],
    "MaxPool3d": ["MaxPool3d"],
    "Embedding`": ["Embedding"],
}


@pytest.mark.parametrize(
    "kind,covered,ids",
    [
        (r"will throw a\s+:class:`RuntimeError`\s+when ``mode=True``", DOCUMENTED_ALERTS, {c[0] for c in ALERTS + QUIET}),
        (r"will act\s+deterministically", DOCUMENTED_DETERMINISTIC, {c[0] for c in DETERMINISTIC}),
    ],
    ids=["throws", "deterministic"],
)
def test_every_documented_cuda_entry_has_a_program(kind, covered, ids):
    entries = documented_cuda_entries(kind)
    assert entries, "the documentation's list was not found"
    for entry in entries:
        keys = [key for key in covered if key in entry]
        assert keys, f"no program for the documented entry {entry!r}"
        assert all(i in ids for key in keys for i in covered[key]), entry


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16, torch.complex64, torch.int32, torch.uint8, torch.bool]
)
def test_new_memory_filled_as_cuda_fills_it(dtype):
    """With fill_uninitialized_memory (the default) in deterministic mode,
    CUDA's empty, empty_strided and resize_ fill what they hand out: NaN for
    floating and complex dtypes, the largest value otherwise."""
    filler = torch.nan if dtype.is_floating_point or dtype.is_complex else (True if dtype == torch.bool else torch.iinfo(dtype).max)

    def filled(t):
        t = t.cpu()
        return bool(t.isnan().all()) if filler is torch.nan else bool((t == filler).all())

    torch.use_deterministic_algorithms(True)
    assert filled(torch.empty(10, 9, device=DEV, dtype=dtype))
    assert filled(torch.empty(10, 9, device=DEV, dtype=dtype, out=torch.zeros(1, device=DEV, dtype=dtype)))
    assert filled(torch.empty_like(torch.zeros(10, 9, device=DEV, dtype=dtype)))
    assert filled(torch.empty_strided((10, 9), (1, 5), device=DEV, dtype=dtype))
    assert filled(torch.empty_permuted((2, 3, 5), (1, 0, 2), device=DEV, dtype=dtype))
    grown = torch.zeros(3, device=DEV, dtype=dtype).resize_(20).cpu()
    assert (grown[:3] == torch.zeros(3, dtype=dtype)).all() and filled(grown[3:])


def test_fill_is_stream_work_behind_queued_work():
    torch.use_deterministic_algorithms(True)
    busy(torch.openreg.current_stream(), 200)
    t = torch.empty(1000, device=DEV)
    assert not torch.openreg.current_stream().query()
    assert t.isnan().all().item()
