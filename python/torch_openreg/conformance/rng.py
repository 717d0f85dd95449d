"""Random numbers: seeding, generator state and generator objects, as
device-agnostic code relies on them on CUDA.

A seed fixes every draw: `torch.manual_seed` reaches each device, the device
module's seeding and state functions reproduce draws, `torch.random.fork_rng`
restores them, `torch.Generator(device=...)` draws apart from the default
generator, and activation checkpointing recomputes dropout with the mask of
the forward pass. Each device, and the CPU, has its own generator: drawing on
one leaves the others' sequences alone. A backend without default generators
(its hooks lack getDefaultGenerator; its random ops may then draw from the
CPU's) is not supported by the checks that need them, as one without
`torch.NAME.get_rng_state` and the like is by the checks of those. Draws are
compared bit for bit; their distribution belongs to the ops area.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from torch_openreg.conformance._api import NotSupported, check, expect, first_line

AREA = "random"

_SEED = 20240613


def _size(b) -> int:
    # Big enough that a backend splitting random fills into chunks does so.
    return 1 << 16 if b.full else 1 << 12


def _draws(device, n: int, generator=None) -> dict[str, torch.Tensor]:
    """One result of each random op on `device`, copied to the CPU; with a
    generator, the ops that take one (dropout, which takes none, is replaced
    by bernoulli)."""
    g = {"generator": generator} if generator is not None else {}
    draws = {
        "randn": torch.randn(n, device=device, **g),
        "rand": torch.rand(n, device=device, **g),
        "randint": torch.randint(0, 1 << 30, (n,), device=device, **g),
        "normal_": torch.empty(n, device=device).normal_(2.0, 3.0, **g),
        "multinomial": torch.multinomial(torch.ones(64, device=device), n // 4, replacement=True, **g),
    }
    if generator is None:
        draws["dropout"] = F.dropout(torch.ones(n, device=device), 0.5, training=True)
    else:
        draws["bernoulli"] = torch.bernoulli(torch.full((n,), 0.5, device=device), **g)
    for name, t in draws.items():
        expect(t.device == torch.device(device), f"{name} on {device} returned a tensor on {t.device}")
    return {name: t.cpu() for name, t in draws.items()}


def _differing(first: dict, second: dict) -> list[str]:
    return [name for name in first if not torch.equal(first[name], second[name])]


def _cpu_draws() -> torch.Tensor:
    return torch.rand(16)


def _require_default_generators(b) -> None:
    """NotSupported unless each device has a default generator of its own
    (without one, a backend's random ops may draw from the CPU's)."""
    get_rng_state = getattr(getattr(torch.accelerator, "random", None), "get_rng_state", None)
    if get_rng_state is None:  # a torch without torch.accelerator.random
        b.module_function("get_rng_state")
        return
    for i in range(b.device_count):
        try:
            get_rng_state(i)
        except NotImplementedError as error:  # PrivateUse1HooksInterface without getDefaultGenerator
            raise NotSupported(f"no default generator: torch.accelerator.random.get_rng_state({i}) raised "
                               f"{first_line(error)}") from None


@check("torch.manual_seed(s) makes every device's draws (randn, rand, randint, normal_, multinomial, dropout) "
       "repeat; the draws advance, and another seed gives others")
def manual_seed_repeats(b):
    n = _size(b)
    hint = ""
    if b.module is None or not all(hasattr(b.module, f) for f in ("manual_seed_all", "_is_in_bad_fork")):
        hint = f" (torch.manual_seed seeds a backend through torch.{b.name}.manual_seed_all and _is_in_bad_fork)"
    for i in range(b.device_count):
        device = b.device(i)
        torch.manual_seed(_SEED)
        first = _draws(device, n)
        following = _draws(device, n)
        torch.manual_seed(_SEED)
        again = _draws(device, n)
        differ = _differing(first, again)
        expect(not differ, f"on {device}, {', '.join(differ)} differ after torch.manual_seed({_SEED}) again{hint}")
        stuck = [name for name in first if name not in _differing(first, following)]
        expect(not stuck, f"on {device}, consecutive {', '.join(stuck)} draws are equal: "
                          f"the generator does not advance")
        torch.manual_seed(_SEED + 1)
        ignored = [name for name in first if name not in _differing(first, _draws(device, n))]
        expect(not ignored, f"on {device}, {', '.join(ignored)} draw the same after seeds {_SEED} and {_SEED + 1}")
    return f"{len(first)} ops repeat on {b.device_count} device(s), {n} elements each"


@check("random ops on a device draw from its own default generator: they leave the CPU generator's "
       "sequence alone")
def cpu_generator_untouched(b):
    _require_default_generators(b)
    n = _size(b)
    for i in range(b.device_count):
        torch.manual_seed(_SEED)
        cpu_alone = _cpu_draws()
        torch.manual_seed(_SEED)
        _draws(b.device(i), n)
        expect(torch.equal(_cpu_draws(), cpu_alone),
               f"drawing on {b.device(i)} changed the CPU generator's next draws: the device uses the CPU's generator")
    return f"{b.device_count} device(s)"


@check("each device has its own default generator: drawing on one device does not change another's next draws")
def devices_independent(b):
    b.require_devices(2)
    _require_default_generators(b)
    n = _size(b)
    for i in range(b.device_count):
        for j in range(b.device_count):
            if i == j:
                continue
            torch.manual_seed(_SEED)
            alone = _draws(b.device(j), n)
            torch.manual_seed(_SEED)
            _draws(b.device(i), n)
            differ = _differing(alone, _draws(b.device(j), n))
            expect(not differ, f"drawing on {b.device(i)} changed {b.device(j)}'s next {', '.join(differ)} draws")
    return f"{b.device_count} devices, each pair both ways"


@check("torch.NAME.manual_seed(s) seeds the current device only, manual_seed_all(s) every device")
def module_seeding(b):
    manual_seed = b.module_function("manual_seed")
    manual_seed_all = b.module_function("manual_seed_all")
    n = _size(b)
    after_seed_all = []
    for i in range(b.device_count):
        manual_seed_all(_SEED)
        after_seed_all.append(_draws(b.device(i), n))
    for i in range(b.device_count):
        with torch.accelerator.device_index(i):
            manual_seed(_SEED)
        differ = _differing(after_seed_all[i], _draws(b.device(i), n))
        expect(not differ, f"on device {i}, {', '.join(differ)} after manual_seed({_SEED}) there differ from "
                           f"those after manual_seed_all({_SEED})")
    if b.device_count == 1:
        return "1 device"
    # CUDA's manual_seed seeds the current device; the others keep their state.
    manual_seed_all(_SEED)
    with torch.accelerator.device_index(1):
        manual_seed(_SEED + 1)
    differ = _differing(after_seed_all[0], _draws(b.device(0), n))
    expect(not differ, f"manual_seed under device_index(1) changed device 0's {', '.join(differ)} draws")
    return f"{b.device_count} devices; manual_seed on device 1 leaves device 0 alone"


@check("torch.NAME.initial_seed() (for the current device) and torch.accelerator.random.initial_seed(i) "
       "return the seed torch.manual_seed or torch.NAME.manual_seed gave each device")
def initial_seed(b):
    initial_seed = b.module_function("initial_seed")
    manual_seed = b.module_function("manual_seed")
    torch.manual_seed(_SEED)
    for i in range(b.device_count):
        with torch.accelerator.device_index(i):
            expect(initial_seed() == _SEED, f"after torch.manual_seed({_SEED}), initial_seed() on device {i} is "
                                            f"{initial_seed()}")
    seeds = [_SEED + 1 + i for i in range(b.device_count)]  # distinct, so the device asked for matters
    for i, seed in enumerate(seeds):
        with torch.accelerator.device_index(i):
            manual_seed(seed)
    for i, seed in enumerate(seeds):
        with torch.accelerator.device_index(i):
            expect(initial_seed() == seed, f"after manual_seed({seed}) on device {i}, initial_seed() there is "
                                           f"{initial_seed()}")
    covered = ""
    accelerator_initial_seed = getattr(getattr(torch.accelerator, "random", None), "initial_seed", None)
    if accelerator_initial_seed is not None:
        for i, seed in enumerate(seeds):
            got = accelerator_initial_seed(i)
            expect(got == seed, f"after manual_seed({seed}) on device {i}, torch.accelerator.random.initial_seed({i}) "
                                f"is {got}")
        covered = "; torch.accelerator.random.initial_seed agrees"
    return f"{b.device_count} device(s){covered}"


@check("torch.NAME.get_rng_state(i) / set_rng_state(state, i) replay draws from mid-sequence, per device; "
       "no index means the current device")
def rng_state(b):
    get_rng_state = b.module_function("get_rng_state")
    set_rng_state = b.module_function("set_rng_state")
    n = _size(b)
    torch.manual_seed(_SEED)
    for i in range(b.device_count):
        device = b.device(i)
        _draws(device, n)  # the state must carry the position in the sequence, not only the seed
        state = get_rng_state(i)
        expect(isinstance(state, torch.Tensor) and state.device.type == "cpu" and state.dtype == torch.uint8,
               f"get_rng_state({i}) returned {type(state).__name__} "
               f"{getattr(state, 'dtype', '')} {getattr(state, 'device', '')}, not a CPU uint8 tensor")
        for spelled in (device, str(device)):
            expect(torch.equal(get_rng_state(spelled), state),
                   f"get_rng_state({spelled!r}) differs from get_rng_state({i})")
        with torch.accelerator.device_index(i):
            expect(torch.equal(get_rng_state(), state), f"under device_index({i}) get_rng_state() is not device {i}'s")
        first = _draws(device, n)
        set_rng_state(state, i)
        differ = _differing(first, _draws(device, n))
        expect(not differ, f"on {device}, {', '.join(differ)} differ after set_rng_state(get_rng_state({i}), {i})")
        with torch.accelerator.device_index(i):
            set_rng_state(state)
        differ = _differing(first, _draws(device, n))
        expect(not differ, f"under device_index({i}), set_rng_state(state) did not restore device {i}: "
                           f"{', '.join(differ)} differ")
    covered = ""
    if b.device_count > 1:
        _draws(b.device(1), n)  # device 1's state now differs from device 0's
        state0, state1 = get_rng_state(0), get_rng_state(1)
        first = _draws(b.device(0), n)
        set_rng_state(state0, 0)
        _draws(b.device(1), n)
        set_rng_state(state1, 1)
        differ = _differing(first, _draws(b.device(0), n))
        expect(not differ, f"set_rng_state(state, 1) changed device 0's {', '.join(differ)} draws")
        covered = "; setting device 1's state leaves device 0's"
    accelerator_get = getattr(getattr(torch.accelerator, "random", None), "get_rng_state", None)
    if accelerator_get is not None:
        for i in range(b.device_count):
            expect(torch.equal(accelerator_get(i), get_rng_state(i)),
                   f"torch.accelerator.random.get_rng_state({i}) differs from torch.{b.name}.get_rng_state({i})")
        covered += "; torch.accelerator.random.get_rng_state agrees"
    return f"{b.device_count} device(s){covered}"


@check("torch.random.fork_rng(device_type=NAME) restores the CPU's and every device's generator on exit")
def fork_rng(b):
    for name in ("device_count", "get_rng_state", "set_rng_state"):
        b.module_function(name)  # what fork_rng calls on the device module
    n = _size(b)
    devices = list(range(b.device_count))
    for forked_devices in (devices, None):
        torch.manual_seed(_SEED)
        expected = [_draws(b.device(i), n) for i in devices]
        expected_cpu = _cpu_draws()
        torch.manual_seed(_SEED)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # devices=None warns on more than one device
            with torch.random.fork_rng(devices=forked_devices, device_type=b.name):
                torch.manual_seed(_SEED + 3)
                for i in devices:
                    _draws(b.device(i), n)
                _cpu_draws()
        how = "devices=None" if forked_devices is None else f"devices={devices}"
        for i in devices:
            differ = _differing(expected[i], _draws(b.device(i), n))
            expect(not differ, f"after fork_rng({how}) device {i}'s {', '.join(differ)} draws are not restored")
        expect(torch.equal(_cpu_draws(), expected_cpu), f"after fork_rng({how}) the CPU generator is not restored")
    return f"{b.device_count} device(s), with devices listed and with devices=None"


def _new_generator(device) -> torch.Generator:
    try:
        return torch.Generator(device=device)
    except NotImplementedError as error:  # PrivateUse1HooksInterface without getNewGenerator
        raise NotSupported(f"torch.Generator(device={str(device)!r}) raised {first_line(error)}") from None


@check("torch.Generator(device=...) with manual_seed reproduces draws passed as generator=, "
       "apart from the default generator; get_state/set_state replay them")
def generator_object(b):
    n = _size(b)
    for i in range(b.device_count):
        device = b.device(i)
        g = _new_generator(device)
        expect(g.device == device, f"torch.Generator(device={str(device)!r}).device is {g.device}")
        g.manual_seed(_SEED)
        expect(g.initial_seed() == _SEED, f"the generator's initial_seed() is {g.initial_seed()}, not {_SEED}")

        torch.manual_seed(_SEED + 5)
        default_alone = _draws(device, n)
        torch.manual_seed(_SEED + 5)
        first = _draws(device, n, generator=g)
        differ = _differing(default_alone, _draws(device, n))
        expect(not differ, f"drawing with generator= changed {device}'s default generator ({', '.join(differ)})")

        g.manual_seed(_SEED)
        differ = _differing(first, _draws(device, n, generator=g))
        expect(not differ, f"on {device}, {', '.join(differ)} with generator= differ after g.manual_seed again")
        twin = _new_generator(device)
        twin.manual_seed(_SEED)
        differ = _differing(first, _draws(device, n, generator=twin))
        expect(not differ, f"on {device}, two generators seeded alike draw different {', '.join(differ)}")

        state = g.get_state()
        after = _draws(device, n, generator=g)
        g.set_state(state)
        differ = _differing(after, _draws(device, n, generator=g))
        expect(not differ, f"on {device}, {', '.join(differ)} differ after g.set_state(g.get_state())")
    return f"{b.device_count} device(s)"


@check("torch.utils.checkpoint with dropout (use_reentrant True and False) gives gradients equal bit for bit "
       "to the same model without checkpointing")
def checkpoint_dropout(b):
    import torch.nn as nn
    from torch.utils.checkpoint import checkpoint

    for name in ("device", "get_rng_state", "set_rng_state"):
        b.module_function(name)  # checkpoint saves and restores the device's state through these
    for i in range(b.device_count):
        device = b.device(i)
        torch.manual_seed(_SEED)
        model = nn.Sequential(nn.Linear(32, 64), nn.Dropout(0.5), nn.ReLU(), nn.Linear(64, 8)).to(device)
        x = torch.randn(16, 32, device=device)

        def gradients(run):
            model.zero_grad(set_to_none=True)
            inputs = x.detach().requires_grad_(True)  # use_reentrant=True needs an input that requires grad
            torch.manual_seed(_SEED + 11)
            out = run(inputs)
            torch.rand(1024, device=device)  # moves the generator on between forward and recomputation
            out.square().sum().backward()
            return [out.detach().cpu(), inputs.grad.cpu()] + [p.grad.cpu() for p in model.parameters()]

        reference = gradients(model)
        for reentrant in (True, False):
            got = gradients(lambda t: checkpoint(model, t, use_reentrant=reentrant))
            expect(torch.equal(got[0], reference[0]),
                   f"on {device}, checkpoint(use_reentrant={reentrant})'s output differs from the model's")
            differ = [k for k in range(1, len(got)) if not torch.equal(got[k], reference[k])]
            expect(not differ, f"on {device}, checkpoint(use_reentrant={reentrant}) gives different gradients "
                               f"({len(differ)} of {len(got) - 1} tensors): dropout was recomputed with another mask")
    return f"both use_reentrant modes on {b.device_count} device(s)"
