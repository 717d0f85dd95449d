"""Lightning on openreg (torch_openreg/_lightning.py): the accelerator's
contract, single-device and DDP fits that equal the same training on the
CPU, and its registration however Lightning and torch_openreg are imported.
The training itself is in _lightning_training.py."""

import os

import pytest

pytest.importorskip(
    "pytorch_lightning", reason="Lightning is not installed: pip install -r requirements-training.txt"
)

import pytorch_lightning as pl  # noqa: E402
import torch  # noqa: E402
from lightning_fabric import Fabric  # noqa: E402
from lightning_fabric.accelerators import ACCELERATOR_REGISTRY, Accelerator as FabricAccelerator  # noqa: E402
from lightning_fabric.strategies import SingleDeviceStrategy as FabricSingleDevice  # noqa: E402
from pytorch_lightning.accelerators import AcceleratorRegistry  # noqa: E402
from pytorch_lightning.utilities.exceptions import MisconfigurationException  # noqa: E402
from torch.utils.data import DistributedSampler  # noqa: E402

import _lightning_training as training  # noqa: E402
from _openreg_util import clean_env, script  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

# ------------------------------------------------------------------ scripts
# (the longest first: they start in this order, two at a time)

# DDP: Lightning's launcher starts rank 1 by running rank 0's script file
# again, so rank 0 runs _lightning_training.py (not `python -c`). It runs in
# a session of its own, which is killed at the end: a rank that hangs (or is
# still exiting) goes with it.
DDP_DEADLINE_S = 150
DDP = script(
    "lightning_ddp",
    f"""
    import signal, subprocess, tempfile
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo")
    env.pop("PL_GLOBAL_SEED", None)  # the distributed sampler's seed: 0
    with tempfile.TemporaryDirectory(prefix="openreg-lightning-") as out:
        paths = [os.path.join(out, f"rank{{rank}}.json") for rank in range(2)]
        with open(os.path.join(out, "log"), "w+") as log:
            rank0 = subprocess.Popen(
                [sys.executable, {os.path.join(HERE, "_lightning_training.py")!r}, out],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
            try:
                RESULT["rank0_returncode"] = rank0.wait(timeout={DDP_DEADLINE_S})
            except subprocess.TimeoutExpired:
                RESULT["rank0_returncode"] = "hung"
            grace = time.monotonic() + 20  # rank 1 ends with rank 0
            while not all(map(os.path.exists, paths)) and time.monotonic() < grace:
                time.sleep(0.2)
            try:
                os.killpg(rank0.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            rank0.wait()
            log.seek(0)
            sys.stderr.write(log.read()[-6000:])
        ranks = []
        for path in paths:
            if os.path.exists(path):
                with open(path) as f:
                    ranks.append(json.load(f))
            else:
                ranks.append(None)
        RESULT["ranks"] = ranks
    done(RESULT)
    """,
    timeout=DDP_DEADLINE_S + 40,
)

# Lightning first, with torch's autoload off: torch_openreg's import
# registers with the Lightning already loaded.
LIGHTNING_FIRST = script(
    "lightning_before_torch_openreg",
    """
    import pytorch_lightning as pl
    from pytorch_lightning.accelerators import AcceleratorRegistry
    from lightning_fabric.accelerators import ACCELERATOR_REGISTRY
    RESULT["torch_openreg_loaded"] = "torch_openreg" in sys.modules
    RESULT["registered_before"] = ["openreg" in AcceleratorRegistry, "openreg" in ACCELERATOR_REGISTRY]
    import torch_openreg
    RESULT["registered_after"] = ["openreg" in AcceleratorRegistry, "openreg" in ACCELERATOR_REGISTRY]
    done(RESULT)
    """,
    env=clean_env(TORCH_DEVICE_BACKEND_AUTOLOAD="0"),
    timeout=120,  # Lightning's import alone takes 10-25 s on a loaded machine
)

# Only torch imported: torch's autoload imports torch_openreg, which imports
# no Lightning; Lightning imported next finds "openreg", and the Trainer
# trains on it.
AUTOLOAD = script(
    "lightning_autoload",
    f"""
    import torch
    RESULT["autoloaded"] = "torch_openreg" in sys.modules
    RESULT["lightning_modules"] = sorted(
        m for m in sys.modules if m.split(".")[0] in ("pytorch_lightning", "lightning_fabric", "lightning")
    )
    from lightning_fabric.accelerators import ACCELERATOR_REGISTRY
    RESULT["fabric_registered"] = "openreg" in ACCELERATOR_REGISTRY
    sys.path.insert(0, {HERE!r})
    import _lightning_training as training
    model = training.Regression()
    training.trainer(accelerator="openreg", devices=1).fit(model, training.loader(batch_size=4))
    RESULT["devices"] = sorted({{step["device"] for step in model.steps}})
    done(RESULT)
    """,
    timeout=120,
)

