"""Front ends: what PyTorch's front ends promise on the device. Autograd
gives CPU's gradients; autocast runs matmuls in the autocast dtype;
torch.compile finds the device's dynamo interface and its backends give
eager's results; a torch.accelerator.Graph replays its capture; the profiler
records device activity; torch.multiprocessing shares device tensors with a
spawned process; a torch.distributed backend registered for the device
reduces its tensors across ranks.

Each front end but autograd is optional. A backend that does not offer one
gets NotSupported, decided where torch decides it: is_autocast_available and
the device module's get_amp_supported_dtype (which torch.autocast requires);
dynamo's device interface registry; Inductor's code generation registry; the
Graph constructor's "Graph is not supported on device type"; torch's storage
reduction refusing a device storage ("only available on CPU"); the
distributed default backend map. The profiler is the exception: torch offers
no query for the profiler a backend registers, so a profile with no device
activity at all is taken to mean that there is none.

Processes these checks spawn load the backend as the run does: through the
--import module, read from the check process's command line, or autoload.
"""

from __future__ import annotations

import copy
import datetime
import importlib
import os
import tempfile

import torch

from torch_openreg.conformance._api import Failed, NotSupported, check, expect, first_line

AREA = "frontends"

_CHILD_TIMEOUT_S = 90.0


def _import_backend(module: str | None) -> None:
    """In a spawned process: load the backend as the run does."""
    if module is not None:
        importlib.import_module(module)


def _expect_close(got: torch.Tensor, want: torch.Tensor, what: str, **tolerance) -> None:
    """Raises Failed saying how `what` differs, unless torch.testing.assert_close accepts it."""
    try:
        torch.testing.assert_close(got.detach().cpu(), want.detach().cpu(), **tolerance)
    except AssertionError as error:
        raise Failed(f"{what} differs: {' '.join(str(error).split())[:200]}") from None


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


# --- autograd


@check("a small MLP's loss and gradients (parameters and input) on the device equal CPU's, and live on the device")
def autograd(b):
    host = _mlp()
    device_mlp = copy.deepcopy(host).to(b.device())
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    target = torch.randn(5, 4, generator=torch.Generator().manual_seed(2))
    results = []
    for model, device in ((host, torch.device("cpu")), (device_mlp, b.device())):
        inputs = x.to(device, copy=True).requires_grad_()
        loss = torch.nn.functional.mse_loss(model(inputs), target.to(device))
        loss.backward()
        results.append((loss, inputs.grad, [p.grad for p in model.parameters()]))
    (want_loss, want_input, want_params), (got_loss, got_input, got_params) = results
    grads = [got_input, *got_params]
    expect(all(g is not None for g in grads), "a gradient on the device is None")
    off = [str(g.device) for g in grads if g.device != b.device()]
    expect(not off, f"gradients on {', '.join(off)}, not {b.device()}")
    pairs = [("the loss", got_loss, want_loss), ("the input's gradient", got_input, want_input)]
    pairs += [(f"parameter {i}'s gradient", g, w) for i, (g, w) in enumerate(zip(got_params, want_params))]
    for what, got, want in pairs:
        _expect_close(got, want, f"{what} (against CPU's)", rtol=1e-4, atol=1e-5)
    return f"loss and {len(grads)} gradients equal CPU's"


# --- autocast


