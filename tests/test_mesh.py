"""The one rank mesh (comm/mesh.py): arithmetic, refusals, the grid's and the capstone's use of it,
and its groups equal to PyTorch's ``init_device_mesh`` on real ranks, flattened dims included."""
from __future__ import annotations

import pytest

from mtb_helpers import run
from mtb_helpers.comm.mesh import Mesh, MeshGroups


def test_coords_and_rank_of_are_row_major_last_dim_fastest():
    mesh = Mesh(pp=2, dp=3, cp=2, tp=2)
    assert mesh.size == 24 and mesh.names == ("pp", "dp", "cp", "tp")
    for rank in range(mesh.size):
        at = mesh.coords(rank)
        assert list(at) == ["pp", "dp", "cp", "tp"]
        assert rank == ((at["pp"] * 3 + at["dp"]) * 2 + at["cp"]) * 2 + at["tp"]
        assert mesh.rank_of(**at) == rank
    assert Mesh(dp=2, tp=2).rank_of(dp=1) == 2 and Mesh(dp=2, tp=2).coords(3) == {"dp": 1, "tp": 1}


@pytest.mark.parametrize("sizes", [dict(dp=2, tp=2), dict(pp=2, dp=1, cp=2, tp=2),
                                   dict(dp=3, cp=2, tp=1), dict(tp=4)])
def test_groups_partition_the_ranks_and_vary_only_their_dims(sizes):
    mesh = Mesh(**sizes)
    for dims in [(d,) for d in mesh.names] + [("dp", "cp")] * ("cp" in sizes):
        groups = mesh.group_ranks(*dims)
        assert sorted(r for g in groups for r in g) == list(range(mesh.size))
        n = 1
        for d in dims:
            n *= mesh.sizes[d]
        assert all(len(g) == n for g in groups)
        for g in groups:   # members agree on every other coordinate
            fixed = [{d: v for d, v in mesh.coords(r).items() if d not in dims} for r in g]
            assert all(f == fixed[0] for f in fixed)
            assert all(mesh.group_of(r, *dims) == g for r in g)


def test_bad_meshes_and_names_are_refused():
    with pytest.raises(ValueError, match="tp must be a positive integer"):
        Mesh(dp=2, tp=0)
    with pytest.raises(ValueError, match="dp must be a positive integer"):
        Mesh(dp=True, tp=2)
    with pytest.raises(ValueError, match="at least one dim"):
        Mesh()
    with pytest.raises(ValueError, match="rank 4 is not on Mesh"):
        Mesh(dp=2, tp=2).coords(4)
    with pytest.raises(ValueError, match="outside mesh dim tp"):
        Mesh(dp=2, tp=2).rank_of(dp=0, tp=2)
    with pytest.raises(ValueError, match="distinct dims"):
        Mesh(dp=2, tp=2).group_ranks("cp")
    with pytest.raises(ValueError, match="distinct dims"):
        Mesh(dp=2, tp=2).group_ranks("tp", "tp")


def test_the_grid_and_the_capstone_are_the_same_mesh():
    from mtb_helpers.capstone.grid import GridLayout, group_ranks
    from mtb_helpers.grid.layers import dp_group_ranks, tp_group_ranks
    for tp, dp in [(2, 2), (1, 4), (4, 1), (2, 3), (3, 2)]:
        mesh = Mesh(dp=dp, tp=tp)
        assert tp_group_ranks(tp, dp) == mesh.group_ranks("tp")
        assert dp_group_ranks(tp, dp) == mesh.group_ranks("dp")
        for r in range(tp * dp):
            assert tuple(mesh.coords(r).values()) == divmod(r, tp)   # notebook 08's (dp_index, tp_index)
        # the 4-D layout with pp = cp = 1 numbers ranks exactly as the tp x dp grid does
        layout = GridLayout(tp=tp, dp=dp)
        assert group_ranks(layout, ("tp",)) == tp_group_ranks(tp, dp)
        assert all(layout.mesh().rank_of(**mesh.coords(r)) == r for r in range(tp * dp))
    layout = GridLayout(tp=2, pp=2, dp=2, cp=1)
    assert layout.mesh() == Mesh(pp=2, dp=2, cp=1, tp=2)
    assert layout.mesh().coords(5) == {"pp": 1, "dp": 0, "cp": 0, "tp": 1}


def _groups_on_rank(sizes: dict, flatten: tuple) -> dict:
    """On every rank: the course's groups and ``init_device_mesh``'s, as lists of global ranks."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    mesh = Mesh(**sizes)
    ours = MeshGroups.build(mesh, flatten=flatten)
    dm = init_device_mesh("cpu", mesh.shape, mesh_dim_names=mesh.names)
    try:
        theirs = {d: dm[d].get_group() for d in mesh.names}
        for dims in flatten:
            theirs["_".join(dims)] = dm[dims]._flatten().get_group()
        return {"ours": {k: dist.get_process_group_ranks(g) for k, g in ours.groups.items()},
                "members": dict(ours.members),
                "theirs": {k: dist.get_process_group_ranks(g) for k, g in theirs.items()},
                "index": dict(ours.index), "coordinate": list(dm.get_coordinate())}
    finally:
        ours.destroy()
        default = dist.distributed_c10d._get_default_group()
        for group in set(theirs.values()):
            if group is not None and group != default:
                dist.destroy_process_group(group)


@pytest.mark.parametrize("sizes, flatten", [
    (dict(dp=2, tp=2), ()),
    (dict(dp=2, cp=2), (("dp", "cp"),)),
    (dict(pp=2, dp=1, cp=2, tp=1), (("dp", "cp"),)),
    (dict(pp=1, dp=2, cp=2, tp=2), (("dp", "cp"),)),
    (dict(dp=3, tp=1), ()),
])
def test_groups_equal_init_device_mesh_on_real_ranks(sizes, flatten):
    mesh = Mesh(**sizes)
    per_rank = run(_groups_on_rank, sizes, flatten, world_size=mesh.size, timeout=120.0)
    for rank, res in enumerate(per_rank):
        assert res["index"] == mesh.coords(rank)
        assert res["coordinate"] == list(mesh.coords(rank).values())
        assert set(res["ours"]) == set(res["theirs"]) == set(mesh.names) | {"_".join(f) for f in flatten}
        for name, ranks in res["theirs"].items():
            assert res["ours"][name] == ranks, (rank, name)
            assert res["members"][name] == ranks