# ------------------------------------------------------------- in-process


def _fit(batch_size=4, sampler=None, **trainer_args):
    torch.set_num_threads(1)  # CPU results can move with the thread count
    model = training.Regression()
    fit = training.trainer(**trainer_args)
    fit.fit(model, training.loader(batch_size, sampler))
    return model, fit


@pytest.fixture(autouse=True)
def _threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_registered_on_each_packages_own_base():
    trainer_class = AcceleratorRegistry["openreg"]["accelerator"]
    fabric_class = ACCELERATOR_REGISTRY["openreg"]["accelerator"]
    assert issubclass(trainer_class, pl.accelerators.Accelerator)
    assert issubclass(fabric_class, FabricAccelerator)
    assert not issubclass(fabric_class, pl.accelerators.Accelerator)
    assert trainer_class.name() == fabric_class.name() == "openreg"
    assert isinstance(training.trainer(accelerator="openreg", devices=1).accelerator, trainer_class)


@pytest.mark.parametrize("devices", [1, [1]])
def test_fit_on_one_device_equals_cpu(devices):
    """strategy="auto" with one device: Lightning's placeholder CPU device
    is replaced before the model moves (Note [Lightning's single device for
    an accelerator it does not know]); the first parsed device, as for CUDA."""
    expected_index = 0 if devices == 1 else 1
    torch.openreg.set_device(1 - expected_index)  # not already the current one
    cpu, _ = _fit(accelerator="cpu")
    model, fit = _fit(accelerator="openreg", devices=devices)
    assert fit.strategy.root_device == torch.device("openreg", expected_index)
    assert len(model.steps) == 4  # batches of 4, 4, 4 and 2
    for step in model.steps:
        assert step["device"] == f"openreg:{expected_index}", model.steps
        assert step["current"] == expected_index
    assert [s["indices"] for s in model.steps] == [s["indices"] for s in cpu.steps]
    for name, value in model.final_parameters().items():
        torch.testing.assert_close(torch.tensor(value), torch.tensor(cpu.final_parameters()[name]), rtol=0, atol=1e-7)


class _AutocastRecorder(training.Regression):
    def training_step(self, batch, batch_idx):
        _, inputs, _ = batch
        self.autocast = getattr(self, "autocast", []) + [
            (torch.is_autocast_enabled("openreg"), torch.get_autocast_dtype("openreg"), self.layer(inputs).dtype)
        ]
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("precision, dtype", [("16-mixed", torch.float16), ("bf16-mixed", torch.bfloat16)])
def test_mixed_precision_runs_openreg_autocast_and_scaler(precision, dtype):
    """Lightning's mixed precision targets CUDA for any accelerator it does
    not name; on openreg it autocasts openreg (CUDA's policy) and, for
    float16, scales the loss with an openreg GradScaler: the fit equals the
    same loop written with torch.autocast("openreg") and GradScaler("openreg")."""
    torch.set_num_threads(1)
    model = _AutocastRecorder()
    fit = training.trainer(accelerator="openreg", devices=1, precision=precision)
    fit.fit(model, training.loader(4))
    assert model.autocast == [(True, dtype, dtype)] * 4
    scaler = fit.strategy.precision_plugin.scaler
    assert fit.strategy.precision_plugin.device == "openreg"
    assert (scaler is not None) == (precision == "16-mixed")

    reference = training.Regression().to("openreg")
    optimizer = reference.configure_optimizers()
    manual_scaler = torch.amp.GradScaler("openreg", enabled=precision == "16-mixed")
    for _, inputs, targets in training.loader(4):
        inputs, targets = inputs.to("openreg"), targets.to("openreg")
        with torch.autocast("openreg", dtype=dtype):
            loss = torch.nn.functional.mse_loss(reference.layer(inputs), targets)
        manual_scaler.scale(loss).backward()
        manual_scaler.step(optimizer)
        manual_scaler.update()
        optimizer.zero_grad()
    if scaler is not None:
        assert scaler.get_scale() == manual_scaler.get_scale()
    for name, value in model.final_parameters().items():
        torch.testing.assert_close(torch.tensor(value), torch.tensor(reference.final_parameters()[name]), rtol=0, atol=0)


