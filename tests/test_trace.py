"""The step trace speaks DTensor's placements, as the layers' input_layouts / output_layouts do."""
import json

import pytest
import torch
from torch.distributed.tensor import Partial, Replicate, Shard

from mtb_helpers.checking.trace import LAYOUTS, StepSpec as S, block, build_steps, piece
from mtb_helpers.comm.sharding import local_piece, name


@pytest.mark.parametrize("layout", [Shard(0), Shard(-1), Replicate()])
def test_a_ranks_piece_of_the_view_is_comm_sharding_s_piece(layout):
    full = torch.arange(24.0).reshape(4, 6)
    for t in (1, 2):
        for r in range(t):
            (r0, r1), (c0, c1) = block((4, 6), layout, t, r)
            assert torch.equal(piece(full, layout, t, r), local_piece(full, layout, r, t))
            assert torch.equal(full[r0:r1, c0:c1], local_piece(full, layout, r, t))


def test_a_partial_step_compares_each_rank_with_its_own_addend():
    addends = [torch.ones(2, 3), 2 * torch.ones(2, 3)]
    for layout in (Partial(), Partial("max")):
        assert torch.equal(piece(addends, layout, 2, 1), addends[1])
        assert block((2, 3), layout, 2, 1) == ((0, 2), (0, 3))


def _result(obs: dict) -> dict:
    return {"obs": obs, "record": None, "rank": 0}


def test_a_step_names_its_placement_and_fails_where_a_rank_holds_the_wrong_piece():
    full = torch.arange(24.0, dtype=torch.float64).reshape(4, 6)
    spec = S("w", "shard W by columns", "forward", "W", "W_r = W[:, cols r]", Shard(-1), ("input",))
    good = [_result({"w": local_piece(full, Shard(-1), r, 2)}) for r in range(2)]
    (step,) = build_steps([spec], good, {"w": full}, torch.float64)
    assert step.passed and step.layout == "Shard(-1)" and "- Shard(-1) W [4, 6]" in str(step)
    assert [h.cols for h in step.holdings] == [(0, 3), (3, 6)] and json.loads(json.dumps(step.to_dict()))
    # deliberate mistakes: rank 1 holds rank 0's columns; then every rank holds rows, not columns
    swapped = [good[0], _result({"w": local_piece(full, Shard(-1), 0, 2)})]
    (step,) = build_steps([spec], swapped, {"w": full}, torch.float64)
    assert [h.passed for h in step.holdings] == [True, False] and "FAILED" in str(step)
    rows = [_result({"w": local_piece(full, Shard(0), r, 2)}) for r in range(2)]
    (step,) = build_steps([spec], rows, {"w": full}, torch.float64)
    assert not any(h.passed for h in step.holdings) and step.max_abs_err is None


def test_a_step_layout_outside_dtensor_s_words_is_refused():
    for bad in ("rows", "replicated", Shard(1), Partial("min")):
        with pytest.raises(ValueError, match="not a placement of a 2-D view"):
            S("w", "w", "forward", "W", "W", bad, ("input",))


def test_every_check_s_steps_use_placements_the_figures_can_name():
    from mtb_helpers.tp.attention_check import _specs as attention_specs
    from mtb_helpers.tp.vocab_check import _specs as vocab_specs
    from mtb_helpers.check import check_column_parallel, check_row_parallel, check_tp_mlp
    from mtb_helpers.sp.check import SP_SPECS
    from mtb_helpers.tp.plots import LAYOUT_TEXT
    assert sorted(LAYOUT_TEXT) == sorted(name(p) for p in LAYOUTS)
    steps = [s.layout for check in (check_column_parallel, check_row_parallel, check_tp_mlp)
             for s in check(world_size=2).steps]
    specs = [name(s.layout) for s in [*SP_SPECS, *attention_specs(), *vocab_specs()]]
    assert set(steps + specs) <= set(LAYOUT_TEXT)
    assert {"Shard(0)", "Shard(-1)", "Replicate()", "Partial()"} <= set(steps)
    assert name(next(s.layout for s in vocab_specs() if s.key == "ce.local_max")) == "Partial('max')"
