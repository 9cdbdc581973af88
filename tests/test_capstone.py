"""Capstone pieces without a grid: the text, the model, the rank grid's numbering and groups, the
parameter shards, the stage rebuilt from the course's layers on one process, one real rank."""
from __future__ import annotations

import math
import warnings

import pytest
import torch

from mtb_helpers.capstone.data import ALPHABET, VOCAB, batch_for_step, corpus, decode, encode
from mtb_helpers.capstone.grid import GridLayout, group_ranks
from mtb_helpers.capstone.finalize import FINALIZE, SequenceParallelGrads
from mtb_helpers.capstone.layers import (build_stage, gather_param, param_placement, replicated_params,
                                         shard_param)
from mtb_helpers.capstone.model import GPTConfig, make_model
from mtb_helpers.comm.sharding import Shard
from mtb_helpers.capstone.parallel import full_model, train_parallel
from mtb_helpers.capstone.reference import TrainConfig, train_reference
from mtb_helpers.capstone.validate import admissible_layouts


def test_the_text_is_the_same_everywhere_and_batches_shift_by_one():
    text = corpus()
    assert len(text) == 4096 and text == corpus() and set(text) <= set(ALPHABET)
    assert decode(encode(text[:50])) == text[:50] and VOCAB % 8 == 0 and VOCAB >= len(ALPHABET)
    x, y = batch_for_step(3, 8, 16)
    assert x.shape == y.shape == (16, 8) and torch.equal(x[1:], y[:-1])
    assert not torch.equal(batch_for_step(4, 8, 16)[0], x)


def test_model_is_small_and_starts_near_uniform():
    model = make_model()
    assert sum(p.numel() for p in model.parameters()) == 36288 < 300_000
    x, y = batch_for_step(0, 8, 16)
    assert abs(float(model.loss(x, y).detach()) - math.log(VOCAB)) < 0.05
    # the same seed gives the same weights; another seed other ones
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), make_model().parameters()))
    assert not torch.equal(model.head.lm_head.weight, make_model(seed=1).head.lm_head.weight)


def test_grid_numbering_puts_tensor_ranks_next_to_each_other():
    layout = GridLayout(tp=2, pp=2, dp=2, cp=1)
    assert group_ranks(layout, ("tp",)) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert sorted(group_ranks(layout, ("pp",))) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert sorted(group_ranks(layout, ("dp", "cp"))) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    layout = GridLayout(tp=2, pp=1, dp=2, cp=2)
    assert sorted(group_ranks(layout, ("dp", "cp"))) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert sorted(group_ranks(layout, ("cp",))) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    mesh = layout.mesh()
    assert mesh.names == ("pp", "dp", "cp", "tp") and mesh.coords(5) == {"pp": 0, "dp": 1, "cp": 0, "tp": 1}
    for r in range(8):
        assert mesh.rank_of(**mesh.coords(r)) == r


def test_admissible_layouts_are_exactly_those_whose_sizes_divide():
    layouts = {(l.tp, l.pp, l.dp, l.cp) for l in admissible_layouts((8,))}
    assert (2, 2, 2, 1) in layouts and (1, 1, 1, 8) in layouts
    assert (8, 1, 1, 1) not in layouts       # 4 heads do not split over 8 ranks
    assert (1, 8, 1, 1) not in layouts       # 4 blocks do not fill 8 stages
    assert all(l.world_size == 8 for l in admissible_layouts((8,)))


def test_every_stage_parameter_shards_and_gathers_back_to_the_full_one():
    model = make_model()
    full = dict(model.named_parameters())
    for sp in (True, False):
        stage = build_stage(model, 0, 1, sp, None, None)   # one process: every layer whole
        names = [n for n, _ in stage.named_parameters()]
        assert len(names) == len(full) - 4 * 4   # per block, wq/wk/wv (x2) are one fused qkv
        rebuilt = {}
        for name in names:
            rebuilt.update(gather_param([shard_param(full, name, 2, r) for r in range(2)], name))
        assert set(rebuilt) == set(full)
        assert all(torch.equal(rebuilt[n], full[n]) for n in full)
    assert param_placement("block3.attn.qkv.weight") == ("blocks.3.attn.w{}.weight", Shard(0))
    assert param_placement("block0.mlp.mlp.fc2.weight") == ("blocks.0.mlp.fc2.weight", Shard(1))
    # rank 1's fused Q/K/V rows are the second half of each of wq, wk, wv
    qkv1 = shard_param(full, "block0.attn.qkv.weight", 2, 1)
    assert torch.equal(qkv1[16:32], full["blocks.0.attn.wk.weight"][16:])


@pytest.mark.parametrize("sp", [True, False])
def test_the_stage_built_from_course_layers_is_the_model_on_one_process(sp):
    model = make_model()
    stage = build_stage(model, 0, 1, sp, None, None)
    ids, _ = batch_for_step(0, 4, 16)
    assert torch.allclose(stage(ids), model(ids), rtol=0, atol=1e-13)


