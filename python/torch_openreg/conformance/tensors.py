"""Tensors and modules on the device: copies in every direction, save and
load, views, `Module.to`, training parity with CPU, and the methods torch
generates for a PrivateUse1 backend (`Tensor.NAME()`, `Tensor.is_NAME`).

Copies are exact: the bits arrive, NaN, infinities and -0.0 included, from
and into non-contiguous tensors, with non_blocking=True as well (followed by
a synchronize). `Module.to` keeps Parameter objects, as on CUDA, so tied
weights stay tied and an optimizer built before the move updates the moved
parameters.
"""

from __future__ import annotations

import copy
import io

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_openreg.conformance._api import Failed, check, expect
from torch_openreg.conformance.memory import pinned_memory_missing

AREA = "tensors"

_DTYPES = (torch.float32, torch.float64, torch.int64, torch.bool, torch.complex64,
           torch.bfloat16, torch.float16, torch.uint8)

# Floating dtypes are compared through an integer view of the same width: bit for bit.
_BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
         torch.float64: torch.int64, torch.complex64: torch.int64}

# Views of a 2-D tensor that copies read from.
_LAYOUTS = {
    "contiguous": lambda t: t,
    "transposed": lambda t: t.t(),
    "sliced": lambda t: t[1:5, 2::3],
    "offset": lambda t: t.view(-1)[7:-3],
    "expanded": lambda t: t[:1].expand(4, -1),
}


def _shapes(b) -> tuple:
    # Small, and past the size where a backend may copy in chunks or another way.
    return ((6, 10), (96, 130), (256, 300)) if b.full else ((6, 10), (96, 130))


def _source(dtype: torch.dtype, shape: tuple = (6, 10)) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype == torch.uint8:
        return torch.randint(0, 256, shape, generator=g, dtype=dtype)
    if dtype == torch.int64:
        return torch.randint(-(1 << 62), 1 << 62, shape, generator=g, dtype=dtype)
    values = torch.randn(shape, generator=g, dtype=torch.float64) * 100
    values.view(-1)[:4] = torch.tensor([float("inf"), float("-inf"), float("nan"), -0.0], dtype=torch.float64)
    if dtype.is_complex:
        return torch.complex(values.float(), values.flip(0).float())
    return values.to(dtype)


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    got = got.cpu()
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    if want.dtype in _BITS:
        bits = _BITS[want.dtype]
        return torch.equal(got.contiguous().view(bits), want.contiguous().view(bits))
    return torch.equal(got, want)


def _synchronize_all(b) -> None:
    for i in range(b.device_count):
        torch.accelerator.synchronize(i)


def _copies(b, make, target) -> int:
    """Runs the copies `make(base, view, non_blocking)` yields, as (what, result)
    pairs, for each dtype, shape, layout and blocking mode; each result must be on
    `target` and equal `view(base)`. Returns how many ran."""
    wrong = []
    count = 0
    for dtype, shape in ((dtype, shape) for dtype in _DTYPES for shape in _shapes(b)):
        base = _source(dtype, shape)
        for layout, view in _LAYOUTS.items():
            for non_blocking in (False, True):
                results = list(make(base, view, non_blocking))
                _synchronize_all(b)
                for what, result in results:
                    count += 1
                    case = f"{what} {dtype} {shape} {layout}{' non_blocking' if non_blocking else ''}"
                    if result.device != target:
                        wrong.append(f"{case}: landed on {result.device}")
                    elif not _same(result, view(base)):
                        wrong.append(f"{case}: values differ")
    if wrong:
        raise Failed(f"{len(wrong)} of {count} copies wrong, e.g. " + "; ".join(wrong[:3]))
    return count


def _into_transposed(like: torch.Tensor, device) -> torch.Tensor:
    """An empty destination shaped like `like` whose strides are the transpose of contiguous ones."""
    shape = like.shape
    if len(shape) != 2:
        return torch.empty(shape, dtype=like.dtype, device=device)
    return torch.empty(shape[1], shape[0], dtype=like.dtype, device=device).t()


@check("copies CPU -> device and device -> CPU (to, copy_, into transposed destinations) are exact for 8 dtypes, "
       "contiguous and non-contiguous sources, blocking and non_blocking")
