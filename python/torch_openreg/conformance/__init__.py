"""A conformance kit for any PrivateUse1 backend:

    python -m torch_openreg.conformance --device NAME [--import MODULE] [--quick | --full]

checks which of PyTorch's integration contracts the backend keeps (device and
guard, streams and events, random, memory, tensors and modules, ops against
CPU, front ends, stream order), using torch's public Python API only, each
check with a stable id (`area.name`) and a verdict: pass, fail, not supported
or error. See docs/conformance.md; _api.py says what a
check is, _runner.py how checks run in child processes (Note [Conformance
processes]). Importing this package loads no backend.
"""