@check("under torch.autocast(NAME) a matmul runs in get_autocast_dtype(NAME) and softmax (float32-listed) in float32")
def autocast(b):
    if not torch.amp.is_autocast_available(b.name):
        raise NotSupported(f"torch.amp.is_autocast_available({b.name!r}) is False")
    try:
        supported = b.module_function("get_amp_supported_dtype")()
    except NotSupported as missing:  # torch.autocast's AssertionError (autocast_mode.py)
        raise NotSupported(f"{missing}, which torch.autocast requires of a PrivateUse1 backend") from None
    low = torch.get_autocast_dtype(b.name)
    expect(low in (torch.float16, torch.bfloat16),
           f"get_autocast_dtype({b.name!r}) is {low}, not a lower-precision floating dtype")
    expect(low in supported, f"get_autocast_dtype({b.name!r}) is {low}, which torch.{b.name}.get_amp_supported_dtype() "
                             f"({supported}) lacks: autocast would disable itself")
    a = torch.randn(16, 32, generator=torch.Generator().manual_seed(0))
    w = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
    da, dw = a.to(b.device()), w.to(b.device())
    with torch.autocast(b.name):
        product = da @ dw
        # CUDA's policy (ATen/autocast_mode.h) lists softmax among the ops that run in float32.
        probabilities = torch.softmax(product, dim=-1)
    expect(product.device == b.device(), f"the matmul's result is on {product.device}")
    expect(product.dtype == low, f"under autocast the matmul's result is {product.dtype}, not {low}")
    expect(probabilities.dtype == torch.float32,
           f"under autocast softmax of a {low} tensor gives {probabilities.dtype}, not float32")
    outside = da @ dw
    expect(outside.dtype == torch.float32, f"after autocast a float32 matmul gives {outside.dtype}")
    _expect_close(product.float(), a.to(low).float() @ w.to(low).float(),
                  f"the autocast matmul (against CPU's from {low} operands)", rtol=1e-2, atol=1e-2)
    return f"matmul in {low}, softmax in float32"


# --- torch.compile


def _interface(b):
    from torch._dynamo.device_interface import get_interface_for_device

    try:
        return get_interface_for_device(b.name)
    except NotImplementedError as error:
        raise NotSupported(f"dynamo has no device interface for {b.name!r} ({first_line(error)})") from None


@check("dynamo's device interface for NAME is registered and agrees with torch.accelerator")
def compile_device_interface(b):
    interface = _interface(b)
    expect(interface.is_available(), "the interface's is_available() is False")
    count = interface.device_count()
    expect(count == torch.accelerator.device_count(),
           f"the interface's device_count() is {count}, torch.accelerator's {torch.accelerator.device_count()}")
    original = torch.accelerator.current_device_index()
    try:
        for i in range(b.device_count):
            torch.accelerator.set_device_index(i)
            now = interface.current_device()
            expect(now == i, f"after torch.accelerator.set_device_index({i}) the interface's current_device() is {now}")
            interface.set_device(b.device_count - 1 - i)
            now = torch.accelerator.current_device_index()
            expect(now == b.device_count - 1 - i,
                   f"after the interface's set_device({b.device_count - 1 - i}) the current device is {now}")
    finally:
        torch.accelerator.set_device_index(original)
    t = torch.ones(1 << 12, device=b.device()) * 3
    interface.synchronize()
    expect(t.sum().item() == 3 * (1 << 12), "work before the interface's synchronize() gave a wrong result")
    return f"{interface.__name__}: {count} devices, current device and synchronize agree"


def _compiled_step(x, w):
    y = torch.tanh(x @ w) * 2 - x[:, : w.shape[1]]
    return y.softmax(dim=-1), y.sum(dim=0)


@check("torch.compile with backend='eager' and 'aot_eager' gives eager's results and gradients on the device")
def compile_eager(b):
    import torch._dynamo

    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(0)).to(b.device())
    w = torch.randn(8, 5, generator=torch.Generator().manual_seed(1)).to(b.device())

    def run(function):
        wx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
        outputs = function(wx, ww)
        (outputs[0].sum() * 3 + outputs[1].pow(2).sum()).backward()
        return [*outputs, wx.grad, ww.grad]

    want = run(_compiled_step)
    for backend in ("eager", "aot_eager"):
        torch._dynamo.reset()
        got = run(torch.compile(_compiled_step, backend=backend, fullgraph=True))
        for index, (g, e) in enumerate(zip(got, want)):
            expect(g.device == b.device(), f"backend={backend!r}: result {index} is on {g.device}")
            _expect_close(g, e, f"backend={backend!r}: result {index} (against eager)")
    torch._dynamo.reset()
    return "eager and aot_eager: outputs and gradients equal eager's"


def _inductor_generates_code_for(name: str) -> bool:
    """Whether Inductor has code generation registered for the device type
    (register_backend_for_device, or the device module's _inductor_backend_init
    hook, which Inductor runs here as it does before compiling)."""
    from torch._inductor.codegen.common import get_scheduling_for_device, init_backend_registration

    init_backend_registration()
    return get_scheduling_for_device(name) is not None


@check("torch.compile with Inductor (the default backend) gives eager's results on the device",
       isolated=True, full_only=True, timeout_s=600)
