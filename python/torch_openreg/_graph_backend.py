"""``torch.compile(model, backend="openreg")`` and ``backend="openreg_graphs"``:
what ``mode="reduce-overhead"`` gives on CUDA, on openreg.

Note [Graphed compile backend]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Inductor's graph trees (``mode="reduce-overhead"``) capture CUDA graphs only
(torch 2.15: ``_CUDAGRAPH_SUPPORTED_DEVICE_TYPES``). This backend does the
same for openreg with ``torch.accelerator.Graph``, the way PyTorch's own
``backend="cudagraphs"`` does for CUDA: AOT Autograd splits the program
into a forward and a backward graph, and each compiled graph is wrapped so
that it records one graph per input signature it meets, as graph trees
record one per distinct set of int inputs (the sizes dynamic shapes pass):

- a call's signature holds each non-tensor input's value, each tensor
  input's sizes, strides, dtype and device, and, for the inputs used in
  place (parameters, and tensors dynamo marks as static addresses, as graph
  trees use them; which these are is settled by the first recording), their
  data_ptr instead, so that a graph is never replayed over memory it was
  not recorded on. Their layout is the compiled graph's own: dynamo guards
  every input's dtype, device and static sizes and strides before calling
  it, and passes the values of the dynamic ones among the int inputs. The
  signature is a tuple built on every call and looked up in a dict: about
  0.7 us per copied tensor and 0.1 us per input used in place on a 2-core
  x86 machine (2 us for the forward of an MLP training step, 6 us for its
  backward);
- a call with a new signature runs eagerly (the warm-up: allocations,
  fallback plans and optimizer-free state settle) and returns that call's
  results; its graph is then captured on a side stream, over static copies
  of the tensor inputs not used in place, in a memory pool of its own,
  which executes nothing (Note [Graph capture] in src/runtime/graph.rs);
- a call whose signature was recorded copies those inputs into its graph's
  static copies, replays the graph on the current stream, and returns
  clones of the static outputs (so a result stays valid after the next
  call, unlike graph trees' outputs, which the next replay overwrites); an
  output that is one of the inputs (a parameter the forward saves for the
  backward) is returned as that input, as eagerly;
- an input the compiled graph writes in place (Inductor's
  ``mutated_input_idxs``; for an FX graph, a placeholder it ``aten.copy_``-es
  into) is, if copied, copied back from its static copy into the caller's
  tensor after each replay, on the current stream. It is copied rather
  than used in place because its address may change on every call (a
  batch, a saved activation), and a graph per address would reach
  ``MAX_GRAPHS`` at once. Which graphs write inputs (torch 2.15): Inductor
  keeps inference and forward input mutations in its graphs;
  ``openreg_graphs`` leaves AOT Autograd's ``keep_inference_input_mutations``
  off, so AOT Autograd returns those as outputs and copies them into the
  inputs itself, and only a backward writes inputs (an input of the forward
  it saved, written in place by a custom backward). BatchNorm's running
  statistics are buffers, used in place: their updates are already the
  caller's.

A compiled graph records at most ``MAX_GRAPHS`` graphs (8, the count past
which graph trees warn, ``cudagraph_dynamic_shape_warn_limit``), each with
its pool and static copies. Recording stops at that bound, at inputs not
all on one openreg device, at a call with no tensor inputs (an FX graph
makes its tensors on the device current at each call, which signatures do
not hold; running it eagerly is exactly eager, and such a graph has no
inputs to copy), and at a graph that cannot be captured (an op that
synchronizes with the host, a data-dependent shape), with one warning
naming the backend, the graph and why (at the bound: ``MAX_GRAPHS``, to be
raised for more): from then on the signatures recorded replay and every
other runs eagerly. Random ops draw new numbers on each replay (Note
[Graph-safe random numbers]).

Note [The openreg compile backend]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
``backend="openreg"`` is the device's own name for its best compile path,
what Inductor with ``mode="reduce-overhead"`` is on CUDA: Inductor compiles
the forward and backward graphs (C++ kernels in stream order, Note [Inductor
kernels in stream order] in _inductor.py), and each compiled graph is
wrapped as above, so its kernels are captured once per input signature
and replayed.
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

import operator
import warnings
from typing import Any, Callable, NamedTuple

import torch

_DEVICE_TYPE = "openreg"

# The most graphs one compiled graph records (Note [Graphed compile backend]).
MAX_GRAPHS = 8


class _Recording(NamedTuple):
    """One captured graph of a compiled graph, for one input signature."""

    graph: torch.accelerator.Graph
    copies: list[tuple[int, torch.Tensor]]  # (input index, its static copy)
    written: list[tuple[int, torch.Tensor]]  # the copies the graph writes, copied back into their inputs
    outputs: list[Any]  # the static outputs, which each replay overwrites; None where an input is returned
    returned_inputs: list[tuple[int, int]]  # (output index, input index): outputs that are inputs


class _GraphedCallable:
    """A boxed callable (it takes the list of inputs and empties it, as AOT
    Autograd calls compiled graphs) that records a graph of ``fn`` for each
    input signature it meets and replays it when that signature recurs
    (Note [Graphed compile backend]). ``fn`` writes the inputs at
    ``mutated_indices`` in place and no others."""

    def __init__(
        self,
        fn: Callable[[list[Any]], Any],
        in_place_indices: set[int],
        mutated_indices: set[int],
        backend: str,
        name: str,
    ):
        # An instance attribute: wrappers (torch._dynamo.disable) copy
        # __dict__, so AOT Autograd still sees a boxed callable through them.
        self._boxed_call = True
        self._fn = fn
        self._in_place_indices = in_place_indices  # completed by the first recording
        self._mutated_indices = mutated_indices
        self._backend = backend
        self._name = name
        self._recordings: dict[tuple[Any, ...], _Recording] = {}
        self._signature: Callable[[list[Any]], tuple[Any, ...]] | None = None  # set by the first recording
        self._stopped = False  # records no more graphs

    def __call__(self, inputs: list[Any]) -> Any:
        if self._recordings:
            recording = self._recordings.get(self._signature(inputs))
            if recording is not None:
                return self._replay(recording, inputs)
        return self._call_unrecorded(inputs)

    def _call_unrecorded(self, inputs: list[Any]) -> Any:
        """Runs a call whose signature has no graph eagerly, then records
        one for it unless recording has stopped or stops now."""
        if not self._stopped:
            why = self._not_recordable(inputs)
            if why:
                self._stop_recording(why)
        if self._stopped:
            return self._fn(inputs)
        if self._signature is None:
            self._in_place_indices |= {i for i, value in enumerate(inputs) if _has_static_address(value)}
            self._signature = _signature_function(len(inputs), self._in_place_indices)
        signature = self._signature(inputs)
        outputs = self._fn(list(inputs))  # the warm-up call's own results
        recording = self._capture(inputs)
        if recording is not None:
            self._recordings[signature] = recording
        inputs.clear()
        return outputs

    def _not_recordable(self, inputs: list[Any]) -> str | None:
        if len(self._recordings) >= MAX_GRAPHS:
            return (
                f"it has recorded {len(self._recordings)} graphs, the bound "
                f"torch_openreg._graph_backend.MAX_GRAPHS = {MAX_GRAPHS} (raise it to record more)"
            )
        devices = {value.device for value in inputs if isinstance(value, torch.Tensor)}
        if not devices:
            return "it has no tensor inputs"
        if any(d.type != _DEVICE_TYPE for d in devices):
            return f"inputs on {sorted(str(d) for d in devices)}, not all on one openreg device"
        if len(devices) > 1:
            return f"inputs on several devices: {sorted(str(d) for d in devices)}"
        return None

    def _stop_recording(self, why: str) -> None:
        self._stopped = True
        kept = f"; those it recorded ({len(self._recordings)}) keep replaying" if self._recordings else ""
        warnings.warn(f"{self._backend}: the {self._name} graph runs eagerly for new input signatures: {why}{kept}")

    def _capture(self, inputs: list[Any]) -> _Recording | None:
        """A graph of ``fn`` over static copies of the inputs that change
        from call to call, in its own memory pool; None (recording stops)
        if it cannot be captured."""
        static_inputs = [
            value
            if i in self._in_place_indices or not isinstance(value, torch.Tensor)
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
                    outputs = self._fn(list(static_inputs))
            except RuntimeError as e:
                graph.reset()
                self._stop_recording(f"it could not be captured: {e}")
                return None
            torch.accelerator.current_stream().wait_stream(side)
        copies = [
            (i, static)
            for i, static in enumerate(static_inputs)
            if i not in self._in_place_indices and isinstance(static, torch.Tensor)
        ]
        written = [(i, static) for i, static in copies if i in self._mutated_indices]
        position = {id(static): i for i, static in enumerate(static_inputs) if isinstance(static, torch.Tensor)}
        returned_inputs = [(k, position[id(o)]) for k, o in enumerate(outputs) if id(o) in position]
        outputs = list(outputs)
        for k, _ in returned_inputs:
            outputs[k] = None
        return _Recording(graph, copies, written, outputs, returned_inputs)

    def _replay(self, recording: _Recording, inputs: list[Any]) -> Any:
        """Replays ``recording``, whose signature the inputs have, copies
        the static copies it writes back into their inputs, and returns
        clones of its outputs (the inputs themselves for outputs that are
        inputs)."""
        for i, static in recording.copies:
            static.copy_(inputs[i])
        written = [(inputs[i], static) for i, static in recording.written]
        returned = [(k, inputs[i]) for k, i in recording.returned_inputs]
        inputs.clear()
        recording.graph.replay()
        for value, static in written:
            value.copy_(static)
        outputs = [o.clone() if isinstance(o, torch.Tensor) else o for o in recording.outputs]
        for k, value in returned:
            outputs[k] = value
        return outputs


def _signature_function(num_inputs: int, in_place_indices: set[int]) -> Callable[[list[Any]], tuple[Any, ...]]:
    """The signature of a compiled graph's inputs (Note [Graphed compile
    backend]): each non-tensor's value, each copied tensor's sizes, strides,
    dtype and device, and the address of each tensor used in place."""
    others = _items([i for i in range(num_inputs) if i not in in_place_indices])
    in_place = _items(sorted(in_place_indices))
    data_ptr = torch.Tensor.data_ptr

    def signature(inputs: list[Any]) -> tuple[Any, ...]:
        return (
            *[(v.shape, v.stride(), v.dtype, v.device) if isinstance(v, torch.Tensor) else v for v in others(inputs)],
            *map(data_ptr, in_place(inputs)),
        )

    return signature


def _items(indices: list[int]) -> Callable[[list[Any]], tuple[Any, ...]]:
    """A function of a list that gives its items at ``indices`` as a tuple
    (operator.itemgetter gives a lone item bare)."""
    if len(indices) == 1:
        (i,) = indices
        return lambda values: (values[i],)
    return operator.itemgetter(*indices) if indices else lambda values: ()


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


def _mutated_inputs(gm: torch.fx.GraphModule) -> set[int]:
    """The indices of the inputs an AOT Autograd graph writes: those it
    ``aten.copy_``-es into (Note [Graphed compile backend])."""
    placeholders = {node: i for i, node in enumerate(gm.graph.find_nodes(op="placeholder"))}
    copies = gm.graph.find_nodes(op="call_function", target=torch.ops.aten.copy_.default)
    return {placeholders[node.args[0]] for node in copies if node.args[0] in placeholders}


def _graphed(backend: str, name: str, fixed_inputs: Callable[[list[Any]], int]):
    """An AOT Autograd compiler that graphs ``gm`` run as an FX interpreter;
    its first ``fixed_inputs(inputs)`` inputs are used in place."""
    from torch._dynamo.backends.debugging import boxed_nop

    def compile_graph(gm: torch.fx.GraphModule, inputs: list[Any]) -> _GraphedCallable:
        fixed = set(range(fixed_inputs(inputs)))
        return _GraphedCallable(boxed_nop(gm, inputs), fixed, _mutated_inputs(gm), backend, name)

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
        compiled.current_callable = _GraphedCallable(
            compiled.current_callable, set(range(fixed)), set(compiled.mutated_input_idxs), "openreg", name
        )
        return compiled

    with torch._functorch.config.patch(enable_autograd_cache=False):
        return compile_fx(gm, example_inputs, inner_compile=graphed_inner_compile, config_patches=options)
