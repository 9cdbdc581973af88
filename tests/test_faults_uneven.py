"""Issue 25, item 1: a layer that assumes equal shards never returns a number from uneven ones,
nor aborts a rank inside gloo (context parallelism).

The issue's example: V = 10 on 4 ranks, ``torch.tensor_split`` widths 3, 3, 2, 2, targets
``[0, 3, 7]``: F.cross_entropy gives 3.217777; the vocabulary-parallel loss used to return
3.761975 (class 9's logit for target 7). Every rank must now refuse, with the widths named."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mtb_helpers import RankError, RankTimeoutError, run
from mtb_helpers.tp import VocabParallelEmbedding, vocab_parallel_cross_entropy
from mtb_helpers.tp.attention import LocalAttention

V = 10


def issue_logits() -> torch.Tensor:
    return torch.arange(3 * V, dtype=torch.float64).reshape(3, V).sin() * 3   # [3, V]


def _uneven_ce(logits, target, split, vocab_size):
    """Cut the logits unevenly; return the loss, or the ValueError's message if refused."""
    import torch.distributed as dist
    t, r = dist.get_world_size(), dist.get_rank()
    pieces = logits.tensor_split(t, dim=-1) if split == "tensor_split" else logits.chunk(t, -1)
    try:
        loss = vocab_parallel_cross_entropy(pieces[r].clone(), target, vocab_size=vocab_size)
    except ValueError as err:
        return str(err)
    return float(loss)


@pytest.mark.parametrize("split, widths", [("tensor_split", "[3, 3, 2, 2]"),
                                           ("chunk", "[3, 3, 3, 1]")])
def test_cross_entropy_refuses_uneven_vocabulary_shards_on_every_rank(split, widths):
    logits, target = issue_logits(), torch.tensor([0, 3, 7])
    assert F.cross_entropy(logits, target).dtype == torch.float64   # the truth exists; no rank returns a number
    for out in run(_uneven_ce, logits, target, split, None, world_size=4):
        assert isinstance(out, str), f"returned a number: {out}"
        assert widths in out and "equal" in out


def test_cross_entropy_with_vocab_size_refuses_before_communicating():
    # vocab_size known: each rank sees alone that 10 does not split into 4 equal shards
    logits, target = issue_logits(), torch.tensor([0, 3, 9])
    for out in run(_uneven_ce, logits, target, "tensor_split", V, world_size=4):
        assert isinstance(out, str) and "vocab_size=10" in out and "4" in out


def test_even_shards_still_equal_torch_with_and_without_vocab_size():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 12, generator=gen, dtype=torch.float64)
    target = torch.tensor([0, 5, 11])
    want = float(F.cross_entropy(logits, target))
    for vocab_size in (None, 12):
        for out in run(_uneven_ce, logits, target, "tensor_split", vocab_size, world_size=4):
            assert abs(out - want) < 1e-12
    with pytest.raises(ValueError, match=r"vocab_size=12 .* \[\.\., 3\]"):
        vocab_parallel_cross_entropy(logits[:, :3], target, vocab_size=12)   # one rank, 3 columns


def _uneven_embedding(weight_rows, vocab):
    import torch.distributed as dist
    r = dist.get_rank()
    try:
        VocabParallelEmbedding(torch.randn(weight_rows[r], 4), vocab)
    except ValueError as err:
        return str(err)
    return "built"


def test_embedding_refuses_uneven_rows():
    for out in run(_uneven_embedding, [3, 3, 2, 2], V, world_size=4):
        assert "num_embeddings=10" in out and "4" in out
    # even split, but this rank was given the wrong number of rows
    for out in run(_uneven_embedding, [3, 3, 3, 3], 8, world_size=4):
        assert "weight has 3 rows" in out and "8/4 = 2" in out


def test_local_attention_refuses_heads_that_do_not_split():
    with pytest.raises(ValueError, match=r"n_heads=3 .* world size 2"):
        LocalAttention(3, 4, world_size=2)
    core = LocalAttention(4, 2, world_size=2)          # 2 local heads of 2 features: qkv [s, b, 12]
    with pytest.raises(ValueError, match=r"qkv .* 12"):
        core(torch.randn(5, 1, 9))
    assert core(torch.randn(5, 1, 12)).shape == (5, 1, 4)


