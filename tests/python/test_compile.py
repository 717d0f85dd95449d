"""torch.compile on openreg: dynamo's device interface, and the default
Inductor backend generating C++ kernels that run in stream order on the
device of their tensors (Note [Inductor kernels in stream order])."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend

from _openreg_util import busy, clean_env, new_stream, script

DEV = "openreg"


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles its functions afresh; FX graphs come from this
    process's compiles, never from the on-disk cache of another run."""
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False):
        yield
    torch._dynamo.reset()


# --- dynamo's device interface -----------------------------------------------


def _interface():
    from torch._dynamo.device_interface import get_interface_for_device

    return get_interface_for_device(DEV)


def test_device_interface_devices_and_properties():
    iface = _interface()
    assert iface.is_available() and iface.device_count() == torch.openreg.device_count() == 2
    assert not iface.is_gpu()  # C++ code generation, not Triton
    assert iface.current_device() == 0
    assert iface.exchange_device(1) == 0
    assert iface.current_device() == 1 == torch.openreg.current_device()
    assert iface.maybe_exchange_device(0) == 1
    assert iface.exchange_device(-1) == -1 and iface.current_device() == 0
    iface.set_device(1)
    assert torch.openreg.current_device() == 1
    iface.set_device(0)
    with iface.device(1):
        assert torch.openreg.current_device() == 1
    props = iface.get_device_properties(1)
    assert props == torch.openreg.get_device_properties(1)
    assert iface.Worker.get_device_properties("openreg:1") == props
    assert iface.Worker.current_device() == 0
    major, minor = props.major, props.minor
    assert iface.get_compute_capability(1) == major * 10 + minor
    assert iface.is_bf16_supported() and iface.is_dtype_supported(torch.bfloat16)
    before = iface.memory_allocated(1)
    block = torch.empty(1 << 20, dtype=torch.uint8, device="openreg:1")
    assert iface.memory_allocated(1) == before + block.numel()


def test_device_interface_streams_and_events():
    iface = _interface()
    assert issubclass(iface.Stream, torch.Stream) and issubclass(iface.Event, torch.Event)
    side = iface.Stream(device=0)
    with iface.stream(side):
        assert iface.current_stream() == side
        assert iface.get_raw_stream(0) == side.native_handle
    assert iface.current_stream() != side
    iface._set_stream_by_id(side.stream_id, side.device_index, side.device_type)
    assert iface.current_stream() == side
    iface.set_stream(torch.openreg.default_stream(0))
    assert iface.get_raw_stream(0) == torch.openreg.default_stream(0).native_handle

    start, end = iface.Event(enable_timing=True), iface.Event(enable_timing=True)
    start.record()
    torch.openreg._sleep(20)
    end.record()
    iface.synchronize()
    assert end.query()
    assert start.elapsed_time(end) >= 15


def test_default_generators():
    gens = torch.openreg.default_generators
    assert len(gens) == torch.openreg.device_count()
    assert [g.device for g in gens] == [torch.device(DEV, i) for i in range(len(gens))]
    gens[1].manual_seed(123)
    first = torch.randn(4, device="openreg:1").cpu()
    torch.openreg.manual_seed_all(0)
    gens[1].manual_seed(123)
    assert torch.equal(torch.randn(4, device="openreg:1").cpu(), first)
    assert gens[1].initial_seed() == 123


IMPORT_IS_LAZY = script(
    "dynamo-interface-lazy",
    """
    import torch, torch_openreg
    RESULT["dynamo_loaded_by_import"] = "torch._dynamo" in sys.modules
    import torch._dynamo
    from torch._dynamo.device_interface import get_interface_for_device
    RESULT["interface"] = get_interface_for_device("openreg").__name__
    from torch._inductor.utils import GPU_TYPES
    RESULT["gpu_types"] = list(GPU_TYPES)
    done(RESULT)
    """,
)


@pytest.mark.subprocess
def test_interface_registers_when_dynamo_loads():
    data = IMPORT_IS_LAZY.result().check_ok()
    assert data["dynamo_loaded_by_import"] is False  # importing torch_openreg stays cheap
    assert data["interface"] == "OpenRegInterface"
    assert "openreg" not in data["gpu_types"]


