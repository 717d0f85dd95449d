"""The training that test_lightning.py runs under Lightning, on openreg and
on the CPU; run as a script (``python _lightning_training.py OUT_DIR``),
its two-rank DDP fit on openreg.

Lightning's DDP launcher starts the other rank by running this file again
(with LOCAL_RANK set), so it must stay importable without pytest. Each rank
writes what it saw to OUT_DIR/rank{R}.json. The module imports no
torch_openreg: a script that tests the autoload path uses it too.
"""

from __future__ import annotations

import json
import os
import sys

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SAMPLES = 14  # in DDP, 7 a rank: batches of 3, 3 and 1
FEATURES, OUTPUTS = 4, 3


def dataset() -> TensorDataset:
    """(sample index, input, target) triples."""
    g = torch.Generator().manual_seed(0)
    inputs = torch.randn(SAMPLES, FEATURES, generator=g)
    targets = torch.randn(SAMPLES, OUTPUTS, generator=g)
    return TensorDataset(torch.arange(SAMPLES), inputs, targets)


def loader(batch_size: int, sampler=None) -> DataLoader:
    return DataLoader(dataset(), batch_size=batch_size, sampler=sampler)


class Regression(pl.LightningModule):
    """A linear layer fit by SGD to a mean squared error, from the same
    weights every time. Each ``training_step`` records where the weight is,
    the current openreg device and the indices of its samples."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(FEATURES, OUTPUTS)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in self.layer.parameters():
                p.uniform_(-0.5, 0.5, generator=g)
        self.steps: list[dict] = []

    def training_step(self, batch, batch_idx):
        indices, inputs, targets = batch
        self.steps.append(
            {
                "device": str(self.layer.weight.device),
                "current": torch.openreg.current_device(),
                "indices": indices.tolist(),
            }
        )
        return nn.functional.mse_loss(self.layer(inputs), targets)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def final_parameters(self) -> dict[str, list]:
        return {name: p.detach().cpu().tolist() for name, p in self.named_parameters()}


def trainer(**kwargs) -> pl.Trainer:
    """A Trainer for one epoch, without the extras that cost time or write files."""
    return pl.Trainer(
        max_epochs=1,
        enable_progress_bar=False,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        **kwargs,
    )


def _ddp_rank(out_dir: str) -> None:
    import torch_openreg  # noqa: F401

    model = Regression()
    fit = trainer(accelerator="openreg", devices=2)
    fit.fit(model, loader(batch_size=3))
    result = {
        "strategy": type(fit.strategy).__name__,
        "launcher": type(fit.strategy.launcher).__name__,
        "backend": torch.distributed.get_backend(),
        "world_size": fit.world_size,
        "root_device": str(fit.strategy.root_device),
        "steps": model.steps,
        "parameters": model.final_parameters(),
    }
    path = os.path.join(out_dir, f"rank{fit.global_rank}.json")
    with open(path + ".part", "w") as f:
        json.dump(result, f)
    os.replace(path + ".part", path)  # whole, or not there


if __name__ == "__main__":
    _ddp_rank(sys.argv[1])
