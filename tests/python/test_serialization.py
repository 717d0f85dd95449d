"""torch.save / torch.load of openreg tensors and modules, map_location,
shared storage, and copy.deepcopy."""

import copy
import io

import pytest
import torch
import torch.nn as nn

from _openreg_util import script


def _round_trip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


def test_tensors_keep_device_dtype_and_values():
    data = {
        "f": torch.randn(3, 4).to("openreg:1"),
        "i": torch.arange(5, dtype=torch.int64, device="openreg:0"),
        "b": torch.tensor([True, False], device="openreg:1"),
        "h": torch.randn(2, 2).half().to("openreg:0"),
        "scalar": torch.tensor(2.5, device="openreg:1"),
        "empty": torch.empty(0, 3, device="openreg:1"),
    }
    loaded = _round_trip(data)
    for k, v in data.items():
        assert loaded[k].device == v.device, k
        assert loaded[k].dtype == v.dtype and loaded[k].shape == v.shape, k
        assert torch.equal(loaded[k].cpu(), v.cpu()), k
        assert loaded[k].numel() == 0 or loaded[k].data_ptr() != v.data_ptr(), k


def test_views_keep_sharing_storage():
    base = torch.arange(12.0, device="openreg:1").reshape(3, 4)
    view = base[1:, ::2]
    loaded_base, loaded_view = _round_trip([base, view])
    assert loaded_view.untyped_storage().data_ptr() == loaded_base.untyped_storage().data_ptr()
    assert loaded_view.stride() == view.stride() and loaded_view.storage_offset() == view.storage_offset()
    loaded_view.fill_(-1.0)
    expected = torch.arange(12.0).reshape(3, 4)
    expected[1:, ::2] = -1.0
    assert torch.equal(loaded_base.cpu(), expected)


@pytest.mark.parametrize(
    "map_location, expected",
    [
        ("cpu", "cpu"),
        (torch.device("cpu"), "cpu"),
        ("openreg:0", "openreg:0"),
        (torch.device("openreg:0"), "openreg:0"),
        ({"openreg:1": "openreg:0"}, "openreg:0"),
        ({"openreg:1": "cpu"}, "cpu"),
        (lambda storage, location: storage, "cpu"),
    ],
    ids=["str_cpu", "device_cpu", "str_openreg0", "device_openreg0", "dict_to_openreg0", "dict_to_cpu", "callable"],
)
def test_map_location(map_location, expected):
    t = torch.arange(6.0).reshape(2, 3).to("openreg:1")
    loaded = _round_trip(t, map_location=map_location)
    assert loaded.device == torch.device(expected)
    assert torch.equal(loaded.cpu(), torch.arange(6.0).reshape(2, 3))


def test_cpu_checkpoint_loads_onto_the_device():
    t = torch.arange(4.0)
    loaded = _round_trip(t, map_location="openreg:1")
    assert loaded.device == torch.device("openreg:1")
    assert loaded.tolist() == [0.0, 1.0, 2.0, 3.0]
    with torch.openreg.device(1):
        assert _round_trip(t, map_location="openreg").device == torch.device("openreg:1")


def test_module_state_dict_round_trip():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)).to("openreg:1")
    model.train()
    model(torch.randn(5, 4).to("openreg:1"))  # running statistics change
    state = _round_trip(model.state_dict(), weights_only=True)
    for k, v in model.state_dict().items():
        assert state[k].device == torch.device("openreg:1"), k
        assert torch.equal(state[k].cpu(), v.cpu()), k
    fresh = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)).to("openreg:0")
    fresh.load_state_dict(state)
    # load_state_dict copies into the parameters: they stay on openreg:0.
    assert all(p.device == torch.device("openreg:0") for p in fresh.parameters())
    fresh.eval()
    model.eval()
    x = torch.randn(3, 4)
    torch.testing.assert_close(fresh(x.to("openreg:0")).cpu(), model(x.to("openreg:1")).cpu())


def test_whole_module_round_trip():
    model = nn.Linear(3, 2).to("openreg:1")
    loaded = _round_trip(model, weights_only=False)
    assert isinstance(loaded, nn.Linear)
    assert loaded.weight.device == torch.device("openreg:1")
    assert torch.equal(loaded.weight.cpu(), model.weight.cpu())
    on_cpu = _round_trip(model, weights_only=False, map_location="cpu")
    assert on_cpu.weight.device.type == "cpu"


def test_optimizer_state_round_trip():
    model = nn.Linear(3, 2).to("openreg:1")
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(4, 3, device="openreg:1")).sum().backward()
    opt.step()
    state = _round_trip(opt.state_dict())
    for entry in state["state"].values():
        assert entry["exp_avg"].device == torch.device("openreg:1")
    opt2 = torch.optim.Adam(model.parameters(), lr=0.1)
    opt2.load_state_dict(state)
    original = opt.state_dict()["state"][0]["exp_avg_sq"]
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg_sq"].cpu(), original.cpu())


def test_deepcopy():
    t = torch.arange(5.0, device="openreg:1")
    c = copy.deepcopy(t)
    assert c.device == t.device and c.data_ptr() != t.data_ptr()
    t.zero_()
    assert c.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    m = copy.deepcopy(nn.Linear(2, 2).to("openreg:0"))
    assert m.weight.device == torch.device("openreg:0")


def test_load_to_a_missing_device_is_an_error():
    t = torch.ones(2, device="openreg:1")
    with pytest.raises(RuntimeError, match=r"device 5 .*device_count\(\) is 2"):
        _round_trip(t, map_location="openreg:5")


# torch.save waits for the stream while holding the GIL; a deadlock there
# must not hang the test run: the subprocess gives up after a few seconds.
SAVE_AFTER_QUEUED_WORK = script(
    "save_after_queued_work",
    """
    import faulthandler, io
    import torch, torch_openreg
    x = torch.empty(1 << 22, device="openreg")
    faulthandler.dump_traceback_later(8, exit=True)
    x.fill_(1.5)  # 4M elements: queued on the stream's worker, not run inline
    buf = io.BytesIO()
    torch.save(x, buf)
    buf.seek(0)
    y = torch.load(buf)
    RESULT["sum"] = y.sum().item()
    faulthandler.cancel_dump_traceback_later()
    done(RESULT)
    """,
    timeout=60,
)


@pytest.mark.subprocess
def test_save_right_after_a_queued_kernel():
    assert SAVE_AFTER_QUEUED_WORK.result().check_ok()["sum"] == 1.5 * (1 << 22)
