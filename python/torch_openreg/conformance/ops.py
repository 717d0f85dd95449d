"""Ops against CPU, over PyTorch's own databases: op_db's samples give CPU's
results on the device, module_db's modules give CPU's outputs and gradients,
and the device supports the dtypes op_db declares for CUDA (and refuses the
ones CUDA refuses).

An op the device does not implement (NotImplementedError where CPU returns)
is counted as unsupported and fails nothing: CUDA lacks ops too. Values are
compared at PyTorch's own device-vs-CPU tolerances (rtol = atol = 1e-3, as
test_compare_cpu in PyTorch's test/test_ops.py), NaN equal to NaN. Results
are compared by device, dtype and shape only where op_db or module_db skips
its own device-vs-CPU test for the op or module on this device type (random
or uninitialized results, undefined outputs, a known difference on every
device), and where a sample that differs draws random numbers on CPU (an
operator tagged nondeterministic_seeded runs): the device draws its own.

Note [Ops in forked children]
Each op and module runs in a forked child, so a crash or a hang costs one op,
not the check. A backend, like CUDA, may refuse forked children of a process
that has used the device: the checks never touch the device in this process,
and the first child is a probe; where it cannot use the device, every unit
runs in this process instead (and a crash ends the check). The check
functions import op_db (torch_openreg._op_db.load_op_db, which evaluates
op_db's GPU-dependent CUDA dtypes as on a current GPU) when they run.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import select
import signal
import time
import warnings
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torch_openreg.conformance._api import check, expect, first_line

AREA = "ops"

# PyTorch's own tolerances for comparing a device with the CPU (test_compare_cpu).
_TOLERANCE = {"rtol": 1e-3, "atol": 1e-3}
_QUICK_OPS = 50
_QUICK_MODULES = 15
_QUICK_DTYPE_OPS = 30
_QUICK_SAMPLES = 2
_UNIT_TIMEOUT_S = {False: 60.0, True: 180.0}  # per op or module: quick, full
_LISTED = 8  # names listed in a message; the rest are counted
_DETAIL_LIMIT = 300

# The dtypes an op is compared at in op_db and module_db: float32, or for an
# op without it, the first of these that both CPU and CUDA support.
_COMPARISON_DTYPES = (torch.float32, torch.int64, torch.bool, torch.complex64, torch.float64, torch.uint8)


# --- running units of work in forked children (Note [Ops in forked children])


def _fork(work: Callable[[], dict], timeout_s: float) -> dict:
    """`work()` in a forked child; its dict, or {"status": "differ", "detail":
    why} when it raised, crashed or ran past `timeout_s`."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running exit handlers
        os.close(read_end)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = work()
        except BaseException as error:  # noqa: B902 - the unit's failure
            result = {"status": "differ", "detail": f"raised {_short(error)}"}
        payload = json.dumps(result).encode()
        while payload:
            payload = payload[os.write(write_end, payload):]
        os._exit(0)
    os.close(write_end)
    chunks, deadline = [], time.monotonic() + timeout_s
    try:
        while True:
            ready, _, _ = select.select([read_end], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return {"status": "differ", "detail": f"timed out after {timeout_s:.0f} s"}
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return {"status": "differ", "detail": f"crashed ({signal.Signals(os.WTERMSIG(status)).name})"}
    if not chunks:
        return {"status": "differ", "detail": f"the child exited with status {os.WEXITSTATUS(status)}"}
    return json.loads(b"".join(chunks))


class _Units:
    """Runs units of work in forked children where the backend lets them use
    the device, else in this process."""

    def __init__(self, b):
        self.timeout_s = _UNIT_TIMEOUT_S[b.full]

        def probe() -> dict:
            return {"status": "ok", "detail": str(torch.ones(2, device=b.device()).add(1).sum().item())}

        outcome = _fork(probe, self.timeout_s)
        self.forked = outcome == {"status": "ok", "detail": "4.0"}
        self.note = "" if self.forked else f" (in one process: a forked child could not use the device: " \
                                           f"{outcome['detail'][:120]})"

    def run(self, work: Callable[[], dict]) -> dict:
        if self.forked:
            return _fork(work, self.timeout_s)
        try:
            return work()
        except Exception as error:  # noqa: B902 - the unit's failure
            return {"status": "differ", "detail": f"raised {_short(error)}"}


# --- PyTorch's databases


def _op_db() -> list:
    """op_db, ordered by name and variant."""
    from torch_openreg._op_db import load_op_db

    return sorted(load_op_db(), key=_label)


def _module_db() -> list:
    _op_db()  # common_modules imports op_db, which must be built by load_op_db first
    from torch.testing._internal.common_modules import module_db

    return sorted(module_db, key=lambda info: info.name)


def _label(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def _spread(items: list, count: int, full: bool) -> list:
    """All items (full), or `count` of them evenly spread from the first: the same every run."""
    if full or len(items) <= count:
        return items
    return [items[i * len(items) // count] for i in range(count)]


def _skipped_by_pytorch(info, test_class: str, test_name: str, device_type: str, dtype) -> bool:
    """Whether the database skips PyTorch's own test `test_class.test_name`
    for `info` on this device type and dtype, or expects it to fail: a
    decorator marks the test as unittest does (__unittest_skip__,
    __unittest_expecting_failure__)."""

    def test():
        pass

    for decoration in info.decorators:
        if not hasattr(decoration, "is_active") or not decoration.is_active(test_class, test_name, device_type,
                                                                            dtype, {}):
            continue
        for decorator in decoration.decorators:
            marked = decorator(test)
            if getattr(marked, "__unittest_skip__", False) or getattr(marked, "__unittest_expecting_failure__", False):
                return True
    return False


def _comparison_dtype(op):
    both = set(op.supported_dtypes("cpu")) & set(op.supported_dtypes("cuda"))
    return next((dtype for dtype in _COMPARISON_DTYPES if dtype in both), None)


# --- moving samples and comparing results


def _map(value, function):
    """`value` with `function` applied to every leaf of its lists, tuples and dicts."""
    if isinstance(value, list):
        return [_map(v, function) for v in value]
    if isinstance(value, tuple):
        mapped = [_map(v, function) for v in value]
        return type(value)(*mapped) if hasattr(value, "_fields") else type(value)(mapped)
    if isinstance(value, dict):
        return {k: _map(v, function) for k, v in value.items()}
    return function(value)


def _leaves(value) -> list:
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in _leaves(v)]
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    return [value]


def _names_device(value, device_type: str) -> bool:
    if isinstance(value, torch.device):
        return value.type == device_type
    if isinstance(value, str) and value.split(":")[0] == device_type:
        return True
    return False


def _on_host(sample, device_type: str):
    """The sample's tensors copied to the CPU, and device arguments naming the
    device under test naming the CPU (as test_compare_cpu's transform)."""

    def host(value):
        if isinstance(value, torch.Tensor):
            with torch.no_grad():
                return value.detach().to("cpu").requires_grad_(value.requires_grad)
        return torch.device("cpu") if _names_device(value, device_type) else value

    return _map((sample.input, sample.args, sample.kwargs), host)


def _result_device_type(sample, device_type: str) -> str:
    """Where the sample's results belong: on the device it names (a factory
    op's device=, or "cpu" in a sample of to or empty_like), else on the
    device of its tensors, else (a factory op) on the default device, the CPU."""
    leaves = _leaves((sample.input, sample.args, sample.kwargs))
    named = [v for v in leaves if isinstance(v, torch.device)] + \
            ([sample.kwargs["device"]] if sample.kwargs.get("device") is not None else [])
    if named:
        return torch.device(named[-1]).type
    on_device = any(isinstance(v, torch.Tensor) and v.device.type == device_type for v in leaves)
    return device_type if on_device else "cpu"


def _difference(got, want, device_type: str, values: bool) -> str | None:
    """How the device's result `got` differs from CPU's `want`, or None;
    the device's tensors belong on `device_type`."""
    got_leaves, want_leaves = _leaves(got), _leaves(want)
    if len(got_leaves) != len(want_leaves):
        return f"{len(got_leaves)} results where CPU gives {len(want_leaves)}"
    for index, (g, w) in enumerate(zip(got_leaves, want_leaves)):
        where = f"result {index}" if len(want_leaves) > 1 else "the result"
        if isinstance(w, torch.Tensor):
            if not isinstance(g, torch.Tensor):
                return f"{where} is a {type(g).__name__}, not a tensor"
            if g.device.type != device_type:
                return f"{where} is on {g.device}"
            if (g.dtype, g.shape) != (w.dtype, w.shape):
                return f"{where} is {g.dtype} {tuple(g.shape)}, CPU's {w.dtype} {tuple(w.shape)}"
            g = g.detach().cpu()
        elif isinstance(g, torch.Tensor):
            return f"{where} is a tensor, CPU's a {type(w).__name__}"
        if not values:
            continue
        try:
            torch.testing.assert_close(g, w.detach() if isinstance(w, torch.Tensor) else w, equal_nan=True,
                                       **_TOLERANCE)
        except (AssertionError, TypeError, ValueError) as error:
            if isinstance(w, torch.Tensor) or g != w:
                return f"{where}: {' '.join(str(error).split())[:200]}"
    return None


def _short(error: BaseException) -> str:
    return first_line(error)[:160]


def _listing(items: list[str]) -> str:
    shown = "; ".join(items[:_LISTED])
    return shown + (f"; and {len(items) - _LISTED} more" if len(items) > _LISTED else "")


def _samples(op, device, dtype):
    """(index, sample) pairs of the op's samples made on `device`; what making
    them raises is raised as they are drawn."""
    yield from enumerate(op.sample_inputs(device, dtype))


class _Tally:
    """What op_db's or module_db's units came to, and the line that says it."""

    def __init__(self, things: str, skips: str):
        self.things, self.skips = things, skips  # "ops", and whose test skips their values
        self.equal, self.differ, self.unsupported = [], [], []
        self.unvalued, self.random, self.no_sample, self.no_dtype = [], [], [], []

    def record(self, name: str, outcome: dict, values: bool) -> None:
        detail = outcome["detail"][:_DETAIL_LIMIT]
        if outcome["status"] == "equal":
            self.equal.append(name)
            if not values:
                self.unvalued.append(name)
            elif outcome["random"]:
                self.random.append(name)
        elif outcome["status"] == "no sample":
            self.no_sample.append(name)
        elif outcome["status"] == "unsupported":
            self.unsupported.append(f"{name} ({detail})")
        else:
            self.differ.append(f"{name} ({detail})")

    def verdict(self, note: str) -> str:
        """The pass line; raises Failed naming the units that differ."""
        summary = f"{len(self.equal)} of {len(self.equal) + len(self.differ)} {self.things} equal CPU{note}"
        notes = [f"{len(self.unvalued)} by device, dtype and shape only ({self.skips} skips their values in "
                 f"PyTorch's own device-vs-CPU test)"] if self.unvalued else []
        if self.random:
            notes.append(f"{len(self.random)} random, by device, dtype and shape only: {_listing(self.random)}")
        if self.unsupported:
            notes.append(f"{len(self.unsupported)} unsupported: {_listing(self.unsupported)}")
        if self.no_sample:
            notes.append(f"{len(self.no_sample)} with no sample CPU accepts")
        if self.no_dtype:
            notes.append(f"{len(self.no_dtype)} without a dtype CPU and CUDA both support")
        tail = "".join(f"; {n}" for n in notes)
        expect(not self.differ, f"{summary}; differ: {_listing(self.differ)}{tail}")
        return summary + tail


# --- op_db against CPU


class _RandomDraws(TorchDispatchMode):
    """Records whether an operator that draws random numbers (tagged
    nondeterministic_seeded) runs."""

    def __init__(self):
        super().__init__()
        self.drew = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.drew = self.drew or torch.Tag.nondeterministic_seeded in func.tags
        return func(*args, **(kwargs or {}))


def _draws_random_numbers(op, host) -> bool:
    host_input, host_args, host_kwargs = host
    draws = _RandomDraws()
    try:
        with draws:
            op(host_input, *host_args, **host_kwargs)
    except Exception:  # noqa: B902 - whether it drew is the question
        pass
    return draws.drew


def _compare_op(op, b, dtype, limit: int | None, values: bool) -> dict:
    """The op's samples (the first `limit`) on the device against CPU. A
    sample that draws random numbers on CPU is compared by device, dtype and
    shape only ("random": the device draws its own; op_db seeds its random
    ops, so CPU repeats itself)."""
    torch.manual_seed(0)
    compared, random = 0, False
    samples = _samples(op, b.name, dtype)
    while True:
        try:
            index, sample = next(samples)
        except StopIteration:
            break
        except NotImplementedError as error:
            return {"status": "unsupported", "detail": f"making its samples: {_short(error)}"}
        if limit is not None and index >= limit:
            break
        host, spare = _on_host(sample, b.name), _on_host(sample, b.name)
        try:
            want = op(host[0], *host[1], **host[2])
        except Exception:  # noqa: B902 - CPU refuses the sample: nothing to compare
            continue
        try:
            got = op(sample.input, *sample.args, **sample.kwargs)
        except NotImplementedError as error:
            return {"status": "unsupported", "detail": _short(error)}
        except Exception as error:  # noqa: B902 - CPU returned
            return {"status": "differ", "detail": f"sample {index} raised {_short(error)} where CPU returns"}
        got, want = sample.output_process_fn_grad(got), sample.output_process_fn_grad(want)
        where = _result_device_type(sample, b.name)
        difference = _difference(got, want, where, values)
        if difference and values and _draws_random_numbers(op, spare):
            random = True
            difference = _difference(got, want, where, False)
        if difference:
            return {"status": "differ", "detail": f"sample {index}: {difference}"}
        compared += 1
    torch.accelerator.synchronize()
    return {"status": "equal" if compared else "no sample", "detail": str(compared), "random": random}


@check("op_db's samples (quick: 2 of each of 50 ops spread over op_db) give CPU's results on the device",
       timeout_s=3600)
def op_db(b):
    ops = _spread(_op_db(), _QUICK_OPS, b.full)
    units = _Units(b)
    tally = _Tally("ops", "op_db")
    for op in ops:
        dtype = _comparison_dtype(op)
        if dtype is None:
            tally.no_dtype.append(_label(op))
            continue
        values = not _skipped_by_pytorch(op, "TestCommon", "test_compare_cpu", b.name, dtype)
        limit = None if b.full else _QUICK_SAMPLES
        outcome = units.run(lambda: _compare_op(op, b, dtype, limit, values))
        tally.record(_label(op) if dtype == torch.float32 else f"{_label(op)} ({str(dtype)[6:]})", outcome, values)
    return tally.verdict(units.note)


# --- module_db against CPU


def _forward_backward(module, args, kwargs) -> dict:
    """Forward from seed 1, then backward of the sum of the floating outputs
    that require grad; what is compared."""
    torch.manual_seed(1)
    output = module(*args, **kwargs)
    differentiable = [t for t in _leaves(output)
                      if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad]
    if differentiable:
        sum(t.sum() for t in differentiable).backward()
    leaves = [t for t in _leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.requires_grad]
    return {
        "forward": output,
        "buffers": list(module.buffers()),
        "parameter gradients": [p.grad for p in module.parameters()],
        "input gradients": [t.grad for t in leaves],
    }


def _copied(value, device):
    """A forward input's tensors copied to `device` as fresh leaves."""
    def copy_tensor(t):
        if not isinstance(t, torch.Tensor):
            return t
        return t.detach().to(device, copy=True).requires_grad_(t.requires_grad)

    return _map(value, copy_tensor)


def _compare_module(info, b, dtype, limit: int | None, values: bool, modes: tuple[bool, ...]) -> dict:
    """The module's samples (the first `limit` per mode), built on CPU and
    copied to the device with the same parameters, against CPU; random ones
    (drawing random numbers on CPU) by device, dtype and shape only."""
    compared, random = 0, False
    for training in modes:
        torch.manual_seed(0)
        samples = info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=True, training=training)
        for index, sample in enumerate(samples):
            if limit is not None and index >= limit:
                break
            where = f"{'train' if training else 'eval'} sample {index}"
            constructor, forward = sample.constructor_input, sample.forward_input
            if forward is None:
                continue
            try:
                torch.manual_seed(0)
                host = info.module_cls(*constructor.args, **constructor.kwargs).to(dtype).train(training)
                if info.is_lazy:
                    with torch.no_grad():
                        host(*_copied(forward.args, "cpu"), **_copied(forward.kwargs, "cpu"))
                device_module, spare = copy.deepcopy(host), copy.deepcopy(host)
                want = _forward_backward(host, _copied(forward.args, "cpu"), _copied(forward.kwargs, "cpu"))
            except Exception:  # noqa: B902 - CPU refuses the sample
                continue
            try:
                device_module.to(b.device())
                got = _forward_backward(device_module, _copied(forward.args, b.device()),
                                        _copied(forward.kwargs, b.device()))
            except NotImplementedError as error:
                return {"status": "unsupported", "detail": _short(error)}
            except Exception as error:  # noqa: B902 - CPU returned
                return {"status": "differ", "detail": f"{where} raised {_short(error)} where CPU returns"}
            differences = {what: _difference(got[what], want[what], b.name, values) for what in want}
            if values and any(differences.values()):
                draws = _RandomDraws()
                with draws:
                    _forward_backward(spare, _copied(forward.args, "cpu"), _copied(forward.kwargs, "cpu"))
                if draws.drew:
                    random = True
                    differences = {what: _difference(got[what], want[what], b.name, False) for what in want}
            for what, difference in differences.items():
                if difference:
                    return {"status": "differ", "detail": f"{where}, {what}: {difference}"}
            compared += 1
    torch.accelerator.synchronize()
    return {"status": "equal" if compared else "no sample", "detail": str(compared), "random": random}


@check("module_db's modules (quick: 2 samples of 15), copied from CPU, give CPU's outputs and gradients",
       timeout_s=3600)
def module_db(b):
    infos = _spread(_module_db(), _QUICK_MODULES, b.full)
    units = _Units(b)
    tally = _Tally("modules", "module_db")
    for info in infos:
        dtype = torch.float32 if torch.float32 in info.dtypes else info.dtypes[0]
        values = not _skipped_by_pytorch(info, "TestModule", "test_cpu_gpu_parity", b.name, dtype)
        # Training, and eval too where the ModuleInfo says the two differ (full runs).
        modes = (True, False) if b.full and info.train_and_eval_differ else (True,)
        limit = None if b.full else _QUICK_SAMPLES
        tally.record(info.name, units.run(lambda: _compare_module(info, b, dtype, limit, values, modes)), values)
    return tally.verdict(units.note)


# --- dtype support as CUDA's
#
# Note [Dtypes as CUDA's]
# op_db declares per op the dtypes CUDA supports (as on a current GPU, see
# torch_openreg/_op_db.py) and those CPU supports. A backend that keeps
# CUDA's dtype support runs each op's first sample at a dtype CUDA supports,
# and refuses (raises on) some sample at a dtype only CPU supports, as
# PyTorch's own test_dtypes decides that a dtype is unsupported; samples are
# made on the device, as there. Some pairs tell nothing about a backend, and
# are set apart, or counted as unsupported ops, by rules that hold for any
# backend:
# - refused above the backends: the device raises from PyTorch's
#   device-independent code, before any operator call reaches the dispatcher
#   below autograd (a backend kernel, or the dispatcher finding none). FFTs
#   of float16 are refused so on every device but CUDA (promote_type_fft in
#   aten/src/ATen/native/SpectralOps.cpp), and jiterator ops off CUDA: no
#   backend can accept them.
# - unsupported ops: NotImplementedError at a dtype CUDA supports where the
#   device also raises it at a dtype CPU and CUDA both support (the op is
#   missing, e.g. for sparse layouts), or where CPU supports no dtype of
#   that kind (a CUDA-only kernel: flash attention, complex nansum). Counted,
#   as in op_db, not failed.
# - unverified: PyTorch's own test_dtypes checks the declarations on CUDA
#   over the standard dtypes only (all_types_and_complex_and(half,
#   bfloat16, bool), and complex32 where CUDA declares it), so only those
#   are checked: not uint16-64, nor float8 (_scaled_mm's float8 samples
#   reach CUDA at dtypes it is declared to refuse, and CUDA accepts them).
#   Where op_db skips test_dtypes for the op on CUDA (resize_, polar...),
#   PyTorch does not vouch for the declaration either: a pair that differs
#   is set apart.
# - refused by argument: CUDA declares the dtype for another variant of the
#   same op (scatter_reduce refuses bool for reduce="prod" but not for
#   "sum"), so CUDA refuses it for some argument values only; accepting it
#   there is a coarser rule than CUDA's, not a broken dtype.


class _KernelCalls(TorchDispatchMode):
    """Records whether an operator call that reached the dispatcher below
    autograd raised (a backend kernel, or the dispatcher finding none)."""

    def __init__(self):
        super().__init__()
        self.raised = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        try:
            return func(*args, **(kwargs or {}))
        except Exception:
            self.raised = True
            raise


def _refused_above_backends(op, sample) -> bool:
    """Whether the sample raises on the device from PyTorch's device-independent code."""
    calls = _KernelCalls()
    try:
        with calls:
            op(sample.input, *sample.args, **sample.kwargs)
    except Exception:  # noqa: B902 - where it raised is the question
        return not calls.raised
    return False


def _kind(dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    return "complex" if dtype.is_complex else "floating" if dtype.is_floating_point else "integer"


def _verified_dtypes(cuda: set) -> set:
    """The dtypes PyTorch's test_dtypes checks on CUDA, for an op CUDA declares `cuda` for."""
    from torch.testing._internal.common_dtype import all_types_and_complex_and

    complex32 = (torch.complex32,) if torch.complex32 in cuda else ()
    return set(all_types_and_complex_and(torch.half, torch.bfloat16, torch.bool, *complex32))


def _check_dtypes(op, b, cuda: set, cpu: set, refused_by_argument: set) -> dict:
    """Each dtype of the op's CUDA or CPU declaration, as Note [Dtypes as CUDA's] says."""
    result = {"ran": 0, "refused": 0, "unsupported": [], "set apart": [], "failures": []}
    both = cuda & cpu
    common = next((d for d in (*_COMPARISON_DTYPES, *sorted(both, key=str)) if d in both), None)

    @functools.cache
    def op_missing() -> bool:
        """Whether the device raises NotImplementedError at a dtype CPU and CUDA both support."""
        if common is None:
            return False
        try:
            _, sample = next(_samples(op, b.name, common))
            op(sample.input, *sample.args, **sample.kwargs)
        except NotImplementedError:
            return True
        except Exception:  # noqa: B902 - the op is there, whatever else it does
            pass
        return False

    for dtype in sorted((cuda | cpu) & _verified_dtypes(cuda), key=str):
        pair = f"{_label(op)} {str(dtype)[6:]}"
        unverified = _skipped_by_pytorch(op, "TestCommon", "test_dtypes", "cuda", dtype)
        torch.manual_seed(0)
        if dtype in cuda:
            sample = None
            try:
                _, sample = next(_samples(op, b.name, dtype))
                op(sample.input, *sample.args, **sample.kwargs)
                torch.accelerator.synchronize()
                result["ran"] += 1
            except StopIteration:
                pass
            except Exception as error:  # noqa: B902 - told apart below
                if sample is not None and _refused_above_backends(op, sample):
                    result["set apart"].append(f"{pair}: refused above the backends")
                elif isinstance(error, NotImplementedError) and (_kind(dtype) not in {_kind(d) for d in cpu}
                                                                  or op_missing()):
                    result["unsupported"].append(f"{pair} ({_short(error)})")
                elif unverified:
                    result["set apart"].append(f"{pair}: unverified")
                else:
                    step = "making its first sample" if sample is None else "its first sample"
                    result["failures"].append(f"{pair}: {step} raised {_short(error)} (CUDA supports it)")
            continue
        ran, refused = 0, False
        try:
            for _, sample in _samples(op, b.name, dtype):
                host_input, host_args, host_kwargs = _on_host(sample, b.name)
                try:
                    op(host_input, *host_args, **host_kwargs)
                except Exception:  # noqa: B902 - CPU refuses the sample too
                    continue
                try:
                    op(sample.input, *sample.args, **sample.kwargs)
                    torch.accelerator.synchronize()
                    ran += 1
                except Exception:  # noqa: B902 - refused, as on CUDA
                    refused = True
                    break
        except Exception:  # noqa: B902 - making the samples is refused: so is the dtype
            refused = True
        if refused:
            result["refused"] += 1
        elif unverified:
            result["set apart"].append(f"{pair}: unverified")
        elif dtype in refused_by_argument:
            result["set apart"].append(f"{pair}: refused by argument")
        elif ran:
            result["failures"].append(f"{pair}: {ran} samples ran (CUDA refuses it)")
    result["status"] = "checked"
    return result


def _declarations_differ(op) -> bool:
    cuda, cpu = set(op.supported_dtypes("cuda")), set(op.supported_dtypes("cpu"))
    return bool((cuda ^ cpu) & _verified_dtypes(cuda))


@check("op_db's CUDA dtypes (quick: 30 ops whose CUDA and CPU dtypes differ): each dtype CUDA supports "
       "runs on the device, each only CPU supports is refused", timeout_s=3600)
def cuda_dtypes(b):
    ops = _op_db()
    cuda_by_name: dict[str, list[set]] = {}
    for op in ops:
        cuda_by_name.setdefault(op.name, []).append(set(op.supported_dtypes("cuda")))
    chosen = ops if b.full else _spread([op for op in ops if _declarations_differ(op)], _QUICK_DTYPE_OPS, False)
    units = _Units(b)
    ran = refused = 0
    unsupported, set_apart, failures = [], [], []
    for op in chosen:
        cuda, cpu = set(op.supported_dtypes("cuda")), set(op.supported_dtypes("cpu"))
        # The dtypes CUDA declares for another variant of this op.
        refused_by_argument = set().union(*cuda_by_name[op.name]) - cuda
        outcome = units.run(lambda: _check_dtypes(op, b, cuda, cpu, refused_by_argument))
        if outcome["status"] != "checked":
            failures.append(f"{_label(op)}: {outcome['detail'][:_DETAIL_LIMIT]}")
            continue
        ran += outcome["ran"]
        refused += outcome["refused"]
        unsupported += outcome["unsupported"]
        set_apart += outcome["set apart"]
        failures += [f[:_DETAIL_LIMIT] for f in outcome["failures"]]
    summary = (f"{len(chosen)} ops: {ran} (op, dtype) pairs CUDA supports ran, {refused} only CPU supports "
               f"were refused{units.note}")
    notes = [f"{len(unsupported)} pairs of unsupported ops: {_listing(unsupported)}"] if unsupported else []
    if set_apart:
        notes.append(f"{len(set_apart)} set apart (Note [Dtypes as CUDA's] in ops.py): {_listing(set_apart)}")
    expect(not failures, f"{len(failures)} pairs differ from CUDA: {_listing(failures)}; {summary}"
           + "".join(f"; {n}" for n in notes))
    return summary + "".join(f"; {n}" for n in notes)
