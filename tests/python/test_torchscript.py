"""TorchScript on openreg: scripted and traced functions and modules run as
on CPU and never hang (a list TorchScript builds for `x[mask] = v` reached
the CPU kernel unconverted, which then waited for its own stream: Note
[Waiting from inside a kernel] in src/runtime/stream.rs)."""

import warnings

import pytest
import torch
from torch import nn

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated, still supported

    @torch.jit.script
    def masked_assign(x):
        x[x < 50] = 1.0
        return x

    @torch.jit.script
    def index_with_lists(x, rows: torch.Tensor, cols: torch.Tensor):
        y = x.clone()
        y[rows, cols] = y[rows, cols] * 2
        return y[rows], y[:, cols].sum(0)


def test_scripted_masked_assignment():
    for device in ["openreg", "openreg:1"]:
        got = masked_assign(torch.arange(100.0, device=device))
        want = masked_assign(torch.arange(100.0))
        assert got.device.type == "openreg"
        assert torch.equal(got.cpu(), want)


def test_scripted_advanced_indexing():
    x = torch.randn(5, 4)
    rows, cols = torch.tensor([0, 2, 4]), torch.tensor([1, 3, 0])
    got = index_with_lists(x.to("openreg"), rows.to("openreg"), cols.to("openreg"))
    want = index_with_lists(x, rows, cols)
    torch.testing.assert_close([t.cpu() for t in got], list(want))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(6, 6)
        self.norm = nn.LayerNorm(6)

    def forward(self, x):
        h = self.norm(torch.relu(self.linear(x)))
        h[h > 1.0] = 1.0
        return h.softmax(-1)


@pytest.mark.parametrize("compile_with", ["script", "trace"])
def test_scripted_and_traced_modules_match_cpu(compile_with):
    torch.manual_seed(0)
    model = Block()
    x = torch.randn(3, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = torch.jit.script(model) if compile_with == "script" else torch.jit.trace(model, x)
        want = compiled(x)
        compiled.to("openreg")
        got = compiled(x.to("openreg"))
    torch.testing.assert_close(got.cpu(), want)
    got.sum().backward()
    assert all(p.grad is not None and p.grad.device.type == "openreg" for p in compiled.parameters())
