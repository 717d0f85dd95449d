"""Sparse tensors on openreg as on CPU (Note [Sparse tensors] in
cpp/ops/sparse_tensors.h, issue 47): the constructors and factories of every
layout (COO, CSR, CSC, BSR, BSC) with members in device memory, conversions
between layouts and devices, a representative set of sparse ops, autograd
and the optimizers that take sparse gradients, serialization, memory
accounting, bad input, the stream sanitizer and graph capture. Each result
is compared with the same call on the CPU, at one CPU thread (the fallback
runs CPU kernels on one stream worker). The model trainings are in
test_sparse_programs.py."""

import copy
import io
import re

import pytest
import torch
import torch.nn as nn

from _openreg_util import new_stream

DEV = "openreg:0"
DEV1 = "openreg:1"
BLOCK = (2, 2)

COMPRESSED = (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)
LAYOUTS = (torch.sparse_coo, *COMPRESSED)
LAYOUT_IDS = [str(layout).split(".")[-1] for layout in LAYOUTS]


pytestmark = pytest.mark.usefixtures("one_cpu_thread")


# ---------------------------------------------------------------- helpers


def _matrix(seed=0, shape=(6, 8), density=0.4, dtype=torch.float32):
    """A dense CPU matrix with about ``density`` of its entries nonzero."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=dtype)
    return x * (torch.rand(*shape, generator=g) < density)


def _to_layout(dense, layout):
    """``dense`` in ``layout`` (on its own device), blocks of BLOCK."""
    if layout == torch.sparse_coo:
        return dense.to_sparse()
    if layout in (torch.sparse_bsr, torch.sparse_bsc):
        return dense.to_sparse(layout=layout, blocksize=BLOCK)
    return dense.to_sparse(layout=layout)


def _uncoalesced(device="cpu"):
    """A 4x5 COO tensor with a repeated index (uncoalesced): (1, 2) twice."""
    indices = torch.tensor([[1, 0, 1, 3, 2], [2, 4, 2, 0, 1]])
    values = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    return torch.sparse_coo_tensor(indices, values, (4, 5), device=device, check_invariants=True)


def _members(t):
    """The member tensors of a sparse tensor (without dispatching a coalesce)."""
    if t.layout == torch.sparse_coo:
        return [t._indices(), t._values()]
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return [t.crow_indices(), t.col_indices(), t.values()]
    return [t.ccol_indices(), t.row_indices(), t.values()]


def _in_device_memory(t):
    """Whether ``t``'s data lies in an allocated block of its openreg device's memory."""
    assert t.device.type == "openreg", t.device
    if t.numel() == 0:
        return True
    start, end = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    for segment in torch.openreg.memory_snapshot():
        if segment["device"] != t.device.index:
            continue
        for block in segment["blocks"]:
            if block["state"] == "active_allocated" and block["address"] <= start and end <= block["address"] + block["size"]:
                return True
    return False


def _check_on_device(t, device=DEV):
    """``t`` is a sparse tensor on ``device`` whose members are openreg
    tensors in that device's memory."""
    assert t.device == torch.device(device), t.device
    for member in _members(t):
        assert member.device == torch.device(device), member.device
        assert _in_device_memory(member), f"a {t.layout} member is not in {device} memory"


def _plain(t):
    """What a tensor (sparse or dense, on any device) holds, as comparable
    CPU objects: a dense CPU tensor, or (metadata, member CPU tensors)."""
    if not isinstance(t, torch.Tensor):
        return t
    if t.layout == torch.strided:
        return t.detach().cpu()
    meta = {
        "layout": t.layout,
        "shape": tuple(t.shape),
        "dtype": t.dtype,
        "sparse_dim": t.sparse_dim(),
        "dense_dim": t.dense_dim(),
        "nnz": t._nnz(),
    }
    if t.layout == torch.sparse_coo:
        meta["is_coalesced"] = t.is_coalesced()
    return meta, [m.detach().cpu() for m in _members(t)]


def _assert_plain_equal(got, want):
    """Two _plain() results agree: same metadata, members close."""
    if isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], dict):
        assert isinstance(want, tuple) and got[0] == want[0], (got[0], want and want[0])
        torch.testing.assert_close(got[1], want[1])
    else:
        torch.testing.assert_close(got, want)


