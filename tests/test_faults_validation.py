"""Issue 25, item 8: bad input is a ValueError naming the argument, raised before any rank starts."""
from __future__ import annotations

import pytest
import torch

from mtb_helpers.cp import shard_positions, shard_sequence, unshard_sequence

X = torch.arange(2 * 12, dtype=torch.float64).reshape(1, 2, 12, 1)    # [b, heads, s, d]


@pytest.mark.parametrize("args, message", [
    ((3, -1), r"rank=-1 .* \[0, 3\)"),
    ((3, 3, "zigzag"), r"rank=3 .* \[0, 3\)"),
    ((3, 3), r"rank=3 .* \[0, 3\)"),
    ((0, 0), r"world_size=0"),
    ((-2, 0), r"world_size=-2"),
    ((3, 0, "contiguous", 4), r"dim=4 .* 4 dims"),
    ((3, 0, "contiguous", -5), r"dim=-5 .* 4 dims"),
    ((3, 0, "diagonal"), r"layout 'diagonal'"),
])
def test_shard_sequence_refuses_bad_arguments(no_ranks, args, message):
    with pytest.raises(ValueError, match=message):
        shard_sequence(X, *args)


def test_shard_positions_refuses_bad_rank_and_world_size(no_ranks):
    with pytest.raises(ValueError, match=r"rank=2"):
        shard_positions(8, 2, 2, "zigzag")
    with pytest.raises(ValueError, match=r"world_size=0"):
        shard_positions(8, 0, 0)


def test_good_shards_round_trip_and_negative_dim_works(no_ranks):
    for layout in ("contiguous", "zigzag"):
        shards = [shard_sequence(X, 3, r, layout, dim=-2) for r in range(3)]
        assert torch.equal(unshard_sequence(shards, layout, dim=-2), X)


def test_unshard_refuses_shards_of_different_lengths(no_ranks):
    shards = list(X.tensor_split(3, dim=2)) + [X[:, :, :2]]      # 4, 4, 4 and 2 positions
    with pytest.raises(ValueError, match=r"shards .* \[4, 4, 4, 2\]"):
        unshard_sequence(shards)
    with pytest.raises(ValueError, match=r"shards"):
        unshard_sequence([])
