"""The vocabulary split: embedding equal to nn.Embedding, cross-entropy equal to F.cross_entropy
forward and backward without any rank holding [.., V], both equal to PyTorch's own DTensor
versions (RowwiseParallel embedding, loss_parallel) on the same ranks; bugs and refusals."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mtb_helpers import BUGS, run
from mtb_helpers.checking.bug import names_for
from mtb_helpers.tp.attention_bugs import BUGS as ATTENTION_BUGS
from mtb_helpers.comm import record
from mtb_helpers.tp import VocabParallelEmbedding, vocab_parallel_cross_entropy
from mtb_helpers.tp.vocab import VocabParallelCrossEntropy
from mtb_helpers.tp.vocab_check import QUANTITIES, check_vocab_parallel, draw_vocab_inputs

V = 12


def _ce_job(logits, target, reduction, d_loss, fuse_sums=False):
    import torch.distributed as dist
    t, r = dist.get_world_size(), dist.get_rank()
    shard = logits.chunk(t, dim=-1)[r].clone().requires_grad_(True)      # [.., V/t]
    saved = []

    def keep(x):
        saved.append(tuple(x.shape))
        return x

    with record() as rec, torch.autograd.graph.saved_tensors_hooks(keep, lambda x: x):
        loss = vocab_parallel_cross_entropy(shard, target, reduction, fuse_sums=fuse_sums)
        loss.backward(d_loss)
    return {"loss": loss.detach(), "grad": shard.grad, "saved": saved, "rec": rec}


@pytest.mark.parametrize("fuse_sums", [False, True])
@pytest.mark.parametrize("t", [1, 2, 3, 4])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_equals_torch_forward_and_backward(t, reduction, fuse_sums):
    gen = torch.Generator().manual_seed(t)
    logits = 3 * torch.randn(3, 2, V, generator=gen, dtype=torch.float64)
    target = torch.randint(0, V, (3, 2), generator=gen)
    full = logits.clone().requires_grad_(True)
    loss = F.cross_entropy(full.reshape(-1, V), target.reshape(-1), reduction=reduction)
    loss = loss.reshape(3, 2) if reduction == "none" else loss
    d_loss = torch.randn(loss.shape, generator=gen, dtype=torch.float64)
    loss.backward(d_loss)
    for r, out in enumerate(run(_ce_job, logits, target, reduction, d_loss, fuse_sums, world_size=t)):
        assert out["loss"].shape == loss.shape
        assert (out["loss"] - loss.detach()).abs().max() < 1e-12
        assert (out["grad"] - full.grad.chunk(t, dim=-1)[r]).abs().max() < 1e-12
        # no rank ever holds [.., V]: not in what autograd saves, not in what it sends
        assert all(not shape or shape[-1] != V or t == 1 for shape in out["saved"])
        comm = out["rec"].events
        assert [(e.operator, e.direction, e.shape) for e in comm] == [
            ("max", "forward", (3, 2))] + ([("sum_exp+target_logit", "forward", (2, 3, 2))]
                                           if fuse_sums else [("sum_exp", "forward", (3, 2)),
                                                              ("target_logit", "forward", (3, 2))])
        # fused: the same bytes sent, in one all-reduce instead of two
        assert sum(e.sent_bytes for e in comm) == 3 * 2 * (t - 1) * 6 * 8 // t


class _SumsNotReduced(VocabParallelCrossEntropy):
    """The fused sums left as this rank's own (no all-reduce): what the fused path must not do."""

    def combine_sums(self, local_sum, picked):
        return local_sum, picked


def _unreduced_sums_job(logits, target):
    import torch.distributed as dist
    shard = logits.chunk(dist.get_world_size(), dim=-1)[dist.get_rank()]
    return _SumsNotReduced("mean", None, None, True)(shard, target)


def test_the_fused_sums_must_be_all_reduced_to_equal_torch():
    gen = torch.Generator().manual_seed(5)
    logits = 3 * torch.randn(3, 2, V, generator=gen, dtype=torch.float64)
    target = torch.randint(0, V, (3, 2), generator=gen)
    want = F.cross_entropy(logits.reshape(-1, V), target.reshape(-1))
    assert all(abs(float(loss - want)) > 1e-3 for loss in run(_unreduced_sums_job, logits, target,
                                                              world_size=2))


