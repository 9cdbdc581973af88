"""Every parallel layer's declared layouts, checked by one function on real ranks.

Each layer states ``input_layouts`` / ``output_layouts`` with DTensor's placements. Here every layer
of the package is fed its declared input layout (``local_piece`` of full fp64 tensors) and its
output and input grads are compared with the pieces the declared layouts give of the one-process
result; the pieces put back together (``from_pieces``) must be the whole. ``local_piece`` itself
is checked against DTensor's own ``distribute_tensor`` on the same meshes.
"""
from __future__ import annotations

import importlib
import inspect
import math
import pkgutil

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import Partial, Replicate, Shard

import mtb_helpers
from mtb_helpers import run
from mtb_helpers.comm.sharding import (MeshPlacements, describe, from_pieces, local_piece,
                                       on_mesh)

H, FFN, HEADS = 8, 16, 4
TOL = 1e-10


def _lin(i, o, g, bias=True):
    lin = nn.Linear(i, o, bias=bias, dtype=torch.float64)
    with torch.no_grad():
        for p in lin.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
    return lin


def _attention(q, k, v, causal=True):
    """``[b, n, s, d]`` x 3 -> ``[b, n, s, d]``, the plain formula."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return s.softmax(-1) @ v


def _heads(z, n):   # [s, b, h] -> [b, n, s, d]
    s, b, h = z.shape
    return z.reshape(s, b, n, h // n).permute(1, 2, 0, 3)


def _merge(z):      # [b, n, s, d] -> [s, b, n*d]
    b, n, s, d = z.shape
    return z.permute(2, 0, 1, 3).reshape(s, b, n * d)


def _ungroup(qkv, t):
    """The head-grouped ``[.., Q_0 K_0 V_0 Q_1 ..]`` of ``grouped_qkv`` back to ``[.., Q K V]``."""
    parts = [p.chunk(3, dim=-1) for p in qkv.chunk(t, dim=-1)]
    return [torch.cat([p[i] for p in parts], dim=-1) for i in range(3)]


def _cases(t: int, seed: int = 0) -> dict:
    """``{name: (full modules, full inputs, full dy, reference fn)}`` for a 1-D group of ``t``."""
    from mtb_helpers.moe.layers import Expert, moe_reference
    from mtb_helpers.sp.layers import position_keyed_dropout
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    s, b, V = 4 * t, 2, 4 * t
    fc1, fc2 = _lin(H, FFN * t // 2, g), _lin(FFN * t // 2, H, g)
    ln = nn.LayerNorm(H, dtype=torch.float64)
    with torch.no_grad():
        ln.weight.copy_(1 + 0.1 * rnd(H)), ln.bias.copy_(0.1 * rnd(H))
    wq, wk, wv, wo = (_lin(H * t, H * t, g) for _ in range(4))
    emb = nn.Embedding(V, H, dtype=torch.float64)
    with torch.no_grad():
        emb.weight.copy_(rnd(V, H))
    gate, experts = _lin(H, 2 * t, g, bias=False), [Expert(H, FFN, torch.float64) for _ in range(2 * t)]
    x, x_wide = rnd(s, b, H), rnd(s, b, H * t)
    ids, target = torch.randint(0, V, (s, b), generator=g), torch.randint(0, V, (s, b), generator=g)
    q, k, v = rnd(2, HEADS, s * 2, 2), rnd(2, HEADS, s * 2, 2), rnd(2, HEADS, s * 2, 2)
    nh = HEADS * t

    def attn_ref(wq, wk, wv, wo, x):
        return wo(_merge(_attention(_heads(wq(x), nh), _heads(wk(x), nh), _heads(wv(x), nh))))

    def block_ref(ln, fc1, fc2, x):
        return x + position_keyed_dropout(fc2(F.gelu(fc1(ln(x)))), 0.25, 3)

    def local_attn_ref(qkv):
        return _merge(_attention(*(_heads(z, nh) for z in _ungroup(qkv, t))))

    zig = torch.cat([torch.arange(s * 2).view(2 * t, -1)[c] for r in range(t)
                     for c in (r, 2 * t - 1 - r)])
    return {
        "column": ((fc1,), (x,), rnd(s, b, fc1.out_features), lambda m, x: m(x)),
        "column-gather": ((fc1,), (x,), rnd(s, b, fc1.out_features), lambda m, x: m(x)),
        "row": ((fc2,), (rnd(s, b, fc2.in_features),), rnd(s, b, H), lambda m, x: m(x)),
        "row-split": ((fc2,), (rnd(s, b, fc2.in_features),), rnd(s, b, H), lambda m, x: m(x)),
        "mlp": ((fc1, fc2), (x,), rnd(s, b, H), lambda a, c, x: c(F.gelu(a(x)))),
        "local-attention": ((), (rnd(s, b, 3 * H * t),), rnd(s, b, H * t), local_attn_ref),
        "attention": ((wq, wk, wv, wo), (x_wide,), rnd(s, b, H * t), attn_ref),
        "embedding": ((emb,), (ids,), rnd(s, b, H), lambda e, i: e(i)),
        "cross-entropy": ((), (rnd(s, b, V), target), torch.tensor(1.0, dtype=torch.float64),
                          lambda z, y: F.cross_entropy(z.reshape(-1, V), y.reshape(-1),
                                                       reduction="sum")),
        "dropout": ((), (x,), rnd(s, b, H), lambda x: position_keyed_dropout(x, 0.25, 3)),
        "dropout-sp": ((), (x,), rnd(s, b, H), lambda x: position_keyed_dropout(x, 0.25, 3)),
        "sp-layernorm": ((ln,), (x,), rnd(s, b, H), lambda m, x: m(x)),
        "sp-column": ((fc1,), (x,), rnd(s, b, fc1.out_features), lambda m, x: m(x)),
        "sp-row": ((fc2,), (rnd(s, b, fc2.in_features),), rnd(s, b, H), lambda m, x: m(x)),
        "sp-block": ((ln, fc1, fc2), (x,), rnd(s, b, H), block_ref),
        "tp-block": ((ln, fc1, fc2), (x,), rnd(s, b, H), block_ref),
        "moe": ((gate, experts), (rnd(4 * t, H),), rnd(4 * t, H),
                lambda gt, ex, x: moe_reference(gt, ex, x, 2, None)[0]),
        "ring": ((), (q, k, v), rnd(*q.shape), lambda q, k, v: _attention(q, k, v)),
        "allgather": ((), (q, k, v), rnd(*q.shape), lambda q, k, v: _attention(q, k, v)),
        # zigzag: the declared Shard(2) is of the sequence in zigzag chunk order
        "ring-zigzag": ((), tuple(z[:, :, zig] for z in (q, k, v)), rnd(*q.shape),
                        lambda q, k, v: _attention(q, k, v)),
        "allgather-zigzag": ((), tuple(z[:, :, zig] for z in (q, k, v)), rnd(*q.shape),
                             lambda q, k, v: _attention(q, k, v)),
        "_zig": zig,
    }


def _build(name: str, mods: tuple, t: int):
    """The course's layer for case ``name``, built on this rank (whole world as the group)."""
    from mtb_helpers.cp import allgather, ring
    from mtb_helpers.moe.layers import ExpertParallelMoE
    from mtb_helpers.sp import layers as sp
    from mtb_helpers.tp.attention import LocalAttention, ParallelSelfAttention
    from mtb_helpers.tp.layers import ColumnParallelLinear, ParallelMLP, RowParallelLinear
    from mtb_helpers.tp.vocab import VocabParallelCrossEntropy, VocabParallelEmbedding
    build = {
        "column": lambda fc: ColumnParallelLinear.from_full(fc),
        "column-gather": lambda fc: ColumnParallelLinear.from_full(fc, gather_output=True),
        "row": lambda fc: RowParallelLinear.from_full(fc),
        "row-split": lambda fc: RowParallelLinear.from_full(fc, input_is_parallel=False),
        "mlp": ParallelMLP.from_full,
        "local-attention": lambda: LocalAttention(HEADS * t, H // HEADS, True, t),
        "attention": lambda *w: ParallelSelfAttention.from_full(*w, n_heads=HEADS * t),
        "embedding": VocabParallelEmbedding.from_full,
        "cross-entropy": lambda: VocabParallelCrossEntropy("sum"),
        "dropout": lambda: sp.PositionKeyedDropout(0.25, 3, sequence_parallel=False),
        "dropout-sp": lambda: sp.PositionKeyedDropout(0.25, 3, sequence_parallel=True),
        "sp-layernorm": sp.SequenceParallelLayerNorm.from_full,
        "sp-column": sp.SequenceParallelColumnLinear.from_full,
        "sp-row": sp.SequenceParallelRowLinear.from_full,
        "sp-block": lambda *m: sp.SequenceParallelMLPBlock.from_full(*m, dropout_p=0.25, seed=3),
        "tp-block": lambda *m: sp.TensorParallelMLPBlock.from_full(*m, dropout_p=0.25, seed=3),
        "moe": lambda gate, ex: ExpertParallelMoE.from_full(gate, ex, top_k=2),
        "ring": lambda: ring.RingAttention(causal=True),
        "allgather": lambda: allgather.AllGatherAttention(causal=True),
        "ring-zigzag": lambda: ring.RingAttention(causal=True, layout="zigzag"),
        "allgather-zigzag": lambda: allgather.AllGatherAttention(causal=True, layout="zigzag"),
    }
    return build[name](*mods)


def _per_arg(layouts, n: int) -> tuple:
    """One layout per forward argument: a plain tuple already is one; a single placement (or one
    per mesh dim) applies to the one argument."""
    if isinstance(layouts, tuple) and not isinstance(layouts, MeshPlacements):
        assert len(layouts) == n
        return layouts
    return (layouts,) * n


def _feed(layer, args, dy, coords, sizes) -> dict:
    """Cut ``args`` / ``dy`` as the layer declares, run forward and backward; return what this rank
    holds and the layouts it declared."""
    ins = _per_arg(layer.input_layouts, len(args))
    local = [local_piece(a, p, coords, sizes).clone() for a, p in zip(args, ins)]
    for a in local:
        a.requires_grad_(a.is_floating_point())
    y = layer(*local)
    y.backward(local_piece(dy, layer.output_layouts, coords, sizes))
    return {"out": y.detach(), "grads": [a.grad if a.is_floating_point() else None for a in local],
            "ins": ins, "outs": layer.output_layouts, "cls": type(layer)}


def _layers_on_rank(cases: dict, t: int) -> dict:
    import torch.distributed as dist
    r = dist.get_rank()
    return {name: _feed(_build(name, mods, t), args, dy, r, t)
            for name, (mods, args, dy, _) in cases.items()}


def _reference(fn, mods, args, dy):
    args = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
    y = fn(*mods, *args)
    y.backward(dy)
    return y.detach(), [a.grad for a in args]


def _close(got, want, what):
    assert got.shape == want.shape, f"{what}: shape {list(got.shape)} != {list(want.shape)}"
    err = (got - want).abs().max().item() if got.numel() else 0.0
    assert err <= TOL * max(1.0, want.abs().max().item()), f"{what}: max error {err:.2e}"


def _verify(name, per_rank, want_y, want_grads, coords_of, sizes):
    """Each rank's output and input grads are the declared pieces of the one-process ones, and
    the pieces put back together are the whole."""
    ranks = range(len(per_rank))
    for r in ranks:
        got = per_rank[r][name]
        _close(got["out"], local_piece(want_y, got["outs"], coords_of(r), sizes), f"{name} output r{r}")
        for i, (gr, wg, p) in enumerate(zip(got["grads"], want_grads, got["ins"])):
            if wg is not None:
                _close(gr, local_piece(wg, p, coords_of(r), sizes), f"{name} grad of input {i} r{r}")
    first = per_rank[0][name]
    whole = from_pieces({_key(coords_of(r)): per_rank[r][name]["out"] for r in ranks},
                        first["outs"], sizes)
    _close(whole, want_y, f"{name} output from its pieces")


def _key(coords):
    return tuple(coords.values()) if isinstance(coords, dict) else coords


@pytest.mark.parametrize("t", [2, 4])
def test_every_layer_keeps_its_declared_layouts(t):
    cases = _cases(t)
    zig = cases.pop("_zig")
    per_rank = run(_layers_on_rank, cases, t, world_size=t, timeout=120.0)
    for name, (mods, args, dy, ref) in cases.items():
        if name.endswith("zigzag"):   # the one-process truth on the sequence in natural order
            inv = torch.argsort(zig)
            y, grads = _reference(ref, mods, [a[:, :, inv] for a in args], dy[:, :, inv])
            y, grads = y[:, :, zig], [gr[:, :, zig] for gr in grads]
        else:
            y, grads = _reference(ref, mods, args, dy)
        _verify(name, per_rank, y, grads, lambda r: r, t)


def _capstone_on_rank(model, ids, x, dy_x, dy_logits, dp, cp, tp, sp) -> dict:
    from mtb_helpers.capstone.grid import Grid, GridLayout
    from mtb_helpers.capstone.layers import (ContextParallelCore, ParallelBlock, ParallelEmbedding,
                                             ParallelHead)
    from mtb_helpers.tp.attention import check_heads, grouped_qkv
    from mtb_helpers.tp.vocab import VocabParallelEmbedding
    grid = Grid.build(GridLayout(tp=tp, dp=dp, cp=cp))
    try:
        at = {d: grid.index[d] for d in ("dp", "cp", "tp")}
        sizes = {"dp": dp, "cp": cp, "tp": tp}
        tg, cg = grid.tensor_group(), grid.context_group()
        out = {}
        tok = VocabParallelEmbedding.from_full(model.embed.tok, group=tg)
        embed = ParallelEmbedding(tok, model.embed.pos, sp, tg, cg)
        y = embed(local_piece(ids, embed.input_layouts, at, sizes))
        out["embedding"] = {"out": y.detach(), "grads": [None], "ins": (embed.input_layouts,),
                            "outs": embed.output_layouts, "cls": type(embed)}
        block = ParallelBlock.from_full(model.blocks[0], sp, tg, cg)
        out["block"] = _feed(block, (x,), dy_x, at, sizes)
        head = ParallelHead.from_full(model.head, sp, tg)
        out["head"] = _feed(head, (x,), dy_logits, at, sizes)
        a = model.blocks[0].attn
        core = ContextParallelCore(a.heads, check_heads(a.wq.in_features, a.heads, tp), tp, cg)
        qkv = grouped_qkv(a.wq, a.wk, a.wv, tp)(x).detach()
        out["core"] = _feed(core, (qkv,), dy_x, at, sizes)
        out["_coords"] = at
        return out
    finally:
        grid.destroy()


@pytest.mark.parametrize("dp, cp, tp, sp", [(1, 2, 2, True), (2, 1, 2, False), (1, 2, 2, False)])
def test_capstone_layers_keep_their_layouts_on_the_mesh(dp, cp, tp, sp):
    from mtb_helpers.capstone.model import GPTConfig, make_model
    from mtb_helpers.tp.attention import grouped_qkv
    cfg = GPTConfig(vocab=8, seq=8, hidden=8, heads=2, ffn=16, layers=1)
    model = make_model(cfg, seed=1, dtype=torch.float64)
    g = torch.Generator().manual_seed(2)
    b = 2 * dp
    ids = torch.randint(0, cfg.vocab, (cfg.seq, b), generator=g)
    x = torch.randn(cfg.seq, b, cfg.hidden, generator=g, dtype=torch.float64)
    dy_x = torch.randn(cfg.seq, b, cfg.hidden, generator=g, dtype=torch.float64)
    dy_logits = torch.randn(cfg.seq, b, cfg.vocab, generator=g, dtype=torch.float64)
    per_rank = run(_capstone_on_rank, model, ids, x, dy_x, dy_logits, dp, cp, tp, sp,
                   world_size=dp * cp * tp, timeout=120.0)
    sizes = {"dp": dp, "cp": cp, "tp": tp}
    a = model.blocks[0].attn
    qkv = grouped_qkv(a.wq, a.wk, a.wv, tp)

    def core_ref(z):
        return _merge(_attention(*(_heads(w, a.heads) for w in _ungroup(z, tp))))

    refs = {"block": (model.blocks[0], x, dy_x), "head": (model.head, x, dy_logits),
            "core": (core_ref, qkv(x).detach(), dy_x)}
    for name, (fn, inp, dy) in refs.items():
        y, grads = _reference(fn, (), [inp], dy)
        _verify(name, per_rank, y, grads, lambda r: per_rank[r]["_coords"], sizes)
    with torch.no_grad():
        _verify("embedding", per_rank, model.embed(ids), [None], lambda r: per_rank[r]["_coords"],
                sizes)
    assert describe(per_rank[0]["core"]["ins"][0]) == "dp=Shard(1) cp=Shard(0) tp=Shard(-1)"


def _declaring_classes() -> set[type]:
    """Every class of the package (bugs modules aside) that declares a layout."""
    found = set()
    for info in pkgutil.walk_packages(mtb_helpers.__path__, "mtb_helpers."):
        if info.name.rsplit(".", 1)[-1].endswith("bugs") or ".cli" in info.name:
            continue
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != info.name:
                continue
            if "input_layouts" in vars(cls) or "self.input_layouts" in inspect.getsource(cls):
                found.add(cls)
    return found


def test_every_layer_that_declares_a_layout_is_checked_here():
    covered = {c for t in (2,) for name, (mods, *_rest) in _cases(t).items() if name != "_zig"
               for c in type(_build(name, mods, 1)).__mro__}
    from mtb_helpers.capstone import layers as cap
    from mtb_helpers.comm.regions import REGIONS   # each: test_every_region_is_the_redistribution...
    covered |= {cap.ContextParallelCore, cap.ParallelEmbedding, cap.ParallelBlock, cap.ParallelHead,
                *REGIONS.values()}
    missing = {f"{c.__module__}.{c.__name__}" for c in _declaring_classes() - covered}
    assert not missing, f"layers whose layouts no test feeds: {sorted(missing)}"


def _dtensor_on_rank(full, layouts, names, shape) -> list:
    """``distribute_tensor(full, mesh, placements).to_local()`` next to ``local_piece`` for each layout."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    coords = dict(zip(names, mesh.get_coordinate()))
    sizes = dict(zip(names, shape))
    try:
        return [(distribute_tensor(full, mesh, tuple(p)).to_local(),
                 local_piece(full, p if isinstance(p, MeshPlacements) else p[0],
                             coords if isinstance(p, MeshPlacements) else coords[names[0]],
                             sizes if isinstance(p, MeshPlacements) else shape[0]))
                for p in layouts]
    finally:
        default = dist.distributed_c10d._get_default_group()
        for name in names:
            group = mesh.get_group(name)
            if group is not None and group != default:
                dist.destroy_process_group(group)


def _all_declared() -> set:
    """Every placement (and per-mesh-dim layout) the package's layers declare."""
    seen = set()
    for t in (2,):
        for name, (mods, *_rest) in _cases(t).items():
            if name == "_zig":
                continue
            layer = _build(name, mods, 1)
            for lay in (layer.input_layouts, layer.output_layouts):
                if isinstance(lay, tuple) and not isinstance(lay, MeshPlacements):
                    seen |= set(lay)
                else:
                    seen.add(lay)
    return seen


def test_local_piece_is_distribute_tensor_on_real_ranks():
    """The pieces ``local_piece`` cuts are DTensor's own, bit for bit in fp64, on a 1-D mesh of 4
    for every declared placement (and Partial) and on 3-D (dp, cp, tp) meshes for the capstone's."""
    full = torch.randn(8, 4, 12, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    one_d = [(p,) for p in sorted(_all_declared() | {Partial()}, key=str)
             if not isinstance(p, MeshPlacements)]
    assert {Shard(0), Shard(-1), Replicate()} <= {p[0] for p in one_d}
    for got, want in (pair for rank in run(_dtensor_on_rank, full, one_d, ("tp",), (4,),
                                           world_size=4) for pair in rank):
        assert torch.equal(got, want)
    from mtb_helpers.capstone.layers import sequence_layouts
    meshed = [sequence_layouts(True), sequence_layouts(False),
              on_mesh(dp=Shard(1), cp=Shard(0), tp=Shard(-1)),
              on_mesh(dp=Partial(), cp=Shard(0), tp=Shard(0))]
    for shape in ((1, 2, 2), (2, 2, 1), (2, 1, 2)):
        for rank in run(_dtensor_on_rank, full, meshed, ("dp", "cp", "tp"), shape,
                        world_size=math.prod(shape)):
            for got, want in rank:
                assert torch.equal(got, want)


def test_local_piece_and_from_pieces_refuse_what_does_not_fit():
    x = torch.arange(24.0).reshape(4, 6)
    with pytest.raises(ValueError, match="not divisible"):
        local_piece(x, Shard(0), 0, 3)
    with pytest.raises(ValueError, match="coords"):
        local_piece(x, on_mesh(cp=Shard(0), tp=Shard(1)), {"cp": 0}, {"cp": 2, "tp": 2})
    with pytest.raises(ValueError, match="placement"):
        local_piece(x, "sharded(0)", 0, 2)
    with pytest.raises(ValueError, match="outside"):
        local_piece(x, Shard(1), 2, 2)
    with pytest.raises(ValueError, match="replicas differ"):
        from_pieces({0: x, 1: x + 1}, Replicate(), 2)
    layout = on_mesh(cp=Shard(0), tp=Shard(0))
    pieces = {(c, j): local_piece(x, layout, {"cp": c, "tp": j}, {"cp": 2, "tp": 2})
              for c in range(2) for j in range(2)}
    assert pieces[(1, 0)].tolist() == [x[2].tolist()]          # piece 0 of cp's piece 1
    assert torch.equal(from_pieces(pieces, layout, {"cp": 2, "tp": 2}), x)
    parts = {r: local_piece(x, Partial(), r, 4) for r in range(4)}
    assert torch.equal(from_pieces(parts, Partial(), 4), x)
    assert repr(layout) == "on_mesh(cp=Shard(0), tp=Shard(0))"


def _regions_on_rank(full: torch.Tensor) -> dict:
    """Each region's forward next to DTensor's ``redistribute`` between the region's layouts."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from mtb_helpers.comm import regions
    t, r = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (t,), mesh_dim_names=("tp",))
    try:
        out = {}
        for name, region in regions.REGIONS.items():
            x = local_piece(full, region.input_layouts, r, t).contiguous()
            theirs = DTensor.from_local(x, mesh, [region.input_layouts], run_check=False)
            out[name] = (getattr(regions, name)(x.clone()).detach(),
                         theirs.redistribute(mesh, [region.output_layouts]).to_local())
        return out
    finally:
        group = mesh.get_group("tp")
        if group != dist.distributed_c10d._get_default_group():
            dist.destroy_process_group(group)


@pytest.mark.parametrize("t", [2, 3])
def test_every_region_is_the_redistribution_between_its_layouts(t):
    """f, g and the other regions of comm/regions.py: forward takes ``input_layouts`` to
    ``output_layouts`` as DTensor's ``redistribute`` does, on the same ranks, fp64."""
    from mtb_helpers.comm.regions import REGIONS
    full = torch.randn(6, 4, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    per_rank = run(_regions_on_rank, full, world_size=t)
    assert {r.input_layouts for r in REGIONS.values()} == {Replicate(), Partial(), Shard(-1), Shard(0)}
    for r, res in enumerate(per_rank):
        for name, (ours, theirs) in res.items():
            _close(ours, theirs, f"{name} vs redistribute r{r}")
            _close(ours, local_piece(full, REGIONS[name].output_layouts, r, t), f"{name} r{r}")