# --- Inductor ----------------------------------------------------------------


def _pointwise_reduction_matmul(x, y):
    z = (x.sin() + y).relu() * 2
    return z.sum(0), z.mean(-1, keepdim=True) - z.amax(), x @ y.t(), torch.softmax(z, -1)


def test_compiled_ops_match_eager_and_cpu_compile():
    torch.manual_seed(0)
    x, y = torch.randn(16, 24), torch.randn(16, 24)
    compiled = torch.compile(_pointwise_reduction_matmul)
    on_device = compiled(x.to(DEV), y.to(DEV))
    eager = _pointwise_reduction_matmul(x.to(DEV), y.to(DEV))
    on_cpu = torch.compile(_pointwise_reduction_matmul)(x, y)
    for d, e, c in zip(on_device, eager, on_cpu):
        assert d.device.type == DEV
        torch.testing.assert_close(d.cpu(), e.cpu())
        torch.testing.assert_close(d.cpu(), c)


def test_inductor_generates_stream_launchers():
    from torch._inductor.utils import run_and_get_code

    _, code = run_and_get_code(torch.compile(lambda a: (a * 2).exp()), torch.ones(8, device=DEV))
    assert "torch_openreg::launch(torch_openreg::current_stream(0)" in code[0]


def test_kernels_use_openreg_kernel_threads():
    # Device kernels open no OpenMP team, whatever the process's thread
    # count (Note [Kernel threads]).
    from torch._inductor.utils import run_and_get_code

    fn = lambda a: (a.sin() * 2).sum()  # noqa: E731
    x = torch.randn(1 << 18)
    _, cpu_code = run_and_get_code(torch.compile(fn), x)
    if torch.get_num_threads() < 2 or "#pragma omp parallel" not in cpu_code[0]:
        pytest.skip("the CPU build of this kernel is not parallel here")
    out, code = run_and_get_code(torch.compile(fn), x.to(DEV))
    assert "#pragma omp parallel" not in code[0]
    torch.testing.assert_close(out.cpu(), fn(x))


def test_kernels_run_in_stream_order():
    compiled = torch.compile(lambda a: a * 3 + 1)
    a = torch.zeros(4096, device=DEV)
    compiled(a)  # compiled now; the calls below only queue work
    torch.openreg.synchronize()
    side = new_stream(0)
    with torch.openreg.stream(side):
        torch.openreg._sleep(500)
        a.fill_(2.0)  # queued behind the sleep
        out = compiled(a)  # must read the 2.0s, after the sleep
        queued = not side.query()
    assert queued, "the compiled kernel ran before the work queued ahead of it"
    assert torch.openreg.default_stream(0).query(), "the kernel went to the wrong stream"
    side.synchronize()
    assert torch.equal(out.cpu(), torch.full((4096,), 7.0))


def test_kernels_run_on_the_device_of_their_tensors():
    compiled = torch.compile(lambda a, b: (a + b).relu().sum(0))
    a = torch.randn(32, 8).to("openreg:1")
    b = torch.randn(32, 8).to("openreg:1")
    compiled(a, b)  # compiled now; the call below only queues work
    torch.openreg.synchronize(1)
    busy(torch.openreg.current_stream(1), 500)
    out = compiled(a, b)  # current device 0, tensors on 1
    assert out.device == torch.device("openreg:1")
    assert not torch.openreg.current_stream(1).query()
    assert torch.openreg.default_stream(0).query(), "the kernel went to device 0"
    torch.testing.assert_close(out.cpu(), (a.cpu() + b.cpu()).relu().sum(0))


def test_dynamic_shapes_and_recompiles():
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(lambda t: (t * t).sum(-1) + t.shape[0], backend=counter, dynamic=True)
    for n in (5, 7, 11):
        t = torch.randn(n, 3)
        torch.testing.assert_close(compiled(t.to(DEV)).cpu(), (t * t).sum(-1) + n)
    assert counter.frame_count == 1  # one dynamic graph serves every size

    counter = CompileCounterWithBackend("inductor")
    static = torch.compile(lambda t: t.cos() * 2, backend=counter, dynamic=False)
    for n in (4, 6):
        t = torch.randn(n)
        torch.testing.assert_close(static(t.to(DEV)).cpu(), t.cos() * 2)
    assert counter.frame_count == 2  # a new shape recompiles


