"""Private PyTorch names live in one guarded place (runtime/compat.py, beside mp_private.py for
multiprocessing): every one is still there in this torch (a release that removes one fails here,
naming it), each public fallback gives the private name's answer, a missing name with no fallback
is refused naming it, and no other module of the package reads a private torch name."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from mtb_helpers.runtime import compat
from mtb_helpers.runtime.ranks import run

PACKAGE = Path(__file__).resolve().parents[1] / "mtb_helpers"
GUARDED = {"runtime/compat.py", "runtime/mp_private.py"}
# where else a private torch name may still be read, and who moves it (issue 34, item 3)
ELSEWHERE = {"comm/issue.py"}   # its collective fast path: moved by the communication rewrite


def _owner(where: str):
    module, _, cls = where.rpartition(".")
    if cls[:1].isupper():
        return getattr(importlib.import_module(module), cls)
    return importlib.import_module(where)


@pytest.mark.parametrize("where", sorted(compat.PRIVATE_NAMES))
def test_every_private_name_is_still_in_this_torch(where):
    owner = _owner(where)
    gone = [name for name in compat.PRIVATE_NAMES[where] if not hasattr(owner, name)]
    assert not gone, (f"torch {torch.__version__} removed {where}.{', '.join(gone)}: update "
                      f"mtb_helpers/runtime/compat.py (its fallback, or a new public API)")


def test_no_private_torch_name_outside_the_guarded_place():
    private = re.compile(r"(c10d\._[a-z]|\._partition_parameters|\._context_parallel|"
                         r"_cp_options|_get_default_group|_rank_not_in_group\()")
    found = [f"{p.relative_to(PACKAGE)}:{n}" for p in sorted(PACKAGE.rglob("*.py"))
             if p.relative_to(PACKAGE).as_posix() not in GUARDED | ELSEWHERE
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if private.search(line.split("#")[0]) and not line.lstrip().startswith(("``", '"'))]
    assert not found, f"private torch names outside runtime/compat.py: {found}"


def test_rank_not_in_group_falls_back_to_the_public_non_member(monkeypatch):
    cases = [None, dist.GroupMember.NON_GROUP_MEMBER, object()]
    private = [compat.rank_not_in_group(g) for g in cases]
    assert private == [False, True, False]
    monkeypatch.delattr(compat.c10d, "_rank_not_in_group")
    assert [compat.rank_not_in_group(g) for g in cases] == private


def _default_group_both_ways() -> tuple[bool, bool]:
    from mtb_helpers.runtime import compat as c
    private = c.default_group()
    saved = c.c10d._get_default_group
    del c.c10d._get_default_group
    try:
        public = c.default_group()
    finally:
        c.c10d._get_default_group = saved
    return private is dist.group.WORLD, public is private


def _zero_partition_both_ways() -> tuple[list, list]:
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from mtb_helpers.runtime import compat as c
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    zero = ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD, lr=0.1,
                                   process_group=dist.group.WORLD)
    index = {p: i for i, p in enumerate(model.parameters())}

    class WithoutPrivate:   # the optimizer as a torch without _partition_parameters shows it
        optim, process_group = zero.optim, zero.process_group
    return c.zero_partition(zero, index), c.zero_partition(WithoutPrivate(), index)


def test_default_group_and_zero_partition_fall_back_to_the_same_answer_on_ranks():
    assert run(_default_group_both_ways, world_size=2) == [(True, True)] * 2
    for private, public in run(_zero_partition_both_ways, world_size=2):
        assert private == public and sorted(sum(private, [])) == list(range(6))


def test_pytorch_ring_restores_its_options_and_names_a_missing_name(monkeypatch):
    ring = importlib.import_module(compat.RING_MODULE)
    before = (ring._cp_options.enable_load_balance, ring._cp_options.convert_to_f32,
              ring._cp_options.rotate_method)
    with compat.pytorch_ring(load_balance=not before[0]) as (forward, backward):
        assert forward is ring._templated_ring_attention
        assert ring._cp_options.convert_to_f32 is False
    assert (ring._cp_options.enable_load_balance, ring._cp_options.convert_to_f32,
            ring._cp_options.rotate_method) == before
    monkeypatch.delattr(ring, "_templated_ring_attention_backward")
    with pytest.raises(compat.PrivateAPIMissing, match="_templated_ring_attention_backward"):
        with compat.pytorch_ring(load_balance=False):
            pass
