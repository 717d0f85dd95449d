"""Random number generators: the per-device default generators, as in
``torch.cuda``. Their state (seed, offset) lives in the Rust runtime; each
function reaches it through ``_C._get_default_generator``, i.e. through
ATen's ``globalContext().defaultGenerator`` and the backend's hooks.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from torch_openreg import _C

from ._device import _device_index, device_count


def _default_generator(device: Any = None) -> torch.Generator:
    return _C._get_default_generator(_device_index(device, optional=True))


def default_generators() -> tuple[torch.Generator, ...]:
    """Every device's default generator, in device order (``torch.openreg.default_generators``)."""
    return tuple(_C._get_default_generator(index) for index in range(device_count()))


def get_rng_state(device: Any = "openreg") -> torch.Tensor:
    """The state of ``device``'s default generator: 16 bytes (seed, offset) as a CPU uint8 tensor."""
    return _default_generator(device).get_state()


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state(new_state: torch.Tensor, device: Any = "openreg") -> None:
    """Restores a state from ``get_rng_state``; a tensor of the wrong size or dtype is an error."""
    _default_generator(device).set_state(new_state.clone(memory_format=torch.contiguous_format))


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    for index, state in enumerate(new_states):
        set_rng_state(state, index)


def manual_seed(seed: int) -> None:
    """Seeds the current device's default generator."""
    _default_generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seeds every device's default generator (``torch.manual_seed`` calls this)."""
    seed = int(seed)
    for index in range(device_count()):
        _C._get_default_generator(index).manual_seed(seed)


def seed() -> None:
    """Seeds the current device's default generator with a non-deterministic number."""
    _default_generator().seed()


def seed_all() -> None:
    """Seeds every device's default generator with one non-deterministic number."""
    count = device_count()
    if count == 0:
        return
    random_seed = _C._get_default_generator(0).seed()
    for index in range(1, count):
        _C._get_default_generator(index).manual_seed(random_seed)


def initial_seed() -> int:
    """The seed of the current device's default generator."""
    return _default_generator().initial_seed()
