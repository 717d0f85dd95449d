"""Inductor, ``torch.compile``'s default backend, on openreg.

Note [Inductor kernels in stream order]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
openreg device memory is host memory, so Inductor's C++ code generation for
the CPU can compute on it: openreg registers Inductor's C++ scheduling
(``CppScheduling``) for the device type ``openreg``. What the CPU code does
not do is respect streams: a generated kernel is a C function that the
compiled module calls with the data pointers of its tensors, and the module
runs it at once on the calling thread, while work queued earlier on the
stream may not have run yet (or later work may already run).

So every kernel Inductor generates for openreg becomes a launcher. Its
generated body is kept as a ``static`` function; the function that the module
calls (``kernel``) queues that body, with the same arguments (data pointers
and sizes, captured by value), on the current stream of the kernel's device
through ``torch_openreg::launch`` (``include/torch_openreg/kernel.h``), and
returns. The body then runs on the stream's worker after everything queued
before it and before anything queued after, like every other device kernel
(Note [One door]), with device memory accessible under
``OPENREG_MEMORY_PROTECT=1``. The buffers it writes need no extra lifetime:
device memory is stream-ordered, so a buffer the module frees afterwards is
reused only by work queued later on the same stream (Note [Stream-ordered
memory]). The device index is the one Inductor compiled the kernel for: a
graph whose inputs move to another device recompiles (dynamo guards on
devices).

Library calls that Inductor leaves to ATen (``extern_kernels.mm``, ...) are
ordinary openreg ops and already run in stream order.
"""

from __future__ import annotations

import os
import re

import torch

_DEVICE_TYPE = "openreg"


# The OpenMP team of a generated kernel: one, as every device kernel's
# (Note [Kernel threads] in cpp/device/device_memory.h).
_KERNEL_TEAM = 1


def _kernel_launcher(src_code: str, device_index: int, kernel_name_placeholder: str) -> str:
    """Turn the generated C++ source of one kernel into a launcher (see the Note)."""
    import torch_openreg

    signature = re.search(
        r'extern "C"\s+(?:\w+\s+)*void\s+' + re.escape(kernel_name_placeholder) + r"\s*\(([^)]*)\)", src_code
    )
    if signature is None:
        raise RuntimeError(
            "torch_openreg: the C++ kernel Inductor generated has no recognizable "
            f"'extern \"C\" void {kernel_name_placeholder}(...)' definition; this torch version "
            "is not supported by openreg's Inductor backend"
        )
    parameters = " ".join(signature.group(1).split())
    names = [p.strip().split()[-1].lstrip("*&") for p in parameters.split(",") if p.strip()]
    body_name = "openreg_kernel_body"
    head = src_code[: signature.start()]
    body = src_code[signature.end() :]
    header = os.path.join(torch_openreg.include_dir(), "torch_openreg", "kernel.h")
    return (
        f'{head}#include "{header}"\n'
        f"static void {body_name}({parameters}){body}\n"
        f'extern "C" void {kernel_name_placeholder}({parameters})\n'
        "{\n"
        f"    torch_openreg::launch(torch_openreg::current_stream({device_index}),\n"
        f"                          [=] {{ {body_name}({', '.join(names)}); }});\n"
        "}\n"
    )


