"""The data-parallel check: ``steps`` Adam steps of DDP / ZeRO-1 / ZeRO-2 / ZeRO-3 on real ranks
against the single-process steps on the whole batch, compared after every step.

    report = check_data_parallel(world_size=2, strategy="zero2")

The caller draws the MLP (``dp.make_mlp``), a warm-up batch and the checked batch
``X, target [B, h]`` from ``seed``, and takes one Adam step on the warm-up batch on one process:
Adam's first step is ``lr·sign(g)`` whatever the scale of ``g``, so a gradient that is ``p`` times
too large or too small would not show in the parameters; from the second step on it does. Then
every rank starts from that state and runs ``steps`` (default 3) training steps, each on its
``B/p`` rows of a new batch; the reference takes the same steps on one process
(``torch.optim.Adam`` on the ``nn.Module``), in the run's dtype and in float64. Several steps,
because state carries over: one step cannot show gradients that are never cleared (step 2 would
use ``g1 + g2``). Rows, per rank and step (``row.note`` says ``"step k"``): ``params`` after the
step, ``grads`` (the averaged gradient the optimizer used), ``exp_avg`` and ``exp_avg_sq`` (Adam's
m and v), each the piece the rank holds (see ``dp.SHARDED``). ``extra``: bytes held per rank after
the last step vs the ZeRO paper's accounting (``memory``) and bytes sent per rank in one step from
the record vs the formulas (``communication``; ``records`` are those of the last step).
"""
from __future__ import annotations

import copy
import functools

import torch
import torch.nn.functional as F
from torch.nn.utils import vector_to_parameters

from mtb_helpers.checking.bug import resolve
from mtb_helpers.comm.mesh import group_rank, group_size
from mtb_helpers.comm.records import record
from mtb_helpers.dp.fsdp import build_strategy
from mtb_helpers.dp.strategies import (MEMORY_SHARDED, MEMORY_TERMS, SHARDED, STRATEGIES, Adam, FlatShards,
                                       flat, make_mlp)
from mtb_helpers.runtime.ranks import resolve_world_size, run
from mtb_helpers.checking.tolerances import as_dtype, check_config, divisible, number, positive_sizes
from mtb_helpers.checking.report import Report, compare

__all__ = ["check_data_parallel", "check_all_strategies", "make_problem", "reference_step",
           "reference_steps",
           "memory_model", "communication_model", "QUANTITIES", "MEMORY_TERMS",
           "MEMORY_SHARDED"]

QUANTITIES = ("params", "grads", "exp_avg", "exp_avg_sq")
PAPER_K = 12   # ZeRO paper, mixed-precision Adam: fp32 master params, momentum and variance


def make_problem(batch: int, hidden: int, ffn_hidden: int, dtype: torch.dtype, seed: int,
                 steps: int = 1):
    """``(model, (x0, y0), (x, y))``: the MLP, the warm-up batch and the checked batch, ``[B, h]``;
    with ``steps > 1`` the last item is the list of the ``steps`` checked batches (the first of
    them is the one ``steps=1`` returns)."""
    gen = torch.Generator().manual_seed(seed)
    model = make_mlp(hidden, ffn_hidden, gen, dtype)
    batches = [tuple(torch.randn(batch, hidden, generator=gen, dtype=dtype) for _ in range(2))
               for _ in range(1 + steps)]
    return model, batches[0], (batches[1] if steps == 1 else batches[1:])


def reference_step(model, batch, adam: Adam, state: dict | None = None):
    """One Adam step of ``model`` (a copy) on the whole batch, on one process, optionally from the
    flat ``state`` (``exp_avg``, ``exp_avg_sq``, ``step``). Returns the flat ``[Ψ]`` results:
    ``{"params", "grads", "exp_avg", "exp_avg_sq", "step"}``."""
    return reference_steps(model, [batch], adam, state)[0]


def reference_steps(model, batches, adam: Adam, state: dict | None) -> list[dict]:
    """``reference_step`` chained over ``batches``: the flat results after each step. One copy
    of the model and one optimizer carry the state from step to step (the same numbers as
    restoring the flat state before every step, without a deep copy per step)."""
    model = copy.deepcopy(model)
    params = list(model.parameters())
    opt = adam.torch_optimizer(params)   # PyTorch's own: every DP check holds the course's update to it
    if state is not None:
        offset = 0
        for p in params:
            opt.state[p] = {"step": torch.tensor(float(state["step"])),
                            **{k: state[k][offset:offset + p.numel()].view_as(p).clone().to(p.dtype)
                               for k in ("exp_avg", "exp_avg_sq")}}
            offset += p.numel()
    out = []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)   # every step's gradient is its own batch's
        F.mse_loss(model(x), y).backward()
        opt.step()
        out.append({"params": flat(params), "grads": flat(p.grad for p in params),
                    "exp_avg": flat(opt.state[p]["exp_avg"] for p in params),
                    "exp_avg_sq": flat(opt.state[p]["exp_avg_sq"] for p in params),
                    "step": int(opt.state[params[0]]["step"])})
    return out


