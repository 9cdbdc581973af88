"""Context parallelism: sequence shards, the online softmax, ring and all-gather attention on real
ranks against PyTorch's scaled_dot_product_attention, bytes and work against the formulas, and
bad input refused before any rank starts."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mtb_helpers import run
from mtb_helpers.check import check_context_parallel
from mtb_helpers.cp import (allgather_attention, merge_partials, online_softmax_rows,
                            ring_attention, shard_positions, shard_sequence, unshard_sequence)
from mtb_helpers.cp.allgather import GATHER_KV
from mtb_helpers.cp.reference import expected_work, make_cp_inputs


def test_zigzag_gives_rank_r_chunks_r_and_2t_minus_1_minus_r():
    assert [shard_positions(8, 2, r, "zigzag").tolist() for r in range(2)] == \
        [[0, 1, 6, 7], [2, 3, 4, 5]]
    assert shard_positions(12, 3, 1, "contiguous").tolist() == [4, 5, 6, 7]
    x = torch.arange(2 * 3 * 12).reshape(2, 3, 12)
    for layout in ("contiguous", "zigzag"):
        shards = [shard_sequence(x, 3, r, layout, dim=2) for r in range(3)]
        assert all(s.shape == (2, 3, 4) for s in shards)
        assert torch.equal(unshard_sequence(shards, layout, dim=2), x)
        for r in range(3):
            assert torch.equal(shards[r][0, 0], x[0, 0, shard_positions(12, 3, r, layout)])


def test_online_softmax_equals_the_full_softmax_and_lse_merge_too():
    gen = torch.Generator().manual_seed(1)
    scores = torch.randn(3, 10, generator=gen, dtype=torch.float64) * 4
    v = torch.randn(10, 5, generator=gen, dtype=torch.float64)
    full = torch.softmax(scores, -1) @ v
    out, maxima = online_softmax_rows(scores, v, block=3)
    assert (out - full).abs().max() < 1e-14
    assert len(maxima) == 4 and torch.equal(maxima[-1].squeeze(-1), scores.amax(-1))
    assert all((b >= a).all() for a, b in zip(maxima, maxima[1:]))   # the running max only grows
    o1, o2 = (torch.softmax(s, -1) @ w for s, w in ((scores[:, :4], v[:4]), (scores[:, 4:], v[4:])))
    lse1, lse2 = (torch.logsumexp(s, -1, keepdim=True) for s in (scores[:, :4], scores[:, 4:]))
    merged, lse = merge_partials(o1, lse1, o2, lse2)
    assert (merged - full).abs().max() < 1e-14
    assert (lse - torch.logsumexp(scores, -1, keepdim=True)).abs().max() < 1e-14


@pytest.mark.parametrize("variant", ["ring", "allgather"])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("t", [1, 2, 3, 4])
def test_every_rank_matches_sdpa_in_fp64(t, causal, layout, variant):
    report = check_context_parallel(world_size=t, seq=24, heads=2, head_dim=4, causal=causal,
                                    variant=variant, layout=layout, dtype=torch.float64, batch=2)
    assert report.passed, str(report)
    assert {(r.quantity, r.rank) for r in report.rows} == \
        {(q, r) for q in ("output", "q_grad", "k_grad", "v_grad") for r in range(t)}
    assert max(r.max_abs_err for r in report.rows) < 1e-12
    cp = report.extra["cp"]
    assert cp["bytes"]["matches_formula"], cp["bytes"]
    assert cp["work"]["forward"] == cp["work"]["expected"] == cp["work"]["backward"]
    assert cp["kv_peak_bytes"] == [cp["kv_peak_formula"]] * t


def test_float32_passes_within_its_tolerance():
    assert check_context_parallel(world_size=2, seq=8, causal=True, dtype=torch.float32).passed


def test_ring_bytes_and_hops_against_the_formulas():
    report = check_context_parallel(world_size=4, seq=16, heads=2, head_dim=4, causal=True,
                                    variant="ring", dtype=torch.float64)
    n = 1 * 2 * 4 * 4 * 8                        # one K shard [b, heads, s/t, d] in float64
    rec = report.records[0]
    assert rec.count("send", "forward") == 3 and rec.count("recv", "forward") == 3
    assert rec.count("send", "backward") == 4    # t-1 hops with K, V, dK, dV, then dK, dV home
    assert report.extra["cp"]["bytes"]["forward"] == [2 * 3 * n] * 4
    assert report.extra["cp"]["bytes"]["backward"] == [4 * 3 * n + 2 * n] * 4
    gathered = check_context_parallel(world_size=4, seq=16, heads=2, head_dim=4,
                                      variant="allgather", dtype=torch.float64)
    rec = gathered.records[0]
    assert rec.count("all_gather", "forward") == 1 and rec.count("reduce_scatter", "backward") == 1
    assert gathered.extra["cp"]["bytes"]["forward"] == [2 * 3 * n] * 4
    assert gathered.extra["cp"]["kv_peak_bytes"] == [4 * 2 * n] * 4          # all of K and V
    assert report.extra["cp"]["kv_peak_bytes"] == [2 * 2 * n] * 4            # two blocks


def test_ring_steps_say_which_block_each_rank_held():
    report = check_context_parallel(world_size=3, seq=12, causal=True, dtype=torch.float64)
    steps = report.extra["cp"]["steps"]
    assert [[s["source"] for s in steps[r]] for r in range(3)] == [[0, 2, 1], [1, 0, 2], [2, 1, 0]]
    # contiguous + causal: rank r computes only the blocks of ranks <= r
    assert [[s["pairs"] for s in steps[r]] for r in range(3)] == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    for r in range(3):
        maxima = torch.tensor([s["running_max"] for s in steps[r]])
        assert (maxima[1:] >= maxima[:-1]).all()


def test_causal_work_is_imbalanced_contiguous_and_balanced_zigzag():
    t, s = 4, 32
    contiguous = check_context_parallel(world_size=t, seq=s, causal=True, dtype=torch.float64)
    zigzag = check_context_parallel(world_size=t, seq=s, causal=True, layout="zigzag",
                                    dtype=torch.float64)
    work_c, work_z = contiguous.extra["cp"]["work"], zigzag.extra["cp"]["work"]
    assert work_c["forward"] == [64 * (r + 1) for r in range(t)]      # (r+1) blocks of (s/t)^2
    assert work_z["forward"] == [16 * (2 * t + 1)] * t                # 2t+1 pairs of (s/2t)^2
    assert work_c["imbalance"] == 256 / 160 and work_z["imbalance"] == 1.0
    assert expected_work(s, t, 0, "zigzag", False) == s // t * s


def test_ring_attention_functions_match_sdpa_on_the_same_ranks():
    def on_rank(q, k, v, layout):
        import torch.distributed as dist
        t, r = dist.get_world_size(), dist.get_rank()
        parts = [shard_sequence(x, t, r, layout) for x in (q, k, v)]
        return ring_attention(*parts, causal=True, layout=layout), \
            allgather_attention(*parts, causal=True, layout=layout)

    q, k, v = torch.randn(3, 1, 2, 8, 4, dtype=torch.float64)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    for layout in ("contiguous", "zigzag"):
        results = run(on_rank, q, k, v, layout, world_size=2)
        for r, (ring, gathered) in enumerate(results):
            assert (ring - shard_sequence(ref, 2, r, layout)).abs().max() < 1e-12
            assert (gathered - shard_sequence(ref, 2, r, layout)).abs().max() < 1e-12


@pytest.mark.parametrize("kwargs, message", [
    (dict(world_size=3, seq=16), "seq=16 is not divisible by the world size 3"),
    (dict(world_size=2, seq=10, layout="zigzag"), "seq=10 is not divisible by 2 x world size = 4"),
    (dict(variant="tree"), "unknown variant 'tree'"),
    (dict(layout="striped"), "unknown layout 'striped'"),
    (dict(world_size=0), "world_size"),
    (dict(world_size=9), "world_size"),
    (dict(heads=0), "heads must be a positive integer"),
    (dict(causal="yes"), "causal must be True or False"),
    (dict(bug="cp-nope"), "unknown bug 'cp-nope'"),
    (dict(variant="allgather", bug="cp-no-rescale"), "does not apply"),
])
def test_bad_input_is_refused_before_any_rank_starts(no_ranks, kwargs, message):
    with pytest.raises(ValueError, match=message):
        check_context_parallel(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(layouts=()), "layouts is empty"),
    (dict(layouts=("contiguous", "striped")), "unknown layout 'striped'"),
    (dict(world_size=2, seq=10), "seq=10 is not divisible by 2 x world size = 4"),
    # refused if it cannot show in one of the layouts, as a call of that layout's own would be
    (dict(variant="allgather", bug="cp-zigzag-wrong-order"), "needs the zigzag layout"),
])
def test_both_layouts_at_once_refuse_what_either_call_alone_would(no_ranks, kwargs, message):
    from mtb_helpers.cp.check import check_layouts
    with pytest.raises(ValueError, match=message):
        check_layouts(**{"world_size": 4, "seq": 24, **kwargs})


@pytest.mark.parametrize("causal, layout", [(False, "contiguous"), (True, "contiguous"),
                                            (True, "zigzag")])
def test_same_as_pytorchs_own_ring_attention_on_the_same_ranks(causal, layout):
    from mtb_helpers.cp.pytorch import compare_with_pytorch
    diffs = compare_with_pytorch(world_size=4, seq=16, causal=causal, layout=layout)
    assert len(diffs) == 4
    for per_rank in diffs:
        assert set(per_rank) == {"output", "q_grad", "k_grad", "v_grad"}
        assert max(per_rank.values()) < 1e-12, per_rank


def test_the_rings_last_running_max_is_the_true_max_of_the_visible_scores():
    t, s = 3, 12
    report = check_context_parallel(world_size=t, seq=s, causal=True, layout="zigzag",
                                    dtype=torch.float64)
    q, k, _, _ = make_cp_inputs(1, 2, s, 4, torch.float64, seed=0)
    scores = (q[0, 0] @ k[0, 0].T) / 2.0                              # head 0, d = 4
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), -torch.inf)
    for r, steps in enumerate(report.extra["cp"]["steps"]):
        rows = shard_positions(s, t, r, "zigzag")
        final = torch.tensor(steps[-1]["running_max"], dtype=torch.float64)
        assert (final - scores[rows].amax(-1)).abs().max() < 1e-14     # the same max, to rounding


def test_cp_layers_import_nothing_above_them():
    """The house rule of tests/test_layering.py, applied to the cp layers (runtime -> comm ->
    layers -> checking): the layers import only comm and each other."""
    from tests.test_layering import GRAPH
    layers = [f"mtb_helpers.cp.{m}" for m in ("sharding", "online", "base", "ring",
                                              "allgather")]
    for name in layers:
        allowed = {m for m in GRAPH[name] if m.startswith(("mtb_helpers.comm", "mtb_helpers.cp."))}
        assert GRAPH[name] == allowed, (name, GRAPH[name] - allowed)
        assert not any(m.startswith("mtb_helpers.cp.") and m.split(".")[-1] not in
                       ("sharding", "online", "base", "ring", "allgather")
                       for m in GRAPH[name]), name


def test_pytorch_comparison_refuses_zigzag_without_a_mask_before_any_rank_starts(no_ranks):
    import mtb_helpers.cp.pytorch as cp_pytorch
    with pytest.raises(ValueError, match="requires causal=True"):
        cp_pytorch.compare_with_pytorch(world_size=2, seq=8, causal=False, layout="zigzag")
    with pytest.raises(ValueError, match="seq=9 is not divisible"):
        cp_pytorch.compare_with_pytorch(world_size=2, seq=9)


@pytest.mark.parametrize("t", [1, 2, 4])
def test_allgather_attention_names_its_two_collectives_in_the_record_at_every_world_size(t):
    # forward: one all-gather of K and V [2, b, heads, s/t, d] along the sequence (dim 3);
    # backward: one reduce-scatter of dK, dV back. One rank moves nothing and is still recorded
    # (0 bytes sent), so a record has the same shape at every world size.
    report = check_context_parallel(world_size=t, seq=16, heads=2, head_dim=4, causal=False,
                                    variant="allgather", dtype=torch.float64)
    shard, full = (2, 1, 2, 16 // t, 4), (2, 1, 2, 16, 4)
    n = 2 * 1 * 2 * (16 // t) * 4 * 8                 # K and V shards of this rank, float64
    for rec in report.records:
        got = [(e.op, e.operator, e.direction, e.shape, e.out_shape, e.bytes, e.sent_bytes,
                e.group_size) for e in rec if e.region == GATHER_KV]
        assert got == [("all_gather", "", "forward", shard, full, n, (t - 1) * n, t),
                       ("reduce_scatter", "", "backward", full, shard, t * n, (t - 1) * n, t)]
