"""The single-process references of the TP checks: the same computation on the full tensors.

Each ``*_reference(layers, x, dy, t)`` runs ``nn.Linear`` (and the exact GeLU) forward and
backward on one process and returns, for every key a check's step trace or report uses, the global
tensor a rank's piece is compared with (weights in the math layout ``W = weight.T``, ``[in, out]``);
for a ``"partial"`` step, the list of per-rank partial sums ``X[.., s_r] @ W[s_r, :]``.
The checks call each twice: in the run's dtype and in float64.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mtb_helpers.comm.sharding import shard_range

__all__ = ["random_linear", "draw_inputs", "cast_linear", "linear_reference", "mlp_reference"]


def random_linear(n_in: int, n_out: int, gen: torch.Generator, dtype: torch.dtype) -> nn.Linear:
    """An ``nn.Linear(n_in, n_out)`` with weights ~ N(0, 1/n_in) and bias ~ N(0, 1) from ``gen``."""
    lin = nn.Linear(n_in, n_out, dtype=dtype)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n_out, n_in, generator=gen, dtype=dtype) / n_in ** 0.5)
        lin.bias.copy_(torch.randn(n_out, generator=gen, dtype=dtype))
    return lin


def draw_inputs(seed: int, batch: tuple[int, ...], dtype: torch.dtype,
                *shapes: tuple[int, int]) -> tuple[list[nn.Linear], torch.Tensor, torch.Tensor]:
    """What a check draws for ``seed``, in its order: one ``nn.Linear(n_in, n_out)`` per shape,
    then X ``[*batch, first n_in]`` and dY ``[*batch, last n_out]``. A notebook calls it to hold
    the very tensors the check used."""
    gen = torch.Generator().manual_seed(seed)
    layers = [random_linear(n_in, n_out, gen, dtype) for n_in, n_out in shapes]
    x = torch.randn(*batch, shapes[0][0], generator=gen, dtype=dtype)
    dy = torch.randn(*batch, shapes[-1][1], generator=gen, dtype=dtype)
    return layers, x, dy


def cast_linear(lin: nn.Linear, dtype: torch.dtype) -> nn.Linear:
    """A copy of ``lin`` in ``dtype`` (the reference never touches the layer it was given)."""
    out = nn.Linear(lin.in_features, lin.out_features, dtype=dtype)
    out.load_state_dict({k: v.to(dtype) for k, v in lin.state_dict().items()})
    return out


def _slices(n: int, t: int) -> list[slice]:
    return [slice(*shard_range(n, t, r)) for r in range(t)]


def linear_reference(layers, x, dy, t) -> dict:
    """One ``nn.Linear`` split either way: the column layer's steps (``local``, ``dx_partial``:
    the input grad of each rank's output columns) and the row layer's (``x_shard``, ``partial``:
    each rank's input rows' product, ``reduced``, ``dx_shard``)."""
    (lin,) = layers
    x = x.clone().requires_grad_(True)
    y = lin(x)
    y.backward(dy)
    y, xd, w = y.detach(), x.detach(), lin.weight.detach().T             # w: [in, out]
    return {"weight": w, "bias": lin.bias.detach(), "input": xd, "local": y, "output": y,
            "dx_partial": [dy[..., s] @ w[:, s].T for s in _slices(w.shape[1], t)],
            "x_shard": xd, "partial": [xd[..., s] @ w[s] for s in _slices(w.shape[0], t)],
            "reduced": xd @ w, "dx_shard": x.grad, "input_grad": x.grad,
            "weight_grad": lin.weight.grad.T, "bias_grad": lin.bias.grad}


def mlp_reference(layers, x, dy, t) -> dict:
    fc1, fc2 = layers
    x = x.clone().requires_grad_(True)
    h = fc1(x)
    a = F.gelu(h)            # exact (erf) GeLU, like the layer's
    h.retain_grad()
    a.retain_grad()
    y = fc2(a)
    y.backward(dy)
    w1, w2 = fc1.weight.detach().T, fc2.weight.detach().T             # [h, ffn], [ffn, h]
    dh = h.grad
    return {"fc1.weight": w1, "fc2.weight": w2, "input": x.detach(), "fc1": h.detach(),
            "act": a.detach(),
            "partial": [a.detach()[..., s] @ w2[s] for s in _slices(w2.shape[0], t)],
            "reduced": a.detach() @ w2, "output": y.detach(), "d_act": a.grad,
            "dx_partial": [dh[..., s] @ w1[:, s].T for s in _slices(w1.shape[1], t)],
            "input_grad": x.grad, "fc1.weight_grad": fc1.weight.grad.T,
            "fc1.bias_grad": fc1.bias.grad,
            "fc2.weight_grad": fc2.weight.grad.T, "fc2.bias_grad": fc2.bias.grad}