def _on_rank(strategy: str, model, start: dict, batches, adam: Adam, bug) -> dict:
    """Run on every rank: build the strategy (``bug``'s wrong one if given), one training step per
    batch on this rank's rows; report the pieces after each step, the bytes held after the last,
    the record of the last step and the strategy's ``FlatShards``."""
    t, r = group_size(), group_rank()
    dp = build_strategy(strategy, model, start, adam, bug)
    pieces = []
    for x, y in batches:
        n = x.shape[0] // t
        with record() as rec:
            dp.train_step(x[r * n:(r + 1) * n], y[r * n:(r + 1) * n])
        pieces.append(dp.pieces())
    held = dp.held()
    if strategy == "zero3":
        held["gathered_transient"] = dp.gathered_bytes
    return {"pieces": pieces, "held": held, "record": rec.without_tensors(), "layout": dp.layout}


def memory_model(strategy: str, layout: FlatShards, dtype_bytes: int) -> dict:
    """Bytes per rank our run should hold: params ``dΨ``, grads ``dΨ``, Adam ``2dΨ`` (``d`` bytes
    per element, K = 2d: m and v, no master copy since the parameters already are in the run's
    dtype), each of them ``/p`` where the strategy shards it (``Ψ`` padded then). Next to it the
    ZeRO paper's mixed-precision accounting ``2Ψ + 2Ψ + KΨ``, K = 12, sharded the same way."""
    t, d = layout.world_size, dtype_bytes
    sharded = MEMORY_SHARDED[strategy]
    n = {q: (layout.padded_numel // t if q in sharded else layout.numel if strategy == "ddp"
             else layout.padded_numel) for q in MEMORY_TERMS}
    ours = {"params": d * n["params"], "grads": d * n["grads"],
            "optimizer_state": 2 * d * n["optimizer_state"]}
    psi = layout.numel
    paper = {q: k * psi // (t if q in sharded else 1)
             for q, k in (("params", 2), ("grads", 2), ("optimizer_state", PAPER_K))}
    return {"ours": ours, "paper_mixed_precision": paper}


# the course's letters (glossary): p ranks, e bytes per element, Ψ parameters
_FORMULA_TEXT = {"ddp": "all-reduce 2(p-1)/p·eΨ", "zero1": "reduce-scatter + all-gather 2(p-1)/p·eΨ",
                 "zero2": "reduce-scatter + all-gather 2(p-1)/p·eΨ",
                 "zero3": "all-gather fwd + all-gather bwd + reduce-scatter 3(p-1)/p·eΨ"}


