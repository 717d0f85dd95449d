"""openreg against CPU over PyTorch's own module database (module_db).

Each module runs in a forked child (tests/parity_harness.py), so a crash or a
hang is one module's counted failure. For every sample of the module's
module_inputs_func at a dtype, in training mode and, where the ModuleInfo
says the two differ, in eval mode: the module is built on CPU from a fixed
seed (a lazy module materialized by one CPU forward), deep-copied and moved
to openreg with .to("openreg"); both run forward on the same inputs from the
same seed, then backward of the sum of their floating outputs. Outputs,
buffers (running stats), parameter gradients and input gradients must be
equal under torch.testing.assert_close's default tolerances (NaN equal to
NaN, as in tests/opinfo_parity.py). A sample CPU itself rejects is skipped.

  python3 tests/module_parity.py                     # every module and sample, float32 and float64
  python3 tests/module_parity.py --modules nn.LSTM,nn.BatchNorm2d --dtypes float64 -v
  python3 tests/module_parity.py --memory-formats    # channels-last inputs and parameters

With --memory-formats, each sample whose forward input has a 4-D or 5-D
tensor runs four times: its 4-D (5-D) inputs and its module's 4-D (5-D)
parameters each as they are or channels_last (channels_last_3d). Besides
the values, the outputs and the parameter and input gradients must have
CPU's strides (as tests/opinfo_parity.py's --memory-formats compares them:
the strides of the dimensions of more than one element, where CPU's tensor
is dense).

Prints one line per failing module, a closing 'N passed, N failed, N
unsupported' line and the number of samples compared; exits 1 if any module
failed.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "1")

import torch  # noqa: E402
import torch._prims_common  # noqa: E402
import torch_openreg  # noqa: E402,F401
from torch.testing._internal.common_modules import module_db  # noqa: E402
from torch.utils._pytree import tree_flatten, tree_map  # noqa: E402

from parity_harness import Tally, first_line, in_fork  # noqa: E402

DEV = "openreg"
DTYPES = {"float32": torch.float32, "float64": torch.float64}
MODULE_TIMEOUT_S = 60


def training_modes(info) -> tuple[bool, ...]:
    """Training, and eval too where the ModuleInfo says they differ (as
    PyTorch's own module tests choose)."""
    return (True, False) if info.train_and_eval_differ else (True,)


def copied_to(device: str, value):
    """The tensors of a (nested) forward input copied to `device` as fresh
    leaves, each requiring grad where the original does."""
    return tree_map(
        lambda t: t.detach().to(device, copy=True).requires_grad_(t.requires_grad)
        if isinstance(t, torch.Tensor) else t,
        value,
    )


def forward_backward(module: torch.nn.Module, args, kwargs) -> dict:
    """Runs `module` forward from seed 1, then backward of the sum of its
    floating outputs that require grad; returns what is compared."""
    torch.manual_seed(1)
    output = module(*args, **kwargs)
    differentiable = [
        t for t in tree_flatten(output)[0]
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad
    ]
    if differentiable:
        sum(t.sum() for t in differentiable).backward()
    leaves = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    return {
        "forward": output,
        "buffers": dict(module.named_buffers()),
        "parameter gradients": {name: p.grad for name, p in module.named_parameters()},
        "input gradients": [t.grad for t in leaves],
    }


def on_host(value):
    """A (nested) result with its tensors detached and on the CPU."""
    return tree_map(lambda t: t.detach().cpu() if isinstance(t, torch.Tensor) else t, value)


def compare(what: str, got, want) -> None:
    """Every tensor of `got` is on openreg and `got` equals `want` (default
    tolerances, NaN equal to NaN)."""
    tensors = [t for t in tree_flatten(got)[0] if isinstance(t, torch.Tensor)]
    assert all(t.device.type == DEV for t in tensors), f"{what}: a result is not on {DEV}"
    try:
        torch.testing.assert_close(on_host(got), on_host(want), equal_nan=True)
    except AssertionError as e:
        raise AssertionError(f"{what}: {' '.join(str(e).split())}") from None


# The memory format a 4-D (5-D) tensor is given by --memory-formats.
CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}


def has_image_tensor(value) -> bool:
    return any(isinstance(t, torch.Tensor) and t.layout == torch.strided and t.dim() in CHANNELS_LAST
               for t in tree_flatten(value)[0])


def channels_last(t: torch.Tensor) -> torch.Tensor:
    """A 4-D (5-D) strided tensor made channels_last (channels_last_3d);
    any other unchanged."""
    if t.layout != torch.strided or t.dim() not in CHANNELS_LAST:
        return t
    return t.contiguous(memory_format=CHANNELS_LAST[t.dim()])


def layout_strides(t: torch.Tensor) -> tuple:
    """The strides that define a tensor's layout: those of its dimensions of
    more than one element (any stride describes a dimension of one)."""
    return tuple((d, stride) for d, (size, stride) in enumerate(zip(t.shape, t.stride())) if size > 1)


