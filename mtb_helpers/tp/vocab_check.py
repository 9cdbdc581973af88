"""``check_vocab_parallel``: the vocabulary split at both ends, on real ranks, against one process.

    report = check_vocab_parallel(world_size=2, vocab=12, hidden=4, tokens=(4, 2))

The check draws, from ``seed``: an embedding table ``E [V, h]``, token ids ``[*tokens]`` and an
upstream grad ``dE [*tokens, h]`` for ``VocabParallelEmbedding``; logits ``[*tokens, V]``, targets
``[*tokens]`` and the loss's upstream grad for ``vocab_parallel_cross_entropy``. Every rank gets
the full tensors and keeps its vocabulary range (rows of E, columns of the logits). The reference
is ``nn.Embedding`` and ``F.cross_entropy`` on the full tensors, plus the three per-token numbers
the parallel loss combines (max, sum of exp(x - max), target logit - max). Rows compare per rank;
``report.steps`` traces every step, the three all-reduces included.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import Partial, Replicate, Shard

from mtb_helpers.checking.bug import Bug, resolve, swap
from mtb_helpers.checking.report import Report
from mtb_helpers.checking.tolerances import as_dtype, check_config, positive_sizes
from mtb_helpers.checking.trace import StepSpec as S, traced_report
from mtb_helpers.comm.records import record
from mtb_helpers.comm.mesh import group_rank, group_size
from mtb_helpers.comm.sharding import check_divisible, shard_range
from mtb_helpers.runtime.ranks import resolve_world_size, run
from mtb_helpers.tp.vocab import REDUCTIONS, VocabParallelCrossEntropy, VocabParallelEmbedding

__all__ = ["check_vocab_parallel", "draw_vocab_inputs", "vocab_reference", "QUANTITIES"]

QUANTITIES = ("embedding.output", "embedding.weight_grad", "ce.max", "ce.sum_exp",
              "ce.target_logit", "loss", "logits_grad")


def draw_vocab_inputs(seed: int, vocab: int, hidden: int, tokens: tuple[int, ...],
                      reduction: str = "mean", dtype=torch.float32) -> dict:
    """The tensors the check draws for ``seed``: ``embedding`` (``nn.Embedding(V, h)``), ``ids``,
    ``d_emb``, ``logits`` ``[*tokens, V]`` (spread ~N(0, 2^2) so the max matters), ``target``
    and ``d_loss`` (a scalar, or ``[*tokens]`` for ``reduction="none"``)."""
    dtype, gen = as_dtype(dtype), torch.Generator().manual_seed(seed)
    emb = nn.Embedding(vocab, hidden, dtype=dtype)
    with torch.no_grad():
        emb.weight.copy_(torch.randn(vocab, hidden, generator=gen, dtype=dtype))
    ids = torch.randint(0, vocab, tokens, generator=gen)
    d_emb = torch.randn(*tokens, hidden, generator=gen, dtype=dtype)
    logits = 2 * torch.randn(*tokens, vocab, generator=gen, dtype=dtype)
    target = torch.randint(0, vocab, tokens, generator=gen)
    d_loss = torch.randn(tokens if reduction == "none" else (), generator=gen, dtype=dtype)
    return {"embedding": emb, "ids": ids, "d_emb": d_emb, "logits": logits, "target": target,
            "d_loss": d_loss}


def vocab_reference(inputs: dict, t: int, reduction: str, dtype: torch.dtype) -> dict:
    """Every traced quantity on one process, in ``dtype``; per-rank lists for the local steps."""
    emb = nn.Embedding.from_pretrained(inputs["embedding"].weight.detach().to(dtype), freeze=False)
    out = emb(inputs["ids"])
    out.backward(inputs["d_emb"].to(dtype))
    logits = inputs["logits"].to(dtype).clone().requires_grad_(True)
    target, vocab = inputs["target"], logits.shape[-1]
    loss = F.cross_entropy(logits.reshape(-1, vocab), target.reshape(-1), reduction=reduction)
    loss = loss.reshape(target.shape) if reduction == "none" else loss
    loss.backward(inputs["d_loss"].to(dtype))
    x = logits.detach()
    m = x.max(dim=-1).values                                           # [..]
    shifted = x - m.unsqueeze(-1)
    cuts = [slice(*shard_range(vocab, t, r)) for r in range(t)]
    picked = shifted.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    owner = [(target >= c.start) & (target < c.stop) for c in cuts]
    rows = emb.weight.detach()[inputs["ids"]]
    ids = inputs["ids"].unsqueeze(-1)
    return {"embedding.weight": emb.weight.detach(),
            "embedding.partial": [rows * ((ids >= c.start) & (ids < c.stop)) for c in cuts],
            "embedding.output": out.detach(), "embedding.weight_grad": emb.weight.grad,
            "logits": x, "ce.local_max": [x[..., c].max(dim=-1).values for c in cuts],
            "ce.max": m, "ce.local_sum_exp": [shifted[..., c].exp().sum(dim=-1) for c in cuts],
            "ce.sum_exp": shifted.exp().sum(dim=-1),
            "ce.local_target_logit": [picked * own for own in owner],
            "ce.target_logit": picked, "loss": loss.detach().reshape(-1),
            "logits_grad": logits.grad}


def _vocab_on_rank(inputs: dict, reduction: str, wrong: Bug | None) -> dict:
    """On every rank: the embedding forward/backward, then the loss forward/backward."""
    t, r = group_size(), group_rank()
    emb = swap(wrong, VocabParallelEmbedding).from_full(inputs["embedding"])
    ce = swap(wrong, VocabParallelCrossEntropy)(reduction, vocab_size=inputs["logits"].shape[-1])
    logits = inputs["logits"].chunk(t, dim=-1)[r].clone().requires_grad_(True)   # [.., V/t]
    with record(keep_tensors=True) as rec:
        out = emb(inputs["ids"])
        out.backward(inputs["d_emb"])
        loss = ce(logits, inputs["target"])
        loss.backward(inputs["d_loss"])
    obs = {"embedding.weight": emb.weight, "embedding.output": out,
           "embedding.weight_grad": emb.weight.grad, "logits": logits, "loss": loss.reshape(-1),
           "logits_grad": logits.grad}
    for e, (x_in, x_out) in zip(rec.events, rec.tensors):
        if e.operator == "g":
            obs["embedding.partial"] = x_in
        elif e.operator in ("max", "sum_exp", "target_logit"):   # the loss's three all-reduces
            obs[f"ce.{e.operator}"], obs[f"ce.local_{e.operator}"] = x_out, x_in
    return {"obs": {k: v.detach().clone() for k, v in obs.items() if v is not None},
            "record": rec.without_tensors(), "rank": r}


def _specs() -> list[S]:
    return [
        S("embedding.weight", "shard W_emb by vocabulary rows", "forward", "W_emb",
          "W_emb_r = W_emb[ids of rank r, :]", Shard(0), ("param",)),
        S("embedding.partial", "look up own tokens", "forward", "X",
          "X^(r) = W_emb_r[id - start] if rank r owns id, else 0", Partial(), ("record",)),
        S("embedding.output", "all-reduce (g forward)", "forward", "X", "X = sum_r X_r",
          Replicate(), ("output",), ("g", "forward")),
        S("embedding.weight_grad", "embedding grad of own rows", "backward", "dW_emb",
          "dW_emb_r[id - start] += dX (own ids only)", Shard(0), ("grad",)),
        S("logits", "shard logits by vocabulary", "forward", "z", "z_r = z[:, ids of rank r]",
          Shard(-1), ("input",)),
        S("ce.local_max", "local max", "forward", "mx", "mx_r = max_j z_r[:, j]", Partial("max"),
          ("record",)),
        S("ce.max", "all-reduce (max)", "forward", "mx", "mx = max_r mx_r", Replicate(),
          ("record",), ("max", "forward")),
        S("ce.local_sum_exp", "local sum of exp", "forward", "sum_exp", "sum_exp_r = sum_j exp(z_r - mx)",
          Partial(), ("record",)),
        S("ce.sum_exp", "all-reduce (sum of exp)", "forward", "sum_exp", "sum_exp = sum_r sum_exp_r", Replicate(),
          ("record",), ("sum_exp", "forward")),
        S("ce.local_target_logit", "pick own target logits", "forward", "target_logit",
          "target_logit_r = z_r[target] - mx if rank r owns target, else 0", Partial(), ("record",)),
        S("ce.target_logit", "all-reduce (target logit)", "forward", "target_logit",
          "target_logit = sum_r target_logit_r",
          Replicate(), ("record",), ("target_logit", "forward")),
        S("loss", "loss", "forward", "loss",
          "loss = log sum_exp - target_logit (then the reduction)", Replicate(),
          ("output",)),
        S("logits_grad", "logits grad (local)", "backward", "dz",
          "dz_r = (exp(z_r - mx) / sum_exp - onehot_r(target)) * dloss", Shard(-1), ("input_grad",)),
    ]


def check_vocab_parallel(world_size: int = 2, vocab: int = 12, hidden: int = 4,
                         tokens: tuple[int, ...] = (4, 2), reduction: str = "mean",
                         dtype=torch.float32, seed: int = 0, bug: str | None = None,
                         timeout: float = 30.0) -> Report:
    """``VocabParallelEmbedding`` and ``vocab_parallel_cross_entropy`` on ``world_size`` ranks.

    Rank r owns tokens ``[r*V/t, (r+1)*V/t)``: those rows of E, those columns of the logits.
    Refuses a vocabulary not divisible by the world size before any rank starts.
    """
    dtype, t = as_dtype(dtype), resolve_world_size(world_size)
    tokens = tuple(tokens)
    positive_sizes(vocab=vocab, hidden=hidden, **{f"tokens[{i}]": n for i, n in enumerate(tokens)})
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    wrong = resolve(bug, "vocab_parallel")
    check_divisible("vocab", vocab, t)
    inputs = draw_vocab_inputs(seed, vocab, hidden, tokens, reduction, dtype)
    results = run(_vocab_on_rank, inputs, reduction, wrong, world_size=t, timeout=timeout)
    refs = vocab_reference(inputs, t, reduction, dtype)
    refs64 = vocab_reference(inputs, t, reduction, torch.float64)
    config = check_config(t, dtype, seed, bug, vocab=vocab, hidden=hidden, tokens=list(tokens),
                       reduction=reduction)
    return traced_report("vocab_parallel", config, _specs(), [(q, q) for q in QUANTITIES],
                         results, refs, refs64, dtype)
