"""DataLoader with worker processes pinning batches for openreg, and
non_blocking copies of the pinned batches, in a subprocess under a deadline
(worker processes: fork, as by default, from a parent that has initialized
openreg, and spawn)."""

import pytest

from _openreg_util import script

DATALOADER = script(
    "dataloader",
    """
    import warnings
    import torch, torch_openreg
    from torch.utils.data import DataLoader, TensorDataset

    # An importable dataset type: spawned workers unpickle it.
    SQUARES = TensorDataset(
        torch.arange(40, dtype=torch.float32).pow(2).view(40, 1, 1).expand(40, 3, 4).contiguous(), torch.arange(40)
    )

    def run(context, **pin):
        loader = DataLoader(SQUARES, batch_size=8, num_workers=2, pin_memory=True,
                            multiprocessing_context=context, **pin)
        out = {"pinned": [], "devices": set()}
        batches = []
        for x, i in loader:
            out["pinned"].append(x.is_pinned() and i.is_pinned())
            # Behind a busy stream: the copies are queued, the pinned batch
            # is dropped at the next step while its copy may still wait.
            torch.openreg._sleep(20)
            batches.append((x.to("openreg:1", non_blocking=True), i.to("openreg:1", non_blocking=True)))
        out["devices"] = sorted({str(t.device) for pair in batches for t in pair})
        x = torch.cat([b[0] for b in batches]).cpu()
        i = torch.cat([b[1] for b in batches]).cpu()
        expected = torch.arange(40, dtype=torch.float32).pow(2).view(40, 1, 1).expand(40, 3, 4)
        out["values_ok"] = bool(torch.equal(x, expected)) and i.tolist() == list(range(40))
        out["pinned"] = all(out["pinned"]) and len(out["pinned"]) == 5
        return out

    if __name__ == "__main__":
        torch.ones(1, device="openreg:0").sum().item()  # the parent is initialized
        with warnings.catch_warnings():
            # torch 2.15 deprecates pin_memory_device (the current accelerator is used)
            warnings.filterwarnings("ignore", message="pin_memory_device is deprecated")
            RESULT["fork"] = run("fork", pin_memory_device="openreg")
            RESULT["spawn"] = run("spawn", pin_memory_device="openreg")
        RESULT["accelerator_default"] = run("fork")
        done(RESULT)
    """,
    timeout=110,
)


@pytest.mark.subprocess
@pytest.mark.parametrize("case", ["fork", "spawn", "accelerator_default"])
def test_pinned_batches_from_workers(case):
    result = DATALOADER.result().check_ok()[case]
    assert result == {"pinned": True, "devices": ["openreg:1"], "values_ok": True}, result
