"""Fixtures for the openreg Python tests.

Run with ``python3 -m pytest tests/python -q`` against the installed
torch_openreg package.
"""

import faulthandler
import sys

import pytest
import torch

import torch_openreg  # noqa: F401  (registers torch.openreg)

from _openreg_util import shutdown_scripts, start_all_scripts

# A test that hangs (a deadlock in the runtime) dumps every thread's stack
# and ends the run instead of hanging it forever.
_PER_TEST_HANG_LIMIT_S = 120


def pytest_configure(config):
    config.addinivalue_line("markers", "subprocess: the test checks a fresh Python subprocess")


def pytest_collection_modifyitems(session, config, items):
    """Subprocess tests last: their scripts run in the background meanwhile,
    so by then their results are (mostly) ready."""
    items.sort(key=lambda item: item.get_closest_marker("subprocess") is not None)


@pytest.fixture(scope="session", autouse=True)
def _background_scripts():
    """Starts every declared subprocess script now, so they run while the
    in-process tests do (see _openreg_util)."""
    start_all_scripts()
    yield
    shutdown_scripts()


# A subprocess test waits for its script, which may still be queued behind
# others (two run at a time); each script bounds itself with its own timeout.
_SUBPROCESS_TEST_HANG_LIMIT_S = 600


@pytest.fixture(autouse=True)
def _hang_guard(request):
    is_subprocess_test = request.node.get_closest_marker("subprocess") is not None
    limit = _SUBPROCESS_TEST_HANG_LIMIT_S if is_subprocess_test else _PER_TEST_HANG_LIMIT_S
    faulthandler.dump_traceback_later(limit, exit=True, file=sys.stderr)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(autouse=True)
def _restore_openreg_state():
    """Each test starts on device 0 with the default streams current and
    no work pending, whatever the previous test left behind."""
    yield
    count = torch.openreg.device_count()
    for index in range(count):
        torch.openreg.synchronize(index)
    for index in reversed(range(count)):
        torch.accelerator.set_stream(torch.openreg.default_stream(index))
    torch.openreg.set_device(0)



@pytest.fixture
def one_cpu_thread():
    """CPU kernels at one thread, as the fallback runs them on a stream
    worker: CPU PyTorch's own results move with its thread count."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture
def exact_memory():
    """For tests that compare allocator statistics exactly: no automatic
    garbage collection during the test (it could free an earlier test's
    tensors between two readings). Garbage the test itself made is still
    young afterwards, so a cheap ``gc.collect(0)`` finds it."""
    import gc

    gc.collect(1)
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