def test_one_real_rank_trains_like_one_process():
    ref = train_reference(run=TrainConfig(steps=2))
    run = train_parallel(1, 1, 1, 1, steps=2)
    assert [abs(a - b) < 1e-12 for a, b in zip(run.losses, ref["losses"])] == [True, True]
    assert ref["losses"][1] < ref["losses"][0]          # it learns
    assert list(run.params) == list(ref["params"])
    assert max(float((run.params[n] - p).abs().max()) for n, p in ref["params"].items()) < 1e-10


def test_figures_have_titles_labels_legends_and_rank_colours():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mtb_helpers.capstone.check import check_capstone, grid_table
    from mtb_helpers.capstone.plots import plot_bytes, plot_drift, plot_losses, plot_rank_grid
    from mtb_helpers.plots.palette import rank_color

    layout = GridLayout(tp=2, pp=2, dp=2, cp=1)
    fig = plot_rank_grid(grid_table(layout, GPTConfig(), 8), layout.sizes())
    ax = fig.axes[0]
    assert "tp=2 pp=2 dp=2 cp=1" in ax.get_title() and ax.get_xlabel() and ax.get_legend()
    assert [p.get_edgecolor()[:3] for p in ax.patches[:8]] == [matplotlib.colors.to_rgb(rank_color(r))
                                                                 for r in range(8)]
    report = check_capstone(1, 1, 1, 1, steps=2).to_dict()
    fig = plot_losses(report["losses"]["parallel"], report["losses"]["reference"])
    assert all(a.get_ylabel() and a.get_legend() for a in fig.axes) and fig.axes[0].get_title()
    one_rank = report["bytes"]   # one rank sends nothing: every bar and tick is 0
    assert all(v == 0 for sent in one_rank["per_rank"] + one_rank["formula"] for v in sent.values())
    sending = {**one_rank, "per_rank": [{g: 3072 for g in one_rank["groups"]}],
               "formula": [{g: 3072 for g in one_rank["groups"]}]}
    for info in (one_rank, sending):
        with warnings.catch_warnings():
            warnings.simplefilter("error")   # e.g. matplotlib's "identical low and high ylims"
            fig = plot_bytes(info)
        assert fig.axes[0].get_legend() and fig.axes[0].get_ylabel() == "KiB sent per training step"
        ax = fig.axes[0]   # the formulas' total tick stays inside the axes
        assert 0 <= max(line.get_ydata()[0] for line in ax.lines) < ax.get_ylim()[1]
    assert [t.get_text() for t in ax.texts] == [] and ax.get_ylim()[1] > 3 * len(sending["groups"])
    assert any("no bytes sent" in t.get_text() for t in plot_bytes(one_rank).axes[0].texts)
    fig = plot_drift(report["drift"])
    ax = fig.axes[0]
    assert ax.get_yscale() == "log" and ax.get_legend() and ax.get_title()
    assert [list(line.get_xdata()) for line in ax.lines[:2]] == [report["drift"]["steps"]] * 2
    plt.close("all")


def test_the_explorer_offers_only_layouts_that_divide_and_summarises_a_run():
    from mtb_helpers.capstone.check import check_capstone
    from mtb_helpers.capstone.widget import capstone_summary, layout_options

    options = layout_options()
    assert "tp=2 pp=2 dp=2 cp=1" in options and "tp=3 pp=1 dp=1 cp=1" not in options
    assert "tp=8 pp=1 dp=1 cp=1" not in options and len(options) == len(set(options))
    text = capstone_summary(check_capstone(1, 1, 1, 1, steps=2))
    assert text.splitlines()[0] == "capstone PASSED" and "tolerance 1e-10" in text


def _finalize_on_rank():
    import torch.distributed as dist

    from mtb_helpers.comm.records import record

    r = dist.get_rank()
    params = [torch.nn.Parameter(torch.zeros(3, dtype=torch.float64)) for _ in range(2)]
    for i, p in enumerate(params):   # rank r's partial grads: its own rows' contribution
        p.grad = torch.full((3,), 10.0 * i + r + 1, dtype=torch.float64)
    with record() as rec:
        SequenceParallelGrads(params, None).finalize()
    events = [(e.op, e.operator, e.shape) for e in rec.events]
    return [p.grad.tolist() for p in params], events


def test_finalize_sums_every_replicated_grad_over_the_group_in_one_all_reduce():
    from mtb_helpers import run
    for grads, events in run(_finalize_on_rank, world_size=2):
        assert grads == [[3.0] * 3, [23.0] * 3]          # (1 + 2), (11 + 12): summed, not averaged
        assert events == [("all_reduce", FINALIZE, (6,))]  # both parameters in one collective