def compare_strides(what: str, got, want) -> None:
    """Each tensor of `got` has the layout_strides of `want`'s, where
    `want`'s is a dense strided tensor of more than one element."""
    for g, w in zip(tree_flatten(got)[0], tree_flatten(want)[0]):
        if (isinstance(w, torch.Tensor) and w.layout == torch.strided and w.numel() > 1
                and torch._prims_common.is_non_overlapping_and_dense_or_false(w)):
            assert isinstance(g, torch.Tensor) and layout_strides(g) == layout_strides(w), (
                f"{what}: strides {tuple(g.stride())}, want {tuple(w.stride())} (shape {tuple(w.shape)})")


# (inputs, parameters): whether each is made channels-last.
MEMORY_FORMATS = ((False, False), (True, False), (False, True), (True, True))


def check_sample(info, sample, dtype, training: bool, memory_formats=((False, False),)) -> int:
    """How many of `memory_formats` the sample was compared in (0: CPU
    rejects it); raises where openreg differs. A memory format (inputs,
    parameters) other than (False, False) also compares strides."""
    constructor, forward = sample.constructor_input, sample.forward_input
    if forward is None:
        return 0
    compared = 0
    for inputs_cl, parameters_cl in memory_formats:
        args, kwargs = forward.args, forward.kwargs
        if inputs_cl:
            args, kwargs = tree_map(lambda t: channels_last(t) if isinstance(t, torch.Tensor) else t, (args, kwargs))
        try:
            torch.manual_seed(0)
            cpu_module = info.module_cls(*constructor.args, **constructor.kwargs).to(dtype).train(training)
            if info.is_lazy:
                with torch.no_grad():
                    cpu_module(*copied_to("cpu", args), **copied_to("cpu", kwargs))
            if parameters_cl:
                with torch.no_grad():
                    for p in cpu_module.parameters():
                        p.data = channels_last(p.data)
            device_module = copy.deepcopy(cpu_module)
            want = forward_backward(cpu_module, copied_to("cpu", args), copied_to("cpu", kwargs))
        except Exception:
            continue
        device_module.to(DEV)
        got = forward_backward(device_module, copied_to(DEV, args), copied_to(DEV, kwargs))
        where = "" if (inputs_cl, parameters_cl) == (False, False) else (
            f"{'channels-last' if inputs_cl else 'as-is'} inputs, "
            f"{'channels-last' if parameters_cl else 'as-is'} parameters: ")
        for what in want:
            compare(where + what, got[what], want[what])
            if memory_formats != ((False, False),):
                compare_strides(where + what, got[what], want[what])
        compared += 1
    return compared


def check_module(info, dtype, memory_formats: bool = False) -> str:
    """Runs every sample in each mode (with `memory_formats`, each sample
    with a 4-D/5-D input in each of MEMORY_FORMATS); returns how many were
    compared, raises at the first that differs."""
    compared = 0
    for training in training_modes(info):
        torch.manual_seed(0)
        samples = info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=True, training=training)
        for index, sample in enumerate(samples):
            where = f"{'train' if training else 'eval'} sample {index} ({sample.desc or 'no desc'})"
            if memory_formats and not has_image_tensor(sample.forward_input and (
                    sample.forward_input.args, sample.forward_input.kwargs)):
                continue
            try:
                compared += check_sample(
                    info, sample, dtype, training, MEMORY_FORMATS if memory_formats else ((False, False),))
            except Exception as e:
                detail = str(e) if isinstance(e, AssertionError) else first_line(e)
                raise AssertionError(f"{where}: {detail}") from None
    torch.openreg.synchronize()
    return str(compared)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", default="float32,float64", help="comma-separated")
    parser.add_argument("--modules", default="", help="comma-separated module names, as nn.Linear (default: all)")
    parser.add_argument(
        "--memory-formats", action="store_true",
        help="samples with 4-D/5-D inputs, inputs and parameters as they are and channels-last: CPU's strides too",
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    dtypes = args.dtypes.split(",")
    wanted = set(args.modules.split(",")) if args.modules else None
    tally = Tally(args.verbose)
    compared = modules_compared = 0
    for name in dtypes:
        dtype = DTYPES[name]
        infos = [
            info for info in module_db
            if (wanted is None or info.name in wanted) and dtype in info.dtypes
        ]
        start = time.monotonic()
        failed_before = tally.failed
        for info in infos:
            outcome = in_fork(lambda: check_module(info, dtype, args.memory_formats), MODULE_TIMEOUT_S)
            tally.record(f"{name:8} {info.name}", outcome)
            if outcome.status == "ok":
                compared += int(outcome.detail)
                modules_compared += int(outcome.detail) > 0
        dtype_failed = tally.failed - failed_before
        print(f"-- {name}: {len(infos) - dtype_failed} of {len(infos)} modules clean ({time.monotonic() - start:.0f} s)")
        sys.stdout.flush()
    print(f"{compared} samples compared, of {modules_compared} (module, dtype) pairs")
    print(tally.summary())
    return 1 if tally.failed else 0


if __name__ == "__main__":
    sys.exit(main())
