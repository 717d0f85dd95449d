"""Lightning's accelerator for openreg: ``Trainer(accelerator="openreg")``
and ``Fabric(accelerator="openreg")``.

Lightning looks accelerators up by name in a registry that its
``accelerators`` package creates when it is imported. ``_runtime.py`` runs
``register_trainer`` and ``register_fabric`` right after that import (Note
[Registering with lazily imported torch modules] in _after_import.py): so
torch_openreg imports no Lightning, and Lightning finds "openreg" whether it
was imported before or after torch_openreg. The classes are built inside the
registration, on the ``Accelerator`` base of the package just imported
(``pytorch_lightning`` and ``lightning_fabric``, or the unified package's
``lightning.pytorch`` and ``lightning.fabric``).

``devices`` takes CUDA's forms: ``2`` (openreg:0 and openreg:1), ``[1]``,
``"0,1"``, ``"1,"``, ``"2"``, and ``-1``, ``"-1"`` or ``"auto"`` for every
device. With more than one, the Trainer runs DDP over gloo (Note
[Collectives over gloo] in _distributed.py; Lightning picks the device's
default backend, ``openreg_gloo``).

Note [Lightning's single device for an accelerator it does not know]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Lightning 2.6 picks the device of a single-device run by the accelerator's
*name*: ``_AcceleratorConnector._choose_strategy``
(pytorch_lightning/trainer/connectors/accelerator_connector.py:411-419; the
same in lightning_fabric/connector.py:402-410) gives "cuda", "gpu" and "mps"
the first of the devices parsed from ``devices``, and any other accelerator
``SingleDeviceStrategy(device="cpu")``: with ``strategy="auto"`` an openreg
model would silently train on the CPU. Of an accelerator's hooks only
``setup(trainer)`` sees the strategy; ``Strategy.setup`` calls it just before
it moves the model to ``root_device`` (strategy.py:149-155). There the
Trainer's accelerator gives a single-device strategy on the CPU the device
Lightning gives CUDA, the first of the parsed devices (``devices=1``:
openreg:0, ``devices=[1]``: openreg:1), and makes it current, as
``setup_device`` does. That takes two private attributes of Lightning's,
since neither has a public way in: the connector's ``_parallel_devices``
(the parsed devices) and the strategy's ``_root_device`` (a property without
a setter). Everything else (launcher, precision, DDP) stays Lightning's
choice. Consequences:
- ``Strategy.setup_environment`` calls ``setup_device`` earlier, with the
  CPU placeholder (strategy.py:129); the Trainer's accelerator lets it pass.
  Any other device that is not openreg's is an error, as for CUDA.
- Until ``setup(trainer)``, in the LightningModule's ``setup`` and
  ``configure_model`` hooks, ``trainer.strategy.root_device`` is the CPU.
  From the model's move on (every ``training_step``), it is openreg's.
- An explicit ``strategy=SingleDeviceStrategy(device="cpu")`` with
  ``accelerator="openreg"`` cannot be told apart from the placeholder; it
  too runs on openreg (CUDA's accelerator refuses it).
- Fabric's accelerator has no such hook: Fabric calls ``setup_device`` only
  from ``launch()`` and ``to_device(module)``, and never otherwise hands the
  accelerator its strategy. There one device is
  ``strategy=SingleDeviceStrategy(device="openreg:N")``, and ``setup_device``
  refuses the CPU placeholder with that advice; but ``fabric.setup(model)``
  without ``launch()`` calls no hook of the accelerator, and runs on the
  CPU unnoticed. (Fabric's DDP cannot run on openreg:
  lightning_fabric/strategies/ddp.py:126-130 creates a ``torch.cuda.Stream()``,
  as below, and has no hook to avoid it.)

DDP: ``DDPStrategy._setup_model`` (pytorch_lightning/strategies/ddp.py:
191-196) wraps the model under a new ``torch.cuda.Stream()`` whenever
``determine_ddp_device_ids()`` is not None, which it is for every device
but the CPU; with no CUDA that raises. So ``setup(trainer)``, which a DDP
strategy calls before it wraps the model (ddp.py:160), has the strategy's
``determine_ddp_device_ids`` return None: DistributedDataParallel takes
None for a module on one device of any type, and then leaves each batch
where it is (Lightning has moved it to the rank's device already).
(Lightning also passes ``device_id=openreg:N`` to ``init_process_group``,
ddp.py:206, which asks the backend ``supports_splitting``: see the NB in
``OpenRegGloo``.)

Mixed precision: for ``precision="16-mixed"`` or ``"bf16-mixed"`` the
connector gives every accelerator but "cpu" and "mps" a ``MixedPrecision``
for "cuda" (accelerator_connector.py:489), whose autocast and GradScaler
would then target CUDA, which is absent. ``setup(trainer)``, before the
first step, points such a plugin at openreg: its autocast device, and a
``GradScaler("openreg")`` in place of the CUDA one Lightning made (with the
defaults Lightning gave it). A plugin the user made for another device than
"cuda" is left as it is.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import torch

NAME = "openreg"


class _OpenRegDevices:
    """What Lightning's accelerator bases (Trainer's and Fabric's) ask of a
    device type, short of ``setup_device``. Mixed into a subclass of the
    imported package's base, which sets ``_misconfiguration`` to that
    package's ``MisconfigurationException``."""

    _misconfiguration: type[Exception]

    def teardown(self) -> None:
        """Releases the memory the caching allocator holds unused, as CUDA's
        accelerator does (Lightning has moved the model off by then)."""
        torch.openreg.empty_cache()

    @classmethod
    def parse_devices(cls, devices: Any) -> list[int]:
        """The indices of the openreg devices that ``devices`` names: an int
        N, the first N; -1, every device; a list or tuple of indices; a
        string of any of these ("2", "-1", "0,1", "1,") or "auto", every
        device. Raises for an index with no device, a repeated index, or no
        device at all."""
        count = torch.openreg.device_count()
        if isinstance(devices, str):
            text = devices.strip()
            if text == "auto":
                indices = list(range(count))
            elif "," in text:
                indices = [cls._int_of(part, devices) for part in text.split(",") if part.strip()]
            else:
                indices = cls._first(cls._int_of(text, devices), count, devices)
        elif type(devices) is int:  # not a bool
            indices = cls._first(devices, count, devices)
        elif isinstance(devices, (list, tuple)) and all(type(index) is int for index in devices):
            indices = list(devices)
        else:
            raise TypeError(f"openreg devices are an int, a string or a list of ints, not {devices!r}")
        if not indices:
            raise cls._misconfiguration(f"devices={devices!r} names no openreg device")
        for index in indices:
            if not 0 <= index < count:
                raise cls._misconfiguration(
                    f"devices={devices!r}: there is no openreg device {index}; there are {count} "
                    "(OPENREG_DEVICE_COUNT sets how many)"
                )
        if len(set(indices)) != len(indices):
            raise cls._misconfiguration(f"devices={devices!r} names an openreg device twice")
        return indices

    @classmethod
    def _int_of(cls, text: str, devices: Any) -> int:
        try:
            return int(text)
        except ValueError:
            raise cls._misconfiguration(
                f"devices={devices!r} is neither a number of openreg devices nor a list of their indices"
            ) from None

    @classmethod
    def _first(cls, number: int, count: int, devices: Any) -> list[int]:
        """The first ``number`` devices, or all of them for -1."""
        if number == -1:
            return list(range(count))
        if number < 0:
            raise cls._misconfiguration(f"devices={devices!r}: a number of devices is positive, or -1 for all")
        if number > count:
            raise cls._misconfiguration(
                f"devices={devices!r}: there is no openreg device {count}; there are {count} "
                "(OPENREG_DEVICE_COUNT sets how many)"
            )
        return list(range(number))

    @classmethod
    def get_parallel_devices(cls, devices: Any) -> list[torch.device]:
        """The openreg devices that ``devices`` (a form ``parse_devices`` takes) names."""
        return [torch.device(NAME, index) for index in cls.parse_devices(devices)]

    @staticmethod
    def auto_device_count() -> int:
        """Every openreg device (``devices="auto"``)."""
        return torch.openreg.device_count()

    @staticmethod
    def is_available() -> bool:
        return torch.openreg.is_available()

    @staticmethod
    def name() -> str:
        return NAME