@pytest.mark.parametrize("stage", [0, 1])
def test_the_replicated_parameters_are_the_layernorms_and_the_row_biases(stage):
    stage_module = build_stage(make_model(), stage, 2, True, None, None)
    names = {n for n, p in stage_module.named_parameters()
             if any(p is q for q in replicated_params(stage_module))}
    blocks = [f"block{i}." for i in ((0, 1) if stage == 0 else (2, 3))]
    want = {b + rest for b in blocks for rest in ("ln1.weight", "ln1.bias", "attn.out.bias",
                                                  "mlp.ln.weight", "mlp.ln.bias", "mlp.fc2.bias")}
    assert names == want | ({"head.ln_f.weight", "head.ln_f.bias"} if stage == 1 else set())


def _full_model_after_training(cfg, seed, dtype):
    return {n: p.clone() for n, p in full_model(cfg, seed, dtype).named_parameters()}


def test_the_full_model_a_rank_keeps_between_calls_is_never_written():
    from mtb_helpers import run
    cfg = GPTConfig()
    train_parallel(2, 2, 1, 1, steps=2)   # trains on the ranks from their kept full model
    fresh = dict(make_model(cfg, 0, torch.float64).named_parameters())
    for kept in run(_full_model_after_training, cfg, 0, torch.float64, world_size=4):
        assert all(torch.equal(kept[n], p) for n, p in fresh.items())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_flat_reference_takes_the_steps_of_torch_adamw_on_every_tensor(dtype):
    """The reference steps one flat [Ψ] vector (one copy to load a state, one to read it back);
    it must be the plain one-process run: ``torch.optim.AdamW`` over the model's own tensors.
    A reference that forgets to hand AdamW the new gradient (its last one kept) must differ."""
    from mtb_helpers.capstone.reference import Reference

    cfg, run = GPTConfig(), TrainConfig(steps=4)
    model = make_model(cfg, run.seed, dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=run.lr, weight_decay=run.weight_decay)
    want = []
    for k in range(run.steps):
        ids, targets = batch_for_step(k, run.batch, cfg.seq)
        opt.zero_grad()
        loss = model.loss(ids, targets)
        loss.backward()
        opt.step()
        want.append((float(loss.detach()), {n: p.detach().clone() for n, p in model.named_parameters()}))

    def accumulating(ref):   # the deliberate mistake: grads never cleared, each step adds on
        ref.zero_grad = lambda: None
        return ref

    for make, equal in ((lambda: Reference(cfg, run, dtype), True),
                        (lambda: accumulating(Reference(cfg, run, dtype)), False)):
        ref, same = make(), []
        for k, (loss, params) in enumerate(want):
            got_loss, after = ref.step(k)
            got = ref.named(after)
            same.append(got_loss == loss and all(torch.equal(got[n], p) for n, p in params.items()))
        assert same == [True] * 4 if equal else same[0] and not any(same[1:]), same


def _kept_stages() -> int:
    from mtb_helpers.capstone import kept
    return len(kept.STAGES)


def test_a_stage_kept_between_calls_starts_from_the_state_it_is_given():
    from mtb_helpers import run
    first = train_parallel(2, 2, 1, 1, steps=3)
    assert min(run(_kept_stages, world_size=4)) >= 1          # every rank kept its stage
    again = train_parallel(2, 2, 1, 1, steps=3)               # the kept stages, a fresh start
    assert again.losses == first.losses
    assert all(torch.equal(again.params[n], p) for n, p in first.params.items())


def _kept_moments_on_a_rank() -> tuple[bool, int, bool]:
    """On a rank of one (the DP wrappers are built under a process group): the same call twice
    from a kept stage, then once with the deliberate mistake in FlatStep.load."""
    from mtb_helpers.capstone import kept, parallel
    from mtb_helpers.dp.strategies import FlatStep
    args = ((GPTConfig(), 0, torch.float64), GridLayout(1, 1, 1, 1), TrainConfig(steps=2), 2, "1f1b",
            True, "ddp")
    correct_load, saved_stages = FlatStep.load, dict(kept.STAGES)
    kept.STAGES.clear()                                        # this call's own
    try:
        first = parallel.train_on_rank(*args)["snapshots"]["flat"]
        same = torch.equal(parallel.train_on_rank(*args)["snapshots"]["flat"], first)
        stages = len(kept.STAGES)

        def params_only(self, start):
            with torch.no_grad():
                self.flat.copy_(self.layout.piece(start["params"], 0, sharded=False))

        FlatStep.load = params_only
        caught = not torch.equal(parallel.train_on_rank(*args)["snapshots"]["flat"], first)
    finally:
        FlatStep.load = correct_load
        kept.STAGES.clear()
        kept.STAGES.update(saved_stages)
    return same, stages, caught


def test_a_kept_stage_that_kept_its_moments_is_caught():
    """The deliberate mistake: loading a kept stage's parameters but not Adam's state (the
    moments and step of the last call's run stay): the same call then gives other parameters.
    On a rank, not in this process: a process group made here would be inherited, with its
    flight recorder and kept mesh groups, by every rank pool forked after it."""
    from mtb_helpers import run
    [(same, stages, caught)] = run(_kept_moments_on_a_rank, world_size=1)
    assert same and stages == 1 and caught
