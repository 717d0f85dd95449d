"""The conformance kit (python -m torch_openreg.conformance), tested against
defects as well as against a healthy backend:

- openreg passes every check (the "not supported" ones are listed here with
  their reasons);
- openreg with contracts broken by its own options (OPENREG_DTYPES=cpu,
  OPENREG_DEVICE_COUNT, OPENREG_FAULT) fails exactly the checks that should
  fail;
- the toy backend (examples/toy_backend: malloc'd memory, CPU fallback, no
  real streams, four contracts broken on purpose, one of them a crash and one
  a hang) is built with torch.utils.cpp_extension and the kit reports each
  broken contract by its id and nothing else;
- the runner itself: a device no backend registers, unknown names, --list.

Each kit run is a subprocess (the kit starts its own children); this test
process never loads the toy backend, which would take PrivateUse1 from openreg.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from _openreg_util import clean_env

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOY_DIR = os.path.join(REPO, "examples", "toy_backend")

pytestmark = pytest.mark.subprocess

# The check of dtype support against PyTorch's declared CUDA dtypes.
CUDA_DTYPES_CHECK = "ops.cuda_dtypes"


def run_kit(tmp_path, *args: str, env: dict | None = None, timeout: float = 900) -> tuple[subprocess.CompletedProcess, dict]:
    """Runs the kit with --json; returns the process and the parsed report."""
    report_path = tmp_path / "report.json"
    process = subprocess.run(
        [sys.executable, "-m", "torch_openreg.conformance", *args, "--json", str(report_path)],
        cwd=tmp_path, env=clean_env() if env is None else env, capture_output=True, text=True, timeout=timeout,
    )
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    return process, report


def verdicts(report: dict, *wanted: str) -> dict[str, str]:
    """id -> detail of the checks whose verdict is one of `wanted`."""
    return {c["id"]: c["detail"] for c in report["checks"] if c["verdict"] in wanted}


def describe(process: subprocess.CompletedProcess) -> str:
    return f"rc={process.returncode}\n--- stdout:\n{process.stdout[-6000:]}\n--- stderr:\n{process.stderr[-3000:]}"


# openreg offers every front end the kit checks: nothing is "not supported".
NOT_SUPPORTED_ON_OPENREG: dict[str, str] = {}


def test_openreg_passes_every_check(tmp_path):
    process, report = run_kit(tmp_path, "--device", "openreg", "--markdown", str(tmp_path / "report.md"))
    assert process.returncode == 0, describe(process)
    assert report["passed"] and report["device"] == "openreg" and report["mode"] == "quick"
    assert not verdicts(report, "fail", "error"), describe(process)
    assert verdicts(report, "not supported").keys() == NOT_SUPPORTED_ON_OPENREG.keys(), describe(process)
    ids = [c["id"] for c in report["checks"]]
    assert len(ids) == len(set(ids)) and all(i.split(".")[0] == c["area"] for i, c in zip(ids, report["checks"]))
    assert sum(report["summary"].values()) == len(ids)
    assert report["areas"].keys() == {"device", "streams", "random", "memory", "tensors", "ops", "frontends",
                                      "stream_order"}
    markdown = (tmp_path / "report.md").read_text()
    assert all(f"`{i}`" in markdown for i in ids)
    assert "PASSED" in process.stdout
    # Progress on stderr names every check as it runs.
    assert all(i in process.stderr for i in ids)


# The checks that need two devices: with one, each is "not supported", not failed.
TWO_DEVICE_CHECKS = {
    "streams.wait_across_devices", "streams.event_device_mismatch_raises", "random.devices_independent",
    "tensors.copy_between_devices", "stream_order.cross_device_copies",
}


def test_one_device_makes_cross_device_checks_not_supported(tmp_path):
    process, report = run_kit(tmp_path, "--device", "openreg", "--only", "device,streams,random,tensors,stream_order",
                              env=clean_env(OPENREG_DEVICE_COUNT="1"))
    assert process.returncode == 0, describe(process)
    assert report["device_count"] == 1
    unsupported = verdicts(report, "not supported")
    assert unsupported.keys() == TWO_DEVICE_CHECKS, describe(process)
    assert all("needs 2 devices" in why for why in unsupported.values()), unsupported


def test_no_device_fails_the_device_checks_and_runs_nothing_else(tmp_path):
    process, report = run_kit(tmp_path, "--device", "openreg", "--only", "device,tensors,streams",
                              env=clean_env(OPENREG_DEVICE_COUNT="0"))
    assert process.returncode == 1, describe(process)
    failed = verdicts(report, "fail")
    assert {"device.available", "device.count"} <= failed.keys(), describe(process)
    assert failed["device.count"] == "device_count() is 0"
    others = [c for c in report["checks"] if c["area"] != "device"]
    assert others and all(c["verdict"] == "error" and c["detail"] == "not run: the backend reports no device"
                          for c in others), describe(process)


# OPENREG_FAULT=kind:0 makes the process's first operation of that kind fail
# once: the first check of each child that does one reports the error, named,
# and the next check, in the same process, passes.
FAULTS = [
    ("alloc:0", "tensors.copy_same_device,tensors.views_share_storage", "allocating"),
    ("event:0", "streams.wait_stream_and_event,streams.event_query_synchronize", "recording an event"),
    ("kernel:0", "stream_order.event_handoff,stream_order.host_threads", "a kernel"),
]


@pytest.mark.parametrize("fault, only, what", FAULTS, ids=[f[0] for f in FAULTS])
def test_injected_fault_fails_the_check_that_meets_it(tmp_path, fault, only, what):
    process, report = run_kit(tmp_path, "--device", "openreg", "--only", only, env=clean_env(OPENREG_FAULT=fault))
    assert process.returncode == 1, describe(process)
    first, second = only.split(",")
    failed = verdicts(report, "fail", "error")
    assert failed.keys() == {first}, describe(process)
    assert "injected fault" in failed[first] and what in failed[first] and "OPENREG_FAULT" in failed[first]
    assert verdicts(report, "pass").keys() == {second}


def test_cpu_dtype_support_fails_the_cuda_dtype_check_only(tmp_path):
    process, report = run_kit(tmp_path, "--device", "openreg", "--only", "ops", env=clean_env(OPENREG_DTYPES="cpu"))
    assert process.returncode == 1, describe(process)
    assert verdicts(report, "fail", "error").keys() == {CUDA_DTYPES_CHECK}, describe(process)


def test_a_device_no_backend_registers_runs_nothing(tmp_path):
    process, report = run_kit(tmp_path, "--device", "nosuch", "--only", "device")
    assert process.returncode == 1, describe(process)
    details = {c["detail"] for c in report["checks"]}
    assert len(details) == 1 and "PrivateUse1 backend is named 'privateuseone', not 'nosuch'" in details.pop()


def test_unknown_names_and_list(tmp_path):
    process = subprocess.run([sys.executable, "-m", "torch_openreg.conformance", "--device", "openreg",
                              "--only", "device,bogus.check"], capture_output=True, text=True, env=clean_env())
    assert process.returncode == 2 and "no conformance check or area named bogus.check" in process.stderr
    listing = subprocess.run([sys.executable, "-m", "torch_openreg.conformance", "--device", "openreg", "--list"],
                             capture_output=True, text=True, env=clean_env())
    assert listing.returncode == 0
    ids = [line.split(":")[0].split(" ")[0] for line in listing.stdout.splitlines()]
    assert "device.count" in ids and "memory.out_of_memory" in ids and len(ids) == len(set(ids))


def test_another_device_under_test_leaves_openreg_unloaded():
    """Note [Conformance kit without openreg]: autoload imports torch_openreg,
    which then leaves PrivateUse1 to the backend under test."""
    code = "import sys, torch, torch_openreg; " \
           "print('torch_openreg._runtime' in sys.modules, torch._C._get_privateuse1_backend_name())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=clean_env(TORCH_OPENREG_CONFORMANCE_DEVICE="toy")).stdout.split()
    assert out == ["False", "privateuseone"]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=clean_env(TORCH_OPENREG_CONFORMANCE_DEVICE="openreg")).stdout.split()
    assert out == ["True", "openreg"]


def _collect_from(checks, events: list[tuple[float, dict]], exit_after_s: float, timeout_s: float):
    """The runner's collection of one child that writes `events` (each
    after its pause) on the result pipe, then lives `exit_after_s` more;
    every check gets `timeout_s`. Returns the results and the runner's
    import problem."""
    from torch_openreg.conformance import _runner

    runner = _runner.Runner(_runner.Options(device="openreg", module=None, full=False, timeout_s=timeout_s,
                                            progress=False, autoload=None))
    lines = [(pause, json.dumps(event) + "\n") for pause, event in events]
    code = ("import os, sys, time\n"
            f"for pause, line in {lines!r}:\n"
            "    time.sleep(pause)\n"
            "    os.write(int(sys.argv[1]), line.encode())\n"
            f"time.sleep({exit_after_s})\n")
    read_fd, write_fd = os.pipe()
    child = subprocess.Popen([sys.executable, "-c", code, str(write_fd)], pass_fds=(write_fd,),
                             start_new_session=True)
    os.close(write_fd)
    try:
        results = runner._collect(child, read_fd, {c.id: c for c in checks}, os.devnull)
    finally:
        os.close(read_fd)
    return [(r.id, r.verdict, r.detail) for r in results], runner.import_problem


def test_a_child_slow_to_exit_after_its_checks_keeps_their_results():
    """A check's time limit ends with its result: a child whose exit (the
    backend's teardown) outlasts what was left of that limit is neither a
    timed-out check nor a failed import (the toy backend's last check of an
    area once made the kit report every later area as not imported)."""
    from torch_openreg.conformance import _api

    checks = list(_api.registered().values())[:2]
    events = [(0, {"event": "ready", "device_count": 1})]
    for check in checks:
        events += [(0, {"event": "start", "id": check.id}),
                   (0.5, {"event": "result", "id": check.id, "verdict": "pass", "detail": "", "seconds": 0.5})]
    results, problem = _collect_from(checks, events, exit_after_s=2.0, timeout_s=1.0)
    assert problem is None
    assert results == [(c.id, "pass", "") for c in checks]
    # A check that does run past its limit is still a timeout.
    results, problem = _collect_from(checks, events[:2], exit_after_s=5.0, timeout_s=1.0)
    assert problem is None
    assert [r[:2] for r in results] == [(checks[0].id, "fail")] and "timed out after 1 s" in results[0][2]


# ------------------------------------------------------------ the toy backend

# Each contract examples/toy_backend breaks, and how the kit must see it.
TOY_BROKEN = {
    "device.bad_index_raises": "did not raise",  # its guard validates no index
    "memory.out_of_memory": "not torch.OutOfMemoryError",  # its allocator raises a plain RuntimeError
    "streams.timing_events": "killed by SIGABRT",  # elapsedTime aborts the process
    "streams.query_honest": "timed out after 20 s",  # queryStream never returns
    CUDA_DTYPES_CHECK: "",  # CPU fallback: CPU's dtype support, not CUDA's
}


@pytest.fixture(scope="module")
def toy_env(tmp_path_factory) -> dict:
    """The environment that imports the toy backend, built once (in a
    subprocess: loading it here would take PrivateUse1 from openreg)."""
    env = clean_env(TOY_BACKEND_BUILD_DIR=str(tmp_path_factory.mktemp("toy_build")),
                    PYTHONPATH=TOY_DIR, TORCH_DEVICE_BACKEND_AUTOLOAD="0", TORCH_OPENREG_CONFORMANCE_DEVICE="toy")
    build = subprocess.run([sys.executable, "-c", "import toy"], env=env, capture_output=True, text=True,
                           timeout=600)
    assert build.returncode == 0, build.stderr[-4000:]
    return env


def test_toy_backend_is_reported_by_its_broken_contracts_only(tmp_path, toy_env):
    process, report = run_kit(tmp_path, "--device", "toy", "--import", "toy", "--timeout", "20", env=toy_env)
    assert process.returncode == 1, describe(process)
    failed = verdicts(report, "fail", "error")
    assert failed.keys() == TOY_BROKEN.keys(), describe(process)
    for check_id, symptom in TOY_BROKEN.items():
        assert symptom in failed[check_id], (check_id, failed[check_id])
    # What the toy does not offer is "not supported", each with its reason.
    unsupported = verdicts(report, "not supported")
    assert {"streams.priorities", "memory.stats_keys", "memory.pinned", "random.rng_state"} <= unsupported.keys()
    assert all(why for why in unsupported.values())
