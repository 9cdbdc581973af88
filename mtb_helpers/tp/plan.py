"""The ``parallelize_module`` plan of tensor parallelism's comparisons with PyTorch, on its own.

``tp/pytorch.py`` builds DTensor's layers from it; ``tp/bugs.py`` subclasses it with one placement
wrong. It lives apart so that the bug registry (which imports every topic's bugs) does not import
the comparison module: runtime/start.py preloads ``torch.distributed.tensor.debug`` (and with it
``torch._dynamo``, ~0.8 s and ~35 MB a rank) wherever ``tp/pytorch.py`` is loaded, which would
then be every notebook that reads ``BUGS`` or runs a check.
"""
from __future__ import annotations

__all__ = ["TensorParallelPlan"]


class TensorParallelPlan:
    """The ``parallelize_module`` plan of each comparison: a column layer is ``ColwiseParallel``,
    a row layer ``RowwiseParallel``, the MLP ``{"0": Colwise, "2": Rowwise}`` (the indices of
    ``nn.Sequential(fc1, GELU, fc2)``). A bug overrides one method with a wrong placement."""

    def column(self):
        from torch.distributed.tensor.parallel import ColwiseParallel
        return ColwiseParallel()          # weight Shard(0), input Replicate, output Shard(-1)

    def row(self):
        from torch.distributed.tensor.parallel import RowwiseParallel
        return RowwiseParallel()          # weight Shard(1), input Shard(-1), output Replicate

    def plan(self, kind: str):
        if kind == "mlp":
            return {"0": self.column(), "2": self.row()}
        return self.column() if kind == "column" else self.row()
