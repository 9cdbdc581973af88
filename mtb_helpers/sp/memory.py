"""Activation memory and communication of the MLP block, measured, next to Korthikanti et al. 2022.

*Measured*: run the block's forward on every rank inside ``torch.autograd.graph.saved_tensors_hooks``
and add up the bytes of every tensor autograd keeps for backward (each piece of memory counted
once, parameters left out: they are weights, not activations), by the module that saved it.

*Model*: Korthikanti et al. 2022 (Sec. 4.1, "Reducing Activation Recomputation in Large
Transformer Models") count per layer, in bytes with 2-byte activations: LayerNorm input 2sbh; MLP
19sbh = fc1 input 2sbh + GeLU input 8sbh + fc2 input 8sbh + dropout mask sbh (with ffn = 4h); the
attention block, the second LayerNorm and the 5as^2b of the score matrices are not in our block.
With ``d`` bytes per element and ffn width ``f`` our block keeps, per rank:

    term            TP only        TP + SP          TP + SP, fc1 input re-gathered (Megatron)
    LayerNorm input d sbh          d sbh/t          d sbh/t
    fc1 input       d sbh          d sbh            d sbh/t
    GeLU input      d sbf/t        d sbf/t          d sbf/t
    fc2 input       d sbf/t        d sbf/t          d sbf/t
    dropout mask    sbh            sbh/t            sbh/t        (1 byte per element; 0 if p = 0)

fc1's input is the all-gathered ``[s, b, h]``: our block keeps it for backward; Megatron keeps the
shard and all-gathers it again in backward (``save_input_shard=True``), one more all-gather for
the last ``sbh/t``. LayerNorm also keeps its mean and 1/std (``[s, b, 1]`` each), which the model
leaves out; they are reported as "LayerNorm stats".
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from mtb_helpers.comm.mesh import group_rank, group_size
from mtb_helpers.comm.records import CollectiveRecord, record
from mtb_helpers.comm.regions import GRAD_ALLREDUCE_SP
from mtb_helpers.runtime.ranks import resolve_world_size, run
from mtb_helpers.sp.layers import SequenceParallelMLPBlock, TensorParallelMLPBlock
from mtb_helpers.comm.sharding import check_divisible, shard_range
from mtb_helpers.checking.tolerances import divisible
from mtb_helpers.tp.reference import random_linear

__all__ = ["TERMS", "STATS", "VARIANTS", "make_block_inputs", "check_block_sizes", "counting_saved", "saved_bytes",
           "measure_on_rank",
           "activation_model", "communication_summary", "memory_figures", "measure_activation_memory",
           "memory_table"]

TERMS = ("LayerNorm input", "fc1 input", "GeLU input", "fc2 input", "dropout mask")
STATS = "LayerNorm stats"
VARIANTS = {"tp": "TP only", "sp": "TP + SP", "sp_regather": "TP + SP, fc1 input re-gathered"}
_LABEL = dict(zip(("ln", "fc1", "act", "fc2", "dropout"), TERMS))   # the submodule that saves each term


def make_block_inputs(seq_len: int, batch: int, hidden: int, ffn_hidden: int,
                      dtype: torch.dtype = torch.float32, seed: int = 0):
    """``(ln, fc1, fc2, x, dy)`` drawn from ``seed``: LayerNorm over ``hidden`` (weight near 1),
    fc1 ``hidden -> ffn_hidden``, fc2 ``ffn_hidden -> hidden`` (``random_linear``), x and dy
    ``[seq_len, batch, hidden]``."""
    gen = torch.Generator().manual_seed(seed)
    ln = nn.LayerNorm(hidden, dtype=dtype)
    with torch.no_grad():
        ln.weight.copy_(1 + 0.2 * torch.randn(hidden, generator=gen, dtype=dtype))
        ln.bias.copy_(0.2 * torch.randn(hidden, generator=gen, dtype=dtype))
    fc1 = random_linear(hidden, ffn_hidden, gen, dtype)
    fc2 = random_linear(ffn_hidden, hidden, gen, dtype)
    x = torch.randn(seq_len, batch, hidden, generator=gen, dtype=dtype)
    dy = torch.randn(seq_len, batch, hidden, generator=gen, dtype=dtype)
    return ln, fc1, fc2, x, dy


def check_block_sizes(seq_len: int, ffn_hidden: int, world_size: int) -> None:
    """Refuse (ValueError, before any rank starts) a ``seq_len`` or ``ffn_hidden`` that
    ``world_size`` does not divide: the block splits both into equal shards."""
    divisible("seq_len", seq_len, f"the world size {world_size}", world_size,
              f"sequence parallelism splits the sequence into {world_size} equal shards")
    check_divisible("ffn_hidden", ffn_hidden, world_size)


@contextmanager
def counting_saved(module: nn.Module, hidden: int):
    """Inside this context, the bytes autograd saves for backward during ``module``'s forwards
    add up, by the submodule (``ln``, ``fc1``, ``act``, ``fc2``, ``dropout``) that saved them, in
    the ``{term: bytes}`` dict it yields. ``hidden``: the block's width (LayerNorm's stats are
    the saved tensors of width 1)."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    found: dict[str, int] = {t: 0 for t in (*TERMS, STATS)}
    seen: set[tuple] = set()
    current = ["other"]   # a stack: the submodule whose forward is running

    def leave(module, args, output) -> None:   # a forward hook must return None
        current.pop()

    handles = []
    for name, sub in module.named_modules():
        label = _LABEL.get(name.split(".")[-1])
        if label:
            handles.append(sub.register_forward_pre_hook(
                lambda m, a, lab=label: current.append(lab)))
            handles.append(sub.register_forward_hook(leave))

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        key = (ptr, t.storage_offset(), t.numel(), t.dtype)
        if ptr not in params and key not in seen:   # views of one buffer are one buffer
            seen.add(key)
            label = current[-1]
            if label == "LayerNorm input" and t.shape[-1] == 1 and hidden != 1:
                label = STATS                        # mean and 1/std, [.., 1]
            found[label] = found.get(label, 0) + t.numel() * t.element_size()
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield found
    finally:
        for h in handles:
            h.remove()


