"""The capstone grid's process groups are kept in the rank processes between calls
(``MeshGroups.build(keep=True)``): reused for the same layout on the same pool, never for another
layout, never after the pool or the default group was made again, and never more than
``KEEP_MESHES`` meshes' worth."""
from __future__ import annotations

import os

from mtb_helpers import run, shutdown
from mtb_helpers.capstone.check import check_capstone
from mtb_helpers.capstone.grid import GridLayout
from mtb_helpers.comm.mesh import KEEP_MESHES


def _grid_on_rank(layout: GridLayout) -> dict:
    """On every rank: build the capstone grid twice (as two calls would), and report its groups'
    real members, their identities, an all-reduce in each group, and what the rank keeps."""
    import torch
    import torch.distributed as dist

    from mtb_helpers.capstone.grid import Grid
    from mtb_helpers.comm.mesh import kept_meshes

    grid = Grid.build(layout)
    again = Grid.build(layout)
    sums = {}
    for name, group in grid.groups.items():
        x = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(x, group=group)
        sums[name] = float(x)
    grid.destroy()   # the keeper owns the groups: they stay usable
    x = torch.ones(1)
    dist.all_reduce(x, group=grid.groups["tp"])
    return {"pid": os.getpid(), "ranks": {n: dist.get_process_group_ranks(g) for n, g in grid.groups.items()},
            "members": dict(grid.members), "ids": {n: id(g) for n, g in grid.groups.items()},
            "same": all(again.groups[n] is g for n, g in grid.groups.items()), "sums": sums,
            "after_destroy": float(x), "kept": kept_meshes(),
            "registered": len(dist.distributed_c10d._world.pg_map)}


def _check_groups(per_rank: list[dict], layout: GridLayout) -> None:
    mesh = layout.mesh()
    for rank, res in enumerate(per_rank):
        assert res["same"]
        for name, ranks in res["ranks"].items():
            dims = tuple(name.split("_"))
            assert ranks == res["members"][name] == mesh.group_of(rank, *dims), (rank, name)
            assert res["sums"][name] == sum(ranks)
        assert res["after_destroy"] == len(res["ranks"]["tp"])


def test_groups_are_reused_for_a_layout_and_never_for_another():
    a, b = GridLayout(tp=2, pp=2), GridLayout(tp=2, dp=2)
    first = run(_grid_on_rank, a, world_size=4, timeout=120.0)
    _check_groups(first, a)
    other = run(_grid_on_rank, b, world_size=4, timeout=120.0)
    _check_groups(other, b)
    back = run(_grid_on_rank, a, world_size=4, timeout=120.0)
    _check_groups(back, a)
    for r in range(4):
        assert first[r]["pid"] == other[r]["pid"] == back[r]["pid"]      # one pool throughout
        assert back[r]["ids"] == first[r]["ids"]                           # a's groups, kept
        # b has other tp groups' members on some ranks and other pp/dp groups on all: its own
        assert other[r]["ranks"] != first[r]["ranks"]
        assert a.mesh().names in [k[0] for k in back[r]["kept"]] and len(back[r]["kept"]) >= 2
    # the capstone trains on the kept groups and still tells right from wrong
    assert check_capstone(tp=2, pp=2, steps=2).passed
    assert not check_capstone(tp=2, dp=2, steps=2, bug="capstone-dp-allreduce-in-tp-group").passed
    assert check_capstone(tp=2, dp=2, steps=2).passed
    assert check_capstone(tp=2, pp=2, steps=2).passed


def test_at_most_keep_meshes_layouts_are_kept():
    layouts = [GridLayout(tp=4), GridLayout(pp=4), GridLayout(dp=4), GridLayout(cp=4), GridLayout(tp=2, pp=2),
               GridLayout(tp=2, dp=2), GridLayout(pp=2, cp=2)]
    assert len(layouts) > KEEP_MESHES + 1
    others = set()
    for layout in layouts:
        per_rank = run(_grid_on_rank, layout, world_size=4, timeout=120.0)
        _check_groups(per_rank, layout)
        for res in per_rank:
            assert len(res["kept"]) <= KEEP_MESHES
            assert res["kept"][-1][1] == layout.mesh().shape   # the newest is the last used
            # a rank is in 5 groups of a layout (one per dim, dp_cp); any other group it holds
            # (WORLD) stays: groups of layouts no longer kept were destroyed, none leaked
            others.add(res["registered"] - 5 * len(res["kept"]))
    assert len(per_rank[0]["kept"]) == KEEP_MESHES and len(others) == 1


def test_a_new_pool_starts_with_no_kept_groups():
    layout = GridLayout(tp=2, pp=2)
    before = run(_grid_on_rank, layout, world_size=4, timeout=120.0)
    shutdown()
    after = run(_grid_on_rank, layout, world_size=4, timeout=120.0)
    _check_groups(after, layout)
    for r in range(4):
        assert after[r]["pid"] != before[r]["pid"]
        assert after[r]["kept"] == [(layout.mesh().names, layout.mesh().shape, (("dp", "cp"),))]


def _rebuild_world(store_dir: str) -> dict:
    """Keep groups, destroy the default group, make a new one: the old groups must not come back."""
    import torch
    import torch.distributed as dist

    from mtb_helpers.capstone.grid import Grid
    from mtb_helpers.comm.mesh import kept_meshes

    layout = GridLayout(tp=2)
    old = Grid.build(layout).groups["tp"]
    kept_before = len(kept_meshes())
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(store_dir, "store"), world),
                            rank=rank, world_size=world)
    kept_between = len(kept_meshes())
    new = Grid.build(layout).groups["tp"]
    x = torch.ones(1)
    dist.all_reduce(x, group=new)
    return {"kept": [kept_before, kept_between, len(kept_meshes())], "reused": new is old,
            "sum": float(x), "ranks": dist.get_process_group_ranks(new)}


def test_a_new_default_group_drops_the_kept_groups(tmp_path):
    try:
        per_rank = run(_rebuild_world, str(tmp_path), world_size=2, timeout=120.0)
    finally:
        from mtb_helpers.runtime.ranks import release
        release(2)   # its ranks live on in the new default group; start the next test afresh
    for res in per_rank:
        assert res["kept"] == [1, 0, 1] and not res["reused"]
        assert res["sum"] == 2.0 and res["ranks"] == [0, 1]


def test_one_process_builds_no_groups_and_keeps_none():
    from mtb_helpers.capstone.grid import Grid
    from mtb_helpers.comm.mesh import kept_meshes

    grid = Grid.build(GridLayout())
    assert grid.groups == {n: None for n in ("pp", "dp", "cp", "tp", "dp_cp")} and kept_meshes() == []