def test_graph_breaks():
    counter = CompileCounterWithBackend("inductor")

    def fn(t):
        u = t.exp()
        if u.sum().item() > 0:  # data-dependent control flow: a graph break
            u = u * 2
        return u.log()

    t = torch.randn(10)
    out = torch.compile(fn, backend=counter)(t.to(DEV))
    torch.testing.assert_close(out.cpu(), fn(t))
    assert counter.frame_count == 2


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 5))


def _cnn():
    torch.manual_seed(1)
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1, bias=False),
        nn.BatchNorm2d(6),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(6 * 4 * 4, 5),
    )


def _train(model, inputs, target, steps, compile_step):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    def step(x, y):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    step_fn = torch.compile(step) if compile_step else step
    losses = []
    for _ in range(steps):
        losses.append(step_fn(inputs, target).detach())
        optimizer.step()
    return [l.cpu() for l in losses], [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("make_model, shape", [(_mlp, (8, 12)), (_cnn, (4, 3, 8, 8))], ids=["mlp", "cnn"])
def test_compiled_training_step_matches_eager(make_model, shape):
    torch.manual_seed(2)
    x, y = torch.randn(*shape), torch.randint(0, 5, (shape[0],))
    model = make_model()
    compiled = _train(copy.deepcopy(model).to(DEV), x.to(DEV), y.to(DEV), 3, compile_step=True)
    eager = _train(copy.deepcopy(model).to(DEV), x.to(DEV), y.to(DEV), 3, compile_step=False)
    for c, e in zip(compiled[0] + compiled[1], eager[0] + eager[1]):
        torch.testing.assert_close(c, e, rtol=1e-5, atol=1e-5)


MEMORY_PROTECT = script(
    "compile-memory-protect",
    """
    import torch, torch_openreg
    torch._inductor.config.fx_graph_cache = False
    x = torch.randn(64)
    out = torch.compile(lambda t: (t.sin() * 2).sum())(x.to("openreg"))
    RESULT["error"] = float((out.cpu() - (x.sin() * 2).sum()).abs())
    done(RESULT)
    """,
    env=clean_env(OPENREG_MEMORY_PROTECT="1"),
    timeout=240,
)


@pytest.mark.subprocess
def test_compiled_kernels_under_memory_protection():
    # Host code touching device memory would fault: the kernels run through the stream.
    data = MEMORY_PROTECT.result().check_ok()
    assert data["error"] < 1e-4


# --- backend="openreg_graphs": compiled graphs captured and replayed ----------
# (Note [Graphed compile backend] in python/torch_openreg/_graph_backend.py)


class _GraphEvents:
    def __init__(self):
        self.captured: list[str] = []  # the names of the graphs captured, in order
        self.replayed: list[str] = []  # and replayed


@pytest.fixture
def graph_events(monkeypatch):
    """Counts the graphs the graphed backends capture and replay, by the
    name of their compiled graph ("forward", "backward", "inference")."""
    from torch_openreg import _graph_backend

    events = _GraphEvents()
    capture, replay = _graph_backend._GraphedCallable._capture, _graph_backend._GraphedCallable._replay

    def counted_capture(self, inputs):
        recording = capture(self, inputs)
        if recording is not None:
            events.captured.append(self._name)
        return recording

    def counted_replay(self, recording, inputs):
        events.replayed.append(self._name)
        return replay(self, recording, inputs)

    monkeypatch.setattr(_graph_backend._GraphedCallable, "_capture", counted_capture)
    monkeypatch.setattr(_graph_backend._GraphedCallable, "_replay", counted_replay)
    return events


def test_graphed_backend_is_found_by_name():
    """dynamo finds the backend through the package's entry point."""
    assert "openreg_graphs" in torch._dynamo.list_backends()


def test_graphed_training_matches_eager_bit_for_bit():
    """Forward and backward graphs captured after their first call replay
    exactly what eager training computes, step after step (parameters and
    their updates in place, new batches copied into the static inputs)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(DEV)
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="openreg_graphs")
    optimizer, reference_optimizer = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference))
    for _ in range(5):
        x, y = torch.randn(8, 16, device=DEV), torch.randn(8, 4, device=DEV)
        for net, opt in ((compiled, optimizer), (reference, reference_optimizer)):
            F.mse_loss(net(x), y).backward()
            opt.step()
            opt.zero_grad()
        for a, b in zip(model.parameters(), reference.parameters()):
            assert torch.equal(a.cpu(), b.cpu())


def test_graphed_results_stay_valid_after_the_next_call():
    """Each call returns its own tensors, not the graph's static outputs,
    which the next replay overwrites."""
    f = torch.compile(lambda x: x * 2 + 1, backend="openreg_graphs")
    outputs = [f(torch.full((64,), float(i), device=DEV)) for i in range(5)]
    for i, out in enumerate(outputs):
        assert torch.equal(out.cpu(), torch.full((64,), 2.0 * i + 1))


def test_graphed_random_ops_draw_per_call_and_repeat_after_seed():
    """Dropout in a replayed graph draws a new mask on every call, and the
    sequence of calls repeats after manual_seed."""
    f = torch.compile(lambda x: F.dropout(x, 0.5, training=True), backend="openreg_graphs")
    x = torch.ones(256, device=DEV)

    def calls():
        torch.openreg.manual_seed(3)
        return [f(x).cpu() for _ in range(4)]

    first, second = calls(), calls()
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert not torch.equal(first[2], first[3]), "two replays drew the same mask"


def test_graphed_backend_runs_uncapturable_graphs_eagerly():
    """A graph that synchronizes with the host cannot be captured: it runs
    eagerly from then on, with a warning naming why; inputs on the CPU are
    not graphed either."""
    # multinomial reads its probabilities on the host (Tensor.item()).
    f = torch.compile(lambda p: torch.multinomial(p, 2) + 1, backend="openreg_graphs")
    p = torch.tensor([0.5, 0.5, 0.0], device=DEV)
    with pytest.warns(UserWarning, match="could not be captured.*item"):
        results = [sorted(f(p).tolist()) for _ in range(3)]
    assert results == [[1, 2]] * 3
    g = torch.compile(lambda x: x + 1, backend="openreg_graphs")
    with pytest.warns(UserWarning, match="not all on one openreg device"):
        assert torch.equal(g(torch.ones(3)), torch.full((3,), 2.0))


# --- backend="openreg": Inductor, its compiled graphs replayed ----------------
# (Note [The openreg compile backend] in python/torch_openreg/_graph_backend.py)


def test_openreg_backend_is_found_by_name():
    assert "openreg" in torch._dynamo.list_backends()


def test_openreg_backend_trains_as_on_the_cpu(graph_events):
    """A small model's forward and backward: Inductor generates their kernels
    (stream launchers), the graphs are replayed from the second step on, and
    losses and gradients are the CPU's."""
    from torch._inductor.utils import run_and_get_code

    model = _mlp()
    on_cpu = copy.deepcopy(model)
    compiled = torch.compile(model.to(DEV), backend="openreg")

    def step(net, x, y):
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        return loss.detach()

    torch.manual_seed(3)
    for i in range(3):
        x, y = torch.randn(8, 12), torch.randint(0, 5, (8,))
        if i == 0:
            loss, code = run_and_get_code(step, compiled, x.to(DEV), y.to(DEV))
            assert len(code) == 2 and all("torch_openreg::launch(" in c for c in code)  # forward, backward
        else:
            loss = step(compiled, x.to(DEV), y.to(DEV))
        torch.testing.assert_close(loss.cpu(), step(on_cpu, x, y), rtol=1e-5, atol=1e-5)
        for p, q in zip(model.parameters(), on_cpu.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-5)
            p.grad, q.grad = None, None
    assert graph_events.captured == ["forward", "backward"]
    assert graph_events.replayed == ["forward", "backward"] * 2


# --- both graphed backends: a graph per input signature ------------------------
# (Note [Graphed compile backend] in python/torch_openreg/_graph_backend.py)

SIZES = (4, 8, 3, 16, 8)  # the second 8 is the only size seen before


def _small_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.Linear(8, 3))


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic_dynamic", "dynamic"])
@pytest.mark.parametrize("backend", ["openreg_graphs", "openreg"])
def test_graphed_calls_match_eager_over_changing_sizes(backend, dynamic, graph_events):
    """Each batch size gets its own graph, recorded the first time it comes
    and replayed when it comes again; a graph recorded for one size is never
    replayed for another. With dynamic=None dynamo compiles the first size
    statically and the others as one dynamic graph; with dynamic=True one
    dynamic graph serves them all (the int sizes are among its inputs)."""
    model = _small_net().to(DEV)
    net = copy.deepcopy(model)
    compiled = torch.compile(net, backend=backend, dynamic=dynamic)
    for n in SIZES:
        x = torch.randn(n, 6, device=DEV)
        out, expected = compiled(x), model(x)
        out.square().sum().backward()
        expected.square().sum().backward()
        torch.testing.assert_close(out.cpu(), expected.cpu())
        for p, q in zip(net.parameters(), model.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad.cpu())
            p.grad, q.grad = None, None
    assert graph_events.captured == ["forward", "backward"] * 4
    assert graph_events.replayed == ["forward", "backward"]


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic_dynamic", "dynamic"])
def test_graphed_training_with_a_smaller_last_batch(dynamic):
    """Training steps whose last batch is smaller: the parameters end as
    eager training on openreg leaves them, and as on the CPU."""
    torch.manual_seed(4)
    batches = [(torch.randn(n, 12), torch.randint(0, 5, (n,))) for n in (8, 8, 8, 5)]
    model = _mlp()

    def train(net, device, compile_backend=None):
        net = net.to(device)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        forward = torch.compile(net, backend=compile_backend, dynamic=dynamic) if compile_backend else net
        for x, y in batches:
            F.cross_entropy(forward(x.to(device)), y.to(device)).backward()
            optimizer.step()
            optimizer.zero_grad()
        return [p.detach().cpu() for p in net.parameters()]

    graphed = train(copy.deepcopy(model), DEV, "openreg_graphs")
    eager = train(copy.deepcopy(model), DEV)
    on_cpu = train(copy.deepcopy(model), "cpu")
    for g, e, c in zip(graphed, eager, on_cpu):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(g, c, rtol=1e-5, atol=1e-5)