def _assert_same(got, want):
    """``got`` (openreg) equals ``want`` (CPU): layouts, structure, members."""
    if isinstance(got, (tuple, list)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _assert_same(g, w)
        return
    if isinstance(got, torch.Tensor):
        assert got.device.type == "openreg", got.device
        if got.layout != torch.strided:
            _check_on_device(got, str(got.device))
    _assert_plain_equal(_plain(got), _plain(want))


def _outcome(fn):
    """fn()'s result, or ("raises", type, message)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - compared with the CPU's
        return ("raises", type(e), str(e))


# ---------------------------------------------------------------- 1. constructors


def _cpu_members(layout):
    return _members(_to_layout(_matrix(), layout))


CONSTRUCTORS = {
    torch.sparse_coo: lambda m, size, **kw: torch.sparse_coo_tensor(m[0], m[1], size, **kw),
    torch.sparse_csr: lambda m, size, **kw: torch.sparse_csr_tensor(m[0], m[1], m[2], size, **kw),
    torch.sparse_csc: lambda m, size, **kw: torch.sparse_csc_tensor(m[0], m[1], m[2], size, **kw),
    torch.sparse_bsr: lambda m, size, **kw: torch.sparse_bsr_tensor(m[0], m[1], m[2], size, **kw),
    torch.sparse_bsc: lambda m, size, **kw: torch.sparse_bsc_tensor(m[0], m[1], m[2], size, **kw),
}


@pytest.mark.parametrize("check_invariants", [True, False])
@pytest.mark.parametrize("members_on", ["cpu", "openreg"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_constructor_with_device_openreg(layout, members_on, check_invariants):
    """torch.sparse_<layout>_tensor(..., device="openreg") from CPU members
    (copied to the device) or from openreg members, as on CPU."""
    members = _cpu_members(layout)
    make = CONSTRUCTORS[layout]
    want = make(members, (6, 8), check_invariants=check_invariants)
    if members_on == "cpu":
        got = make(members, (6, 8), device=DEV, check_invariants=check_invariants)
    else:
        got = make([m.to(DEV) for m in members], (6, 8), check_invariants=check_invariants)
    assert got.layout == layout and got.is_sparse == (layout == torch.sparse_coo)
    _assert_same(got, want)
    _assert_same(got.to_dense(), want.to_dense())


@pytest.mark.parametrize("check_invariants", [True, False])
@pytest.mark.parametrize("layout", COMPRESSED, ids=LAYOUT_IDS[1:])
def test_sparse_compressed_tensor_with_device_openreg(layout, check_invariants):
    members = _cpu_members(layout)
    kw = dict(layout=layout, check_invariants=check_invariants)
    want = torch.sparse_compressed_tensor(*members, (6, 8), **kw)
    got = torch.sparse_compressed_tensor(*members, (6, 8), device=DEV, **kw)
    _assert_same(got, want)
    _assert_same(got.to_dense(), want.to_dense())


def test_coo_constructor_without_size_and_with_dtype():
    indices, values = _cpu_members(torch.sparse_coo)
    want = torch.sparse_coo_tensor(indices, values, dtype=torch.float64, check_invariants=True)
    got = torch.sparse_coo_tensor(indices, values, dtype=torch.float64, device=DEV, check_invariants=True)
    _assert_same(got, want)


def test_uncoalesced_coo_constructor():
    got, want = _uncoalesced(DEV), _uncoalesced("cpu")
    assert not got.is_coalesced()
    _assert_same(got, want)


@pytest.mark.parametrize("check_invariants", [True, False])
@pytest.mark.parametrize("is_coalesced", [True, False])
def test_coo_constructor_with_is_coalesced(is_coalesced, check_invariants):
    """With is_coalesced=True and check_invariants=True the constructor
    checks that the indices are sorted and unique (flatten_indices)."""
    indices, values = _cpu_members(torch.sparse_coo)
    kw = dict(is_coalesced=is_coalesced, check_invariants=check_invariants)
    want = torch.sparse_coo_tensor(indices, values, (6, 8), **kw)
    got = torch.sparse_coo_tensor(indices.to(DEV), values.to(DEV), (6, 8), **kw)
    assert got.is_coalesced() == is_coalesced
    _assert_same(got, want)


FACTORIES = {
    "empty_coo": lambda d: torch.empty(4, 6, layout=torch.sparse_coo, device=d),
    "zeros_coo": lambda d: torch.zeros(4, 6, layout=torch.sparse_coo, device=d),
    "zeros_coo_3d": lambda d: torch.zeros(2, 4, 6, layout=torch.sparse_coo, device=d, dtype=torch.float64),
    "empty_csr": lambda d: torch.empty(4, 6, layout=torch.sparse_csr, device=d),
    "zeros_csr": lambda d: torch.zeros(4, 6, layout=torch.sparse_csr, device=d),
    "empty_csc": lambda d: torch.empty(4, 6, layout=torch.sparse_csc, device=d),
    "zeros_like_coo": lambda d: torch.zeros_like(_matrix().to_sparse().to(d)),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_factories_with_sparse_layouts(name):
    """torch.empty/zeros with layout=...: same layout, shape, dtype and nnz
    as on CPU (empty's compressed indices are uninitialized, as on CPU, so
    only zeros' members are compared)."""
    fn = FACTORIES[name]
    got, want = fn(DEV), fn("cpu")
    _check_on_device(got)
    assert (got.layout, got.shape, got.dtype, got._nnz()) == (want.layout, want.shape, want.dtype, want._nnz())
    assert (got.sparse_dim(), got.dense_dim()) == (want.sparse_dim(), want.dense_dim())
    if not name.startswith("empty"):
        _assert_same(got, want)


def test_member_accessors_return_device_tensors():
    coo = _matrix().to_sparse().to(DEV)
    for member in (coo.indices(), coo.values(), coo._indices(), coo._values()):
        assert member.device == torch.device(DEV) and _in_device_memory(member)
    csr = _to_layout(_matrix().to(DEV), torch.sparse_csr)
    csc = _to_layout(_matrix().to(DEV), torch.sparse_csc)
    for member in (csr.crow_indices(), csr.col_indices(), csr.values(), csc.ccol_indices(), csc.row_indices(), csc.values()):
        assert member.device == torch.device(DEV) and _in_device_memory(member)
    # A member is the tensor's own memory, not a copy: writing it changes the tensor.
    csr.values().mul_(2)
    torch.testing.assert_close(csr.to_dense().cpu(), _matrix() * 2)


def test_metadata_as_on_cpu():
    for layout in LAYOUTS:
        got, want = _to_layout(_matrix().to(DEV), layout), _to_layout(_matrix(), layout)
        for attr in ("is_sparse", "is_sparse_csr", "layout", "shape", "dtype"):
            assert getattr(got, attr) == getattr(want, attr), (layout, attr)
        assert (got.sparse_dim(), got.dense_dim(), got._nnz()) == (want.sparse_dim(), want.dense_dim(), want._nnz())
        assert got.device.type == "openreg" and got.is_openreg


# ---------------------------------------------------------------- 2. conversions

CONVERSIONS = {
    "dense.to_sparse()": lambda x: x.to_sparse(),
    "dense.to_sparse(1)": lambda x: x.to_sparse(1),
    "dense3d.to_sparse(2)": lambda x: x.reshape(2, 3, 8).to_sparse(2),
    "dense.to_sparse_csr()": lambda x: x.to_sparse_csr(),
    "dense.to_sparse_csc()": lambda x: x.to_sparse_csc(),
    "dense.to_sparse_bsr(2x2)": lambda x: x.to_sparse_bsr(BLOCK),
    "dense.to_sparse_bsc(2x2)": lambda x: x.to_sparse_bsc(BLOCK),
    "dense.to_sparse(layout=csr)": lambda x: x.to_sparse(layout=torch.sparse_csr),
    "coo.to_dense()": lambda x: x.to_sparse().to_dense(),
    "csr.to_dense()": lambda x: x.to_sparse_csr().to_dense(),
    "csc.to_dense()": lambda x: x.to_sparse_csc().to_dense(),
    "bsr.to_dense()": lambda x: x.to_sparse_bsr(BLOCK).to_dense(),
    "bsc.to_dense()": lambda x: x.to_sparse_bsc(BLOCK).to_dense(),
    "coo.to_sparse_csr()": lambda x: x.to_sparse().to_sparse_csr(),
    "coo.to_sparse_csc()": lambda x: x.to_sparse().to_sparse_csc(),
    "coo.to_sparse_bsr(2x2)": lambda x: x.to_sparse().to_sparse_bsr(BLOCK),
    "csr.to_sparse()": lambda x: x.to_sparse_csr().to_sparse(),
    "csr.to_sparse_csc()": lambda x: x.to_sparse_csr().to_sparse_csc(),
    "csr.to_sparse_bsr(2x2)": lambda x: x.to_sparse_csr().to_sparse_bsr(BLOCK),
    "csc.to_sparse_csr()": lambda x: x.to_sparse_csc().to_sparse_csr(),
    "csc.to_sparse()": lambda x: x.to_sparse_csc().to_sparse(),
    "bsr.to_sparse()": lambda x: x.to_sparse_bsr(BLOCK).to_sparse(),
    "bsr.to_sparse_csr()": lambda x: x.to_sparse_bsr(BLOCK).to_sparse_csr(),
    "bsc.to_sparse_bsr(2x2)": lambda x: x.to_sparse_bsc(BLOCK).to_sparse_bsr(BLOCK),
    "batched dense.to_sparse_csr()": lambda x: x.reshape(2, 3, 8).to_sparse_csr(),
    "hybrid dense.to_sparse_csr(dense_dim=1)": lambda x: x.reshape(6, 4, 2).to_sparse_csr(dense_dim=1),
    "hybrid dense.to_sparse_bsr(2x2, dense_dim=1)": lambda x: x.reshape(6, 4, 2).to_sparse_bsr(BLOCK, dense_dim=1),
    "batched csr.to_dense()": lambda x: x.reshape(2, 3, 8).to_sparse_csr().to_dense(),
    "uncoalesced.to_dense()": lambda x: _uncoalesced(x.device).to_dense(),
    "uncoalesced.to_sparse_csr()": lambda x: _uncoalesced(x.device).to_sparse_csr(),
    "float64 csr": lambda x: x.double().to_sparse_csr(),
    "csr.to(float64)": lambda x: x.to_sparse_csr().to(torch.float64),
    "coo.double()": lambda x: x.to_sparse().double(),
}


@pytest.mark.parametrize("name", sorted(CONVERSIONS))
def test_conversion_on_the_device(name):
    fn = CONVERSIONS[name]
    want = _outcome(lambda: fn(_matrix()))
    got = _outcome(lambda: fn(_matrix().to(DEV)))
    if isinstance(want, tuple):
        assert got == want, "CPU raises this; openreg must raise the same"
        return
    _assert_same(got, want)


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_to_between_cpu_and_openreg_devices_keeps_the_tensor(layout):
    """cpu -> openreg:0 -> openreg:1 -> cpu: layout, dtype and members kept;
    each device copy is in that device's memory."""
    host = _to_layout(_matrix(dtype=torch.float64), layout)
    on0 = host.to(DEV)
    _check_on_device(on0, DEV)
    _assert_same(on0, host)
    on1 = on0.to(DEV1)
    _check_on_device(on1, DEV1)
    _assert_same(on1, host)
    back = on1.to("cpu")
    assert back.device.type == "cpu" and back.layout == layout
    _assert_plain_equal(_plain(back), _plain(host))
    _assert_plain_equal(_plain(on1.cpu()), _plain(host))
    # Copies, not views: changing the device copy leaves the source alone.
    on1.values().zero_()
    _assert_plain_equal(_plain(on0), _plain(host))


def test_to_keeps_an_uncoalesced_coo_uncoalesced():
    host = _uncoalesced()
    for moved in (host.to(DEV), host.to(DEV).to(DEV1), host.to(DEV).to(DEV1).to("cpu"), host.to(DEV1).cpu()):
        assert not moved.is_coalesced(), moved.device
        _assert_plain_equal(_plain(moved), _plain(host))
    coalesced = host.coalesce()
    for moved in (coalesced.to(DEV), coalesced.to(DEV).to(DEV1), coalesced.to(DEV).cpu()):
        assert moved.is_coalesced(), moved.device


def test_to_with_dtype_and_device_at_once():
    host = _matrix().to_sparse_csr()
    got = host.to(DEV1, torch.float64)
    _check_on_device(got, DEV1)
    _assert_same(got, host.to(torch.float64))


# ---------------------------------------------------------------- 3. ops


def _a(d):
    return _matrix(1).to(d).to_sparse()


def _b(d):
    return _matrix(2).to(d).to_sparse()


def _dense(d, shape=(6, 8), seed=3):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(d)


def _csr(d, seed=1):
    return _matrix(seed).to(d).to_sparse_csr()


OPS = {
    # elementwise
    "coo + coo": lambda d: _a(d) + _b(d),
    "coo - coo": lambda d: _a(d) - _b(d),
    "coo * coo": lambda d: _a(d) * _b(d),
    "dense + coo": lambda d: _dense(d) + _a(d),
    "dense - coo": lambda d: _dense(d) - _a(d),
    "coo * dense": lambda d: _a(d) * _dense(d),
    "coo * scalar": lambda d: _a(d) * 2.5,
    "coo / scalar": lambda d: _a(d) / 4,
    "torch.add(coo, coo, alpha)": lambda d: torch.add(_a(d), _b(d), alpha=-0.5),
    "neg coo": lambda d: -_a(d),
    "abs coo": lambda d: _a(d).abs(),
    "pow coo": lambda d: _a(d).pow(2),
    "coo.t()": lambda d: _a(d).t(),
    "coo.t().coalesce()": lambda d: _a(d).t().coalesce(),
    "csr + csr": lambda d: _csr(d, 1) + _csr(d, 2),
    "csr * scalar": lambda d: _csr(d) * 3,
    "csr + dense": lambda d: _dense(d) + _csr(d),
    "csr.abs()": lambda d: _csr(d).abs(),
    "csr.t()": lambda d: _csr(d).t(),
    # products
    "sparse.mm(coo, dense)": lambda d: torch.sparse.mm(_a(d), _dense(d, (8, 5))),
    "sparse.mm(coo, coo)": lambda d: torch.sparse.mm(_a(d), _b(d).t()),
    "mm(coo, dense)": lambda d: torch.mm(_a(d), _dense(d, (8, 5))),
    "addmm(dense, coo, dense)": lambda d: torch.addmm(_dense(d, (6, 5)), _a(d), _dense(d, (8, 5), 4), beta=0.5, alpha=2),
    "sparse.addmm": lambda d: torch.sparse.addmm(_dense(d, (6, 5)), _a(d), _dense(d, (8, 5), 4)),
    "coo @ dense vector": lambda d: _a(d) @ _dense(d, (8,)),
    "csr @ dense": lambda d: _csr(d) @ _dense(d, (8, 5)),
    "csr @ dense vector": lambda d: _csr(d) @ _dense(d, (8,)),
    "addmm(dense, csr, dense)": lambda d: torch.addmm(_dense(d, (6, 5)), _csr(d), _dense(d, (8, 5), 4)),
    "csr @ csr": lambda d: _csr(d, 1) @ _csr(d, 2).t().to_sparse_csr(),
    "bsr @ dense": lambda d: _matrix(1).to(d).to_sparse_bsr(BLOCK) @ _dense(d, (8, 5)),
    "sampled_addmm(csr)": lambda d: torch.sparse.sampled_addmm(
        _matrix(1, (6, 5)).to(d).to_sparse_csr(), _dense(d, (6, 8)), _dense(d, (8, 5), 4), beta=0.5, alpha=2),
    "hspmm": lambda d: torch.hspmm(_a(d), _dense(d, (8, 5))),
    # reductions, softmax
    "sparse.sum(coo)": lambda d: torch.sparse.sum(_a(d)),
    "sparse.sum(coo, dim=1)": lambda d: torch.sparse.sum(_a(d), dim=1),
    "sparse.sum(coo, dim=0)": lambda d: torch.sparse.sum(_a(d), dim=0),
    "coo.sum()": lambda d: _a(d).sum(),
    "csr.sum()": lambda d: _csr(d).sum(),
    "sparse.softmax(coo, 1)": lambda d: torch.sparse.softmax(_a(d), 1),
    "sparse.log_softmax(coo, 0)": lambda d: torch.sparse.log_softmax(_a(d), 0),
    # structure
    "coalesce": lambda d: _uncoalesced(d).coalesce(),
    "uncoalesced + uncoalesced": lambda d: _uncoalesced(d) + _uncoalesced(d),
    "index_select(coo, 0)": lambda d: _a(d).index_select(0, torch.tensor([4, 0, 2, 2], device=d)),
    "index_select(coo, 1)": lambda d: _a(d).index_select(1, torch.tensor([7, 1, 3], device=d)),
    "narrow_copy(coo)": lambda d: _a(d).narrow_copy(1, 2, 4),
    "dense.sparse_mask(coo)": lambda d: _dense(d).sparse_mask(_a(d)),
    "dense.sparse_mask(csr)": lambda d: _dense(d).sparse_mask(_csr(d)),
    "coo.sparse_mask(coo)": lambda d: _b(d).sparse_mask(_a(d)),
    "clone": lambda d: _csr(d).clone(),
    "detach": lambda d: _a(d).detach(),
    "coo[1] (select)": lambda d: _a(d)[1],
    "coo.unsqueeze(0)": lambda d: _a(d).unsqueeze(0),
    "torch.cat(coo, coo)": lambda d: torch.cat([_a(d), _b(d)]),
    "coo.to_dense().relu()": lambda d: _a(d).to_dense().relu(),
    "sparse_resize_and_clear_": lambda d: _a(d).sparse_resize_and_clear_((7, 9), 2, 0),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_sparse_op_as_on_cpu(name):
    fn = OPS[name]
    want = fn("cpu")
    got = fn(DEV)
    _assert_same(got, want)


def _inplace(op):
    def run(d):
        target = op[0](d)
        out = op[1](target, d)
        assert out is target, "an in-place op returns its argument"
        return target

    return run


INPLACE = {
    "coo.add_(coo)": (_a, lambda t, d: t.add_(_b(d))),
    "coo.add_(coo, alpha)": (_a, lambda t, d: t.add_(_b(d), alpha=3)),
    "coo.sub_(coo)": (_a, lambda t, d: t.sub_(_b(d))),
    "coo.mul_(scalar)": (_a, lambda t, d: t.mul_(-2)),
    "coo.mul_(coo)": (_a, lambda t, d: t.mul_(_b(d))),
    "coo.div_(scalar)": (_a, lambda t, d: t.div_(8)),
    "coo.zero_()": (_a, lambda t, d: t.zero_()),
    "coo.copy_(coo)": (_a, lambda t, d: t.copy_(_b(d))),
    "coo.copy_(cpu coo)": (_a, lambda t, d: t.copy_(_b("cpu"))),
    "uncoalesced.copy_(coo)": (_uncoalesced, lambda t, d: t.copy_(_uncoalesced(d).coalesce())),
    "coo.coalesce().abs_()": (lambda d: _uncoalesced(d).coalesce(), lambda t, d: t.neg_()),
    "dense.add_(coo)": (lambda d: _dense(d), lambda t, d: t.add_(_a(d))),
    "dense.sub_(coo)": (lambda d: _dense(d), lambda t, d: t.sub_(_a(d), alpha=2)),
    "dense.addmm_(coo, dense)": (lambda d: _dense(d, (6, 5)), lambda t, d: t.addmm_(_a(d), _dense(d, (8, 5), 4))),
    "csr.mul_(scalar)": (_csr, lambda t, d: t.mul_(0.5)),
    "csr.add_(csr)": (_csr, lambda t, d: t.add_(_csr(d, 2))),
    "csr.zero_()": (_csr, lambda t, d: t.zero_()),
    "csr.copy_(csr)": (_csr, lambda t, d: t.copy_(_csr(d) * 2)),
    "bsr.zero_()": (lambda d: _matrix().to(d).to_sparse_bsr(BLOCK), lambda t, d: t.zero_()),
}


@pytest.mark.parametrize("name", sorted(INPLACE))
def test_inplace_sparse_op_as_on_cpu(name):
    run = _inplace(INPLACE[name])
    _assert_same(run(DEV), run("cpu"))


def test_ops_queued_behind_work_see_it():
    """Sparse ops launched behind queued device work (not on an idle stream)
    read the members as that work left them."""
    x = _matrix().to(DEV)
    torch.openreg._sleep(50)
    x.mul_(2)
    sp = x.to_sparse()
    sp.mul_(3)
    out = torch.sparse.mm(sp, _dense(DEV, (8, 5)))
    want = torch.sparse.mm((_matrix() * 2).to_sparse() * 3, _dense("cpu", (8, 5)))
    torch.testing.assert_close(out.cpu(), want)


def test_coalesce_behind_queued_work_as_on_cpu():
    """coalesce of an uncoalesced COO tensor while the stream is busy: the
    host waits for the CPU kernel on the stream's worker, which sees the
    dispatch keys the caller excludes (the kernel asserts autograd's)."""
    i = torch.tensor([[0, 1, 0], [2, 0, 2]])
    v = torch.tensor([3.0, 4.0, 5.0], dtype=torch.float64)
    want = torch.sparse_coo_tensor(i, v, (2, 3)).coalesce()
    x = torch.sparse_coo_tensor(i, v, (2, 3)).to(DEV)
    big = torch.randn(600, 600, device=DEV)
    for _ in range(3):
        busy = big @ big  # noqa: F841 (queued work ahead of the coalesce)
        got = x.coalesce()
        assert got.is_coalesced()
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


@pytest.mark.parametrize("layout", [torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr])
def test_random_ops_on_sparse_tensors_draw_from_the_openreg_generator(layout):
    """randn_like of a compressed tensor draws its values from openreg's
    generator, in their memory order, as a dense randn_like does (and as
    CUDA's from CUDA's; COO has no randn_like on CPU or CUDA)."""
    d = torch.ones(4, 4, device=DEV)
    sparse = d.to_sparse(layout=layout, blocksize=(2, 2) if layout == torch.sparse_bsr else None)
    torch.manual_seed(0)
    dense_draw = torch.randn_like(d)
    torch.manual_seed(0)
    sparse_draw = torch.randn_like(sparse)
    assert sparse_draw.layout == layout and sparse_draw.device == d.device
    assert torch.equal(sparse_draw.values().flatten().cpu(), dense_draw.flatten().cpu())


# Dtypes as on CUDA (Note [Sparse dtype rules] in cpp/ops/dtype_policy.h):
# a dtype CUDA's sparse kernel computes and the CPU's refuses is computed in
# a wider dtype and rounded back.
@pytest.mark.parametrize("dtype,name", [(torch.float16, "Half"), (torch.bfloat16, "BFloat16")])
def test_sampled_addmm_at_half_precision_as_on_cuda(dtype, name):
    mask = _matrix(4, shape=(6, 5)).to_sparse_csr()
    a, b = torch.randn(6, 3, generator=torch.Generator().manual_seed(5)), torch.randn(3, 5)
    rounded = [t.to(dtype) for t in (mask, a, b)]
    with pytest.raises(RuntimeError, match=f"but got {name}$"):
        torch.sparse.sampled_addmm(*rounded)  # the CPU refuses it
    got = torch.sparse.sampled_addmm(*[t.to(DEV) for t in rounded], beta=0.5, alpha=2.0)
    want = torch.sparse.sampled_addmm(*[t.float() for t in rounded], beta=0.5, alpha=2.0).to(dtype)
    assert got.layout == torch.sparse_csr and got.dtype == dtype and got.device.type == "openreg"
    torch.testing.assert_close(got.to_dense().cpu(), want.to_dense(), rtol=0, atol=0)


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_bool_mul_as_on_cuda(layout):
    # CPU's mul_out_sparse refuses bool; PyTorch's sparse samples expect it
    # to run off the CPU (opinfo/definitions/sparse.py), as CUDA runs it.
    a = torch.tensor([[True, False, True], [True, True, False]])
    b = torch.tensor([[True, True, False], [False, True, False]])
    sa, sb = a.to_sparse(layout=layout), b.to_sparse(layout=layout)
    with pytest.raises(NotImplementedError, match="not implemented for 'Bool'"):
        sa * sb
    got = sa.to(DEV) * sb.to(DEV)
    assert got.layout == layout and got.dtype == torch.bool
    assert torch.equal(got.to_dense().cpu(), a & b)


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_complex32_unary_op_as_on_cuda(layout):
    x = torch.complex(_matrix(6), _matrix(7)).to(torch.complex32)
    sparse = x.to_sparse(layout=layout)
    got = torch.sin(sparse.to(DEV))
    want = torch.sin(x.to(torch.complex64).to_sparse(layout=layout)).to(torch.complex32)
    assert got.layout == layout and got.dtype == torch.complex32
    torch.testing.assert_close(got.to_dense().cpu(), want.to_dense(), rtol=0, atol=0)


# ---------------------------------------------------------------- 4. autograd and optimizers


def _embedding_grads(device, module, idx, offsets=None, weights=None):
    module = copy.deepcopy(module).to(device)
    args = [idx.to(device)]
    if offsets is not None:
        args.append(offsets.to(device))
    kwargs = {} if weights is None else {"per_sample_weights": weights.to(device)}
    out = module(*args, **kwargs)
    (out.square().sum() + out.sum()).backward()
    return out, module.weight.grad


def test_embedding_sparse_gradient_as_on_cpu():
    torch.manual_seed(0)
    emb = nn.Embedding(20, 6, sparse=True)
    idx = torch.tensor([[1, 4, 4, 19], [0, 1, 7, 4]])
    out, grad = _embedding_grads(DEV, emb, idx)
    want_out, want_grad = _embedding_grads("cpu", emb, idx)
    assert grad.layout == torch.sparse_coo
    _assert_same(out, want_out)
    _assert_same(grad, want_grad)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_sparse_gradient_as_on_cpu(mode):
    torch.manual_seed(0)
    bag = nn.EmbeddingBag(20, 6, mode=mode, sparse=True)
    idx = torch.tensor([1, 4, 4, 19, 0, 1, 7, 4, 11])
    offsets = torch.tensor([0, 3, 3, 7])  # one empty bag
    out, grad = _embedding_grads(DEV, bag, idx, offsets)
    want_out, want_grad = _embedding_grads("cpu", bag, idx, offsets)
    assert grad.layout == torch.sparse_coo
    _assert_same(out, want_out)
    _assert_same(grad, want_grad)


def test_embedding_bag_per_sample_weights_sparse_gradient_as_on_cpu():
    torch.manual_seed(0)
    bag = nn.EmbeddingBag(20, 6, mode="sum", sparse=True)
    idx, offsets = torch.tensor([1, 4, 4, 19, 0, 1]), torch.tensor([0, 2, 5])
    weights = torch.linspace(0.5, 2.0, 6)
    _assert_same(_embedding_grads(DEV, bag, idx, offsets, weights), _embedding_grads("cpu", bag, idx, offsets, weights))


def _sparse_mm_grads(device, layout):
    s = _matrix(1).to(device)
    s = (s.to_sparse() if layout == torch.sparse_coo else s.to_sparse_csr()).requires_grad_()
    d = _dense(device, (8, 5)).requires_grad_()
    out = torch.sparse.mm(s, d)
    (out * torch.arange(30.0, device=device).reshape(6, 5)).sum().backward()
    return out, s.grad, d.grad


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
def test_sparse_mm_gradients_of_both_arguments(layout):
    got, want = _sparse_mm_grads(DEV, layout), _sparse_mm_grads("cpu", layout)
    assert got[1].layout == want[1].layout
    _assert_same(got, want)


def test_gradient_through_to_dense():
    def grads(device):
        s = _uncoalesced(device).coalesce().requires_grad_()
        w = torch.arange(20.0, device=device).reshape(4, 5)
        (s.to_dense() * w).sum().backward()
        return s.grad

    _assert_same(grads(DEV), grads("cpu"))


def test_gradient_of_sparse_values_through_sparse_coo_tensor():
    def grads(device):
        values = torch.tensor([1.0, 2.0, 3.0], device=device, requires_grad=True)
        indices = torch.tensor([[0, 1, 2], [2, 0, 1]], device=device)
        s = torch.sparse_coo_tensor(indices, values, (3, 3), check_invariants=True)
        out = torch.sparse.mm(s, torch.ones(3, 2, device=device) * 2)
        (torch.sparse.sum(s * s) + out.sum()).backward()
        return values.grad

    _assert_same(grads(DEV), grads("cpu"))


OPTIMIZERS = {
    "SGD": lambda p: torch.optim.SGD(p, lr=0.1),
    "SGD momentum 0.9": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "SGD momentum 0.9 dampening": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.1),
    "SparseAdam": lambda p: torch.optim.SparseAdam(p, lr=0.05),
    "Adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1),
    "Adagrad lr_decay": lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1),
}


def _optimizer_steps(device, name, template, steps=4):
    module = copy.deepcopy(template).to(device)
    opt = OPTIMIZERS[name](module.parameters())
    history = []
    for k in range(steps):
        idx = torch.tensor([[k, 3, 3, 9], [1, 14 - k, 5, 3]], device=device)
        opt.zero_grad()
        loss = (module(idx) - 0.5).square().mean()
        loss.backward()
        opt.step()
        history.append((loss.detach(), module.weight.detach().clone()))
    return history


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_steps_on_sparse_gradients_as_on_cpu(name):
    torch.manual_seed(0)
    emb = nn.Embedding(15, 4, sparse=True)
    got = _optimizer_steps(DEV, name, emb)
    want = _optimizer_steps("cpu", name, emb)
    for k, (g, w) in enumerate(zip(got, want)):
        _assert_same(g, w)


# ---------------------------------------------------------------- 6. serialization


def _round_trip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_save_and_load_keep_the_sparse_tensor(layout):
    host = _to_layout(_matrix(), layout)
    saved = {"on0": host.to(DEV), "on1": host.to(DEV1)}
    loaded = _round_trip(saved)
    for key, device in (("on0", DEV), ("on1", DEV1)):
        _check_on_device(loaded[key], device)
        _assert_plain_equal(_plain(loaded[key]), _plain(host))
    on_cpu = _round_trip(saved, map_location="cpu")
    for key in saved:
        assert on_cpu[key].device.type == "cpu" and on_cpu[key].layout == layout
        _assert_plain_equal(_plain(on_cpu[key]), _plain(host))


def test_save_and_load_keep_an_uncoalesced_coo():
    loaded = _round_trip(_uncoalesced(DEV))
    _check_on_device(loaded)
    _assert_plain_equal(_plain(loaded), _plain(_uncoalesced()))
    assert not loaded.is_coalesced()


# ---------------------------------------------------------------- 6. memory


def _member_bytes(t):
    return sum(m.numel() * m.element_size() for m in _members(t))


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_memory_allocated_counts_the_members(layout, exact_memory):
    import gc

    host = _to_layout(_matrix(shape=(64, 64)), layout)
    torch.openreg.synchronize()
    before = torch.openreg.memory_allocated(0)
    sp = host.to(DEV)
    held = torch.openreg.memory_allocated(0) - before
    assert held >= _member_bytes(host) > 0
    del sp
    gc.collect(0)
    torch.openreg.synchronize()
    assert torch.openreg.memory_allocated(0) == before


def test_memory_allocated_drops_after_sparse_ops(exact_memory):
    import gc

    a, b = _a(DEV), _b(DEV)
    torch.openreg.synchronize()
    before = torch.openreg.memory_allocated(0)
    out = torch.sparse.mm(a, b.t()).coalesce() * 2
    other = a.to_dense().to_sparse_csr().to_sparse_csc() * 1.5
    assert torch.openreg.memory_allocated(0) - before >= _member_bytes(out) + _member_bytes(other)
    del out, other
    gc.collect(0)
    torch.openreg.synchronize()
    assert torch.openreg.memory_allocated(0) == before


# ---------------------------------------------------------------- 6. bad input

BAD_CONSTRUCTIONS = {
    "coo index out of range": lambda d: torch.sparse_coo_tensor(
        torch.tensor([[0, 5], [1, 1]]), torch.tensor([1.0, 2.0]), (3, 3), device=d, check_invariants=True),
    "coo negative index": lambda d: torch.sparse_coo_tensor(
        torch.tensor([[0, -1], [1, 1]]), torch.tensor([1.0, 2.0]), (3, 3), device=d, check_invariants=True),
    "coo nnz mismatch": lambda d: torch.sparse_coo_tensor(
        torch.tensor([[0, 1, 2], [1, 1, 0]]), torch.tensor([1.0, 2.0]), (3, 3), device=d, check_invariants=True),
    "coo nnz mismatch unchecked": lambda d: torch.sparse_coo_tensor(
        torch.tensor([[0, 1, 2], [1, 1, 0]]), torch.tensor([1.0, 2.0]), (3, 3), device=d, check_invariants=False),
    "coo indices dims vs size": lambda d: torch.sparse_coo_tensor(
        torch.tensor([[0, 1], [1, 1], [0, 0]]), torch.tensor([1.0, 2.0]), (3, 3), device=d, check_invariants=True),
    "csr col index out of range": lambda d: torch.sparse_csr_tensor(
        torch.tensor([0, 1, 2]), torch.tensor([0, 9]), torch.tensor([1.0, 2.0]), (2, 3), device=d, check_invariants=True),
    "csr crow not monotone": lambda d: torch.sparse_csr_tensor(
        torch.tensor([0, 2, 1]), torch.tensor([0, 1]), torch.tensor([1.0, 2.0]), (2, 3), device=d, check_invariants=True),
    "csr last crow != nnz": lambda d: torch.sparse_csr_tensor(
        torch.tensor([0, 1, 3]), torch.tensor([0, 1]), torch.tensor([1.0, 2.0]), (2, 3), device=d, check_invariants=True),
    "csr crow length": lambda d: torch.sparse_csr_tensor(
        torch.tensor([0, 1, 2, 2]), torch.tensor([0, 1]), torch.tensor([1.0, 2.0]), (2, 3), device=d, check_invariants=True),
    "csr values vs col length": lambda d: torch.sparse_csr_tensor(
        torch.tensor([0, 1, 2]), torch.tensor([0, 1]), torch.tensor([1.0, 2.0, 3.0]), (2, 3), device=d, check_invariants=True),
    "csc row index out of range": lambda d: torch.sparse_csc_tensor(
        torch.tensor([0, 1, 2]), torch.tensor([0, 7]), torch.tensor([1.0, 2.0]), (3, 2), device=d, check_invariants=True),
    "bsr size not a multiple of blocks": lambda d: torch.sparse_bsr_tensor(
        torch.tensor([0, 1]), torch.tensor([0]), torch.ones(1, 2, 2), (3, 3), device=d, check_invariants=True),
    "to_sparse_bsr bad blocksize": lambda d: _matrix().to(d).to_sparse_bsr((4, 3)),
    "to_sparse(layout=coo, blocksize)": lambda d: _matrix().to(d).to_sparse(layout=torch.sparse_coo, blocksize=BLOCK),
    "sparse.mm shape mismatch": lambda d: torch.sparse.mm(_a(d), _dense(d, (7, 5))),
    "coo + coo shape mismatch": lambda d: _a(d) + _matrix(2, (6, 7)).to(d).to_sparse(),
    "csr @ dense shape mismatch": lambda d: _csr(d) @ _dense(d, (5, 5)),
    # Calls the CPU refuses, with the same error on openreg.
    "coo + dense (CPU: use add(dense, sparse))": lambda d: _a(d) + _dense(d),
    "dense.sub_(csr) (CPU: unsupported layout)": lambda d: _dense(d).sub_(_csr(d)),
    "index_select out of range": lambda d: _a(d).index_select(0, torch.tensor([9], device=d)),
}


@pytest.mark.parametrize("name", sorted(BAD_CONSTRUCTIONS))
def test_bad_input_raises_as_on_cpu(name):
    """The CPU's error type and message, and the device still works."""
    fn = BAD_CONSTRUCTIONS[name]
    want = _outcome(lambda: fn("cpu"))
    assert isinstance(want, tuple), "the CPU raises"
    got = _outcome(lambda: fn(DEV))
    assert got[:2] == want[:2], got
    assert got[2] == want[2]
    # The device is still usable.
    _assert_same(_a(DEV) + _b(DEV), _a("cpu") + _b("cpu"))


MIXED_DEVICES = {
    "sparse.mm(openreg coo, cpu dense)": lambda: torch.sparse.mm(_a(DEV), _dense("cpu", (8, 5))),
    "sparse.mm(openreg coo, openreg:1 dense)": lambda: torch.sparse.mm(_a(DEV), _dense(DEV1, (8, 5))),
    "mm(cpu dense, openreg coo)": lambda: torch.mm(_dense("cpu", (5, 6)), _a(DEV)),
    "openreg coo + cpu coo": lambda: _a(DEV) + _b("cpu"),
    "cpu coo + openreg coo": lambda: _b("cpu") + _a(DEV),
    "openreg coo * cpu coo": lambda: _a(DEV) * _b("cpu"),
    "openreg coo.add_(cpu coo)": lambda: _a(DEV).add_(_b("cpu")),
    "sparse.mm(openreg coo, cpu coo)": lambda: torch.sparse.mm(_a(DEV), _b("cpu").t()),
    "openreg csr + cpu csr": lambda: _csr(DEV) + _csr("cpu"),
    "openreg coo + openreg:1 coo": lambda: _a(DEV) + _b(DEV1),
    "openreg coo + cpu dense": lambda: _a(DEV) + _dense("cpu"),
    "cpu dense + openreg coo": lambda: _dense("cpu") + _a(DEV),
    "openreg:1 dense + openreg coo": lambda: _dense(DEV1) + _a(DEV),
    "openreg csr @ cpu dense": lambda: _csr(DEV) @ _dense("cpu", (8, 5)),
    "openreg csr @ openreg:1 dense": lambda: _csr(DEV) @ _dense(DEV1, (8, 5)),
    "openreg csr + openreg:1 csr": lambda: _csr(DEV) + _csr(DEV1),
    "addmm(openreg, openreg coo, cpu)": lambda: torch.addmm(_dense(DEV, (6, 5)), _a(DEV), _dense("cpu", (8, 5))),
    "openreg coo.add_(openreg:1 coo)": lambda: _a(DEV).add_(_b(DEV1)),
}


@pytest.mark.parametrize("name", sorted(MIXED_DEVICES))
def test_sparse_with_a_tensor_on_another_device_raises(name):
    """As on CUDA: a RuntimeError, not a crash, a silent copy or a result.
    The message is the one the fallback's device check gives dense
    arguments (Note [Fallback]: "Every route checks devices first, as CUDA
    does"), naming both devices."""
    with pytest.raises(RuntimeError) as info:
        MIXED_DEVICES[name]()
    # The fallback's device check (Note [Fallback]: "Every route checks
    # devices first, as CUDA does"), naming the two devices.
    message = str(info.value)
    devices = re.search(r"Expected all tensors to be on the same device, but found at least two devices, (\S+) and (\S+)!", message)
    assert devices, message
    assert {devices.group(1), devices.group(2)} in ({"openreg:0", "cpu"}, {"openreg:0", "openreg:1"}), message
    _assert_same(_a(DEV) * 2, _a("cpu") * 2)


# ---------------------------------------------------------------- 6. stream sanitizer


def _sparse_made_on_a_side_stream(fixed):
    """A sparse tensor made on a side stream (its members written there),
    then used on the default stream with or without waiting."""
    main = torch.accelerator.current_stream()
    x = _matrix().to(DEV)
    side = new_stream()
    side.wait_stream(main)
    with torch.openreg.stream(side):
        sp = (x * 2).to_sparse_csr()
        sp.values().mul_(3)
    if fixed:
        main.wait_stream(side)
        for member in _members(sp):
            member.record_stream(main)
    out = sp @ torch.ones(8, 2, device=DEV)
    return out.cpu()


@pytest.mark.parametrize("fixed", [False, True], ids=["buggy", "fixed"])
def test_the_sanitizer_sees_sparse_members(fixed):
    sanitizer = torch.openreg.sanitizer
    torch.openreg.synchronize()
    sanitizer.clear()
    with sanitizer.enable("warn"):
        out = _sparse_made_on_a_side_stream(fixed)
        torch.openreg.synchronize()
        counts, reports = sanitizer.counts(), sanitizer.reports()
    sanitizer.clear()
    torch.testing.assert_close(out, (_matrix() * 6).to_sparse_csr() @ torch.ones(8, 2))
    if fixed:
        assert sum(counts.values()) == 0, reports
    else:
        # The report is about a member (its dtype and shape) that a kernel
        # on the side stream wrote.
        assert counts["race"] >= 1, (counts, reports)
        members = [f"{str(m.dtype).split('.')[-1]}[{', '.join(map(str, m.shape))}]" for m in _members(_matrix().to_sparse_csr())]
        assert any(re.search(r"reads tensor (%s)" % "|".join(map(re.escape, members)), r) and "wrote on openreg stream" in r
                   for r in reports), reports


# ---------------------------------------------------------------- 6. graph capture


def test_graph_capture_records_a_warmed_up_sparse_op():
    """Capturing torch.sparse.mm of a COO tensor and a CSR matmul after an
    eager call of each (the usual warm-up, which teaches their plans: Note
    [Sparse plans] in cpp/ops/meta_results.cpp): the capture records them,
    and each replay recomputes them on the inputs' current contents."""
    a_host = _matrix(1)
    coo, csr = a_host.to(DEV).to_sparse(), a_host.to(DEV).to_sparse_csr()
    d = _dense(DEV, (8, 5))
    expected = [torch.sparse.mm(coo, d).cpu(), (csr @ d).cpu()]  # the warm-up
    side, g = new_stream(), torch.accelerator.Graph()
    with side, g:
        outs = [torch.sparse.mm(coo, d), csr @ d]
    g.replay()
    for got, want in zip(outs, expected):
        torch.testing.assert_close(got.cpu(), want)
    new = _dense("cpu", (8, 5), seed=9)
    d.copy_(new)
    coo.values().mul_(2)
    csr.values().mul_(2)
    g.replay()
    torch.testing.assert_close(outs[0].cpu(), torch.sparse.mm((a_host * 2).to_sparse(), new))
    torch.testing.assert_close(outs[1].cpu(), (a_host * 2).to_sparse_csr() @ new)


def test_graph_capture_refuses_a_sparse_op_it_cannot_plan():
    """Without a warm-up the capture cannot learn a sparse op's result
    shapes (the host would wait), and a sparse result's size may depend on
    the data: both refuse, naming the op, and the stream stays usable."""
    a_host = _matrix(2, shape=(7, 9))
    coo = a_host.to(DEV).to_sparse()
    d = _dense(DEV, (9, 4))
    for make in (lambda: torch.sparse.mm(coo, d), lambda: coo + coo):
        side, g = new_stream(), torch.accelerator.Graph()
        with pytest.raises(RuntimeError, match=r"(?i)captur.*sparse|sparse.*captur") as raised:
            with side, g:
                make()
        assert "aten::" in str(raised.value)
        assert not side.is_capturing()
        with side:
            torch.testing.assert_close(torch.sparse.mm(coo, d).cpu(), torch.sparse.mm(a_host.to_sparse(), d.cpu()))
