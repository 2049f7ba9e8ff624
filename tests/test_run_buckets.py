"""``run``'s gradient buckets in one process: what the overlapped reduction hands its thread,
when, and in what order (the program itself is a recorder here; ``test_run.py`` runs the real
programs on 8 gloo processes and compares with one process)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from solver_planner.run import buckets  # noqa: E402
from solver_planner.run.buckets import OverlappedReduction, _pieces  # noqa: E402


class Stage(torch.nn.Module):
    def __init__(self, widths):
        super().__init__()
        self.layers = torch.nn.ModuleDict({str(i): torch.nn.Linear(a, b) for i, (a, b) in
                                           enumerate(zip(widths, widths[1:]))})
        self.layers["act"] = torch.nn.ReLU()            # no parameters: no bucket

    def forward(self, x):
        for m in self.layers.values():
            x = m(x)
        return x


@pytest.mark.parametrize("elements", [1, 7, 100, 10**6])
def test_pieces_cover_each_gradient_once_in_order(elements):
    grads = [torch.arange(n, dtype=torch.float32).reshape(-1, 1) + 1000 * k for k, n in enumerate((5, 13, 1, 40))]
    pieces = _pieces(grads, elements)
    assert all(0 < sum(t.numel() for t in b) <= elements for b in pieces)
    assert all(sum(t.numel() for t in b) == elements for b in pieces[:-1])      # only the last is short
    flat = torch.cat([t for b in pieces for t in b])
    assert torch.equal(flat, torch.cat([g.reshape(-1) for g in grads]))
    for b in pieces:                     # views: reducing a bucket reduces the gradients
        for t in b:
            t.mul_(2)
    assert torch.equal(torch.cat([g.reshape(-1) for g in grads]), 2 * flat)


@pytest.mark.parametrize("elements", [10**6, 50])
def test_each_layer_is_handed_over_during_the_last_backward_in_backward_order(monkeypatch, elements):
    seen = []

    def record(program, grads, groups, rank):
        seen.append(sum(g.numel() for g in grads))
        for g in grads:
            g.add_(1.0)                  # what the thread does reaches the parameters' gradients

    monkeypatch.setattr(buckets, "reduce_tensors", record)
    torch.manual_seed(0)
    stage = Stage([8, 16, 4, 3])
    red = OverlappedReduction(stage, {"data": {"chunks": 1}, "calls": {}}, [], 0, elements)
    x = torch.randn(5, 8)
    stage(x).sum().backward()           # not armed: an earlier micro-batch's backward
    assert red.buckets == 0 and not seen
    before = {n: p.grad.clone() for n, p in stage.named_parameters()}
    red.arm()
    assert red.pending
    stage(x).sum().backward()
    red.finish()
    assert not red.pending
    sizes = [sum(p.numel() for p in stage.layers[str(i)].parameters()) for i in (2, 1, 0)]   # backward order
    want = [n for size in sizes for n in [elements] * (size // elements) + ([size % elements] if size % elements else [])]
    assert seen == want
    assert red.buckets == red.buckets_during_backward == sum(math.ceil(s / elements) for s in sizes)
    for n, p in stage.named_parameters():
        assert torch.allclose(p.grad, 2 * before[n] + 1.0)


def test_a_layer_no_hook_saw_is_handed_over_when_the_backward_returns(monkeypatch):
    """torch's split backward sets weight gradients itself (no hook fires): flush() hands
    every layer over once the backward has returned, still in backward order."""
    seen = []
    monkeypatch.setattr(buckets, "reduce_tensors", lambda program, grads, groups, rank: seen.append(len(grads)))
    stage = Stage([4, 4, 4])
    red = OverlappedReduction(stage, {"data": {"chunks": 1}, "calls": {}}, [], 0, 10**6)
    red.arm()
    for p in stage.parameters():
        p.grad = torch.ones_like(p)      # as stage_backward_weight assigns them
    red.flush()
    red.finish()
    assert seen == [2, 2] and red.buckets == 2 and red.buckets_during_backward == 0


def test_an_error_in_the_thread_is_raised_on_the_training_thread(monkeypatch):
    def fail(program, grads, groups, rank):
        raise ValueError("peer gone")

    monkeypatch.setattr(buckets, "reduce_tensors", fail)
    stage = Stage([4, 4])
    red = OverlappedReduction(stage, {"data": {"chunks": 1}, "calls": {}}, [], 3, 10**6)
    red.arm()
    stage(torch.randn(2, 4)).sum().backward()
    with pytest.raises(RuntimeError, match="gradient program failed on rank 3: peer gone"):
        red.finish()


def test_a_parameter_two_layers_share_is_reduced_once_with_the_first(monkeypatch):
    """GPT-2's logits reuse the token table: on a stage holding both, the table belongs to the
    first layer (its backward runs last, where the table's one accumulation happens), so its
    gradient is handed over once, after both uses have added to it."""
    seen = []

    def record(program, grads, groups, rank):
        seen.append([tuple(g.shape) for g in grads])
        for g in grads:
            g.add_(1.0)

    monkeypatch.setattr(buckets, "reduce_tensors", record)

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            emb, mid = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 4)
            out = torch.nn.Linear(4, 10, bias=False)
            out.weight = emb.weight                 # one parameter in two layers
            self.layers = torch.nn.ModuleDict({"0": emb, "1": mid, "2": out})

        def forward(self, x):
            for m in self.layers.values():
                x = m(x)
            return x

    torch.manual_seed(0)
    stage = Tied()
    x = torch.tensor([1, 2, 3])
    stage(x).sum().backward()                          # unarmed: the plain gradients
    plain = {n: p.grad.clone() for n, p in stage.named_parameters()}
    stage.zero_grad()
    red = OverlappedReduction(stage, {"data": {"chunks": 1}, "calls": {}}, [], 0, 10**6)
    red.arm()
    stage(x).sum().backward()
    red.finish()
    assert seen == [[(16,), (4,)], [(40,)]]            # the middle layer, then the table, once
    assert red.buckets == red.buckets_during_backward == 2
    for n, p in stage.named_parameters():
        assert torch.allclose(p.grad, plain[n] + 1.0), n
