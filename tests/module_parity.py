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


def check_sample(info, sample, dtype, training: bool) -> bool:
    """Whether the sample was compared (False: CPU rejects it); raises where
    openreg differs."""
    constructor, forward = sample.constructor_input, sample.forward_input
    if forward is None:
        return False
    try:
        torch.manual_seed(0)
        cpu_module = info.module_cls(*constructor.args, **constructor.kwargs).to(dtype).train(training)
        if info.is_lazy:
            with torch.no_grad():
                cpu_module(*copied_to("cpu", forward.args), **copied_to("cpu", forward.kwargs))
        device_module = copy.deepcopy(cpu_module)
        want = forward_backward(cpu_module, copied_to("cpu", forward.args), copied_to("cpu", forward.kwargs))
    except Exception:
        return False
    device_module.to(DEV)
    got = forward_backward(device_module, copied_to(DEV, forward.args), copied_to(DEV, forward.kwargs))
    for what in want:
        compare(what, got[what], want[what])
    return True


def check_module(info, dtype) -> str:
    """Runs every sample in each mode; returns how many were compared,
    raises at the first that differs."""
    compared = 0
    for training in training_modes(info):
        torch.manual_seed(0)
        samples = info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=True, training=training)
        for index, sample in enumerate(samples):
            where = f"{'train' if training else 'eval'} sample {index} ({sample.desc or 'no desc'})"
            try:
                compared += check_sample(info, sample, dtype, training)
            except Exception as e:
                detail = str(e) if isinstance(e, AssertionError) else first_line(e)
                raise AssertionError(f"{where}: {detail}") from None
    torch.openreg.synchronize()
    return str(compared)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", default="float32,float64", help="comma-separated")
    parser.add_argument("--modules", default="", help="comma-separated module names, as nn.Linear (default: all)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    dtypes = args.dtypes.split(",")
    wanted = set(args.modules.split(",")) if args.modules else None
    tally = Tally(args.verbose)
    compared = 0
    for name in dtypes:
        dtype = DTYPES[name]
        infos = [
            info for info in module_db
            if (wanted is None or info.name in wanted) and dtype in info.dtypes
        ]
        start = time.monotonic()
        failed_before = tally.failed
        for info in infos:
            outcome = in_fork(lambda: check_module(info, dtype), MODULE_TIMEOUT_S)
            tally.record(f"{name:8} {info.name}", outcome)
            if outcome.status == "ok":
                compared += int(outcome.detail)
        dtype_failed = tally.failed - failed_before
        print(f"-- {name}: {len(infos) - dtype_failed} of {len(infos)} modules clean ({time.monotonic() - start:.0f} s)")
        sys.stdout.flush()
    print(f"{compared} samples compared")
    print(tally.summary())
    return 1 if tally.failed else 0


if __name__ == "__main__":
    sys.exit(main())