def copy_host_device(b):
    # torch pins the destination of .to("cpu", non_blocking=True) from the device: without pinned memory
    # (memory.pinned says so) that one copy is left out.
    no_pinned = pinned_memory_missing()
    total = 0
    for i in range(b.device_count):
        device = b.device(i)

        def host_to_device(base, view, non_blocking):
            source = view(base)
            yield "to(device)", source.to(device, non_blocking=non_blocking)
            yield "copy_ into device", torch.empty(source.shape, dtype=source.dtype, device=device).copy_(
                source, non_blocking=non_blocking)
            yield "copy_ into transposed device", _into_transposed(source, device).copy_(
                source, non_blocking=non_blocking)

        def device_to_host(base, view, non_blocking):
            source = view(base.to(device))
            if not (non_blocking and no_pinned):
                yield "to(cpu)", source.to("cpu", non_blocking=non_blocking)
            yield "copy_ into cpu", torch.empty(source.shape, dtype=source.dtype).copy_(
                source, non_blocking=non_blocking)
            yield "copy_ into transposed cpu", _into_transposed(source, "cpu").copy_(source, non_blocking=non_blocking)

        total += _copies(b, host_to_device, device)
        total += _copies(b, device_to_host, torch.device("cpu"))
    left_out = "; no pinned memory, so no .to('cpu', non_blocking=True)" if no_pinned else ""
    return f"{total} copies exact on {b.device_count} device(s){left_out}"


@check("copies within one device (clone, copy_, to(copy=True), into transposed destinations) are exact "
       "for 8 dtypes and non-contiguous sources, blocking and non_blocking")
def copy_same_device(b):
    total = 0
    for i in range(b.device_count):
        device = b.device(i)

        def within(base, view, non_blocking):
            source = view(base.to(device))
            yield "clone", source.clone()
            yield "to(copy=True)", source.to(device, copy=True, non_blocking=non_blocking)
            yield "copy_", torch.empty(source.shape, dtype=source.dtype, device=device).copy_(
                source, non_blocking=non_blocking)
            yield "copy_ into transposed", _into_transposed(source, device).copy_(source, non_blocking=non_blocking)

        total += _copies(b, within, device)
    return f"{total} copies exact on {b.device_count} device(s)"


@check("copies between two devices (to, copy_, with either device current) are exact for 8 dtypes "
       "and non-contiguous sources, blocking and non_blocking")
def copy_between_devices(b):
    b.require_devices(2)
    total = 0
    for i, j in ((0, 1), (1, 0)):
        source_device, target = b.device(i), b.device(j)

        def across(base, view, non_blocking):
            source = view(base.to(source_device))
            yield "to", source.to(target, non_blocking=non_blocking)
            yield "copy_", torch.empty(source.shape, dtype=source.dtype, device=target).copy_(
                source, non_blocking=non_blocking)
            yield "copy_ into transposed", _into_transposed(source, target).copy_(source, non_blocking=non_blocking)
            for current in (i, j):
                with torch.accelerator.device_index(current):
                    yield f"to under device_index({current})", source.to(target, non_blocking=non_blocking)

        total += _copies(b, across, target)
    return f"{total} copies exact, {b.device(0)} <-> {b.device(1)}"


@check("a copy from pageable CPU memory, blocking or non_blocking=True (which torch says has no effect then), "
       "has read its source when it returns; a blocking copy_ to the CPU has filled its destination")
def pageable_copies(b):
    n = (1 << 22) if b.full else (1 << 18)
    values = torch.arange(n, dtype=torch.float32)
    for i in range(b.device_count):
        device = b.device(i)
        for non_blocking in (False, True):
            source = values.clone()
            on_device = source.to(device, non_blocking=non_blocking)
            source.fill_(-1.0)  # a copy still reading its source would pick this up
            expect(torch.equal(on_device.cpu(), values), f"overwriting a pageable source right after "
                                                         f"to({device}, {non_blocking=}) changed the copy")
        destination = torch.zeros(n)
        destination.copy_(on_device * 2)
        # No synchronize: a blocking copy is complete when it returns.
        expect(torch.equal(destination, values * 2), f"CPU tensor.copy_(a tensor on {device}) returned before "
                                                     f"filling the destination")
    return f"{n} floats on {b.device_count} device(s)"


