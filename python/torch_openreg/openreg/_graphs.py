"""Graph capture helpers, as ``torch.cuda`` has them. The graph itself is
``torch.accelerator.Graph``, which PyTorch builds from the openreg
``at::GraphImplInterface`` (cpp/graphs/graph.cpp, src/runtime/graph.rs)::

    s = torch.Stream(device="openreg")
    g = torch.accelerator.Graph()
    with s, g:            # capture: recorded, not run
        y = model(x)
    for batch in data:
        x.copy_(batch)    # refill the static input in place
        g.replay()        # run the recorded work on the current stream
"""

from __future__ import annotations

from torch_openreg import _C

from ._device import current_device


def graph_pool_handle() -> tuple[int, int]:
    """A fresh memory pool id: graphs given it as ``pool=`` share memory
    (replay them in the order they were captured)."""
    return _C._graph_pool_handle()


def is_current_stream_capturing() -> bool:
    """Whether the current stream of the current device is capturing a graph."""
    return _C._is_current_stream_capturing(current_device())