def test_explicit_single_device_strategy():
    from pytorch_lightning.strategies import SingleDeviceStrategy

    model, fit = _fit(accelerator="openreg", strategy=SingleDeviceStrategy(device="openreg:1"))
    assert {s["device"] for s in model.steps} == {"openreg:1"}
    assert fit.strategy.root_device == torch.device("openreg:1")


def test_setup_device():
    accelerator = training.trainer(accelerator="openreg", devices=1).accelerator
    accelerator.setup_device(torch.device("openreg:1"))
    assert torch.openreg.current_device() == 1
    accelerator.setup_device(torch.device("openreg:0"))
    assert torch.openreg.current_device() == 0
    torch.openreg.set_device(1)
    accelerator.setup_device(torch.device("cpu"))  # Lightning's placeholder, replaced in setup(trainer)
    assert torch.openreg.current_device() == 1
    with pytest.raises(MisconfigurationException, match="meta"):
        accelerator.setup_device(torch.device("meta"))


def test_get_device_stats(exact_memory):
    accelerator = training.trainer(accelerator="openreg", devices=1).accelerator
    held = torch.empty(1 << 20, dtype=torch.uint8, device="openreg:1")
    stats = accelerator.get_device_stats("openreg:1")
    assert stats == torch.openreg.memory_stats(1)
    assert stats["allocated_bytes.all.current"] >= held.numel()
    assert accelerator.get_device_stats(torch.device("openreg:0")) == torch.openreg.memory_stats(0)
    del held


def test_teardown_releases_cached_memory(exact_memory):
    accelerator = training.trainer(accelerator="openreg", devices=1).accelerator
    torch.empty(1 << 20, dtype=torch.uint8, device="openreg:1")  # freed at once, kept cached
    torch.openreg.synchronize(1)
    cached = torch.openreg.memory_reserved(1)
    accelerator.teardown()
    assert torch.openreg.memory_reserved(1) <= cached - (1 << 20)


def test_device_counts():
    accelerator = AcceleratorRegistry["openreg"]["accelerator"]
    assert accelerator.is_available()
    assert accelerator.auto_device_count() == torch.openreg.device_count() == 2
    fit = training.trainer(accelerator="openreg")  # devices="auto": all of them, so DDP
    assert fit.strategy.parallel_devices == [torch.device("openreg:0"), torch.device("openreg:1")]
    assert type(fit.strategy).__name__ == "DDPStrategy"


def test_device_counts_follow_the_runtime(monkeypatch):
    """As if OPENREG_DEVICE_COUNT were 0, then 3."""
    accelerator = AcceleratorRegistry["openreg"]["accelerator"]
    monkeypatch.setattr(torch.openreg, "is_available", lambda: False)
    monkeypatch.setattr(torch.openreg, "device_count", lambda: 0)
    assert not accelerator.is_available() and accelerator.auto_device_count() == 0
    with pytest.raises(MisconfigurationException, match="not available"):
        training.trainer(accelerator="openreg")
    monkeypatch.setattr(torch.openreg, "device_count", lambda: 3)
    assert accelerator.auto_device_count() == 3
    assert accelerator.parse_devices("auto") == [0, 1, 2]


@pytest.mark.parametrize(
    "devices, indices",
    [
        (1, [0]),
        (2, [0, 1]),
        (-1, [0, 1]),
        ("-1", [0, 1]),
        ("auto", [0, 1]),
        ("2", [0, 1]),
        (" 1 ", [0]),
        ("1,", [1]),
        ("1, 0", [1, 0]),
        ([1], [1]),
        ((0, 1), [0, 1]),
    ],
)
def test_parse_devices(devices, indices):
    for accelerator in (AcceleratorRegistry["openreg"]["accelerator"], ACCELERATOR_REGISTRY["openreg"]["accelerator"]):
        assert accelerator.parse_devices(devices) == indices
        assert accelerator.get_parallel_devices(devices) == [torch.device("openreg", i) for i in indices]


@pytest.mark.parametrize(
    "devices, error, match",
    [
        ([2], MisconfigurationException, "no openreg device 2; there are 2"),
        ("0,5", MisconfigurationException, "no openreg device 5"),
        (3, MisconfigurationException, "no openreg device 2; there are 2"),
        ([-1], MisconfigurationException, "no openreg device -1"),
        (-2, MisconfigurationException, "positive, or -1"),
        ([1, 1], MisconfigurationException, "twice"),
        (0, MisconfigurationException, "names no openreg device"),
        ([], MisconfigurationException, "names no openreg device"),
        ("one", MisconfigurationException, "neither a number"),
        (True, TypeError, "True"),
        ([0.0], TypeError, r"\[0.0\]"),
    ],
)
def test_parse_devices_errors(devices, error, match):
    accelerator = AcceleratorRegistry["openreg"]["accelerator"]
    with pytest.raises(error, match=match):
        accelerator.parse_devices(devices)
    with pytest.raises(error, match=match):
        accelerator.get_parallel_devices(devices)