def _check_loaded(loaded: dict, saved: dict, device, how: str) -> None:
    for key, tensor in saved.items():
        got = loaded[key]
        expect(got.device == device, f"{how} put {key!r} on {got.device}, not {device}")
        expect(_same(got, tensor.cpu()) and got.stride() == tensor.stride(),
               f"{how} changed {key!r}'s values or strides")
    base, view = loaded["base"], loaded["view"]
    expect(view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr(),
           f"after {how} the view no longer shares its base's storage")
    view.fill_(-5)
    expect(base[1, 0].item() == -5, f"after {how} writing through the view does not reach the base")


@check("torch.save of device tensors, views and a state_dict loads without map_location onto the original "
       "device, with map_location='cpu' or any device there, values exact and views sharing storage")
def save_load(b):
    loads = 0
    for i in range(b.device_count):
        device = b.device(i)
        base = torch.arange(24, dtype=torch.float32, device=device).view(4, 6)
        saved = {"base": base, "view": base[1:3, ::2], "other": _source(torch.float64).to(device)}
        buffer = io.BytesIO()
        torch.save(saved, buffer)
        targets = [(None, device), ("cpu", torch.device("cpu"))] + [(b.device(j), b.device(j))
                                                                    for j in range(b.device_count)]
        for map_location, lands in targets:
            buffer.seek(0)
            how = "torch.load without map_location" if map_location is None else \
                f"torch.load(map_location={str(map_location)!r})"
            _check_loaded(torch.load(buffer, map_location=map_location), saved, lands, how)
            loads += 1

        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4)).to(device)
        model(torch.randn(8, 5, device=device))  # moves the running statistics off their initial values
        buffer = io.BytesIO()
        torch.save(model.state_dict(), buffer)
        for map_location, lands in ((None, device), ("cpu", torch.device("cpu"))):
            buffer.seek(0)
            state = torch.load(buffer, map_location=map_location)
            for key, value in model.state_dict().items():
                expect(state[key].device == lands and _same(state[key], value.cpu()),
                       f"state_dict entry {key!r} saved on {device} loaded ({map_location=}) as {state[key].device} "
                       f"or with other values")
            restored = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4)).to(lands)
            restored.load_state_dict(state)
            loads += 1
    return f"{loads} loads from {b.device_count} device(s)"


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return torch.allclose(got.detach().cpu(), want.detach(), rtol=1e-4, atol=1e-5)