def _make_backend():
    from torch._inductor import config
    from torch._inductor.codegen.common import DeviceOpOverrides
    from torch._inductor.codegen.cpp import CppScheduling
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
    from torch._inductor.utils import Placeholder
    from torch._inductor.virtualized import V

    def as_cpp_backend():
        # Note [Inductor's backend name for openreg]: while it generates a
        # kernel, Inductor 2.15 asks get_current_backend() (utils.py) which
        # code generator runs; it answers config.cpu_backend for "cpu" and
        # config.cuda_backend ("triton") for every device it does not know,
        # and then propagates dtypes the Triton way, which leaves the C++
        # code generator without the dtype of an index or a size
        # ("expected index.dtype is not None"). While openreg kernels are
        # generated, the answer is "cpp". Their OpenMP team size is that of
        # every other device kernel, one (Note [Kernel threads]), not the
        # process's thread count.
        return config.patch({"cuda_backend": "cpp", "cpp.threads": _KERNEL_TEAM})

    class OpenRegScheduling(CppScheduling):
        """Inductor's C++ scheduling, with every kernel a stream launcher."""

        def codegen_node(self, node):
            with as_cpp_backend():
                return super().codegen_node(node)

        def codegen_template(self, *args, **kwargs):
            with as_cpp_backend():
                return super().codegen_template(*args, **kwargs)

        def flush(self):
            with as_cpp_backend():
                return super().flush()

        def define_kernel(self, src_code, nodes, kernel_args=None):
            device = V.graph.get_current_device_or_throw()
            if device.type == _DEVICE_TYPE:
                index = device.index if device.index is not None else torch.openreg.current_device()
                src_code = _kernel_launcher(src_code, index, str(Placeholder.KERNEL_NAME))
            return super().define_kernel(src_code, nodes, kernel_args)

    def _call_kernel(wrapper, kernel_name, call_args, kwargs, base_helper):
        device = kwargs.get("device") or V.graph.get_current_device_or_throw()
        if not kwargs.get("triton", True) and device.type == _DEVICE_TYPE:
            # A launcher (OpenRegScheduling): calling it queues the kernel.
            wrapper.writeline(wrapper.wrap_kernel_call(kernel_name, call_args))
            return
        base_helper(kernel_name, call_args, **kwargs)

    class OpenRegSubgraphWrapperCodegen(SubgraphPythonWrapperCodegen):
        def _generate_kernel_call_helper(self, kernel_name, call_args, **kwargs):
            _call_kernel(self, kernel_name, call_args, kwargs, super()._generate_kernel_call_helper)

    class OpenRegWrapperCodegen(PythonWrapperCodegen):
        """Python wrapper code that calls openreg C++ kernels like CPU ones."""

        @staticmethod
        def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
            if is_subgraph:
                return OpenRegSubgraphWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
            return OpenRegWrapperCodegen()

        def _generate_kernel_call_helper(self, kernel_name, call_args, **kwargs):
            _call_kernel(self, kernel_name, call_args, kwargs, super()._generate_kernel_call_helper)

        def make_allocation(self, name, device, dtype, shape, stride, allocation_shape=None, is_pinned=False):
            # The base class names only the device type for devices it does
            # not know ("openreg", i.e. the current device), and Inductor
            # emits no device guard for devices that are not GPUs: name the
            # device in full, so a buffer lands on the kernel's device.
            if device.type != _DEVICE_TYPE:
                return super().make_allocation(name, device, dtype, shape, stride, allocation_shape, is_pinned)
            allocation = self.codegen_python_shape_tuple(shape if allocation_shape is None else allocation_shape)
            sizes = self.codegen_python_shape_tuple(shape)
            strides = self.codegen_python_shape_tuple(stride)
            line = f"{name} = empty_strided({allocation}, {strides}, device='{device}', dtype={dtype})"
            if allocation != sizes:
                line += f".as_strided({sizes}, {strides})"
            return line

    class OpenRegDeviceOpOverrides(DeviceOpOverrides):
        """Python snippets the wrapper emits for device and stream handling."""

        def import_get_raw_stream_as(self, name: str) -> str:
            return f"from torch_openreg._inductor import get_raw_stream as {name}"

        def set_device(self, device_idx) -> str:
            return f"torch.openreg.set_device({device_idx})"

        def synchronize(self) -> str:
            return "torch.openreg.synchronize()"

        def device_guard(self, device_idx) -> str:
            return f"torch.openreg.device({device_idx})"

        def current_stream(self) -> str:
            return "torch.openreg.current_stream()"

    return OpenRegScheduling, OpenRegWrapperCodegen, OpenRegDeviceOpOverrides


def _codegen_version_pass():
    """A graph pass that changes nothing: it exists for its ``uuid``, which
    Inductor folds into its FX graph cache key. The uuid hashes this file,
    the header the kernels include and the kernels' thread count, so code
    cached by another version of openreg's code generation (or another
    install, or setting) is never reused."""
    import hashlib

    import torch_openreg
    from torch._inductor.custom_graph_pass import CustomGraphModulePass

    digest = hashlib.sha256()
    with open(__file__, "rb") as source:
        digest.update(source.read())
    digest.update(torch_openreg.include_dir().encode())
    digest.update(str(_KERNEL_TEAM).encode())

    class CodegenVersion(CustomGraphModulePass):
        def __call__(self, gm: torch.fx.GraphModule) -> None:
            pass

        def uuid(self) -> str:
            return digest.hexdigest()

    return CodegenVersion()


def get_raw_stream(device_index: int) -> int:
    """The native handle of the current stream of ``device_index``."""
    return torch.openreg.current_stream(device_index).native_handle


def register() -> None:
    """Register openreg's Inductor backend; torch calls this as
    ``torch.openreg._inductor_backend_init`` when Inductor first sets up its
    device backends."""
    from torch._inductor.codegen.common import register_backend_for_device, register_device_op_overrides

    from torch._inductor import config

    # Note [Inductor's loop transformations]: with these on, Inductor 2.15's
    # scheduler (scheduler.py: _try_reindex_pointwise_for_reduction,
    # shared_data_after_reordering_loop, the loop index inversion score)
    # treats every device whose type is not "cpu" as a SIMD (Triton)
    # device and reads C++ loop groups as (numel, rnumel) pairs: compiling a
    # reduction fused with a pointwise op fails ("can't multiply sequence by
    # non-int of type 'tuple'"). They are skipped for the CPU for the same
    # reason; no per-device setting exists, so they are off for the process.
    config.loop_reindexing_after_fusion = False
    config.loop_ordering_after_fusion = False
    config.loop_index_inversion_in_fusion = False

    scheduling, wrapper, op_overrides = _make_backend()
    register_backend_for_device(_DEVICE_TYPE, scheduling, wrapper, device_custom_pass=_codegen_version_pass())
    register_device_op_overrides(_DEVICE_TYPE, op_overrides())
