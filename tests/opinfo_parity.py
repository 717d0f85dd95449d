"""openreg against CPU over PyTorch's own operator database (op_db).

Each op runs in a forked child, so a crash or a hang is one op's counted
failure, not the end of the sweep. For every sample of the op at a dtype, the
op runs on CPU and on openreg and the results must be equal
(torch.testing.assert_close defaults; shape and dtype only for random ops).
With --busy, each sample on openreg runs behind a queued kernel, so the
fallback takes its queued route (results planned by Meta kernels, Note
[Meta results]) instead of running inline.

  python3 tests/opinfo_parity.py                       # every op, float32
  python3 tests/opinfo_parity.py --dtypes all --busy   # the full sweep
  python3 tests/opinfo_parity.py --ops sin,conj --dtypes complex64 -v

The parent never touches the openreg device (a fork of an initialized process
is refused, as with CUDA); children do. Prints one line per failing op and a
closing 'N passed, N failed' line; exits 1 if any op failed.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "1")

import torch  # noqa: E402
import torch_openreg  # noqa: E402,F401
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

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


def to_device(value):
    """A sample's tensors, and its `device=` arguments, on openreg."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(DEV).requires_grad_(value.requires_grad)
    if isinstance(value, (list, tuple)):
        return type(value)(to_device(v) for v in value)
    if isinstance(value, dict):
        return {k: (DEV if k == "device" else to_device(v)) for k, v in value.items()}
    if isinstance(value, torch.device) and value.type == "cpu" or value == "cpu":
        return DEV
    return value


def to_host(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(to_host(v) for v in value)
    return value


def compare(got, want, exact_values: bool):
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"got {type(got).__name__}, want a tensor"
        assert got.device.type == DEV, f"result on {got.device}"
        got = got.detach().cpu()
        assert got.dtype == want.dtype, f"dtype {got.dtype}, want {want.dtype}"
        assert got.shape == want.shape, f"shape {tuple(got.shape)}, want {tuple(want.shape)}"
        if exact_values:
            torch.testing.assert_close(got, want.detach(), equal_nan=True)
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), "result structure differs"
        for g, w in zip(got, want):
            compare(g, w, exact_values)
    elif isinstance(want, (int, float, complex, bool)) and exact_values:
        torch.testing.assert_close(got, want, equal_nan=True)


def run_op(op, dtype, busy: bool) -> None:
    """Raises on the first sample where openreg differs from CPU."""
    for i, sample in enumerate(op.sample_inputs("cpu", dtype, requires_grad=False)):
        if i >= SAMPLES_PER_OP:
            break
        try:
            want = op(sample.input, *sample.args, **sample.kwargs)
        except Exception:
            continue  # CPU itself rejects the sample
        dev_input, dev_args, dev_kwargs = to_device(sample.input), to_device(sample.args), to_device(sample.kwargs)
        if busy:
            torch.openreg._sleep(1)
        got = op(dev_input, *dev_args, **dev_kwargs)
        try:
            compare(got, want, values_compared(op.name, sample.kwargs))
        except AssertionError as e:
            raise AssertionError(f"sample {i}: {str(e).splitlines()[0]}") from None


def in_child(op, dtype, busy: bool) -> str:
    """'ok', or what went wrong, from a forked child."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            run_op(op, dtype, busy)
            torch.openreg.synchronize()
            msg = "ok"
        except BaseException as e:  # noqa: B902
            msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]
        os.write(w, msg.encode())
        os.close(w)
        os._exit(0)
    os.close(w)
    deadline = time.monotonic() + OP_TIMEOUT_S
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            return "timeout"
        time.sleep(0.005)
    text = os.read(r, 4096).decode()
    os.close(r)
    if os.WIFSIGNALED(status):
        return f"crash: {signal.Signals(os.WTERMSIG(status)).name}"
    return text or "no result"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", default="float32", help="comma-separated, or 'all'")
    parser.add_argument("--ops", default="", help="comma-separated op names (default: all)")
    parser.add_argument("--busy", action="store_true", help="run each openreg sample behind a queued kernel")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    dtypes = list(DTYPES) if args.dtypes == "all" else args.dtypes.split(",")
    wanted = set(args.ops.split(",")) if args.ops else None
    passed = failed = 0
    for name in dtypes:
        dtype = DTYPES[name]
        ops = [op for op in op_db if (wanted is None or op.name in wanted) and op.supports_dtype(dtype, "cpu")]
        start = time.monotonic()
        dtype_failed = 0
        for op in ops:
            outcome = in_child(op, dtype, args.busy)
            if outcome == "ok":
                passed += 1
                if args.verbose:
                    print(f"ok   {name:10} {op.name}.{op.variant_test_name}")
            else:
                failed += 1
                dtype_failed += 1
                print(f"FAIL {name:10} {op.name}.{op.variant_test_name}: {outcome}")
        print(f"-- {name}: {len(ops) - dtype_failed} of {len(ops)} ops clean ({time.monotonic() - start:.0f} s)")
        sys.stdout.flush()
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