def communication_model(strategy: str, layout: FlatShards, dtype_bytes: int) -> int:
    """Bytes each rank sends per step with ring collectives (``Ψ`` padded where sharded)."""
    t = layout.world_size
    units = [layout.padded(i) * dtype_bytes for i in range(len(layout.units))]
    per_unit = 3 if strategy == "zero3" else 2
    return sum(per_unit * (t - 1) * nbytes // t for nbytes in units)


def _validate(strategy, batch, hidden, ffn_hidden, lr, weight_decay, t, bug, steps=3):
    """Refuse bad input before any rank starts; the resolved ``Bug`` (or None)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; expected one of {STRATEGIES}")
    positive_sizes(batch=batch, hidden=hidden, ffn_hidden=ffn_hidden, steps=steps)
    divisible("batch", batch, f"the world size {t}", t, f"data parallelism gives each rank "
              f"{batch}/{t} samples, and equal slices are what make the average of the ranks' "
              f"mean losses the mean of the whole batch")
    for name, value in {"lr": lr, "weight_decay": weight_decay}.items():
        number(name, value, lambda v: v >= 0, "a non-negative number")
    # which strategies a bug applies to is its need (dp/bugs.py), asked like every check's
    return resolve(bug, "data_parallel", strategy=strategy)


@functools.lru_cache(maxsize=4)
def _problem(batch: int, hidden: int, ffn_hidden: int, lr: float, weight_decay: float,
             dtype: torch.dtype, seed: int, steps: int):
    """``(adam, model, start, batches, refs, refs64)``: the problem and its one-process steps (in
    the run's dtype and in float64). None of it depends on the world size, the strategy or the
    bug, so an explorer moving those sliders reuses it (kept for the last few settings; nothing
    here is modified after it is made) and only the ranks run again."""
    adam = Adam(lr=lr, weight_decay=weight_decay)
    model, warm, batches = make_problem(batch, hidden, ffn_hidden, dtype, seed, steps)
    batches = [batches] if steps == 1 else batches
    start = reference_step(model, warm, adam)              # the state after one earlier step
    vector_to_parameters(start["params"].clone(), model.parameters())
    refs = reference_steps(model, batches, adam, start)
    refs64 = reference_steps(copy.deepcopy(model).double(),
                             [tuple(v.double() for v in b) for b in batches], adam,
                             {k: (v.double() if torch.is_tensor(v) else v) for k, v in start.items()})
    return adam, model, start, batches, refs, refs64


def check_data_parallel(world_size: int = 2, strategy: str = "ddp", batch: int = 8, hidden: int = 8,
                        ffn_hidden: int = 32, lr: float = 1e-2, weight_decay: float = 0.0,
                        dtype=torch.float32, seed: int = 0, bug: str | None = None,
                        timeout: float = 30.0, steps: int = 3, link=None) -> Report:
    """``strategy`` on ``world_size`` ranks; see the module docstring. Refuses (ValueError,
    before any rank starts) an unknown strategy, a batch the world size does not divide, and a
    bug that does not apply to the strategy. Any parameter count works: flat buffers are padded.
    """

    dtype, t = as_dtype(dtype), resolve_world_size(world_size)
    wrong = _validate(strategy, batch, hidden, ffn_hidden, lr, weight_decay, t, bug, steps)
    adam, model, start, batches, refs, refs64 = _problem(batch, hidden, ffn_hidden, float(lr),
                                                         float(weight_decay), dtype, seed, steps)
    # the cached problem is shared by every call with the same settings: a strategy running in
    # this process (under torchrun) gets its own model and start, whatever it does to them
    model, start = copy.deepcopy(model), copy.deepcopy(start)
    results = run(_on_rank, strategy, model, start, batches, adam, wrong,
                  world_size=t, timeout=timeout, link=link)   # link=: an emulated link (cost/)
    layout = results[0]["layout"]      # the strategy's flat units and their shards
    rows = []
    for k, (ref, ref64) in enumerate(zip(refs, refs64)):
        for q in QUANTITIES:
            sharded = q in SHARDED[strategy]
            for r, res in enumerate(results):
                rows.append(compare(q, r, res["pieces"][k][q], layout.piece(ref[q], r, sharded),
                                    layout.piece(ref64[q], r, sharded), dtype, note=f"step {k + 1}"))
    d = dtype.itemsize
    records = [res["record"] for res in results]
    extra = {"memory": {"unit": "bytes held per rank after the step", "numel": layout.numel,
                        "padded_numel": layout.padded_numel, "dtype_bytes": d,
                        "per_rank": [res["held"] for res in results],
                        **memory_model(strategy, layout, d)},
             "communication": {"unit": "bytes sent per rank per step (ring)",
                               "per_rank": [_sent_by_op(rec) for rec in records],
                               "formula": communication_model(strategy, layout, d),
                               "formula_text": _FORMULA_TEXT[strategy]}}
    config = check_config(t, dtype, seed, bug, strategy=strategy, batch=batch, hidden=hidden,
                          ffn_hidden=ffn_hidden, lr=lr, weight_decay=weight_decay, steps=steps)
    return Report("data_parallel", config, rows, [], records, extra=extra)


def _sent_by_op(rec) -> dict:
    """``{"total": bytes, "by_op": {"backward reduce_scatter": bytes, ...}}`` from one record."""
    by_op: dict[str, int] = {}
    for e in rec.communicating():
        key = f"{e.direction} {e.op}"
        by_op[key] = by_op.get(key, 0) + e.sent_bytes
    return {"total": sum(by_op.values()), "by_op": by_op}


def check_all_strategies(world_size: int = 2, strategies=STRATEGIES, **kwargs) -> list[Report]:
    """``check_data_parallel`` for each strategy, same problem; a bug is injected only into the
    strategies it applies to (the others run correct). Everything is validated first."""
    bug = kwargs.pop("bug", None)
    strategies = tuple(strategies)
    wrong = resolve(bug, "data_parallel")
    applies = lambda s: wrong is not None and not wrong.unmet(strategy=s)   # the bug's needs
    if wrong is not None and not any(applies(s) for s in strategies):
        raise ValueError(f"bug {bug!r} does not apply to any of {', '.join(strategies)}; "
                         f"it applies to {', '.join(s for s in STRATEGIES if applies(s))}")
    chosen = {s: (bug if applies(s) else None) for s in strategies}
    t = resolve_world_size(world_size)
    for s, b in chosen.items():   # refuse bad input before any rank starts
        _validate(s, kwargs.get("batch", 8), kwargs.get("hidden", 8), kwargs.get("ffn_hidden", 32),
                  kwargs.get("lr", 1e-2), kwargs.get("weight_decay", 0.0), t, b,
                  kwargs.get("steps", 3))
    return [check_data_parallel(world_size=world_size, strategy=s, bug=b, **kwargs)
            for s, b in chosen.items()]
