"""Plans from C++ Meta kernels (Note [C++ Meta kernels] in
cpp/ops/meta_kernels.h) and the one-time cost paid at the first device use
(Note [One-time costs at the first device use] in torch/openreg)."""

import os
import subprocess
import sys

import pytest

from _openreg_util import script

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")

# Replaces the dispatcher's Meta kernels of a structured op (sin, with its
# in-place and out= forms, cumsum, mm) and of an op without a C++ Meta
# kernel (relu) by counting Python ones, then plans each behind queued work.
PLANS = script(
    "plans_from_cxx_meta_kernels",
    """
    import torch, torch_openreg
    RESULT["dynamo_before_device"] = "torch._dynamo" in sys.modules
    x = torch.randn(300, 7, device="openreg")
    RESULT["dynamo_after_first_tensor"] = "torch._dynamo" in sys.modules
    calls = {}
    def counting_meta_kernel(name):
        def kernel(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            raise RuntimeError("a counting Meta kernel")
        return kernel
    lib = torch.library.Library("aten", "IMPL")
    warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
    for name in ("sin", "sin_", "sin.out", "cumsum", "mm", "relu"):
        lib.impl(name, counting_meta_kernel(name), "Meta")
    results = {}
    for label, fn in [
        ("sin", lambda: x.sin()),
        ("sin_", lambda: x.clone().sin_()),
        ("sin.out", lambda: torch.sin(x, out=torch.empty_like(x))),
        ("cumsum", lambda: x.cumsum(0)),
        ("mm", lambda: x @ x.T),
        ("relu", lambda: x.relu()),
    ]:
        torch.openreg.synchronize()
        torch.openreg._sleep(100)
        y = fn()
        torch.openreg.synchronize()
        results[label] = (y.cpu() - fn().cpu()).abs().max().item()
    RESULT["calls"] = calls
    RESULT["differences"] = results
    done(RESULT)
    """,
)


@pytest.mark.subprocess
def test_structured_ops_are_planned_by_their_cxx_meta_kernels():
    data = PLANS.result().check_ok()
    # The Python Meta kernels registered over sin, sin_, sin.out, cumsum and
    # mm were never called: their plans came from at::meta::*. relu has no
    # C++ Meta kernel, so its plan asked the dispatcher's (which raised: the
    # CPU kernel computed it instead).
    assert data["calls"] == {"relu": 1}, data["calls"]
    assert all(v == 0 for v in data["differences"].values()), data["differences"]


@pytest.mark.subprocess
def test_the_first_device_tensor_pays_the_dynamo_import():
    data = PLANS.result().check_ok()
    assert data["dynamo_before_device"] is False
    assert data["dynamo_after_first_tensor"] is True


def test_the_meta_kernel_table_is_generated_from_the_installed_torch():
    run = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "generate_meta_kernels.py"), "--check"],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert "cpp/generated/meta_kernels_table.h is up to date" in run.stdout
