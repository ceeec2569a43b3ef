"""Per-worker gradients of fully connected ReLU networks by explicit back-propagation, fused with worker momentum.

For ``Flatten → Linear → ReLU → … → Linear`` (the ``logreg`` and ``mlp`` models) every worker evaluates the *same*
parameters θ on its own batch, so the forward pass of all W workers is one matrix product per layer over the
stacked ``W·B`` samples, and so is the backward pass of the layer inputs. Only the weight gradients are per worker:
with ``δₗ = ∂ℓ/∂zₗ`` (``zₗ = hₗ₋₁ Wₗᵀ + bₗ``) for the samples of worker i,

    ∇_{Wₗ} ℓᵢ = δₗ,ᵢᵀ hₗ₋₁,ᵢ   (a batched matrix product over workers),   ∇_{bₗ} ℓᵢ = Σ_samples δₗ,ᵢ,

and for the mean cross-entropy over a worker's B samples, ``δ_L = (softmax(z_L) − onehot(y)) / B``;
``δₗ₋₁ = (δₗ Wₗ) ⊙ 1[hₗ₋₁ > 0]`` (``hₗ₋₁ = relu(zₗ₋₁)`` is positive exactly where ``zₗ₋₁`` is; ReLU's subgradient
at 0 is 0, as in autograd). This is the per-example-gradient construction of Goodfellow ("Efficient per-example
gradient computations", arXiv:1510.01799, 2015) applied per worker instead of per example.

Compared with ``vmap(grad(...))`` (which computes the same numbers), it skips functorch's batching rules and the
per-worker copies of the activations' gradients; with many workers both are bound by the same matrix products
(measured in docs/benchmarks.md, "Training rounds"). Any other model — convolutions, normalisation
layers, other activations — goes through ``vmap``; :meth:`LinearStack.of` decides.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class _Layer:
    weight: str  # parameter name of the weight (out, in) in the layout
    bias: str | None


@dataclass(frozen=True)
class LinearStack:
    """The layers of a ``[Flatten →] Linear (→ ReLU → Linear)*`` ``nn.Sequential``, by parameter name."""

    layers: tuple[_Layer, ...]

    @classmethod
    def of(cls, model: nn.Module) -> LinearStack | None:
        """The stack if ``model`` is exactly such a network with no buffers, else ``None`` (use ``vmap``)."""
        if type(model) is not nn.Sequential or any(True for _ in model.buffers()):
            return None
        mods = list(model.named_children())
        if mods and type(mods[0][1]) is nn.Flatten:
            flat = mods[0][1]
            if flat.start_dim != 1 or flat.end_dim != -1:
                return None
            mods = mods[1:]
        if len(mods) % 2 == 0:  # Linear, then (ReLU, Linear) pairs: an odd count
            return None
        layers = []
        for k, (name, mod) in enumerate(mods):
            if k % 2 == 1:
                if type(mod) is not nn.ReLU:
                    return None
                continue
            if type(mod) is not nn.Linear:
                return None
            layers.append(_Layer(f"{name}.weight", f"{name}.bias" if mod.bias is not None else None))
        names = [n for n, _ in model.named_parameters()]
        expected = [n for layer in layers for n in (layer.weight, layer.bias) if n is not None]
        if names != expected:  # shared or frozen parameters: not this simple form
            return None
        return cls(tuple(layers))

    def accumulate(
        self, params: dict[str, Tensor], offsets: dict[str, int], xb: Tensor, yb: Tensor, out: Tensor, weight: float,
        weight_decay: float,
    ) -> Tensor:
        """``out[i] ← (1 − weight)·out[i] + weight·(gᵢ + weight_decay·θ)``, gᵢ the gradient of worker i's mean
        cross-entropy on ``(xb[i], yb[i])``; ``out`` is ``(W, d)`` with contiguous rows, laid out as ``offsets``."""
        w_count, batch = yb.shape
        h = xb.reshape(w_count * batch, -1)
        inputs: list[Tensor] = []  # each layer's input h_{l-1} (after the first: a ReLU output)
        last = len(self.layers) - 1
        for k, layer in enumerate(self.layers):
            inputs.append(h)
            wt = params[layer.weight]
            z = torch.addmm(params[layer.bias], h, wt.t()) if layer.bias else h @ wt.t()
            h = torch.relu_(z) if k < last else z
        # δ_L = (softmax(z_L) − onehot(y)) / B: the gradient of each worker's *mean* loss over its own batch
        delta = torch.softmax(h, dim=1)
        minus_one = torch.full((w_count * batch, 1), -1.0, dtype=delta.dtype, device=delta.device)
        delta.scatter_add_(1, yb.reshape(-1, 1), minus_one)
        delta.mul_(1.0 / batch)
        for k in range(last, -1, -1):
            layer = self.layers[k]
            wt = params[layer.weight]
            o, i = wt.shape
            d3 = delta.view(w_count, batch, o)
            grad_w = torch.bmm(d3.transpose(1, 2), inputs[k].view(w_count, batch, i))
            blend_rows(out, offsets[layer.weight], grad_w, wt, weight, weight_decay)
            if layer.bias is not None:
                blend_rows(out, offsets[layer.bias], d3.sum(dim=1), params[layer.bias], weight, weight_decay)
            if k > 0:  # ReLU's backward, fused (cheaper than multiplying by a boolean mask)
                delta = torch.ops.aten.threshold_backward(delta @ wt, inputs[k], 0)
        return out

    def grads_each(self, params: dict[str, Tensor], offsets: dict[str, int], xb: Tensor, yb: Tensor,
                   out: Tensor) -> Tensor:
        """``out[i] ← gᵢ``, the gradient of worker i's mean cross-entropy on ``(xb[i], yb[i])`` at *its own*
        parameters: ``params`` holds every parameter stacked over the workers, ``(W, *shape)`` (federated clients
        after their first local step). The same back-propagation as :meth:`accumulate` with a batched matrix
        product per layer in the forward pass too: ``zₗ,ᵢ = hₗ₋₁,ᵢ Wₗ,ᵢᵀ + bₗ,ᵢ``,
        ``δₗ₋₁,ᵢ = (δₗ,ᵢ Wₗ,ᵢ) ⊙ 1[hₗ₋₁,ᵢ > 0]``."""
        w_count, batch = yb.shape
        h = xb.reshape(w_count, batch, -1)
        inputs: list[Tensor] = []
        last = len(self.layers) - 1
        for k, layer in enumerate(self.layers):
            inputs.append(h)
            wt = params[layer.weight]
            z = (torch.baddbmm(params[layer.bias][:, None, :], h, wt.transpose(1, 2)) if layer.bias
                 else torch.bmm(h, wt.transpose(1, 2)))
            h = torch.relu_(z) if k < last else z
        delta = torch.softmax(h, dim=2)
        minus_one = torch.full((w_count, batch, 1), -1.0, dtype=delta.dtype, device=delta.device)
        delta.scatter_add_(2, yb.unsqueeze(2), minus_one)
        delta.mul_(1.0 / batch)
        for k in range(last, -1, -1):
            layer = self.layers[k]
            wt = params[layer.weight]
            o, i = wt.shape[1:]
            start = offsets[layer.weight]
            out[:, start : start + o * i] = torch.bmm(delta.transpose(1, 2), inputs[k]).view(w_count, o * i)
            if layer.bias is not None:
                out[:, offsets[layer.bias] : offsets[layer.bias] + o] = delta.sum(dim=1)
            if k > 0:
                delta = torch.ops.aten.threshold_backward(torch.bmm(delta, wt), inputs[k], 0)
        return out


def blend_rows(out: Tensor, offset: int, grad: Tensor, param: Tensor, weight: float, weight_decay: float) -> None:
    """One parameter's columns of the ``(W, d)`` rows ``out`` (from ``offset``): ``← (1 − weight)·out + weight·(gᵢ +
    weight_decay·param)`` with ``grad`` the workers' ``(W, *param.shape)`` gradients (``weight = 1`` writes them)."""
    w_count = out.shape[0]
    cols = out[:, offset : offset + param.numel()].view(w_count, *param.shape)
    if weight == 1.0:
        cols.copy_(grad)
    else:
        cols.lerp_(grad, weight)
    if weight_decay:
        cols.add_(param, alpha=weight * weight_decay)