def test_vocab_embedding_refuses_wrong_rows_one_rank(no_ranks):
    with pytest.raises(ValueError, match=r"weight has 4 rows"):
        VocabParallelEmbedding(nn.Embedding(10, 3).weight[:4], 10)


# Context parallelism: shards of different shapes on different ranks used to abort rank 0 inside
# gloo ("Received data size doesn't match expected size", SIGABRT) or hang. Every rank now sees
# the mismatch in one small all-gather of the shapes and raises the same ValueError.

def _cp_shards(variant, shapes, grad):
    """This rank's q, k, v of ``shapes[r]`` through the variant, forward and backward."""
    import torch.distributed as dist

    from mtb_helpers.cp import allgather_attention, ring_attention
    r = dist.get_rank()
    gen = torch.Generator().manual_seed(r)
    q, k, v = (torch.randn(*shapes[r], generator=gen, dtype=torch.float64, requires_grad=grad)
               for _ in range(3))
    attend = ring_attention if variant == "ring" else allgather_attention
    out = attend(q, k, v, causal=True)
    if grad:
        out.sum().backward()
    return list(out.shape)


def _cp_message(variant, shapes):
    try:
        return _cp_shards(variant, shapes, False)
    except ValueError as err:
        return str(err)


@pytest.mark.parametrize("variant", ["ring", "allgather"])
@pytest.mark.parametrize("lengths", [[4, 6], [4, 4, 6], [6, 4, 4]])
def test_context_parallel_names_every_ranks_sequence_length(variant, lengths):
    shapes = [(1, 2, n, 4) for n in lengths]
    named = ", ".join(f"rank {r}: {n}" for r, n in enumerate(lengths))
    with pytest.raises(RankError) as caught:
        run(_cp_shards, variant, shapes, True, world_size=len(lengths), timeout=30)
    assert not isinstance(caught.value, RankTimeoutError)
    message = str(caught.value)
    assert "ValueError" in message and f"per rank is {named};" in message, message
    assert "Received data size" not in message and "died" not in message
    # every rank raised the same refusal (none left waiting in a collective), and the pool lives on
    outs = run(_cp_message, variant, shapes, world_size=len(lengths), timeout=30)
    assert len(set(outs)) == 1 and named in outs[0]
    even = [(1, 2, 4, 4)] * len(lengths)
    assert run(_cp_shards, variant, even, True, world_size=len(lengths)) == [[1, 2, 4, 4]] * len(lengths)


def test_context_parallel_names_a_shape_that_differs_elsewhere_than_the_sequence():
    shapes = [(1, 2, 4, 4), (1, 2, 4, 8), (2, 4, 4)]      # rank 1: head dim 8; rank 2: 3-D
    outs = run(_cp_message, "ring", shapes, world_size=3, timeout=30)
    assert len(set(outs)) == 1
    assert "rank 0: [1, 2, 4, 4]; rank 1: [1, 2, 4, 8]; rank 2: [2, 4, 4]" in outs[0], outs[0]


def _two_layers_message(lengths):
    """Two ring layers called together; the second layer's shards are uneven across ranks."""
    import torch.distributed as dist

    from mtb_helpers.cp import RingAttention
    r = dist.get_rank()
    even = tuple(torch.zeros(1, 2, 4, 4, dtype=torch.float64) for _ in range(3))
    uneven = tuple(torch.zeros(1, 2, lengths[r], 4, dtype=torch.float64) for _ in range(3))
    try:
        RingAttention.together([RingAttention(True), RingAttention(True)], [even, uneven])
    except ValueError as err:
        return str(err)
    return "computed"


def test_layers_called_together_agree_once_and_name_the_uneven_layer():
    outs = run(_two_layers_message, [4, 6, 4], world_size=3, timeout=30)
    assert len(set(outs)) == 1 and "per rank is rank 0: 4, rank 1: 6, rank 2: 4;" in outs[0], outs
