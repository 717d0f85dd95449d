"""torch.distributed on openreg over gloo (Note [Collectives over gloo] in
torch_openreg/_distributed.py): 2 spawned ranks, gloo over loopback, each
run in a subprocess under a deadline. The rank bodies are in
_distributed_ranks.py; here are the expectations."""

import os

import pytest
import torch

from _openreg_util import script

HERE = os.path.dirname(os.path.abspath(__file__))

_LAUNCH = f"""
sys.path.insert(0, {HERE!r})
import _distributed_ranks
if __name__ == "__main__":
    done(_distributed_ranks.launch(%r, deadline_s=%r, **%r))
"""

DDP_STEPS = 20
GROUP_SUITE = script("group_suite", _LAUNCH % ("group_suite", 100, {"ports": 3}), timeout=110)
TRAINING = script("training", _LAUNCH % ("training", 100, {"ports": 2, "steps": DDP_STEPS}), timeout=110)
FAILURE_TIMEOUT_S = 5
FAILURES = script("failures", _LAUNCH % ("failures", 90, {"ports": 2, "timeout_s": FAILURE_TIMEOUT_S}), timeout=100)


def _ranks(s):
    ranks = s.result().check_ok()
    for rank, result in enumerate(ranks):
        assert "fatal" not in result, f"rank {rank}:\n{result['fatal']}"
    return ranks


def test_registration_in_process():
    import torch.distributed as dist

    assert dist.Backend.default_device_backend_map["openreg"] == "openreg_gloo"
    assert dist.Backend.backend_capability["openreg_gloo"] == ["openreg"]
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"  # CPU untouched


def test_host_view_aliases_device_memory():
    from torch_openreg._distributed import _host_view

    t = torch.arange(12, dtype=torch.float32, device="openreg:1").view(3, 4)[:, 1:3]
    torch.openreg.synchronize(1)
    view = _host_view(t)
    assert view.device.type == "cpu"
    assert view.data_ptr() == t.data_ptr()
    assert view.stride() == t.stride() and view.shape == t.shape
    view.fill_(-1.0)
    assert t.cpu().eq(-1.0).all()


def test_capability_properties():
    """c10d reads a backend's capabilities as Python properties; for a Python
    backend that does not define one, torch 2.15 recurses without end (so
    init_process_group(device_id=openreg:N), as Lightning's DDP calls it,
    failed). Backend's defaults, all False."""
    import torch.distributed as dist
    from torch._C._distributed_c10d import ProcessGroup

    from torch_openreg._distributed import OpenRegGloo

    store = dist.HashStore()
    group = ProcessGroup(store, 0, 1)
    group._register_backend(
        torch.device("openreg"), ProcessGroup.BackendType.CUSTOM, OpenRegGloo(dist.ProcessGroupGloo(store, 0, 1))
    )
    backend = group._get_backend(torch.device("openreg:0"))
    names = ["supports_splitting", "supports_coalescing", "_supports_time_estimate", "supports_shrinking"]
    names += ["supports_reconfigure", "supports_window"]
    assert {name: getattr(backend, name) for name in names} == dict.fromkeys(names, False)


@pytest.mark.subprocess
@pytest.mark.parametrize("backend", ["none", "gloo", "mixed"])
def test_backend_choice(backend):
    """init_process_group() without a backend, "gloo" and
    "cpu:gloo,openreg:openreg_gloo" all reduce openreg tensors; CPU tensors
    go to plain gloo where the group has a CPU backend."""
    ranks = _ranks(GROUP_SUITE)
    for rank, result in enumerate(ranks):
        assert result[f"{backend}/all_reduce"] == [3.0] * 3
        if backend == "none":  # like NCCL for CUDA: the accelerator's backend only
            assert "cpu" in result["none/cpu_error"], result["none/cpu_error"]
        else:
            assert result[f"{backend}/cpu_error"] is None
            assert result[f"{backend}/cpu_all_reduce"] == [3.0, 3.0]


