"""openreg tensors through torch.multiprocessing (Note [Sharing device memory
between processes] in torch_openreg/_multiprocessing.py): aliasing, stream
order, lifetime across processes. The processes are in _ipc_processes.py;
everything runs in a subprocess with deadlines."""

import os
import pickle
import re

import pytest
import torch

from _openreg_util import script

HERE = os.path.dirname(os.path.abspath(__file__))
N = 1 << 18

SHARING = script(
    "ipc_sharing",
    f"""
    sys.path.insert(0, {HERE!r})
    import _ipc_processes
    if __name__ == "__main__":
        done(_ipc_processes.main())
    """,
    timeout=300,
)


def _result():
    return SHARING.result().check_ok()


def test_reductions_are_registered():
    from multiprocessing.reduction import ForkingPickler

    from torch_openreg import _multiprocessing

    assert ForkingPickler._extra_reducers[torch.UntypedStorage] is _multiprocessing.reduce_storage
    assert callable(torch.openreg.ipc_collect)


def test_plain_pickle_still_refuses_device_storage_sharing_by_accident():
    # Plain pickle (torch.save's path) is not ForkingPickler: it copies.
    t = torch.arange(4.0, device="openreg:0")
    back = pickle.loads(pickle.dumps(t))
    assert back.device == t.device and back.tolist() == t.tolist()
    back.add_(1)
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.subprocess
def test_receiver_aliases_sender_memory_in_stream_order():
    r = _result()
    expected_first = [1.0, 2.0, 3.0, 4.0]  # arange + 1: the add queued before the send
    assert r["ready"] == "ready"
    assert r["received"] == {
        "device": "openreg:1",
        "dtype": "torch.float32",
        "shape": [N],
        "first": expected_first,
        "sum": float(sum(range(N)) + N),
    }
    assert r["doubled"] == "doubled"
    assert r["sender_sees"] == [2 * v for v in expected_first]
    assert r["dropped"] == "dropped" and r["exit_1"] == 0


@pytest.mark.subprocess
def test_memory_lives_while_received_and_is_released_after():
    r = _result()
    assert r["deleted_received"]["sum"] == 3.0 * N  # deleted by the sender, still there
    assert r["held_while_received"] >= 4 * N
    assert r["deleted_dropped"] == "dropped" and r["exit_2"] == 0
    assert r["after_release"] == 0, r
    assert r["sends_held"] == 0


@pytest.mark.subprocess
def test_a_receiver_that_dies_releases_its_hold():
    r = _result()
    assert r["exit_3"] == 0
    assert r["after_crashed_receiver"] == 0, r


@pytest.mark.subprocess
def test_module_parameters_as_spawn_arguments():
    r = _result()
    assert r["module"] == {"types": ["Parameter"], "devices": ["openreg:0"], "requires_grad": True}
    assert r["module_updated"] == "updated"
    assert r["module_delta"] == [True, True]  # the child's in-place update, seen by the parent
    assert r["exit_4"] == 0


@pytest.mark.subprocess
def test_cpu_tensors_use_torch_reduction():
    r = _result()
    assert r["cpu_received"]["device"] == "cpu" and r["cpu_received"]["sum"] == 16.0
    assert r["exit_5"] == 0


# CUDA's error (torch/csrc/StorageSharing.cpp), naming openreg.
RESEND_REFUSAL = (
    "Attempted to send openreg tensor received from another process; "
    "this is not currently supported. Consider cloning before sending."
)


@pytest.mark.subprocess
def test_received_tensors_are_not_sent_on_but_their_clones_are():
    r = _result()
    refused = f"RuntimeError: {RESEND_REFUSAL}"
    assert r["resend_attempts"] == {"tensor": refused, "storage": refused, "parameter": refused, "view": refused}
    assert r["resent_clone"] == {"device": "openreg:0", "values": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]}
    assert r["exit_resend"] == 0


def test_storage_opened_in_this_process_is_not_sent_on():
    """The same rule for a storage this process both sent and opened (what
    any receiver does); the record of it goes once it is released."""
    from multiprocessing.reduction import ForkingPickler

    from torch_openreg import _multiprocessing

    t = torch.arange(4.0, device="openreg:0")
    received = ForkingPickler.loads(ForkingPickler.dumps(t))
    assert received.tolist() == t.tolist()
    for value in (received, received[1:], received.untyped_storage(), torch.nn.Parameter(received)):
        with pytest.raises(RuntimeError, match=re.escape(RESEND_REFUSAL)):
            ForkingPickler.dumps(value)
    ForkingPickler.loads(ForkingPickler.dumps(received.clone()))  # a clone is this process's own
    del received, value
    kept = ForkingPickler.loads(ForkingPickler.dumps(t))  # the next receive forgets released storages
    assert kept.untyped_storage()._cdata in _multiprocessing._received
    assert not any(ref.expired() for ref in _multiprocessing._received.values())


@pytest.mark.subprocess
def test_interprocess_event():
    r = _result()
    assert r["event_repr"] == "torch.openreg.Event(device=openreg:0, interprocess=True)"
    for value, kind in ((7.0, "InterprocessEvent"), (9.0, "InterprocessEvent")):
        assert r[f"event_query_while_busy_{value}"] is False
        assert r[f"event_{value}"] == {"sum": value * N, "query": True, "type": kind}
    assert r["event_query_after"] is True
    assert r["exit_event"] == 0


def test_interprocess_event_in_process():
    event = torch.openreg.Event(interprocess=True)
    assert event.query()  # nothing recorded
    torch.openreg._sleep(200)
    event.record()
    assert not event.query()
    other = torch.openreg.Event.from_ipc_handle(0, event.ipc_handle())
    side = torch.openreg.Stream(0)
    other.wait(side)  # the side stream waits for the default stream's sleep
    t = torch.zeros(4, device="openreg:0")
    with torch.openreg.stream(side):
        t.fill_(1.0)
    side.synchronize()
    assert event.query()
    with pytest.raises(ValueError, match="time stamps"):
        torch.openreg.Event(interprocess=True, enable_timing=True)
    with pytest.raises(ValueError, match="not an openreg interprocess event handle"):
        torch.openreg.Event.from_ipc_handle(0, b"garbage")
    with pytest.raises(ValueError, match="interprocess event is on openreg:0"):
        event.record(torch.openreg.Stream(1))