def test_graphed_recording_stops_at_the_bound(monkeypatch, graph_events):
    """Past MAX_GRAPHS input signatures, a new one runs eagerly, with one
    warning that names the backend, the graph and the bound; the signatures
    recorded keep replaying."""
    from torch_openreg import _graph_backend

    monkeypatch.setattr(_graph_backend, "MAX_GRAPHS", 2)
    f = torch.compile(lambda x: x.sin() * x.shape[0], backend="openreg_graphs", dynamic=True)
    results = {}
    with pytest.warns(UserWarning) as caught:
        for n in (4, 8, 3, 4, 8, 16, 3):
            x = torch.randn(n)
            results.setdefault(n, []).append((f(x.to(DEV)).cpu(), x.sin() * n))
    messages = [str(w.message) for w in caught if "MAX_GRAPHS" in str(w.message)]
    assert len(messages) == 1
    assert messages[0].startswith("openreg_graphs: the inference graph runs eagerly for new input signatures")
    assert "recorded 2 graphs, the bound torch_openreg._graph_backend.MAX_GRAPHS" in messages[0]
    for pairs in results.values():
        for out, expected in pairs:
            torch.testing.assert_close(out, expected)
    assert graph_events.captured == ["inference"] * 2
    assert graph_events.replayed == ["inference"] * 2  # the second 4 and 8