def saved_bytes(module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, int]]:
    """``(module(x), {term: bytes})``: the bytes autograd saved for backward during the forward,
    by the submodule (``ln``, ``fc1``, ``act``, ``fc2``, ``dropout``) that saved them."""
    with counting_saved(module, x.shape[-1]) as found:
        y = module(x)
    return y, found


def measure_on_rank(ln: nn.LayerNorm, fc1: nn.Linear, fc2: nn.Linear, x: torch.Tensor,
                    dy: torch.Tensor, dropout_p: float, seed: int,
                    variants: tuple[str, ...] = tuple(VARIANTS)) -> dict:
    """Run on every rank: each of ``variants`` of the block forward (bytes saved) and backward
    (collective record) on this rank's input: the full ``x [s, b, h]`` for TP only, rows
    ``[s/t, b, h]`` for SP. Returns ``{variant: {"saved": {term: bytes}, "record": [events]}}``."""
    t, r = group_size(), group_rank()
    lo, hi = shard_range(x.shape[0], t, r)
    out = {}
    for variant in variants:
        if variant == "tp":
            block, x_in, dy_in = TensorParallelMLPBlock.from_full(ln, fc1, fc2, dropout_p, seed), x, dy
        else:
            block = SequenceParallelMLPBlock.from_full(ln, fc1, fc2, dropout_p, seed,
                                                       save_input_shard=variant == "sp_regather")
            x_in, dy_in = x[lo:hi], dy[lo:hi]
        x_in = x_in.clone().requires_grad_(True)
        with record() as rec:
            y, saved = saved_bytes(block, x_in)
            y.backward(dy_in)
        out[variant] = {"saved": saved, "record": rec.to_list()}
    return out