def compile_inductor(b):
    import torch._dynamo

    if not _inductor_generates_code_for(b.name):
        raise NotSupported(f"Inductor has no code generation registered for {b.name!r} "
                           f"(torch._inductor.codegen.common.register_backend_for_device)")
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(0)).to(b.device())
    w = torch.randn(8, 5, generator=torch.Generator().manual_seed(1)).to(b.device())
    want = _compiled_step(x, w)
    # A cache of this run's own: a kernel compiled by an earlier run is not evidence.
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        try:
            torch._dynamo.reset()
            got = torch.compile(_compiled_step, fullgraph=True)(x, w)
            torch.accelerator.synchronize()
            generated = [name for _, _, names in os.walk(cache) for name in names if name.endswith(".py")]
            expect(generated, "Inductor compiled without writing a module of generated code")
        finally:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR")
            if previous is not None:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous
    for index, (g, e) in enumerate(zip(got, want)):
        expect(g.device == b.device(), f"result {index} is on {g.device}")
        _expect_close(g, e, f"result {index} (against eager)", rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()
    return "Inductor's outputs equal eager's"


# --- torch.accelerator.Graph


@check("a torch.accelerator.Graph captured on a stream replays its ops, reading a changed static input")
def graph(b):
    try:
        captured = torch.accelerator.Graph()
    except RuntimeError as error:
        if "Graph is not supported on device type" in str(error):
            raise NotSupported(f"torch.accelerator.Graph: {first_line(error)}") from None
        raise
    static_input = torch.ones(256, device=b.device())
    torch.accelerator.synchronize()
    stream = torch.Stream(device=b.device())
    with stream, captured:
        hidden = torch.relu(static_input * 2 - 3)
        total = hidden.sum()
    for step, values in enumerate((torch.full((256,), 4.0), torch.arange(256.0))):
        static_input.copy_(values.to(b.device()))
        captured.replay()
        torch.accelerator.synchronize()
        want = torch.relu(values * 2 - 3)
        expect(torch.equal(hidden.cpu(), want), f"replay {step}: the captured relu's output is not the new input's")
        expect(total.item() == want.sum().item(),
               f"replay {step}: the captured sum is {total.item()}, not {want.sum().item()}")
    captured.reset()
    return "2 replays, each after a new static input, computed from it"


# --- profiler


@check("torch.profiler with ProfilerActivity.PrivateUse1 records device events, charged to the ops that ran them")
def profiler(b):
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    if ProfilerActivity.PrivateUse1 not in torch.profiler.supported_activities():
        raise NotSupported("torch.profiler.supported_activities() lacks ProfilerActivity.PrivateUse1")
    x = torch.randn(128, 128).to(b.device())
    torch.accelerator.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        for _ in range(3):
            torch.relu(x @ x)
        torch.accelerator.synchronize()
    device_events = [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]
    charged = [e for e in prof.events() if e.device_type == DeviceType.CPU and e.self_device_time_total > 0]
    # supported_activities() lists PrivateUse1 for every registered backend, and
    # torch offers no query for the profiler a backend registers (Kineto's
    # PrivateUse1ProfilerRegistry, or the legacy profiler stubs): a profile
    # with no device activity at all is the sign that there is none.
    if not device_events and not charged:
        raise NotSupported("the profiler recorded no device activity at all: the backend registers no profiler "
                           "for the device")
    expect(device_events, "ops were charged device time, but no event on the device was recorded")
    bad_index = sorted({e.device_index for e in device_events} - set(range(b.device_count)))
    expect(not bad_index, f"device events name device indices {bad_index}")
    negative = [e.name for e in device_events if e.time_range.elapsed_us() < 0]
    expect(not negative, f"device events with a negative duration: {', '.join(negative[:3])}")
    matmul_time = sum(e.self_device_time_total for e in prof.key_averages() if e.key == "aten::mm")
    expect(matmul_time > 0, "aten::mm is charged no device time")
    return f"{len(device_events)} device events; aten::mm charged {matmul_time:.0f} us of device time"


# --- torch.multiprocessing


def _sharing_child(module, inbox, outbox) -> None:
    """A spawned process: receives a device tensor, reports it, doubles it in place."""
    try:
        _import_backend(module)
        t = inbox.get()
        outbox.put(("received", str(t.device), t.sum().item()))
        t.mul_(2)
        torch.accelerator.synchronize()
        outbox.put(("written",))
    except BaseException as error:  # noqa: B902 - reported to the parent
        outbox.put(("raised", first_line(error)))


@check("a device tensor put on a torch.multiprocessing spawn-context queue arrives in the child on its device, "
       "and the child's in-place write is seen by the sender", isolated=True, timeout_s=180)
def multiprocessing(b):
    import torch.multiprocessing as mp

    device = b.device(b.device_count - 1)
    sent = torch.arange(1024, dtype=torch.float32, device=device)
    context = mp.get_context("spawn")
    inbox, outbox = context.SimpleQueue(), context.Queue()
    child = context.Process(target=_sharing_child, args=(b.import_name, inbox, outbox), daemon=True)
    child.start()
    try:
        try:
            inbox.put(sent)  # a SimpleQueue pickles here, in the caller: a refusal raises here
        except RuntimeError as error:
            # torch's storage reduction, for a storage of a device without its own (reductions.py).
            if "only available on CPU" in str(error):
                raise NotSupported(f"torch.multiprocessing cannot share {b.name} tensors: "
                                   f"{first_line(error)}") from None
            raise
        messages = [outbox.get(timeout=_CHILD_TIMEOUT_S)]
        if messages[0][0] == "received":
            messages.append(outbox.get(timeout=_CHILD_TIMEOUT_S))
        raised = [m[1] for m in messages if m[0] == "raised"]
        expect(not raised, f"the child raised {raised[0] if raised else ''}")
        _, where, total = messages[0]
        expect(where == str(device), f"the tensor arrived on {where}, not {device}")
        expect(total == float(sum(range(1024))), f"the child read a sum of {total}, not {sum(range(1024))}")
        torch.accelerator.synchronize()
        expect(torch.equal(sent.cpu(), torch.arange(1024, dtype=torch.float32) * 2),
               "after the child doubled the received tensor the sender's tensor is unchanged (not shared)")
        child.join(_CHILD_TIMEOUT_S)
        expect(child.exitcode == 0, f"the child exited with {child.exitcode}")
    finally:
        if child.is_alive():
            child.kill()
            child.join()
    return f"shared on {device}: the child read it and its write reached the sender"


# --- torch.distributed


def _distributed_rank(rank, world_size, module, device_type, init_file) -> None:
    """A spawned rank: all_reduce (sum) of rank + 1 on its device."""
    _import_backend(module)
    import torch.distributed as dist

    backend = dist.Backend.default_device_backend_map[device_type]
    dist.init_process_group(f"{device_type}:{backend}", init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=60))
    try:
        device = torch.device(device_type, rank % torch.accelerator.device_count())
        t = torch.full((1000,), float(rank + 1), device=device)
        dist.all_reduce(t)
        want = float(sum(range(1, world_size + 1)))
        if t.device != device:
            raise AssertionError(f"rank {rank}: the reduced tensor moved to {t.device}")
        if not torch.equal(t.cpu(), torch.full((1000,), want)):
            raise AssertionError(f"rank {rank}: all_reduce gave {t[:3].tolist()}..., not {want}")
        dist.barrier()
    finally:
        dist.destroy_process_group()


@check("the torch.distributed backend registered for NAME all_reduces device tensors across 2 spawned ranks",
       isolated=True, timeout_s=180)
def distributed(b):
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available():
        raise NotSupported("torch.distributed is not available in this build of torch")
    backend = dist.Backend.default_device_backend_map.get(b.name)
    if backend is None:
        raise NotSupported(f"torch.distributed.Backend.default_device_backend_map has no backend for {b.name!r}")
    world_size = 2
    with tempfile.TemporaryDirectory() as directory:
        try:
            mp.start_processes(_distributed_rank, args=(world_size, b.import_name, b.name,
                                                        os.path.join(directory, "store")),
                               nprocs=world_size, join=True, start_method="spawn")
        except mp.ProcessRaisedException as error:
            lines = [line for line in str(error).strip().splitlines() if line.strip()]
            raise Failed(f"a rank raised: {lines[-1].strip() if lines else error}") from None
        except mp.ProcessExitedException as error:
            raise Failed(f"a rank died: {first_line(error)}") from None
    return f"{backend}: all_reduce over {world_size} ranks gave the sum on each rank's device"
