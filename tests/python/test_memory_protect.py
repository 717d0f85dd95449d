"""OPENREG_MEMORY_PROTECT=1 (Note [Memory protection]): device pages are
inaccessible to host code except through the runtime, so a host read of
device memory dies with SIGSEGV, while every tensor operation still works.
Each crash happens in its own subprocess, after the script has reported what
it saw."""

import ctypes
import signal
import struct

import pytest
import torch

from _openreg_util import clean_env, script

PROTECT = clean_env(OPENREG_MEMORY_PROTECT="1")

# Everything a user does with tensors works under protection.
_WORKLOAD = """
import ctypes, struct
import torch, torch_openreg
import torch.nn as nn
R = RESULT
R["option"] = torch.openreg.options()["OPENREG_MEMORY_PROTECT"]["value"]
x = torch.arange(16.0, device="openreg:0")
R["elementwise"] = (x * 2 + 1).sum().item()
R["matmul"] = (x.reshape(4, 4) @ x.reshape(4, 4)).cpu().tolist()
R["index"] = [x[3].item(), x[torch.tensor([1, 2])].tolist(), x[x > 13].tolist()]
R["cat_sort"] = torch.sort(torch.cat([x, -x]), descending=True).values[:3].tolist()
R["to_device_1"] = x.to("openreg:1").cpu().tolist()[:4]
y = x.clone()
y.resize_(64)
R["resize"] = y[:3].tolist()
st = y.untyped_storage()
st.resize_(1024)
R["storage_resize"] = st.nbytes()
y.fill_(2.0)
y.zero_()
R["fill_zero"] = y.sum().item()
pinned = torch.zeros(16).pin_memory()
pinned.copy_(x, non_blocking=True)
torch.openreg.synchronize()
R["pinned_host_read"] = struct.unpack("4f", ctypes.string_at(pinned.data_ptr(), 16))
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8, 1)).to("openreg:1")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
losses = []
for _ in range(3):
    opt.zero_grad()
    loss = model(torch.ones(2, 1, 4, 4, device="openreg:1")).pow(2).mean()
    loss.backward()
    opt.step()
    losses.append(loss.item())
R["training_losses_decrease"] = losses[2] < losses[0]
R["print"] = repr(x[:3])
"""

PROTECT_HOST_READ = script(
    "memory_protect_host_read",
    _WORKLOAD
    + """
done(RESULT)
data = ctypes.string_at(x.data_ptr(), 4)   # a host read of device memory: SIGSEGV
print("HOST_READ_SUCCEEDED", data, flush=True)
""",
    env=PROTECT,
)

# The result of a fallback op gets memory mapped while device memory is
# accessible (inside the op); it must be protected once the op is done.
PROTECT_FALLBACK_RESULT = script(
    "memory_protect_fallback_result",
    """
import ctypes
import torch, torch_openreg
x = torch.ones(1 << 20, device="openreg:1")     # 4 MiB
big = x.repeat(4)                                # 16 MiB: a new segment, mapped during the op
RESULT["sum"] = big.sum().item()
RESULT["segments"] = torch.openreg.memory_stats(1)["segment.all.current"]
done(RESULT)
data = ctypes.string_at(big.data_ptr() + (8 << 20), 4)
print("HOST_READ_SUCCEEDED", data, flush=True)
""",
    env=PROTECT,
)

# A write is caught too, on memory reached through a pinned-to-device copy.
PROTECT_HOST_WRITE = script(
    "memory_protect_host_write",
    """
import ctypes
import torch, torch_openreg
src = torch.arange(8.0).pin_memory()
d = torch.empty(8, device="openreg:0")
d.copy_(src, non_blocking=True)
torch.openreg.synchronize()
RESULT["copied"] = d.tolist()
done(RESULT)
ctypes.memset(d.data_ptr(), 0, 4)
print("HOST_WRITE_SUCCEEDED", flush=True)
""",
    env=PROTECT,
)


# set_ to a geometry larger than the storage grows the storage (as on CPU
# and CUDA); the runtime copies the old bytes, so that must not fault.
PROTECT_SET_GROWS_STORAGE = script(
    "memory_protect_set_grows_storage",
    """
import torch, torch_openreg
x = torch.ones(10, device="openreg:0")
t = torch.empty(0, device="openreg:0").set_(x.untyped_storage(), 5, (100,), (1,))
RESULT["nbytes"] = x.untyped_storage().nbytes()
RESULT["head"] = t[:5].tolist()
done(RESULT)
""",
    env=PROTECT,
)