def test_cross_entropy_survives_huge_logits():
    # the max is what keeps exp() finite: logits of 1e4 would overflow without it
    logits = torch.tensor([[1e4, 0.0, -1e4, 1e4 - 1.0]], dtype=torch.float64)
    target = torch.tensor([3])
    out = run(_ce_job, logits, target, "mean", torch.tensor(1.0, dtype=torch.float64),
              world_size=2)
    want = F.cross_entropy(logits, target)
    assert torch.isfinite(out[0]["loss"]) and abs(float(out[0]["loss"] - want)) < 1e-12


def _embedding_job(emb, ids, d_out):
    layer = VocabParallelEmbedding.from_full(emb)
    with record() as rec:
        out = layer(ids)
        out.backward(d_out)
    return out.detach(), layer.weight.grad, rec


@pytest.mark.parametrize("t", [1, 3, 4])
def test_embedding_equals_nn_embedding_with_one_all_reduce(t):
    inputs = draw_vocab_inputs(0, V, 5, (4, 3), dtype=torch.float64)
    emb, ids = inputs["embedding"], inputs["ids"]
    d_out = torch.randn(4, 3, 5, dtype=torch.float64)
    want = emb(ids)
    want.backward(d_out)
    results = run(_embedding_job, emb, ids, d_out, world_size=t)
    for out, grad, rec in results:
        assert (out - want).abs().max() == 0          # one non-zero addend per token: exact
        assert [(e.op, e.operator, e.direction) for e in rec] == [("all_reduce", "g", "forward")]
    assert torch.equal(torch.cat([grad for _, grad, _ in results]), emb.weight.grad)


def _against_dtensor(inputs):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import RowwiseParallel, loss_parallel, parallelize_module
    t, r = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (t,))
    logits, target = inputs["logits"].reshape(-1, V), inputs["target"].reshape(-1)
    theirs = distribute_tensor(logits, mesh, [Shard(1)]).requires_grad_(True)
    with loss_parallel():
        their_loss = F.cross_entropy(theirs, target)
        their_loss.backward()
    mine = logits.chunk(t, dim=-1)[r].clone().requires_grad_(True)
    my_loss = vocab_parallel_cross_entropy(mine, target)
    my_loss.backward()
    emb = inputs["embedding"]
    their_emb = parallelize_module(nn.Embedding.from_pretrained(emb.weight.detach().clone()), mesh,
                                   RowwiseParallel(input_layouts=Replicate()))
    my_emb = VocabParallelEmbedding.from_full(emb)
    return {"loss": abs(float(my_loss - their_loss.full_tensor())),
            "grad": float((mine.grad - theirs.grad.to_local()).abs().max()),
            "embedding": float((my_emb(inputs["ids"]) - their_emb(inputs["ids"])).abs().max()),
            "table": float((my_emb.weight - their_emb.weight.to_local()).abs().max())}


@pytest.mark.parametrize("t", [2, 3])
def test_agrees_with_pytorch_loss_parallel_and_rowwise_embedding(t):
    inputs = draw_vocab_inputs(1, V, 4, (4, 2), dtype=torch.float64)
    for errs in run(_against_dtensor, inputs, world_size=t, timeout=60):
        assert max(errs.values()) < 1e-12, errs


@pytest.mark.parametrize("t, reduction, dtype", [(1, "mean", "float32"), (2, "sum", "float64"),
                                                 (3, "none", "float64"), (4, "mean", "float32")])
def test_check_passes_with_fp64_exact_to_1e_12(t, reduction, dtype):
    report = check_vocab_parallel(world_size=t, reduction=reduction, dtype=dtype)
    assert report.passed, str(report)
    assert report.quantities() == list(QUANTITIES) and all(s.passed for s in report.steps)
    if dtype == "float64":
        assert max(r.max_abs_err for r in report.rows) < 1e-12
    assert report.records[0].count("all_reduce", "forward") == 4      # g + the three of the loss
    assert report.records[0].count(direction="backward") == 0


BROKEN = [
    ("vocab-embedding-no-mask", {"embedding.output", "embedding.weight_grad"}),
    ("vocab-ce-max-not-allreduced", {"ce.max", "ce.sum_exp", "ce.target_logit", "loss",
                                     "logits_grad"}),
    ("vocab-ce-sum-exp-not-allreduced", {"ce.sum_exp", "loss", "logits_grad"}),
    ("vocab-ce-target-not-allreduced", {"ce.target_logit", "loss"}),
]