def _misconfiguration_of(package: str) -> type[Exception]:
    # A leaf module of the package, loaded by its accelerators already.
    return importlib.import_module(f"{package}.utilities.exceptions").MisconfigurationException


def register_trainer(accelerators: ModuleType) -> None:
    """Registers "openreg" with the Trainer's ``accelerators`` module
    (``pytorch_lightning.accelerators`` or ``lightning.pytorch.accelerators``)."""
    package = accelerators.__name__.rpartition(".")[0]
    misconfiguration = _misconfiguration_of(package)

    class OpenRegAccelerator(_OpenRegDevices, accelerators.Accelerator):
        """Lightning's Trainer on openreg devices."""

        __qualname__ = "OpenRegAccelerator"  # as Lightning's messages name it
        _misconfiguration = misconfiguration

        def setup_device(self, device: torch.device) -> None:
            """Makes ``device`` the current openreg device. Lets pass the CPU,
            Lightning's placeholder for a single device, which ``setup``
            replaces (Note [Lightning's single device for an accelerator it
            does not know])."""
            if device.type == "cpu":
                return
            if device.type != NAME:
                raise misconfiguration(f"the openreg accelerator got device {device}, which is not openreg's")
            torch.openreg.set_device(device)

        def setup(self, trainer: Any) -> None:
            """Puts a single-device strategy on its openreg device, keeps DDP
            off CUDA streams, and points mixed precision at openreg (Note
            [Lightning's single device for an accelerator it does not know])."""
            # At fit time: the strategies package is whole by now, which it
            # may not be while the accelerators package loads.
            strategies = importlib.import_module(f"{package}.strategies")
            strategy = trainer.strategy
            if isinstance(strategy, strategies.SingleDeviceStrategy) and strategy.root_device.type == "cpu":
                device = trainer._accelerator_connector._parallel_devices[0]
                strategy._root_device = device
                self.setup_device(device)
            if isinstance(strategy, strategies.DDPStrategy):
                strategy.determine_ddp_device_ids = lambda: None
            precision = strategy.precision_plugin
            mixed_precision = importlib.import_module(f"{package}.plugins.precision").MixedPrecision
            if isinstance(precision, mixed_precision) and precision.device == "cuda":
                precision.device = NAME
                if precision.scaler is not None:
                    precision.scaler = torch.amp.GradScaler(NAME)

        def get_device_stats(self, device: Any) -> dict[str, Any]:
            """The caching allocator's statistics of ``device``
            (``torch.openreg.memory_stats``), as CUDA's accelerator gives
            ``torch.cuda.memory_stats``."""
            return torch.openreg.memory_stats(device)

    accelerators.AcceleratorRegistry.register(NAME, OpenRegAccelerator, description=OpenRegAccelerator.__name__)