def _check_crashed_after_report(result, marker):
    assert not result.timed_out, result.describe()
    assert result.returncode == -signal.SIGSEGV, result.describe()
    assert marker not in result.stdout, result.describe()
    return result.data


@pytest.mark.subprocess
def test_ops_work_and_host_read_faults():
    data = _check_crashed_after_report(PROTECT_HOST_READ.result(), "HOST_READ_SUCCEEDED")
    assert data["option"] == "1"
    assert data["elementwise"] == sum(2 * i + 1 for i in range(16))
    ref = torch.arange(16.0).reshape(4, 4)
    assert data["matmul"] == (ref @ ref).tolist()
    assert data["index"] == [3.0, [1.0, 2.0], [14.0, 15.0]]
    assert data["cat_sort"] == [15.0, 14.0, 13.0]
    assert data["to_device_1"] == [0.0, 1.0, 2.0, 3.0]
    assert data["resize"] == [0.0, 1.0, 2.0]
    assert data["storage_resize"] == 1024
    assert data["fill_zero"] == 0.0
    assert data["pinned_host_read"] == [0.0, 1.0, 2.0, 3.0]  # pinned host memory is never protected
    assert data["training_losses_decrease"] is True
    assert data["print"] == "tensor([0., 1., 2.], device='openreg:0')"


@pytest.mark.subprocess
def test_fallback_results_are_protected_too():
    data = _check_crashed_after_report(PROTECT_FALLBACK_RESULT.result(), "HOST_READ_SUCCEEDED")
    assert data["sum"] == float(4 << 20)
    assert data["segments"] >= 2


@pytest.mark.subprocess
def test_host_write_faults():
    data = _check_crashed_after_report(PROTECT_HOST_WRITE.result(), "HOST_WRITE_SUCCEEDED")
    assert data["copied"] == [float(i) for i in range(8)]


@pytest.mark.subprocess
def test_set_that_grows_the_storage_works_under_protection():
    data = PROTECT_SET_GROWS_STORAGE.result().check_ok()
    assert data["nbytes"] == 105 * 4
    assert data["head"] == [1.0] * 5


# Quantized and nested tensors go through the fallback's wrapped-tensor
# paths (Note [Quantized tensors], Note [Nested tensors]): a per-channel
# quantizer made from device scales, and copies between devices, must read
# device memory only inside kernels.
PROTECT_WRAPPED_TENSORS = script(
    "memory_protect_wrapped_tensors",
    """
import warnings
import torch, torch_openreg
warnings.simplefilter("ignore")
x = torch.arange(24.0, device="openreg").reshape(4, 6) / 10
scales = torch.linspace(0.05, 0.2, 4, dtype=torch.float64, device="openreg")
q = torch.quantize_per_channel(x, scales, torch.arange(4, device="openreg"), 0, torch.quint8)
RESULT["scales"] = q.q_per_channel_scales().cpu().tolist()
RESULT["moved"] = q.to("openreg:1").cpu().int_repr().tolist() == q.cpu().int_repr().tolist()
nt = torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(4, 3)], device="openreg")
RESULT["nested"] = (nt.to("openreg:1") + 1).to_padded_tensor(0.0).sum().item()
done(RESULT)
""",
    env=PROTECT,
)


@pytest.mark.subprocess
def test_quantized_and_nested_tensors_work_under_protection():
    data = PROTECT_WRAPPED_TENSORS.result().check_ok()
    assert data["scales"] == torch.linspace(0.05, 0.2, 4, dtype=torch.float64).tolist()
    assert data["moved"] is True
    assert data["nested"] == 2.0 * 18


def test_without_protection_host_reads_of_device_memory_work():
    """The control: in this (unprotected) process the same read succeeds, so
    the crashes above come from the protection."""
    if torch.openreg.options()["OPENREG_MEMORY_PROTECT"]["value"] != "0":
        pytest.skip("this run has OPENREG_MEMORY_PROTECT set")
    x = torch.arange(4.0, device="openreg:0") + 1
    torch.openreg.synchronize()
    assert struct.unpack("4f", ctypes.string_at(x.data_ptr(), 16)) == (1.0, 2.0, 3.0, 4.0)