def test_every_vocab_bug_is_registered_and_tested():
    assert set(names_for(ATTENTION_BUGS, "vocab_parallel")) == {b for b, _ in BROKEN} and \
        {b for b, _ in BROKEN} <= set(BUGS)


@pytest.mark.parametrize("t, reduction", [(2, "mean"), (3, "none")])
@pytest.mark.parametrize("bug, broken", BROKEN, ids=[b for b, _ in BROKEN])
def test_bug_fails_exactly_the_quantities_it_breaks(bug, broken, t, reduction):
    report = check_vocab_parallel(world_size=t, bug=bug, reduction=reduction)
    failed = {(r.quantity, r.rank) for r in report.failed()}
    assert failed == {(q, rank) for q in broken for rank in range(t)}, str(report)


MISSING = {"vocab-ce-max-not-allreduced": "ce.max", "vocab-ce-sum-exp-not-allreduced": "ce.sum_exp",
           "vocab-ce-target-not-allreduced": "ce.target_logit"}


def test_one_rank_has_no_wrong_number_but_a_missing_all_reduce_still_shows():
    assert check_vocab_parallel(world_size=1, bug="vocab-embedding-no-mask").passed
    for bug, quantity in MISSING.items():
        report = check_vocab_parallel(world_size=1, bug=bug)
        # every value (loss, grads) is right; the all-reduce the bug skips was never issued
        assert [(r.quantity, r.note) for r in report.failed()] == [(quantity, "not produced")]


@pytest.mark.parametrize("call, message", [
    (lambda: check_vocab_parallel(world_size=3, vocab=10), r"vocab=10 .* world size 3"),
    (lambda: check_vocab_parallel(tokens=(2, 0)), r"tokens\[1\] must be a positive integer"),
    (lambda: check_vocab_parallel(reduction="avg"), r"reduction must be one of"),
    (lambda: check_vocab_parallel(world_size=0), r"world.size"),
    (lambda: check_vocab_parallel(dtype="float16"), r"dtype"),
    (lambda: check_vocab_parallel(bug="attn-qkv-without-f"), r"does not apply"),
])
def test_bad_input_is_refused_before_any_rank_starts(no_ranks, call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_layers_refuse_what_they_cannot_split():
    with pytest.raises(ValueError, match="reduction must be one of"):
        VocabParallelCrossEntropy("avg")
    with pytest.raises(ValueError, match=r"target \[3\] must have the leading shape"):
        vocab_parallel_cross_entropy(torch.randn(2, V), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"target ids must lie in \[0, 12\)"):
        vocab_parallel_cross_entropy(torch.randn(2, V), torch.tensor([0, 12]))
    with pytest.raises(ValueError, match="padding_idx"):
        VocabParallelEmbedding.from_full(nn.Embedding(V, 3, padding_idx=0))
    from torch.distributed.tensor import Replicate, Shard
    assert VocabParallelEmbedding.weight_layout == Shard(0)
    assert VocabParallelCrossEntropy.input_layouts == (Shard(-1), Replicate())


def _vocab_in_subgroups(logits, target, emb, ids):
    import torch.distributed as dist
    r = dist.get_rank()
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    group = groups[r // 2]
    shard = logits.chunk(2, dim=-1)[r % 2].clone().requires_grad_(True)
    loss = vocab_parallel_cross_entropy(shard, target, group=group)
    loss.backward()
    out = VocabParallelEmbedding.from_full(emb, group=group)(ids)
    return loss.detach(), shard.grad, out.detach()


def test_vocab_split_inside_a_subgroup():
    inputs = draw_vocab_inputs(2, V, 4, (5,), dtype=torch.float64)
    logits = inputs["logits"].clone().requires_grad_(True)
    loss_ref = F.cross_entropy(logits, inputs["target"])
    loss_ref.backward()
    want = loss_ref.detach()
    results = run(_vocab_in_subgroups, inputs["logits"], inputs["target"], inputs["embedding"],
                  inputs["ids"], world_size=4)
    for r, (loss, grad, out) in enumerate(results):
        assert abs(float(loss - want)) < 1e-12
        assert (grad - logits.grad.chunk(2, dim=-1)[r % 2]).abs().max() < 1e-12
        assert torch.equal(out, inputs["embedding"](inputs["ids"]).detach())