def activation_model(variant: str, seq_len: int, batch: int, hidden: int, ffn_hidden: int,
                     world_size: int, dtype_bytes: int, dropout: bool = True) -> dict[str, int]:
    """Korthikanti et al.'s per-rank bytes for our block (see the module docstring), by term."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {tuple(VARIANTS)}")
    sbh, sbf, t, d = seq_len * batch * hidden, seq_len * batch * ffn_hidden, world_size, dtype_bytes
    seq = 1 if variant == "tp" else t          # what the sequence split divides by
    return {"LayerNorm input": d * sbh // seq,
            "fc1 input": d * sbh // (t if variant == "sp_regather" else 1),
            "GeLU input": d * sbf // t, "fc2 input": d * sbf // t,
            "dropout mask": sbh // seq if dropout else 0}


def communication_summary(events: list[dict] | CollectiveRecord) -> dict:
    """Bytes this rank sent (ring algorithm) in one forward + backward, split into the activation
    collectives and the all-reduces of sequence-parallel parameter grads; plus the op counts."""
    rec = events if isinstance(events, CollectiveRecord) else CollectiveRecord.from_list(events)
    acts = [e for e in rec.communicating() if e.region != GRAD_ALLREDUCE_SP]
    params = [e for e in rec.communicating() if e.region == GRAD_ALLREDUCE_SP]
    ops = [f"{e.direction} {e.op}" + (f" ({e.operator})" if e.operator == "re-gather" else "")
           for e in acts]
    return {"activation_sent": sum(e.sent_bytes for e in acts),
            "param_grad_sent": sum(e.sent_bytes for e in params),
            "param_grad_allreduces": len(params), "activation_ops": ops}


def memory_figures(results: list[dict], seq_len: int, batch: int, hidden: int, ffn_hidden: int,
                   dtype: torch.dtype, dropout_p: float) -> dict:
    """JSON-ready figures of one world size from every rank's ``measure_on_rank`` result: per
    variant the measured bytes (rank 0; ``per_rank_total`` for all), the model, and the bytes sent."""
    t, d = len(results), torch.empty((), dtype=dtype).element_size()
    figures = {"world_size": t, "dtype": str(dtype).replace("torch.", ""), "seq_len": seq_len,
               "batch": batch, "hidden": hidden, "ffn_hidden": ffn_hidden, "dropout_p": dropout_p,
               "unit": "bytes saved for backward per rank", "terms": [*TERMS, STATS], "variants": {}}
    for variant, label in VARIANTS.items():
        if variant not in results[0]:   # an explorer measures only what it shows
            continue
        measured = results[0][variant]["saved"]
        model = activation_model(variant, seq_len, batch, hidden, ffn_hidden, t, d, dropout_p > 0)
        figures["variants"][variant] = {
            "label": label, "measured": {k: measured.get(k, 0) for k in (*TERMS, STATS)},
            "model": model, "measured_total": sum(measured.get(k, 0) for k in TERMS),
            "model_total": sum(model.values()),
            "per_rank_total": [sum(res[variant]["saved"].values()) for res in results],
            "communication": communication_summary(results[0][variant]["record"])}
    return figures


def measure_activation_memory(world_sizes: tuple[int, ...] = (1, 2, 4), seq_len: int = 8,
                              batch: int = 2, hidden: int = 8, ffn_hidden: int = 32,
                              dropout_p: float = 0.1, dtype: torch.dtype = torch.float32,
                              seed: int = 0, timeout: float = 30.0) -> list[dict]:
    """``memory_figures`` for each world size (ranks start once per world size)."""
    sizes = [resolve_world_size(t) for t in world_sizes]
    for t in sizes:
        check_block_sizes(seq_len, ffn_hidden, t)
    ln, fc1, fc2, x, dy = make_block_inputs(seq_len, batch, hidden, ffn_hidden, dtype, seed)
    return [memory_figures(run(measure_on_rank, ln, fc1, fc2, x, dy, dropout_p, seed, world_size=t,
                               timeout=timeout), seq_len, batch, hidden, ffn_hidden, dtype, dropout_p)
            for t in sizes]


_SHORT_TERMS = dict(zip(TERMS, ("LN in", "fc1 in", "GeLU in", "fc2 in", "mask")))
VARIANT_LABELS = {"tp": "TP", "sp": "SP", "sp_regather": "SP+"}


def memory_table(figures: list[dict] | dict) -> str:
    """Measured and modelled bytes per rank, one line per (world size, variant), plus bytes sent.
    Variants: TP = tensor parallel only, SP = TP + SP, SP+ = SP with fc1's input re-gathered."""
    figures = [figures] if isinstance(figures, dict) else figures
    head = ["t", "variant", *_SHORT_TERMS.values(), "total", "model", "LN stats", "sent",
            "sent (grads)"]
    body = []
    for fig in figures:
        for key, v in fig["variants"].items():
            comm = v["communication"]
            body.append([str(fig["world_size"]), VARIANT_LABELS[key],
                         *(str(v["measured"][k]) for k in TERMS), str(v["measured_total"]),
                         str(v["model_total"]), str(v["measured"][STATS]),
                         str(comm["activation_sent"]), str(comm["param_grad_sent"])])
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += ["bytes per rank. TP: tensor parallel only; SP: + sequence parallel; SP+: SP, fc1 "
              "input re-gathered.",
              "total: measured, without LN stats (LayerNorm mean, 1/std); model: Korthikanti et al.",
              "sent: activation collectives (ring bytes); sent (grads): LayerNorm/fc2-bias grads."]
    return "\n".join(lines)