class _Tied(nn.Module):
    """An embedding whose weight is also the output layer's."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(12, 8)
        self.output = nn.Linear(8, 12, bias=False)
        self.output.weight = self.embedding.weight

    def forward(self, tokens):
        return self.output(torch.tanh(self.embedding(tokens)))


@check("Module.to(device) keeps each Parameter object, tied weights stay one Parameter accumulating both "
       "gradients, and an optimizer built before .to updates the moved parameters as on CPU")
def module_to_parameters(b):
    overwrite = torch.__future__.get_overwrite_module_params_on_conversion()
    expect(not overwrite, "torch.__future__.get_overwrite_module_params_on_conversion() is True "
                          "(set by someone; Module.to then replaces Parameters everywhere)")
    for i in range(b.device_count):
        device = b.device(i)
        torch.manual_seed(0)
        model = _Tied()
        reference = copy.deepcopy(model)
        before = list(model.parameters())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        model.to(device)
        after = list(model.parameters())
        expect(len(after) == len(before) and all(p is q for p, q in zip(before, after)),
               f"Module.to({device}) replaced Parameter objects (torch._has_compatible_shallow_copy_type is False "
               f"between CPU tensors and the backend's)")
        expect(all(p.device == device for p in after), f"Module.to({device}) left parameters on "
                                                       f"{sorted({str(p.device) for p in after})}")
        expect(model.output.weight is model.embedding.weight, f"after Module.to({device}) the tied weights are "
                                                              f"two Parameters")

        tokens = torch.tensor([[1, 4, 7], [2, 4, 11]])
        reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
        for m, opt, t in ((model, optimizer, tokens.to(device)), (reference, reference_optimizer, tokens)):
            F.cross_entropy(m(t).flatten(0, 1), t.flatten()).backward()
        expect(_close(model.embedding.weight.grad, reference.embedding.weight.grad),
               f"on {device}, the tied weight's gradient differs from CPU's (both uses accumulate into it there)")
        start = model.embedding.weight.detach().cpu()
        optimizer.step()
        reference_optimizer.step()
        expect(not torch.equal(model.embedding.weight.detach().cpu(), start),
               f"an optimizer built before Module.to({device}) did not change the moved parameters")
        expect(_close(model.embedding.weight, reference.embedding.weight),
               f"after optimizer.step() the moved parameters on {device} differ from CPU's")
    return f"{b.device_count} device(s)"


@check("Module.to(device) moves buffers (BatchNorm running statistics, updated there in training) and "
       "a lazy module moved before its first forward materializes on the device")
def module_buffers_and_lazy(b):
    for i in range(b.device_count):
        device = b.device(i)
        norm = nn.BatchNorm1d(4)
        reference = copy.deepcopy(norm)
        norm.to(device)
        for name, buffer in norm.named_buffers():
            expect(buffer.device == device, f"after BatchNorm1d.to({device}) buffer {name} is on {buffer.device}")
        x = torch.randn(16, 4) * 3 + 1
        norm(x.to(device))
        reference(x)
        for (name, got), (_, want) in zip(norm.named_buffers(), reference.named_buffers()):
            expect(got.device == device and _close(got.float(), want.float()),
                   f"after a training forward on {device}, BatchNorm1d's {name} is {got.cpu().tolist()}, "
                   f"on CPU {want.tolist()}")

        lazy = nn.LazyLinear(3).to(device)
        out = lazy(torch.randn(2, 5, device=device))
        expect(not isinstance(lazy.weight, nn.parameter.UninitializedParameter),
               "LazyLinear's weight is still uninitialized after its first forward")
        expect(lazy.weight.device == device and lazy.bias.device == device and out.device == device,
               f"a LazyLinear moved to {device} materialized on {lazy.weight.device} "
               f"(output on {out.device})")
        expect(lazy.weight.shape == (3, 5), f"LazyLinear materialized with weight shape {tuple(lazy.weight.shape)}")
    return f"{b.device_count} device(s)"


@check("a small model built on CPU, moved with .to(device) and trained 3 SGD steps (momentum) equals "
       "the same training on CPU (float32 tolerances)")
def train_matches_cpu(b):
    steps = 10 if b.full else 3
    for i in range(b.device_count):
        device = b.device(i)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.LayerNorm(32), nn.Linear(32, 4))
        reference = copy.deepcopy(model)
        model.to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
        for step in range(steps):
            x, y = torch.randn(8, 16), torch.randn(8, 4)
            losses = []
            for m, opt, inputs, targets in ((model, optimizer, x.to(device), y.to(device)),
                                            (reference, reference_optimizer, x, y)):
                opt.zero_grad()
                loss = F.mse_loss(m(inputs), targets)
                loss.backward()
                opt.step()
                losses.append(loss.detach().cpu())
            expect(_close(losses[0], losses[1]), f"step {step} on {device}: loss {losses[0].item()}, "
                                                 f"CPU {losses[1].item()}")
        for (name, got), (_, want) in zip(model.named_parameters(), reference.named_parameters()):
            expect(_close(got, want), f"after {steps} steps on {device}, parameter {name} differs from CPU's "
                                      f"by up to {(got.detach().cpu() - want.detach()).abs().max().item():.3g}")
    return f"{steps} steps on {b.device_count} device(s)"


# In-place writes through views of a (4, 6) float32 tensor; each must reach the base.
_VIEW_WRITES = {
    "select": lambda t: t[1].add_(100),
    "slice": lambda t: t[:, 2:4].mul_(2),
    "transpose": lambda t: t.t()[0].fill_(-1),
    "view with step": lambda t: t.view(2, 12)[1, ::5].sub_(7),
    "narrow": lambda t: t.narrow(1, 3, 2).zero_(),
    "diagonal": lambda t: t.diagonal().add_(0.5),
    "unsqueeze/squeeze": lambda t: t.unsqueeze(0).squeeze(0)[3].copy_(torch.full((6,), 9.0, device=t.device)),
    "as_strided": lambda t: t.as_strided((2, 2), (7, 1), 1).neg_(),
    "view(dtype)": lambda t: t.view(torch.int32)[0, 0].fill_(0x3F800000),  # the bits of 1.0
}


@check("views on the device share their base's storage: in-place writes through select, slice, transpose, "
       "view, narrow, diagonal, as_strided and view(dtype) reach the base, and writes to the base reach views")
def views_share_storage(b):
    for i in range(b.device_count):
        device = b.device(i)
        base = torch.arange(24, dtype=torch.float32, device=device).view(4, 6)
        expected = torch.arange(24, dtype=torch.float32).view(4, 6)
        for name, write in _VIEW_WRITES.items():
            view = write(base)
            write(expected)
            expect(view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr(),
                   f"a {name} view on {device} has its own storage")
            expect(view.data_ptr() == base.data_ptr() + view.storage_offset() * view.element_size(),
                   f"a {name} view's data_ptr on {device} does not match its storage offset")
            expect(_same(base, expected), f"writing through a {name} view on {device} did not reach the base "
                                          f"as on CPU")
        row = base[2]
        base.add_(1)
        expect(_same(row, expected[2] + 1), f"an in-place write to the base on {device} did not reach a view of it")
    return f"{len(_VIEW_WRITES)} kinds of view on {b.device_count} device(s)"


@check("Tensor.NAME(), Tensor.is_NAME, Module.NAME() and PackedSequence.NAME() exist "
       "(torch.utils.generate_methods_for_privateuse1_backend) and move to the device")
def generated_methods(b):
    from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

    name, is_name = b.name, f"is_{b.name}"
    # Generating these is a step of registering a backend (torch's rename_privateuse1_backend docs), what CUDA
    # code's .cuda()/.is_cuda become; torch's storage methods are optional (for_storage=False by default).
    wanted = [(torch.Tensor, name), (torch.Tensor, is_name), (nn.Module, name),
              (PackedSequence, name), (PackedSequence, is_name)]
    missing = [f"{owner.__name__}.{attribute}" for owner, attribute in wanted if not hasattr(owner, attribute)]
    expect(not missing, f"{', '.join(missing)} missing: torch.utils.generate_methods_for_privateuse1_backend() "
                        f"was not called (or not for all of them)")
    t = torch.ones(3)
    expect(getattr(t, is_name) is False, f"a CPU tensor's {is_name} is {getattr(t, is_name)!r}")
    moved = getattr(t, name)()
    current = b.device(torch.accelerator.current_device_index())
    expect(moved.device == current and getattr(moved, is_name) is True,
           f"Tensor.{name}() gave a tensor on {moved.device} with {is_name} {getattr(moved, is_name)!r}")
    for i in range(b.device_count):
        expect(getattr(t, name)(i).device == b.device(i), f"Tensor.{name}({i}) is not on {b.device(i)}")
        module = nn.Linear(2, 2)
        expect(getattr(module, name)(i) is module and module.weight.device == b.device(i),
               f"Module.{name}({i}) did not move the module in place to {b.device(i)}")
    packed = pack_padded_sequence(torch.randn(3, 2, 4), [3, 2])
    moved_packed = getattr(packed, name)()
    expect(getattr(moved_packed, is_name) and moved_packed.data.device.type == name,
           f"PackedSequence.{name}() left its data on {moved_packed.data.device}")
    storage = "no storage methods (optional)"
    if hasattr(torch.UntypedStorage, name):
        moved_storage = getattr(t.untyped_storage(), name)(b.device_count - 1)
        expect(getattr(moved_storage, is_name) and moved_storage.device == b.device(b.device_count - 1),
               f"UntypedStorage.{name}({b.device_count - 1}) is on {moved_storage.device}")
        storage = "storage methods too"
    return f"Tensor, Module and PackedSequence methods; {storage}"