def test_graphed_parameter_moved_to_new_memory_gets_a_new_graph(graph_events):
    """A graph uses the parameters in place, at the addresses it was recorded
    on: a parameter given new memory (``.data =``) is a new signature, and the
    results follow the new values."""
    lin = nn.Linear(4, 3).to(DEV)
    compiled = torch.compile(lin, backend="openreg_graphs")
    x = torch.randn(2, 4, device=DEV)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(compiled(x).cpu(), lin(x).cpu())
        old_weight = lin.weight.data
        lin.weight.data = torch.randn(3, 4, device=DEV)
        torch.testing.assert_close(compiled(x).cpu(), lin(x).cpu())
        lin.weight.data = old_weight  # the first graph's memory again
        torch.testing.assert_close(compiled(x).cpu(), lin(x).cpu())
    assert graph_events.captured == ["inference"] * 2
    assert graph_events.replayed == ["inference"] * 2


# --- both graphed backends: inputs the graphs write, graphs without tensor inputs
# (Note [Graphed compile backend] in python/torch_openreg/_graph_backend.py)


@pytest.mark.parametrize("backend", ["openreg_graphs", "openreg"])
def test_graphed_input_mutations_reach_the_caller(backend, graph_events):
    """A compiled function that writes its input in place writes the
    caller's tensor on every call, replays included, as eagerly; a size
    change in between gets its own graph."""

    def f(x):
        x.add_(1)
        return x * 2

    compiled = torch.compile(f, backend=backend)
    tensors = {n: (torch.arange(float(n), device=DEV), torch.arange(float(n), device=DEV)) for n in (4, 6)}
    for n in (4, 4, 6, 6, 4, 4):
        x, reference = tensors[n]
        out, expected = compiled(x), f(reference)
        assert torch.equal(x.cpu(), reference.cpu())
        assert torch.equal(out.cpu(), expected.cpu())
    # The static graph for 4, then the dynamic one dynamo compiles for 6, which
    # also serves the later 4s (a new signature in it).
    assert graph_events.captured == ["inference"] * 3
    assert graph_events.replayed == ["inference"] * 3


