"""Private PyTorch names live in one guarded place (runtime/compat.py, beside mp_private.py for
multiprocessing): every one is still there in this torch (a release that removes one fails here,
naming it), each public fallback gives the private name's answer, a missing name with no fallback
is refused naming it, and no other module of the package reads a private torch name."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from mtb_helpers.runtime import compat
from mtb_helpers.runtime.ranks import run

PACKAGE = Path(__file__).resolve().parents[1] / "mtb_helpers"
GUARDED = {"runtime/compat.py", "runtime/mp_private.py"}


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


def _torch_aliases(tree: ast.Module) -> set[str]:
    """The names a module binds to torch or to something imported from torch."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname or a.name.split(".")[0] for a in node.names
                      if a.name.split(".")[0] == "torch"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            names |= {a.asname or a.name for a in node.names}
    return names


def private_torch_names(path: Path) -> list[str]:
    """``line: expression`` of every private name read from torch in ``path``: an attribute
    starting with one underscore on a chain rooted at a name imported from torch (aten's ops
    registry aside), and the private methods the course was found to call on torch's objects."""
    tree = ast.parse(path.read_text())
    aliases, found = _torch_aliases(tree), []
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            if any(part.startswith("_") for part in node.module.split(".")):
                found.append(f"{node.lineno}: from {node.module} import ...")
        if isinstance(node, ast.Attribute) and id(node) not in inner:   # whole chains only
            chain, root = [node.attr], node.value
            while isinstance(root, ast.Attribute):
                chain.append(root.attr)
                root = root.value
            private = [a for a in chain if a.startswith("_") and not a.startswith("__")]
            if isinstance(root, ast.Name) and root.id in aliases and private and "ops" not in chain:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
            elif set(chain) & KNOWN_PRIVATE_METHODS:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return sorted(set(found))


KNOWN_PRIVATE_METHODS = {"_partition_parameters", "_rank_not_in_group", "_get_default_group",
                         "_templated_ring_attention", "_templated_ring_attention_backward",
                         "_cp_options"}


def test_no_private_torch_name_outside_the_guarded_place():
    found = {p.relative_to(PACKAGE).as_posix(): names for p in sorted(PACKAGE.rglob("*.py"))
             if (names := private_torch_names(p))}
    outside = {p: n for p, n in found.items() if p not in GUARDED}
    assert not outside, f"private torch names outside runtime/compat.py: {outside}"


def test_the_private_name_finder_finds_each_kind(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("import torch\nimport torch.distributed as dist\n"
                       "from torch.distributed import distributed_c10d as c10d\n"
                       "a = c10d._world.pg_coalesce_state\nb = torch._C._has_torch_function\n"
                       "c = dist.group.WORLD\nd = torch.ops.aten._softmax\n"
                       "e = zero._partition_parameters()\n"
                       "from torch.utils._python_dispatch import TorchDispatchMode\n")
    assert [line.split(":")[0] for line in private_torch_names(planted)] == ["4", "5", "8", "9"]


def _default_group_both_ways() -> bool:
    private = dist.distributed_c10d._get_default_group()   # grid/pytorch.py's public answer is torch's own
    return dist.group.WORLD is private


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
    assert run(_default_group_both_ways, world_size=2) == [True] * 2
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


def test_dispatch_mode_is_torchs_and_its_loss_is_named(monkeypatch):
    from torch.utils import _python_dispatch
    assert compat.dispatch_mode() is _python_dispatch.TorchDispatchMode
    monkeypatch.delattr(_python_dispatch, "TorchDispatchMode")
    with pytest.raises(compat.PrivateAPIMissing, match="TorchDispatchMode.*counted"):
        compat.dispatch_mode()
