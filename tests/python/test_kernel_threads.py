"""Note [Kernel threads]: device kernels run with an OpenMP team of one on
every thread, so device work never adds OpenMP teams that slow the user's
own CPU work, and a kernel's rounding does not depend on where it ran.
OPENREG_AUTOGRAD_ON_CALLER: backward runs on the calling thread."""

import threading

import pytest
import torch

from _openreg_util import clean_env, script

# The process's thread names, before and after device work that runs large
# kernels on a stream worker and on autograd's device thread: an OpenMP team
# there adds pool threads, which inherit the name of the thread that made
# them (a second "openreg-d0-s0", say).
_THREADS = """
import collections
import torch, torch_openreg

def names():
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            names.append(open(f"/proc/self/task/{tid}/comm").read().strip())
        except OSError:
            pass
    return collections.Counter(names)

def others():
    return sorted(n for n in names().elements() if not n.startswith(("openreg-", "pt_autograd")))

a = torch.randn(256, 256)
for _ in range(20):
    (a @ a).sum()  # the main thread's own team exists now
before = others()
threads_before = torch.get_num_threads()
w = torch.randn(512, 512, device="openreg", requires_grad=True)
x = torch.randn(512, 512, device="openreg")
torch.openreg._sleep(20)  # what follows queues: it runs on the stream's worker
y = (x @ w).relu().sum(dim=1)
y.sum().backward()
torch.openreg.synchronize()
torch.openreg.synchronize()
for _ in range(20):
    (a @ a).sum()
RESULT.update(before=before, after=others(), runtime=[n for n, k in names().items() if k > 1 and n not in before], threads_before=threads_before, threads_after=torch.get_num_threads(),
              multithreading=torch.autograd.is_multithreading_enabled())
done(RESULT)
"""

THREADS_DEVICE_THREAD = script("kernel_threads_autograd_thread", _THREADS, env=clean_env(OPENREG_AUTOGRAD_ON_CALLER="0"))
THREADS_CALLER = script("kernel_threads_autograd_caller", _THREADS, env=clean_env())


@pytest.mark.subprocess
@pytest.mark.parametrize("run", [THREADS_DEVICE_THREAD, THREADS_CALLER], ids=["autograd-thread", "caller"])
def test_device_work_adds_no_openmp_threads(run):
    data = run.result().check_ok()
    assert data["runtime"] == [], "device kernels started OpenMP teams"
    assert data["after"] == data["before"], "device kernels started OpenMP teams"
    assert data["threads_after"] == data["threads_before"]
    assert data["multithreading"] is (run is THREADS_DEVICE_THREAD)


def test_a_reduction_rounds_the_same_inline_and_queued():
    """A sum large enough for CPU to split across threads: the same bits
    whether it ran inline (idle stream) or on the stream's worker."""
    x = torch.randn(60000, dtype=torch.float32).exp().to("openreg")
    torch.openreg.synchronize()
    inline = x.sum()
    torch.openreg._sleep(10)
    queued = x.sum()
    assert torch.equal(inline.cpu(), queued.cpu())


def test_backward_runs_on_the_calling_thread():
    threads = []
    x = torch.randn(8, device="openreg", requires_grad=True)
    y = x * 2
    y.register_hook(lambda grad: threads.append(threading.get_ident()))
    y.sum().backward()
    assert threads == [threading.get_ident()]
    torch.testing.assert_close(x.grad.cpu(), torch.full((8,), 2.0))


_SAME_ROUNDING = """
import torch, torch_openreg
x = torch.randn(60000, generator=torch.Generator().manual_seed(0)).exp().to("openreg")
torch.openreg.synchronize()
inline = x.sum()
torch.openreg._sleep(10)
queued = x.sum()
RESULT.update(threads=torch.openreg.options()["OPENREG_KERNEL_THREADS"]["value"],
              same=bool(torch.equal(inline.cpu(), queued.cpu())))
done(RESULT)
"""
TWO_THREADS = script("kernel_threads_two", _SAME_ROUNDING, env=clean_env(OPENREG_KERNEL_THREADS="2"))


@pytest.mark.subprocess
def test_inline_and_queued_round_alike_with_two_kernel_threads():
    data = TWO_THREADS.result().check_ok()
    assert data["threads"] == "2"
    assert data["same"], "inline and queued kernels rounded differently"
