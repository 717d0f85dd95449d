"""openreg with Hugging Face accelerate and transformers' Trainer: one device
for both libraries, and a warning where a multi-process launch would train
each process alone.

Neither library is modified: openreg sets one of accelerate's environment
variables, or warns, when their modules are imported (Note [Registering
with lazily imported torch modules]), so ``import torch_openreg`` imports
neither. Read against accelerate 1.16 and transformers 5.25
(requirements-training.txt).

Note [HF Trainer's device with openreg]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Two libraries choose the Trainer's device, each its own way:

- accelerate's state (``PartialState``, made by ``TrainingArguments`` and
  shared by the ``Accelerator`` that prepares the model) takes
  ``ACCELERATE_TORCH_DEVICE`` if it is set, else CPU for ``cpu=True``, else
  ``torch.accelerator.current_accelerator()``: openreg wherever openreg is
  installed and no CUDA is, since ``import torch`` loads it.
- ``TrainingArguments.device``, where the Trainer puts each batch, is
  accelerate's in a distributed run; otherwise CPU for ``use_cpu=True``,
  else the first of the backends transformers names one by one (CUDA, MPS,
  XPU, ...; not openreg), else ``ACCELERATE_TORCH_DEVICE``, else CPU.

Left alone, the model goes to openreg and the batches stay on CPU: the first
step fails with "Expected all tensors to be on the same device, but found
at least two devices, openreg:0 and cpu!", in any script that trains with
the Trainer on a machine where openreg is merely installed. So when
``transformers.training_args`` is imported, if ``ACCELERATE_TORCH_DEVICE``
is unset and the current accelerator is openreg (never where it is CUDA or
any other), openreg sets it to "cpu": both libraries read CPU, and the
Trainer trains on CPU as it would without openreg. CPU is the only default
under which the two never disagree: ``use_cpu=True`` makes transformers
choose CPU whatever the variable says. The variable is in ``os.environ``:
an ``Accelerator`` made later in the process, and processes started from
it, use CPU too.

To train on openreg, set ``ACCELERATE_TORCH_DEVICE=openreg`` (accelerate's
own variable, which transformers reads too) before the import. NB: not
together with ``use_cpu=True`` in one process: accelerate takes the
variable first and transformers takes CPU, and the devices mix again (in a
distributed run the pair is what trains openreg: Note [accelerate across
processes with openreg]). Nor with ``ACCELERATE_USE_CPU=1``: accelerate
reads that variable again for each optimizer it prepares, finds its device
is not CPU and raises.

Note [accelerate across processes with openreg]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
accelerate distributes an accelerator only through its table of backends
(``accelerate.utils.constants.TORCH_DISTRIBUTED_BACKENDS``: NCCL for CUDA
and the like), which has no openreg: in a process launched as one of
several (torchrun, ``accelerate launch --multi_gpu``), ``Accelerator()`` on
openreg gets ``DistributedType.NO`` and says process 0 of 1, and every
process trains alone on all the data, with nothing averaged.

Its CPU path distributes any device: with ``cpu=True`` accelerate starts a
gloo process group (``DistributedType.MULTI_CPU``), and its device is still
``ACCELERATE_TORCH_DEVICE`` if that is set; gloo serves openreg tensors
(Note [Collectives over gloo] in _distributed.py). So
``ACCELERATE_TORCH_DEVICE=openreg`` with ``Accelerator(cpu=True)``, or with
``TrainingArguments(use_cpu=True)`` for the Trainer, trains openreg in every
process: the model wrapped in DistributedDataParallel, the dataloader
sharded, gradients averaged over gloo. Each process's device is
``openreg:0`` (the variable names no index; each process has its own
devices). The argument, not ``ACCELERATE_USE_CPU=1``, which raises once an
optimizer is prepared (Note [HF Trainer's device with openreg]); so
``accelerate launch --cpu`` (which sets it) does not serve, and ``accelerate
launch`` needs ``--multi_gpu`` to start several processes at all; torchrun
needs nothing more.

Where that is not asked for, openreg warns: when ``accelerate.state`` is
imported in a process whose ``WORLD_SIZE`` is above 1, on openreg, with
neither ``ACCELERATE_USE_CPU`` nor ``ACCELERATE_TORCH_DEVICE`` set. That
import is the last point openreg sees before accelerate decides: the
decision is made in ``PartialState.__init__``, where openreg's code runs
only to answer ``torch.accelerator.is_available()``, a query that cannot
tell accelerate from any other caller. So the warning
cannot see the ``cpu`` argument: it names it as the condition, it shows up
also for a CPU run asked with ``cpu=True`` alone, and not for
``ACCELERATE_TORCH_DEVICE=openreg`` without ``cpu=True``, which still
trains each process alone.
"""

from __future__ import annotations

import os
import warnings
from types import ModuleType

import torch

_DEVICE_VARIABLE = "ACCELERATE_TORCH_DEVICE"


def _on_openreg() -> bool:
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is not None and accelerator.type == "openreg"


def default_trainer_device(_training_args: ModuleType) -> None:
    """Run when ``transformers.training_args`` is imported: the Trainer's
    device defaults to CPU (Note [HF Trainer's device with openreg])."""
    if _DEVICE_VARIABLE not in os.environ and _on_openreg():
        os.environ[_DEVICE_VARIABLE] = "cpu"


def warn_undistributed(state: ModuleType) -> None:
    """Run when ``accelerate.state`` is imported: warns where a launch of
    several processes would train each alone (Note [accelerate across
    processes with openreg]). ``state``'s own helpers read the environment
    as accelerate does."""
    world_size = state.get_int_from_env(["WORLD_SIZE"], 1)
    if (
        world_size > 1
        and not state.parse_flag_from_env("ACCELERATE_USE_CPU")
        and _DEVICE_VARIABLE not in os.environ
        and _on_openreg()
    ):
        warnings.warn(
            f"torch_openreg: this process is one of {world_size} (WORLD_SIZE), but accelerate has no distributed "
            "backend for openreg: an Accelerator or HF Trainer made here without cpu=True (use_cpu=True) gets "
            "DistributedType.NO, and each process trains alone on all the data, with no gradients averaged. "
            f"To train openreg in every process over gloo, set {_DEVICE_VARIABLE}=openreg and pass "
            "Accelerator(cpu=True) or TrainingArguments(use_cpu=True); or use torch.distributed with "
            "DistributedDataParallel over backend='gloo'. See Note [accelerate across processes with openreg] "
            "in torch_openreg/_huggingface.py."
        )
