"""``torch.compile(model, backend="openreg")`` and ``backend="openreg_graphs"``:
what ``mode="reduce-overhead"`` gives on CUDA, on openreg.

Note [Graphed compile backend]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Inductor's graph trees (``mode="reduce-overhead"``) capture CUDA graphs only
(torch 2.15: ``_CUDAGRAPH_SUPPORTED_DEVICE_TYPES``). This backend does the
same for openreg with ``torch.accelerator.Graph``, the way PyTorch's own
``backend="cudagraphs"`` does for CUDA: AOT Autograd splits the program
into a forward and a backward graph, and each compiled graph is wrapped so
that

- its first call runs eagerly (the warm-up: allocations, fallback plans and
  optimizer-free state settle) and returns that call's results; the graph is
  then captured on a side stream, over static copies of its inputs, which
  executes nothing (Note [Graph capture] in src/graph.rs);
- every later call copies the inputs that change from call to call into the
  static copies (parameters, and tensors dynamo marks as static addresses,
  are used in place, as graph trees use them), replays the graph on the
  current stream, and returns
  clones of the static outputs (so a result stays valid after the next
  call, unlike graph trees' outputs, which the next replay overwrites).

A graph that cannot be captured (an op that synchronizes with the host, a
data-dependent shape, inputs on another device or with symbolic sizes) runs
eagerly from then on, with a warning naming why. Random ops draw new numbers
on each replay (Note [Graph-safe random numbers]).

Note [The openreg compile backend]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
``backend="openreg"`` is the device's own name for its best compile path,
what Inductor with ``mode="reduce-overhead"`` is on CUDA: Inductor compiles
the forward and backward graphs (C++ kernels in stream order, Note [Inductor
kernels in stream order] in _inductor.py), and each compiled graph is
wrapped as above, so its kernels are captured once and replayed.
``backend="openreg_graphs"`` graphs AOT Autograd's graphs run as FX
interpreters instead (no code generation, nothing to compile).

- Inductor hands each compiled graph to ``compile_fx``'s ``inner_compile``,
  which wraps its callable. The inputs used in place are the same as for
  ``openreg_graphs``, not Inductor's ``static_input_idxs``: those count the
  backward's saved activations as static, as graph trees keep the forward's
  outputs in their pool, whereas here the forward returns clones.
- AOT Autograd's cache is off for these compiles: an entry it loads never
  passes through ``inner_compile`` (it would run without graphs), and an
  entry saved here would be loaded by a plain Inductor compile of the same
  graph. Inductor's FX graph cache stays on: it sits inside
  ``inner_compile``, before the wrapping.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

_DEVICE_TYPE = "openreg"


class _GraphedCallable:
    """A boxed callable (it takes the list of inputs and empties it, as AOT
    Autograd calls compiled graphs) that replays one captured graph of
    ``fn`` after its first, eager, call."""

    def __init__(self, fn: Callable[[list[Any]], Any], static_input_indices: set[int], backend: str, name: str):
        # An instance attribute: wrappers (torch._dynamo.disable) copy
        # __dict__, so AOT Autograd still sees a boxed callable through them.
        self._boxed_call = True
        self._fn = fn
        self._static_input_indices = static_input_indices
        self._backend = backend
        self._name = name
        self._graph: torch.accelerator.Graph | None = None
        self._eager_only = False
        self._static_inputs: list[Any] = []
        self._static_outputs: Any = None

    def __call__(self, inputs: list[Any]) -> Any:
        if self._graph is not None:
            return self._replay(inputs)
        if self._eager_only:
            return self._fn(inputs)
        why = self._not_capturable(inputs)
        if why:
            self._eager_only = True
            warnings.warn(f"{self._backend}: the {self._name} graph runs eagerly: {why}")
            return self._fn(inputs)
        outputs = self._fn(list(inputs))  # the warm-up call's own results
        self._static_input_indices |= {i for i, value in enumerate(inputs) if _has_static_address(value)}
        self._capture(inputs)
        inputs.clear()
        return outputs

    @staticmethod
    def _not_capturable(inputs: list[Any]) -> str | None:
        devices = set()
        for value in inputs:
            if isinstance(value, torch.Tensor):
                devices.add(value.device)
            elif isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                return "an input has a symbolic size (dynamic shapes)"
        if any(d.type != _DEVICE_TYPE for d in devices):
            return f"inputs on {sorted(str(d) for d in devices)}, not all on one openreg device"
        if len(devices) > 1:
            return f"inputs on several devices: {sorted(str(d) for d in devices)}"
        return None

    def _capture(self, inputs: list[Any]) -> None:
        self._static_inputs = [
            value
            if i in self._static_input_indices or not isinstance(value, torch.Tensor)
            else torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device=value.device).copy_(value)
            for i, value in enumerate(inputs)
        ]
        device = next(v.device for v in inputs if isinstance(v, torch.Tensor))
        with torch.accelerator.device_index(device.index):
            side = torch.Stream(device=device)
            side.wait_stream(torch.accelerator.current_stream())
            graph = torch.accelerator.Graph(capture_error_mode="thread_local")
            try:
                with side, graph:
                    self._static_outputs = self._fn(list(self._static_inputs))
            except RuntimeError as e:
                graph.reset()
                self._static_inputs, self._static_outputs = [], None
                self._eager_only = True
                warnings.warn(
                    f"{self._backend}: the {self._name} graph could not be captured and runs eagerly: {e}"
                )
                return
            torch.accelerator.current_stream().wait_stream(side)
        self._graph = graph

    def _replay(self, inputs: list[Any]) -> Any:
        for i, (static, value) in enumerate(zip(self._static_inputs, inputs)):
            if i not in self._static_input_indices and isinstance(value, torch.Tensor):
                if value.data_ptr() != static.data_ptr():
                    static.copy_(value)
        inputs.clear()
        self._graph.replay()
        return [o.clone() if isinstance(o, torch.Tensor) else o for o in self._static_outputs]


def _has_static_address(value: Any) -> bool:
    """Parameters and the tensors dynamo marked (mark_static_address, module
    buffers) keep their memory from call to call."""
    return isinstance(value, torch.nn.Parameter) or hasattr(value, "_dynamo_static_input_type")


def _forward_fixed_inputs(dynamo_inputs: int, inputs: list[Any]) -> int:
    """How many leading inputs of AOT Autograd's forward graph are used in
    place: the parameters and buffers it lifted in front of dynamo's inputs.
    The backward graph has none: its saved activations and tangents change on
    every step (the forward's results are clones)."""
    from torch._inductor.utils import num_fw_fixed_arguments

    return num_fw_fixed_arguments(dynamo_inputs, len(inputs))


def _graphed(backend: str, name: str, fixed_inputs: Callable[[list[Any]], int]):
    """An AOT Autograd compiler that graphs ``gm`` run as an FX interpreter;
    its first ``fixed_inputs(inputs)`` inputs are used in place."""
    from torch._dynamo.backends.debugging import boxed_nop

    def compile_graph(gm: torch.fx.GraphModule, inputs: list[Any]) -> _GraphedCallable:
        return _GraphedCallable(boxed_nop(gm, inputs), set(range(fixed_inputs(inputs))), backend, name)

    return compile_graph


def openreg_graphs(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable[..., Any]:
    """The ``openreg_graphs`` dynamo backend (Note [Graphed compile backend])."""
    from torch._dynamo.backends.common import aot_autograd

    if kwargs:
        warnings.warn(f"openreg_graphs ignores the options {sorted(kwargs)}")
    dynamo_inputs = len(example_inputs)

    def forward_fixed(inputs: list[Any]) -> int:
        return _forward_fixed_inputs(dynamo_inputs, inputs)

    compiler = aot_autograd(
        fw_compiler=_graphed("openreg_graphs", "forward", forward_fixed),
        bw_compiler=_graphed("openreg_graphs", "backward", lambda inputs: 0),
        inference_compiler=_graphed("openreg_graphs", "inference", forward_fixed),
    )
    return compiler(gm, example_inputs)


def openreg(
    gm: torch.fx.GraphModule, example_inputs: list[Any], options: dict[str, Any] | None = None, **kwargs: Any
) -> Callable[..., Any]:
    """The ``openreg`` dynamo backend (Note [The openreg compile backend]):
    Inductor, its compiled graphs replayed. ``options`` are Inductor's
    (``torch.compile(..., options=...)``)."""
    import torch._functorch.config
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    if kwargs:
        warnings.warn(f"the openreg backend ignores the options {sorted(kwargs)}")
    dynamo_inputs = len(example_inputs)

    def graphed_inner_compile(gm: torch.fx.GraphModule, inputs: list[Any], **inner_kwargs: Any):
        compiled = compile_fx_inner(gm, inputs, **inner_kwargs)
        if inner_kwargs.get("is_backward"):
            name, fixed = "backward", 0
        else:
            name = "inference" if inner_kwargs.get("is_inference") else "forward"
            fixed = _forward_fixed_inputs(dynamo_inputs, inputs)
        compiled.current_callable = _GraphedCallable(compiled.current_callable, set(range(fixed)), "openreg", name)
        return compiled

    with torch._functorch.config.patch(enable_autograd_cache=False):
        return compile_fx(gm, example_inputs, inner_compile=graphed_inner_compile, config_patches=options)
