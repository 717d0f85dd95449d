"""The dtypes openreg reports (``torch.accelerator.get_device_capability``'s
``supported_dtypes``, from the guard's getDeviceCapability) are exactly those
that work: a tensor of a listed dtype can be created and converted to another
listed dtype and back; for every other torch dtype that fails with a clear
exception. Listed dtypes also work on CPU (the fallback kernels are CPU's).

Every torch dtype is probed in a subprocess, so a dtype that crashed the
process would fail the test instead of ending the run."""

import pytest
import torch

from _openreg_util import script

PROBE = script(
    "dtype_probe",
    """
    import torch, torch_openreg

    dtypes = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)
    listed = torch.accelerator.get_device_capability("openreg:0")["supported_dtypes"]
    listed_1 = torch.accelerator.get_device_capability("openreg:1")["supported_dtypes"]
    # References to try, most natural first, then every other listed dtype.
    refs = [torch.float32, torch.uint8, torch.int64] + sorted(listed, key=str)

    def round_trip(dtype, device):
        '''The first listed ref that `dtype` converts to and back from on
        `device`, with the errors of the refs that failed.'''
        errors = {}
        try:
            x = torch.empty(16, dtype=dtype, device=device)
            torch.openreg.synchronize()
        except Exception as e:
            return None, {"empty": type(e).__name__ + ": " + str(e)[:300]}
        for ref in dict.fromkeys(refs):
            if ref == dtype:
                continue
            try:
                y = x.to(ref).to(dtype)
                torch.openreg.synchronize()  # a kernel's failure shows here
                assert y.dtype == dtype and y.device == x.device and y.shape == (16,)
                return str(ref), errors
            except Exception as e:
                errors[str(ref)] = type(e).__name__ + ": " + str(e)[:300]
        return None, errors

    RESULT["listed"] = sorted(str(d) for d in listed)
    RESULT["listed_1"] = sorted(str(d) for d in listed_1)
    RESULT["listed_types_ok"] = all(isinstance(d, torch.dtype) for d in listed)
    RESULT["all"] = [str(d) for d in dtypes]
    RESULT["openreg"] = {}
    RESULT["cpu"] = {}
    for d in dtypes:
        RESULT["openreg"][str(d)] = round_trip(d, "openreg")
        RESULT["cpu"][str(d)] = round_trip(d, "cpu")
    done(RESULT)
    """,
    timeout=120,
)


@pytest.fixture(scope="module")
def probe():
    return PROBE.result().check_ok()


@pytest.mark.subprocess
def test_every_device_lists_the_same_dtypes(probe):
    assert probe["listed_types_ok"]
    assert probe["listed"] == probe["listed_1"]
    # The everyday dtypes are there; the quantized ones have no kernels.
    for d in ("torch.float32", "torch.float64", "torch.float16", "torch.bfloat16", "torch.int64", "torch.bool",
              "torch.uint8", "torch.complex64"):
        assert d in probe["listed"]
    for d in ("torch.qint8", "torch.quint8", "torch.qint32", "torch.quint4x2", "torch.quint2x4"):
        assert d not in probe["listed"]


@pytest.mark.subprocess
def test_listed_dtypes_round_trip(probe):
    broken = {d: probe["openreg"][d][1] for d in probe["listed"] if probe["openreg"][d][0] is None}
    assert not broken, f"listed but not working on openreg: {broken}"


@pytest.mark.subprocess
def test_unlisted_dtypes_raise(probe):
    working = {d: probe["openreg"][d][0] for d in probe["all"]
               if d not in probe["listed"] and probe["openreg"][d][0] is not None}
    assert not working, f"working on openreg (via the ref shown) but not listed: {working}"
    for d in probe["all"]:
        if d not in probe["listed"]:
            errors = probe["openreg"][d][1]
            assert errors and all(": " in e for e in errors.values()), (d, errors)


@pytest.mark.subprocess
def test_listed_dtypes_work_on_cpu(probe):
    broken = {d: probe["cpu"][d][1] for d in probe["listed"] if probe["cpu"][d][0] is None}
    assert not broken, f"listed but CPU itself cannot convert them: {broken}"


def test_capability_in_process_matches_the_guard():
    cap = torch.accelerator.get_device_capability("openreg")
    assert cap == torch.accelerator.get_device_capability("openreg:0")
    dtypes = cap["supported_dtypes"]
    assert torch.float32 in dtypes and torch.qint8 not in dtypes
    for d in ("bits8", "bits16", "int4", "uint4", "float4_e2m1fn_x2"):
        if hasattr(torch, d):
            assert getattr(torch, d) not in dtypes, d
