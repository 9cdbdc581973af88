"""Expert parallelism: a mixture-of-experts MLP whose experts live on different ranks.

Notation (one token per row, ``N`` tokens, width ``h``, ``E`` experts, top-``k`` routing, ``p`` ranks):

    probs = softmax(X @ Wg)                  router probabilities                  [N, E]
    (weights, experts) = top-k of probs      the k chosen experts, their probability [N, k]
    Y[i] = sum_j weights[i, j] * Expert_{experts[i, j]}(X[i])   over the kept choices j  [N, h]

Like the Switch Transformer (Fedus et al. 2021) the output is weighted by the raw softmax
probability (not renormalised over the k choices), which is what gives the router a gradient
even with k = 1.

**Expert parallelism** (GShard, Lepikhin et al. 2020): rank r holds N/p of the tokens and the
experts ``r*E/p .. (r+1)*E/p - 1``; the router ``Wg`` is replicated. One forward is

    1. route the local tokens; keep at most ``capacity`` choices per expert (below);
    2. sort the kept (token, choice) pairs by expert, hence by owning rank (permutation ``order``);
    3. all-to-all of the counts per expert, so each rank learns how many rows it will receive;
    4. all-to-all of the rows with uneven split sizes (dispatch);
    5. each local expert's MLP on the rows it received;
    6. all-to-all back with the split sizes swapped (combine);
    7. the inverse permutation puts each row back at its (token, choice), then weight by its
       probability and sum.

The backward of an all-to-all is the all-to-all with input and output splits swapped. The router
sees only this rank's tokens, so its grad is all-reduced over the group (``comm.allreduce_grad``).

**Capacity** (``capacity_factor`` c): each rank's N/p tokens are one group (GShard's groups);
each expert accepts at most ``ceil(capacity_factor * (N/p) * k / E)`` choices from a group, first choices
before second choices, then in token order. A dropped choice contributes zero; a token whose
choices are all dropped gets ``Y[i] = 0``, so in a transformer the residual ``X + Y`` carries it
through unchanged. ``capacity_factor=None`` keeps everything.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from mtb_helpers.comm.sharding import Shard
from mtb_helpers.comm.mesh import group_rank, group_size
from mtb_helpers.comm.records import note, recorded
from mtb_helpers.comm.regions import allreduce_grad

__all__ = ["Expert", "route", "expert_capacity", "capacity_mask", "inverse_permutation",
           "all_to_all_rows", "moe_reference", "ExpertParallelMoE",
           "Routing", "COUNTS", "DISPATCH", "COMBINE", "ROUTER_GRAD"]

COUNTS = "exchange_expert_counts"
DISPATCH = "dispatch_to_experts"
COMBINE = "combine_from_experts"
ROUTER_GRAD = "allreduce_router_grad"


class Expert(nn.Module):
    """One expert: ``fc2(gelu(fc1(x)))``, ``[rows, h] -> [rows, ffn] -> [rows, h]`` (exact-erf GeLU)."""

    def __init__(self, hidden: int, ffn_hidden: int, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn_hidden, dtype=dtype)
        self.fc2 = nn.Linear(ffn_hidden, hidden, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))   # [m, h] @ [h, f] -> GeLU -> @ [f, h] -> [m, h]


def route(x: torch.Tensor, gate_weight: torch.Tensor, top_k: int):
    """``(weights [N, k], experts [N, k], probs [N, E])``: softmax of ``x [N, h] @ gate_weight.T`` (``gate_weight``
    is nn.Linear's ``[E, h]``), its k largest probabilities per row (descending), their experts."""
    probs = torch.softmax(x @ gate_weight.T, dim=-1)   # [N, h] @ [h, E] -> [N, E]
    weights, experts = probs.topk(top_k, dim=-1)
    return weights, experts, probs


def expert_capacity(tokens: int, num_experts: int, top_k: int,
                    capacity_factor: float | None) -> int | None:
    """Choices one expert accepts from a group of ``tokens``: ``ceil(capacity_factor * tokens * k / E)``."""
    if capacity_factor is None:
        return None
    return math.ceil(capacity_factor * tokens * top_k / num_experts)


def capacity_mask(experts: torch.Tensor, num_experts: int, capacity: int | None) -> torch.Tensor:
    """``[tokens, k]`` bool: which choices of one group fit under ``capacity`` per expert. Priority:
    every token's first choice (in token order), then every second choice, ..."""
    if capacity is None:
        return torch.ones_like(experts, dtype=torch.bool)
    tokens, k = experts.shape
    slot_major = experts.T.reshape(-1)                         # [k*tokens]
    onehot = F.one_hot(slot_major, num_experts)
    earlier = (onehot.cumsum(0) * onehot).sum(1) - 1          # choices of this expert before it
    return (earlier < capacity).view(k, tokens).T


def inverse_permutation(order: torch.Tensor) -> torch.Tensor:
    """``inv`` with ``inv[order[i]] = i``: ``rows[order][inv]`` is ``rows`` again."""
    return torch.argsort(order)


@recorded(DISPATCH)   # or COMBINE: each use names its region in ctx.region
class _AllToAll(torch.autograd.Function):
    """forward: all-to-all of rows with splits (send, recv); backward: all-to-all of the grad with
    the splits swapped (recv, send), which returns every row's grad to the rank it came from."""

    @staticmethod
    def forward(ctx, x, send, recv, region, group):
        ctx.send, ctx.recv, ctx.region, ctx.group = send, recv, region, group
        if not dist.is_initialized():   # one process: every row stays here
            return x.view_as(x)
        out = x.new_empty((sum(recv), *x.shape[1:]))
        # [sum(send), h]: send[q] rows to rank q -> recv[q] rows from rank q -> [sum(recv), h]
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send,
                               group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        if not dist.is_initialized():
            return grad, None, None, None, None
        out = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        # [sum(recv), h] -> every row's grad back to the rank it came from -> [sum(send), h]
        dist.all_to_all_single(out, grad.contiguous(), output_split_sizes=ctx.send,
                               input_split_sizes=ctx.recv, group=ctx.group)
        return out, None, None, None, None


def all_to_all_rows(x: torch.Tensor, send: list[int], recv: list[int], region: str,
                    group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``x [sum(send), h]`` -> ``[sum(recv), h]``: ``send[q]`` consecutive rows go to rank q,
    ``recv[q]`` rows arrive from rank q (stacked in rank order). Autograd-aware."""
    return _AllToAll.apply(x, list(send), list(recv), region, group)


def moe_reference(gate: nn.Linear, experts: list[Expert], x: torch.Tensor, top_k: int,
                  capacity_factor: float | None, groups: int = 1,
                  chosen: torch.Tensor | None = None):
    """The MoE on one process, written the plain way (a loop over experts with masks):
    ``(Y [N, h], experts [N, k], kept [N, k])``, differentiable in ``x``, the router and every expert.
    Capacity is applied per group of ``N / groups`` consecutive tokens (a rank's tokens).
    ``chosen`` forces the experts (so a float64 reference follows the float32 routing)."""
    tokens = x.shape[0]
    weights, experts_, probs = route(x, gate.weight, top_k)
    if chosen is not None:
        experts_, weights = chosen, probs.gather(1, chosen)
    size = tokens // groups
    cap = expert_capacity(size, len(experts), top_k, capacity_factor)
    kept = torch.cat([capacity_mask(experts_[i * size:(i + 1) * size], len(experts), cap)
                      for i in range(groups)])
    y = x.new_zeros(x.shape)
    for i, expert in enumerate(experts):
        tok, slot = ((experts_ == i) & kept).nonzero(as_tuple=True)
        y = y.index_add(0, tok, expert(x[tok]) * weights[tok, slot].unsqueeze(1))
    return y, experts_, kept


@dataclass
class Routing:
    """What one rank's last forward did (plain tensors). ``experts``/``weights``/``kept``
    ``[N/p, k]``; ``dest_expert [kept]`` the expert of each kept choice in (token, choice) order;
    ``order [kept]`` the sort by expert; ``send``/``recv`` the dispatch split sizes per rank;
    ``recv_counts [p, E/p]`` rows received from each rank for each local expert."""
    experts: torch.Tensor
    weights: torch.Tensor
    kept: torch.Tensor
    dest_expert: torch.Tensor
    order: torch.Tensor
    send: list[int]
    recv: list[int]
    recv_counts: torch.Tensor
    capacity: int | None


class ExpertParallelMoE(nn.Module):
    """The MoE layer on one rank: ``forward(x [N/p, h]) -> y [N/p, h]`` for this rank's tokens.
    ``experts`` holds only this rank's ``E/p`` experts (global ids from ``first_expert``)."""
    input_layouts = output_layouts = Shard(0)   # [N/p, h]: each rank routes its own tokens

    def __init__(self, gate: nn.Linear, experts: list[Expert], num_experts: int, top_k: int,
                 capacity_factor: float | None, group: dist.ProcessGroup | None = None):
        super().__init__()
        self.gate, self.experts = gate, nn.ModuleList(experts)
        self.num_experts, self.top_k, self.capacity_factor = num_experts, top_k, capacity_factor
        self.group = group
        self.first_expert = group_rank(group) * len(experts)
        self.last: Routing | None = None

    @classmethod
    def from_full(cls, gate: nn.Linear, experts: list[Expert], top_k: int = 1,
                  capacity_factor: float | None = None, group=None) -> "ExpertParallelMoE":
        """Inside a rank: the replicated router and this rank's block of the full expert list."""
        p, r = group_size(group), group_rank(group)
        per_rank = len(experts) // p
        mine = [copy.deepcopy(expert) for expert in experts[r * per_rank:(r + 1) * per_rank]]
        return cls(copy.deepcopy(gate), mine, len(experts), top_k, capacity_factor, group)

    def router_weight(self) -> torch.Tensor:
        """The replicated router weight ``[E, h]``, its grad (a sum over this rank's tokens only)
        summed over the group in backward."""
        return allreduce_grad(self.gate.weight, ROUTER_GRAD, "gate.weight", self.group)

    def unpermute(self, back: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        """Rows came back sorted by expert; put each at its (token, choice) again."""
        return back[inverse_permutation(order)]

    def weigh(self, rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return rows * weights.unsqueeze(1)

    def run_experts(self, received: torch.Tensor, recv_counts: torch.Tensor) -> torch.Tensor:
        """``received [rows_in, h]`` arrives grouped by source rank, then by local expert
        (``recv_counts [p, E/p]``); run each local expert on its rows, in the same row order."""
        local = torch.arange(len(self.experts)).repeat(recv_counts.shape[0])
        which = local.repeat_interleave(recv_counts.reshape(-1))      # local expert of each row
        pieces, where = [], []
        for j, expert in enumerate(self.experts):
            idx = (which == j).nonzero().squeeze(1)
            pieces.append(expert(received[idx]))   # also on 0 rows, so every grad exists
            where.append(idx)
        return torch.cat(pieces)[inverse_permutation(torch.cat(where))]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p, tokens, k, E = group_size(self.group), x.shape[0], self.top_k, self.num_experts
        weights, experts, _ = route(x, self.router_weight(), k)
        cap = expert_capacity(tokens, E, k, self.capacity_factor)
        kept = capacity_mask(experts, E, cap)
        token = torch.arange(tokens).repeat_interleave(k)             # choice token*k + j
        sel = kept.reshape(-1).nonzero().squeeze(1)                   # the kept choices
        dest_expert = experts.reshape(-1)[sel]
        order = torch.argsort(dest_expert, stable=True)               # by expert = by rank
        counts = torch.bincount(dest_expert, minlength=E)             # [E]
        # [E] -> all-to-all -> [p * E/p]: how many rows each source rank sends each local expert
        recv_counts = counts.clone()
        if dist.is_initialized():
            dist.all_to_all_single(recv_counts, counts, group=self.group)
        note("all_to_all", counts, recv_counts, COUNTS, "", "forward", p,
             sent=(p - 1) * counts.numel() // p * counts.element_size())
        recv_counts = recv_counts.view(p, E // p)                     # [source rank, local expert]
        send = counts.view(p, E // p).sum(1).tolist()
        recv = recv_counts.sum(1).tolist()
        # [kept, h] -> all-to-all (uneven) -> [rows_in, h]: the rows this rank's experts must process
        received = all_to_all_rows(x[token[sel][order]], send, recv, DISPATCH, self.group)
        out = self.run_experts(received, recv_counts)                 # [rows_in, h] -> [rows_in, h]
        # [rows_in, h] -> all-to-all back (the transposed splits) -> [kept, h], in `order`
        back = all_to_all_rows(out, recv, send, COMBINE, self.group)
        rows = self.unpermute(back, order)                            # in (token, choice) order
        weighted = self.weigh(rows, weights.reshape(-1)[sel])
        y = x.new_zeros(x.shape).index_add(0, token[sel], weighted)  # sum the k choices per token
        self.last = Routing(experts.detach(), weights.detach(), kept, dest_expert, order, send,
                            recv, recv_counts, cap)
        return y