class _WritesSavedInBackward(torch.autograd.Function):
    """x * s, whose backward adds 1 to the s it saved."""

    @staticmethod
    def forward(ctx, x, s):
        ctx.save_for_backward(s)
        return x * s

    @staticmethod
    def backward(ctx, grad):
        (s,) = ctx.saved_tensors
        s.add_(1)
        return grad * 2, None


@pytest.mark.parametrize("backend", ["openreg_graphs", "openreg"])
def test_graphed_backward_writes_a_saved_input(backend, graph_events):
    """A backward graph that writes an input of the forward it saved writes
    the caller's tensor, replays included, as eagerly."""
    compiled = torch.compile(_WritesSavedInBackward.apply, backend=backend)
    s, reference = torch.ones(5, device=DEV), torch.ones(5, device=DEV)
    for _ in range(3):
        x = torch.randn(5, device=DEV, requires_grad=True)
        compiled(x, s).sum().backward()
        _WritesSavedInBackward.apply(x.detach().requires_grad_(), reference).sum().backward()
        assert torch.equal(s.cpu(), reference.cpu())
    assert graph_events.captured == ["forward", "backward"]
    assert graph_events.replayed == ["forward", "backward"] * 2


@pytest.mark.parametrize("backend", ["openreg_graphs", "openreg"])
def test_graphed_batchnorm_running_stats_match_eager(backend, graph_events):
    """BatchNorm's running statistics (buffers the forward graph updates)
    after each compiled training step are eager training's."""
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4)).to(DEV)
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend=backend)
    for _ in range(4):
        x = torch.randn(8, 6, device=DEV)
        compiled(x).square().sum().backward()
        reference(x).square().sum().backward()
        for a, b in zip(model.buffers(), reference.buffers()):
            torch.testing.assert_close(a.cpu(), b.cpu())
    assert graph_events.captured == ["forward", "backward"]
    assert graph_events.replayed == ["forward", "backward"] * 3


@pytest.mark.parametrize("backend", ["openreg_graphs", "openreg"])
def test_graphed_function_without_tensor_inputs_runs_eagerly(backend, graph_events):
    """A graph with no tensor inputs runs eagerly, with a warning."""
    f = lambda: torch.ones(3, device=DEV) * 2  # noqa: E731
    compiled = torch.compile(f, backend=backend)
    with pytest.warns(UserWarning, match="no tensor inputs"):
        results = [compiled() for _ in range(3)]
    assert all(torch.equal(r.cpu(), f().cpu()) and r.device == torch.device(DEV, 0) for r in results)
    assert graph_events.captured == graph_events.replayed == []
