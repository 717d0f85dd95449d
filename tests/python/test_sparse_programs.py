"""Programs that train with sparse tensors on openreg (issue 47, part 7),
step for step equal to the same program on the CPU: a recommender (sparse
EmbeddingBags trained by SparseAdam, a dense MLP by Adam, a last batch of
another size) and a two-layer graph convolutional network over a sparse
normalized adjacency (COO and CSR, built on the device) trained by Adam.
Models are built once on the CPU and copied with .to(); losses and
parameters are compared after every step."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

DEV = "openreg:0"


pytestmark = pytest.mark.usefixtures("one_cpu_thread")


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _assert_params_equal(got: nn.Module, want: nn.Module):
    for (name, p), (_, q) in zip(got.named_parameters(), want.named_parameters()):
        assert p.device.type == "openreg", name
        torch.testing.assert_close(p.detach().cpu(), q.detach(), msg=lambda m: f"{name}: {m}")


# ---------------------------------------------------------------- recommender


class Recommender(nn.Module):
    """Users' and items' histories pooled by sparse EmbeddingBags (sum and
    mean), scored by a dense MLP."""

    def __init__(self, users=50, items=80, dim=8):
        super().__init__()
        self.users = nn.EmbeddingBag(users, dim, mode="sum", sparse=True)
        self.items = nn.EmbeddingBag(items, dim, mode="mean", sparse=True)
        self.mlp = nn.Sequential(nn.Linear(2 * dim, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, u_idx, u_off, i_idx, i_off):
        pooled = torch.cat([self.users(u_idx, u_off), self.items(i_idx, i_off)], dim=1)
        return self.mlp(pooled).squeeze(1)


def _bags(gen, batch, vocabulary):
    lengths = torch.randint(1, 5, (batch,), generator=gen)
    idx = torch.randint(0, vocabulary, (int(lengths.sum()),), generator=gen)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    return idx, offsets


def _recommender_batches():
    gen = _gen(7)
    batches = []
    for batch in (16, 16, 16, 16, 16, 7):  # the last batch is smaller
        u_idx, u_off = _bags(gen, batch, 50)
        i_idx, i_off = _bags(gen, batch, 80)
        target = (torch.rand(batch, generator=gen) < 0.5).float()
        batches.append((u_idx, u_off, i_idx, i_off, target))
    return batches


def _train_recommender(template, device):
    model = copy.deepcopy(template).to(device)
    sparse_params = [model.users.weight, model.items.weight]
    sparse_opt = torch.optim.SparseAdam(sparse_params, lr=0.05)
    dense_opt = torch.optim.Adam(model.mlp.parameters(), lr=0.01)
    losses = []
    for batch in _recommender_batches():
        *inputs, target = (t.to(device) for t in batch)
        sparse_opt.zero_grad()
        dense_opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(model(*inputs), target)
        loss.backward()
        assert model.users.weight.grad.is_sparse and model.items.weight.grad.is_sparse
        sparse_opt.step()
        dense_opt.step()
        losses.append(loss.detach())
    return model, torch.stack(losses)


def test_recommender_trains_as_on_cpu():
    torch.manual_seed(0)
    template = Recommender()
    model, losses = _train_recommender(template, DEV)
    want_model, want_losses = _train_recommender(template, "cpu")
    assert losses.device.type == "openreg"
    torch.testing.assert_close(losses.cpu(), want_losses)
    _assert_params_equal(model, want_model)
    # Training changed the embeddings (the comparison is not of untouched copies).
    assert not torch.equal(want_model.users.weight, template.users.weight)


# ---------------------------------------------------------------- graph network

NODES, FEATURES, HIDDEN, CLASSES = 40, 12, 16, 4


def _graph():
    """A random undirected graph (edge list, both directions), node
    features, labels and a training mask, on the CPU."""
    gen = _gen(3)
    src = torch.randint(0, NODES, (120,), generator=gen)
    dst = torch.randint(0, NODES, (120,), generator=gen)
    loops = torch.arange(NODES)
    edges = torch.stack([torch.cat([src, dst, loops]), torch.cat([dst, src, loops])])
    features = torch.randn(NODES, FEATURES, generator=gen)
    labels = torch.randint(0, CLASSES, (NODES,), generator=gen)
    train = torch.rand(NODES, generator=gen) < 0.6
    return edges, features, labels, train


def _normalized_adjacency(edges, device, layout):
    """D^-1/2 (A + I) D^-1/2, computed on ``device`` with sparse ops
    (repeated edges add up when coalesced)."""
    ones = torch.ones(edges.shape[1], device=device)
    adjacency = torch.sparse_coo_tensor(edges.to(device), ones, (NODES, NODES), check_invariants=True).coalesce()
    degree = torch.sparse.sum(adjacency, dim=1).to_dense()
    scale = degree.pow(-0.5)
    index = adjacency.indices()
    values = adjacency.values() * scale[index[0]] * scale[index[1]]
    normalized = torch.sparse_coo_tensor(index, values, (NODES, NODES), check_invariants=True).coalesce()
    return normalized if layout == torch.sparse_coo else normalized.to_sparse_csr()


class GCN(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer1 = nn.Linear(FEATURES, HIDDEN)
        self.layer2 = nn.Linear(HIDDEN, CLASSES)

    def forward(self, adjacency, x):
        h = F.relu(torch.sparse.mm(adjacency, self.layer1(x)))
        h = F.dropout(h, 0.0, self.training)
        return torch.sparse.mm(adjacency, self.layer2(h))


def _train_gcn(template, device, layout, steps=8):
    edges, features, labels, train = _graph()
    adjacency = _normalized_adjacency(edges, device, layout)
    assert adjacency.layout == layout and adjacency.device.type == torch.device(device).type
    x, labels, train = features.to(device), labels.to(device), train.to(device)
    model = copy.deepcopy(template).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.02, weight_decay=5e-4)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        logits = model(adjacency, x)
        loss = F.cross_entropy(logits[train], labels[train])
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return model, torch.stack(losses), adjacency


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
def test_gcn_trains_as_on_cpu(layout):
    torch.manual_seed(1)
    template = GCN()
    model, losses, adjacency = _train_gcn(template, DEV, layout)
    want_model, want_losses, want_adjacency = _train_gcn(template, "cpu", layout)
    torch.testing.assert_close(adjacency.to_dense().cpu(), want_adjacency.to_dense())
    torch.testing.assert_close(losses.cpu(), want_losses)
    _assert_params_equal(model, want_model)
    assert want_losses[-1] < want_losses[0], "the network learns"
