"""The MoE pieces: routing, capacity, permutations, the all-to-all region and its record."""
from __future__ import annotations

import torch
import torch.distributed as dist

from mtb_helpers import run
from mtb_helpers.comm.records import record
from mtb_helpers.moe.layers import (DISPATCH, ExpertParallelMoE, all_to_all_rows, expert_capacity,
                             inverse_permutation, capacity_mask, moe_reference, route)
from mtb_helpers.moe.check import make_moe_inputs


def test_route_picks_the_largest_probabilities():
    x = torch.eye(3)
    gate_weight = torch.tensor([[0.0, 0, 5], [5.0, 0, 0], [0, 5.0, 0]])   # [E=3, h=3]
    w, e, p = route(x, gate_weight, top_k=1)
    assert e.flatten().tolist() == [1, 2, 0]
    assert torch.allclose(p.sum(1), torch.ones(3)) and torch.equal(w[:, 0], p.max(1).values)
    w2, e2, _ = route(x, gate_weight, top_k=2)
    assert torch.equal(e2[:, 0], e[:, 0]) and (w2[:, 0] >= w2[:, 1]).all()


def test_capacity_keeps_first_choices_first_then_token_order():
    assert expert_capacity(8, 4, 1, None) is None
    assert expert_capacity(8, 4, 2, 1.0) == 4 and expert_capacity(8, 4, 1, 0.3) == 1
    experts = torch.tensor([[0, 1], [0, 1], [1, 0], [0, 1]])           # [n=4, k=2]
    kept = capacity_mask(experts, 2, capacity=2)
    # first choices: expert 0 gets tokens 0, 1 (full), token 3 dropped; expert 1 gets token 2;
    # second choices: expert 1 has one place left -> token 0; expert 0 is full
    assert kept.tolist() == [[True, True], [True, False], [True, False], [False, False]]
    assert capacity_mask(experts, 2, None).all()


def test_inverse_permutation_undoes_the_sort():
    order = torch.tensor([2, 0, 3, 1])
    rows = torch.arange(8.0).view(4, 2)
    assert torch.equal(rows[order][inverse_permutation(order)], rows)


def test_one_rank_layer_equals_the_reference():
    gate, experts, x, dy = make_moe_inputs(12, 4, 8, 3, torch.float64, seed=2)
    layer = ExpertParallelMoE.from_full(gate, experts, top_k=2, capacity_factor=0.75)
    y = layer(x)
    ref, chosen, kept = moe_reference(gate, experts, x, 2, 0.75)
    assert torch.allclose(y, ref, atol=1e-12) and (~kept).any()
    assert torch.equal(layer.last.experts, chosen) and torch.equal(layer.last.kept, kept)
    dropped = ~kept.any(1)
    assert torch.equal(y[dropped], torch.zeros_like(y[dropped]))   # fully dropped tokens are 0


def test_all_to_all_with_uneven_splits_and_its_backward():
    def job():
        r = dist.get_rank()
        send = [[1, 2, 0], [0, 0, 3], [2, 1, 1]][r]                  # rows rank r sends to q
        recv = [[1, 0, 2], [2, 0, 1], [0, 3, 1]][r]                  # = column r of that matrix
        x = (torch.arange(sum(send) * 2.0).view(-1, 2) + 100 * r).requires_grad_(True)
        with record() as rec:
            y = all_to_all_rows(x, send, recv, DISPATCH)
            (y * torch.arange(1.0, y.shape[0] + 1).unsqueeze(1)).sum().backward()
        return x.detach(), y.detach(), x.grad, rec

    out = run(job, world_size=3)
    xs = [o[0] for o in out]
    send = [[1, 2, 0], [0, 0, 3], [2, 1, 1]]
    for r, (_, y, grad, rec) in enumerate(out):
        expected = torch.cat([xs[q][sum(send[q][:r]):sum(send[q][:r + 1])] for q in range(3)])
        assert torch.equal(y, expected)
        fwd, bwd = rec.select("all_to_all", "forward")[0], rec.select("all_to_all", "backward")[0]
        assert fwd.sent_bytes == (sum(send[r]) - send[r][r]) * 8 and fwd.region == DISPATCH
        assert bwd.shape == fwd.out_shape and bwd.out_shape == fwd.shape
    # backward returned each row's grad (its position on the receiving rank) to its sender
    for q in range(3):
        grad = out[q][2]
        offset = 0
        for r in range(3):
            k = send[q][r]
            before = sum(send[p][r] for p in range(q))
            pos = torch.arange(before + 1, before + k + 1, dtype=torch.float32)
            assert torch.equal(grad[offset:offset + k], pos.unsqueeze(1).expand(k, 2))
            offset += k