def register_fabric(accelerators: ModuleType) -> None:
    """Registers "openreg" with Fabric's ``accelerators`` module
    (``lightning_fabric.accelerators`` or ``lightning.fabric.accelerators``)."""
    package = accelerators.__name__.rpartition(".")[0]
    misconfiguration = _misconfiguration_of(package)

    class OpenRegAccelerator(_OpenRegDevices, accelerators.Accelerator):
        """Lightning Fabric on one openreg device, given as
        ``strategy=SingleDeviceStrategy(device="openreg:N")``."""

        __qualname__ = "OpenRegAccelerator"
        _misconfiguration = misconfiguration

        def setup_device(self, device: torch.device) -> None:
            """Makes ``device`` the current openreg device; refuses any other."""
            if device.type != NAME:
                raise misconfiguration(
                    f"the openreg accelerator got device {device}, which is not openreg's. On one device, Fabric "
                    "gives accelerators it does not know the CPU: pass "
                    'strategy=SingleDeviceStrategy(device="openreg:0") (Note [Lightning\'s single device for an '
                    "accelerator it does not know] in torch_openreg/_lightning.py)"
                )
            torch.openreg.set_device(device)

    accelerators.ACCELERATOR_REGISTRY.register(NAME, OpenRegAccelerator, description=OpenRegAccelerator.__name__)
