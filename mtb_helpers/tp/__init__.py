"""Tensor parallelism (notebooks 01-03): column- and row-parallel linear layers and the MLP.

Attention split by heads and the vocabulary split (notebook 10) are their own topic,
``mtb_helpers.attention``, built on these layers. Two things stay importable from here:
``ParallelSelfAttention``, ``VocabParallelEmbedding`` and ``vocab_parallel_cross_entropy`` (stable
entry points), and the modules' old paths (``mtb_helpers.tp.attention``, ``.vocab``,
``.attention_check``, ``.attention_plots``, ``.attention_bugs``, ``.vocab_check``), which resolve
to the same module objects in ``mtb_helpers.attention`` when imported (notebook 10 names them).
"""
import importlib
import importlib.abc
import importlib.util
import sys

from mtb_helpers.comm.sharding import check_divisible, shard_range
from mtb_helpers.tp.layers import ColumnParallelLinear, ParallelMLP, RowParallelLinear
# after tp.layers, which is all the attention topic needs from this package (no circle at runtime)
from mtb_helpers.attention.layers import ParallelSelfAttention  # noqa: E402
from mtb_helpers.attention.vocab import VocabParallelEmbedding, vocab_parallel_cross_entropy  # noqa: E402

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "ParallelMLP", "check_divisible",
           "shard_range", "ParallelSelfAttention", "VocabParallelEmbedding",
           "vocab_parallel_cross_entropy"]

MOVED = {"attention": "layers", "attention_bugs": "bugs", "attention_check": "check",
         "attention_plots": "plots", "vocab": "vocab", "vocab_check": "vocab_check"}


class _MovedToAttention(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import mtb_helpers.tp.<old>`` gives ``mtb_helpers.attention.<new>`` itself, imported only
    when asked (so importing tp loads no plot or check)."""

    def find_spec(self, name, path=None, target=None):
        package, _, old = name.rpartition(".")
        if package == __name__ and old in MOVED:
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        module = importlib.import_module(f"mtb_helpers.attention.{MOVED[spec.name.rpartition('.')[2]]}")
        spec.loader_state = module.__spec__   # the import system sets __spec__; put it back below
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = module.__spec__.loader_state


if not any(isinstance(f, _MovedToAttention) for f in sys.meta_path):
    sys.meta_path.append(_MovedToAttention())