def test_trainer_names_a_bad_index():
    with pytest.raises(MisconfigurationException, match=r"devices=\[7\]: there is no openreg device 7"):
        training.trainer(accelerator="openreg", devices=[7])


def test_fabric_on_one_device_equals_cpu():
    def run(**fabric_args):
        torch.set_num_threads(1)
        fabric = Fabric(**fabric_args)
        fabric.launch()
        model = training.Regression()
        optimizer = model.configure_optimizers()
        model, optimizer = fabric.setup(model, optimizer)
        for batch_idx, batch in enumerate(fabric.setup_dataloaders(training.loader(batch_size=4))):
            optimizer.zero_grad()
            fabric.backward(model.training_step(batch, batch_idx))
            optimizer.step()
        return model.module

    cpu = run(accelerator="cpu", devices=1)
    model = run(accelerator="openreg", strategy=FabricSingleDevice(device="openreg:1"))
    assert {s["device"] for s in model.steps} == {"openreg:1"}
    assert {s["current"] for s in model.steps} == {1}
    for name, value in model.final_parameters().items():
        torch.testing.assert_close(torch.tensor(value), torch.tensor(cpu.final_parameters()[name]), rtol=0, atol=1e-7)


def test_fabric_refuses_the_cpu_placeholder():
    fabric = Fabric(accelerator="openreg", devices=1)
    assert fabric.device == torch.device("cpu")  # Lightning's choice, not ours
    with pytest.raises(MisconfigurationException, match=r'SingleDeviceStrategy\(device="openreg:0"\)'):
        fabric.launch()


# ------------------------------------------------------------- subprocess


@pytest.mark.subprocess
def test_torch_openreg_imports_no_lightning():
    """torch_openreg's import (here torch's autoload of it) loads no
    Lightning; Lightning imported after it finds "openreg"."""
    data = AUTOLOAD.result().check_ok()
    assert data["autoloaded"]
    assert data["lightning_modules"] == []
    assert data["fabric_registered"]


@pytest.mark.subprocess
def test_lightning_imported_before_torch_openreg():
    data = LIGHTNING_FIRST.result().check_ok()
    assert data["torch_openreg_loaded"] is False
    assert data["registered_before"] == [False, False]
    assert data["registered_after"] == [True, True]


@pytest.mark.subprocess
def test_autoload_only_torch_imported():
    data = AUTOLOAD.result().check_ok()
    assert data["autoloaded"]
    assert data["devices"] == ["openreg:0"]


@pytest.mark.subprocess
def test_ddp_on_two_devices_equals_cpu_on_the_full_batch():
    """devices=2: Lightning's default strategy (DDP, its subprocess launcher)
    over gloo. Each rank trains on its own shard on its own device; the
    averaged gradients give the parameters of one CPU process that sees
    both shards of each step as one batch."""
    data = DDP.result().check_ok()
    assert data["rank0_returncode"] == 0, data
    ranks = data["ranks"]
    assert None not in ranks, data
    shards = []
    for rank, result in enumerate(ranks):
        assert result["strategy"] == "DDPStrategy" and result["launcher"] == "_SubprocessScriptLauncher"
        assert result["backend"] == "openreg_gloo" and result["world_size"] == 2
        assert result["root_device"] == f"openreg:{rank}"
        assert {s["device"] for s in result["steps"]} == {f"openreg:{rank}"}
        assert {s["current"] for s in result["steps"]} == {rank}
        # Lightning's distributed sampler (shuffled, seed 0) gives each rank its shard.
        shard = list(DistributedSampler(range(training.SAMPLES), num_replicas=2, rank=rank, shuffle=True, seed=0))
        assert [s["indices"] for s in result["steps"]] == [shard[0:3], shard[3:6], shard[6:7]]
        shards.append(shard)
    assert sorted(shards[0] + shards[1]) == list(range(training.SAMPLES))
    assert ranks[0]["parameters"] == ranks[1]["parameters"]

    full_batches = [shards[0][a:b] + shards[1][a:b] for a, b in ((0, 3), (3, 6), (6, 7))]
    cpu, _ = _fit(accelerator="cpu", batch_size=6, sampler=[i for batch in full_batches for i in batch])
    assert [s["indices"] for s in cpu.steps] == full_batches
    for name, value in ranks[0]["parameters"].items():
        torch.testing.assert_close(torch.tensor(value), torch.tensor(cpu.final_parameters()[name]))