def _expected_collectives(rank):
    return {
        "all_reduce": [10.0, 12.0, 14.0, 16.0],
        "all_reduce_max": [2.0, -1.0],
        "all_reduce_async_int64": [3] * 5,
        "all_reduce_slice": [0.0, 0.0, 3.0, 3.0, 3.0, 3.0, 0.0, 0.0],
        "broadcast": [1.0] * 3,
        "reduce": [3.0, 3.0] if rank == 0 else None,
        "all_gather": [[0.0, 0.0], [1.0, 1.0]],
        "all_gather_into_tensor": [5.0, 5.0, 6.0, 6.0],
        # rank r's chunk j is r + 10 j: chunk i summed over ranks is 1 + 20 i
        "reduce_scatter": [[1.0, 1.0], [21.0, 21.0]][rank],
        "reduce_scatter_tensor": [[0.0, 3.0], [6.0, 9.0]][rank],
        "all_to_all": [[[0.0, 0.0], [10.0, 10.0]], [[1.0, 1.0], [11.0, 11.0]]][rank],
        "all_to_all_single": [[0.0, 1.0, 100.0, 101.0], [2.0, 3.0, 102.0, 103.0]][rank],
        "all_to_all_single_uneven": [[0.0, 100.0, 101.0], [1.0, 2.0, 3.0, 102.0, 103.0]][rank],
        "gather": [[7.0, 7.0], [8.0, 8.0]] if rank == 0 else None,
        "scatter": [[20.0, 20.0], [21.0, 21.0]][rank],
        "send_recv": [[10.0] * 3, [1.0] * 3][rank],
        "isend_irecv": [[2.0, 2.0], [1.0, 1.0]][rank],
        # (1 + 1) + (1 + 2), then * 10 after the collective
        "stream_order": [50.0] * 4,
        "side_stream": [5.0] * 4,
        "future_devices": [f"openreg:{rank}"],
        "future_values": [[2.0, 2.0]],
        "after_errors": [2.0, 2.0],
    }


@pytest.mark.subprocess
@pytest.mark.parametrize("backend", ["gloo", "mixed"])
def test_every_collective(backend):
    ranks = _ranks(GROUP_SUITE)
    for rank, result in enumerate(ranks):
        got = dict(result[backend])
        errors = {k: got.pop(k) for k in ("cpu_mixed_error", "cpu_mixed_into_error", "two_devices_error")}
        assert got == _expected_collectives(rank), f"rank {rank}"
        for name in ("cpu_mixed_error", "cpu_mixed_into_error"):
            assert errors[name].startswith("ValueError") and "cpu" in errors[name] and "openreg" in errors[name], errors
        assert "openreg:0 and openreg:1" in errors["two_devices_error"], errors


@pytest.mark.subprocess
@pytest.mark.parametrize("backend", ["gloo", "mixed"])
def test_openreg_and_cpu_ranks_share_gloo(backend):
    ranks = _ranks(GROUP_SUITE)
    assert [r[f"{backend}/across_ranks"] for r in ranks] == [
        {"values": [3.0, 3.0], "device": "openreg:0"},
        {"values": [3.0, 3.0], "device": "cpu"},
    ]


@pytest.mark.subprocess
def test_ddp_matches_one_process_training():
    ranks = _ranks(TRAINING)
    for rank, result in enumerate(ranks):
        ddp = result["ddp"]
        assert ddp["devices"] == [f"openreg:{rank}"]
        assert ddp["moved"] > 1e-3, "training changed nothing: the comparison would be vacuous"
        assert ddp["max_difference"] < 1e-5, ddp


@pytest.mark.subprocess
def test_fully_shard_matches_one_process_training():
    ranks = _ranks(TRAINING)
    for rank, result in enumerate(ranks):
        fsdp = result["fsdp"]
        assert fsdp["devices"] == [f"openreg:{rank}"]
        assert fsdp["max_difference"] < 1e-5, fsdp


TORCHRUN = script(
    "torchrun_example",
    f"""
    import subprocess
    example = os.path.join({HERE!r}, "..", "..", "examples", "distributed.py")
    torchrun = [sys.executable, "-m", "torch.distributed.run"]  # the torchrun command
    proc = subprocess.run([*torchrun, "--nproc-per-node", "2", example], capture_output=True, text=True, timeout=100)
    done({{"rc": proc.returncode, "out": proc.stdout, "err": proc.stderr[-3000:]}})
    """,
    timeout=110,
)


@pytest.mark.subprocess
def test_torchrun_example():
    result = TORCHRUN.result().check_ok()
    assert result["rc"] == 0, result
    assert "parameter checksums per rank" in result["out"], result


@pytest.mark.subprocess
def test_failures_are_errors_within_the_timeout():
    ranks = _ranks(FAILURES)
    bound = FAILURE_TIMEOUT_S + 30  # the timeout, plus slack for a loaded machine
    result = ranks[0]
    assert result["missing_peer_error"] is not None, result
    assert "timed out" in result["missing_peer_error"].lower(), result
    assert FAILURE_TIMEOUT_S * 0.9 < result["missing_peer_seconds"] < bound, result
    assert result["early_exit_error"] is not None, result
    assert result["early_exit_seconds"] < bound, result
