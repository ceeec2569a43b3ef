"""A learning problem in flat-vector form: the model's parameters as one vector θ, per-worker gradients as rows.

All honest workers of a round are computed in one call: ``torch.func.vmap(torch.func.grad(loss))`` over the
workers' batches, with :func:`torch.func.functional_call` running the user's unmodified ``nn.Module`` on parameters
that are *views* of θ (the gradient is taken with respect to a dict of views, then concatenated, which is faster
than slicing one flat vector inside the model; docs/benchmarks.md). :meth:`Problem.grads_loop` is the plain
per-worker loop, kept for the tests that check both give the same gradients. Fully connected ReLU networks under
the default cross-entropy (``logreg``, ``mlp``) skip ``vmap``: their per-worker gradients are a few batched matrix
products (:mod:`phalanx.training.linear_stack`, the same numbers); ``per_worker="vmap"`` forces ``vmap``.

The loss is a parameter: ``loss(logits, y)`` returning the mean over the batch (default
``torch.nn.functional.cross_entropy``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from phalanx.errors import ConfigError
from phalanx.models.norm import evaluating
from phalanx.training.linear_stack import LinearStack, blend_rows

Loss = Callable[[Tensor, Tensor], Tensor]
"""``loss(logits, y)``: a scalar, the mean over the batch's samples."""


@dataclass(frozen=True)
class ParamLayout:
    """Names, shapes and offsets of a model's *trainable* parameters inside the flat vector θ.

    A parameter with ``requires_grad = False`` (a pre-trained base under LoRA adapters, :mod:`phalanx.models.hf`)
    is not in θ: it never travels, is never aggregated, and :func:`torch.func.functional_call` reads it from the
    one model of the process (so the frozen base is held once, however many workers there are). A model whose
    parameters all require gradients — every built-in — has the layout it always had."""

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    offsets: tuple[int, ...]
    dim: int

    @classmethod
    def of(cls, model: nn.Module) -> ParamLayout:
        names, shapes, offsets = [], [], []
        off = 0
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            names.append(name)
            shapes.append(p.shape)
            offsets.append(off)
            off += p.numel()
        return cls(tuple(names), tuple(shapes), tuple(offsets), off)

    def views(self, theta: Tensor) -> dict[str, Tensor]:
        """Parameter tensors as views of ``theta`` (no copy)."""
        return {
            n: theta[o : o + s.numel()].view(s) for n, s, o in zip(self.names, self.shapes, self.offsets)
        }

    def flatten(self, tensors: dict[str, Tensor], batch_dims: int = 0) -> Tensor:
        """Concatenate per-parameter tensors (with ``batch_dims`` leading dims) into flat rows."""
        parts = [tensors[n].reshape(*tensors[n].shape[:batch_dims], -1) for n in self.names]
        return torch.cat(parts, dim=batch_dims)


class Problem:
    """A model and its loss, seen as a function of the flat parameter vector θ."""

    def __init__(self, model: nn.Module, per_worker: str = "auto", loss: Loss | None = None) -> None:
        if per_worker not in ("auto", "vmap"):
            raise ConfigError("per_worker", per_worker, "'auto' (explicit back-propagation where it applies) or 'vmap'")
        if not isinstance(model, nn.Module):
            raise ConfigError("model", type(model).__name__, "a torch.nn.Module")
        if loss is not None and not callable(loss):
            raise ConfigError("loss", loss, "a function loss(logits, y) -> scalar (the batch mean), or None")
        self.model = model
        self.loss = None if loss is F.cross_entropy else loss  # the default: the fast explicit paths apply
        self.layout = ParamLayout.of(model)
        self.buffers = dict(model.named_buffers())
        # explicit back-propagation for fully connected ReLU stacks under cross-entropy (None: vmap(grad))
        self.stack = LinearStack.of(model) if per_worker == "auto" and self.loss is None else None
        self._offsets = dict(zip(self.layout.names, self.layout.offsets))

    def _eval_mode(self) -> AbstractContextManager[nn.Module]:
        """The model in evaluation mode (normalisation layers use the global statistics) for a prediction."""
        return evaluating(self.model)

    @property
    def dim(self) -> int:
        """Number of trainable parameters d."""
        return self.layout.dim

    def initial_theta(self) -> Tensor:
        """The model's current trainable parameters as one flat vector (a copy)."""
        params = dict(self.model.named_parameters())
        return torch.cat([params[n].detach().reshape(-1) for n in self.layout.names]).clone()

    def _loss(self, params: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        logits = functional_call(self.model, (params, self.buffers), (x,))
        return F.cross_entropy(logits, y) if self.loss is None else self.loss(logits, y)

    def grads(self, theta: Tensor, xb: Tensor, yb: Tensor) -> Tensor:
        """Per-worker gradients ``(W, d)`` of the mean loss on batches ``xb (W, B, ...)``, ``yb (W, B)``."""
        if self.stack is not None:
            out = torch.empty(xb.shape[0], self.dim, dtype=theta.dtype, device=theta.device)
            return self.accumulate_grads(theta, xb, yb, out, 1.0)
        params = {k: v.detach() for k, v in self.layout.views(theta).items()}
        per_worker = vmap(grad(self._loss), in_dims=(None, 0, 0))(params, xb, yb)
        return self.layout.flatten(per_worker, batch_dims=1)

    def grads_each(self, thetas: Tensor, xb: Tensor, yb: Tensor) -> Tensor:
        """Gradients ``(W, d)`` when every worker has parameters of its own: row i of ``thetas (W, d)`` on batch
        ``(xb[i], yb[i])`` — one ``vmap(grad)`` over the stacked parameters (federated clients after their first
        local step); fully connected ReLU stacks take explicit back-propagation with batched matrix products
        (:meth:`~phalanx.training.linear_stack.LinearStack.grads_each`, the same numbers)."""
        if thetas.dim() != 2 or thetas.shape != (xb.shape[0], self.dim):
            raise ValueError(f"thetas must be ({xb.shape[0]}, {self.dim}), got {tuple(thetas.shape)}")
        w = thetas.shape[0]
        params = {
            n: thetas[:, o : o + s.numel()].detach().view(w, *s)
            for n, s, o in zip(self.layout.names, self.layout.shapes, self.layout.offsets)
        }
        if self.stack is not None:  # fully connected ReLU stack: explicit back-propagation, batched over workers
            out = torch.empty(w, self.dim, dtype=thetas.dtype, device=thetas.device)
            return self.stack.grads_each(params, self._offsets, xb, yb, out)
        per_worker = vmap(grad(self._loss), in_dims=(0, 0, 0))(params, xb, yb)
        return self.layout.flatten(per_worker, batch_dims=1)

    def accumulate_grads(
        self, theta: Tensor, xb: Tensor, yb: Tensor, out: Tensor, weight: float, weight_decay: float = 0.0,
    ) -> Tensor:
        """``out ← (1 − weight)·out + weight·(gᵢ + weight_decay·θ)`` row by row, with gᵢ as in :meth:`grads`.

        The worker-momentum update mᵢ ← β mᵢ + (1 − β) gᵢ (``weight = 1 − β``; ``weight = 1`` writes gᵢ) fused
        with the gradient: each parameter's ``(W, *shape)`` gradient from ``vmap`` goes straight into its columns
        of ``out`` (a ``(W, d)`` tensor whose rows are contiguous, e.g. rows of the momentum buffer), so the
        ``(W, d)`` matrix of flat gradients is never built — that copy cost as much as the momentum update itself.
        Returns ``out``.
        """
        if out.dim() != 2 or out.shape != (xb.shape[0], self.dim) or out.stride(1) != 1:
            raise ValueError(f"out must be a row-contiguous ({xb.shape[0]}, {self.dim}) tensor, got {tuple(out.shape)}")
        params = {k: v.detach() for k, v in self.layout.views(theta).items()}
        if self.stack is not None:
            return self.stack.accumulate(params, self._offsets, xb, yb, out, weight, weight_decay)
        if xb.shape[0] == 1:  # one worker (a torchrun rank): plain autograd, cheaper than vmap(grad) for one row
            per_worker = {k: g[None] for k, g in self._autograd_grads(theta, xb[0], yb[0]).items()}
        else:
            per_worker = vmap(grad(self._loss), in_dims=(None, 0, 0))(params, xb, yb)
        for name, off in zip(self.layout.names, self.layout.offsets):
            blend_rows(out, off, per_worker[name], params[name], weight, weight_decay)
        return out

    def _autograd_grads(self, theta: Tensor, x: Tensor, y: Tensor) -> dict[str, Tensor]:
        """One worker's gradient by ordinary reverse mode on leaf views of θ (no functorch transform)."""
        leaves = {k: v.detach().requires_grad_() for k, v in self.layout.views(theta).items()}
        with torch.enable_grad():
            loss = self._loss(leaves, x, y)
            grads = torch.autograd.grad(loss, list(leaves.values()))
        return dict(zip(leaves, grads))

    def grads_loop(self, theta: Tensor, xb: Tensor, yb: Tensor) -> Tensor:
        """The same as :meth:`grads` with a Python loop over workers (reference for tests)."""
        params = {k: v.detach() for k, v in self.layout.views(theta).items()}
        rows = [self.layout.flatten(grad(self._loss)(params, xb[i], yb[i])) for i in range(xb.shape[0])]
        return torch.stack(rows)

    @torch.no_grad()
    def predict(self, theta: Tensor, x: Tensor, batch: int = 2048) -> Tensor:
        """The predicted class of every input of ``x`` under θ (argmax of the logits), ``(N,)``."""
        params = self.layout.views(theta)
        with self._eval_mode():
            out = [functional_call(self.model, (params, self.buffers), (x[s : s + batch],)).argmax(dim=1)
                   for s in range(0, x.shape[0], batch)]
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.long, device=x.device)

    @torch.no_grad()
    def evaluate(self, theta: Tensor, x: Tensor, y: Tensor, batch: int = 2048) -> tuple[float, float]:
        """``(accuracy, mean loss)`` of θ on a data set (non-finite θ gives accuracy 0 and loss inf)."""
        if not bool(torch.isfinite(theta).all()):
            return 0.0, float("inf")
        params = self.layout.views(theta)
        correct, total_loss = 0, 0.0
        for s in range(0, x.shape[0], batch):
            with self._eval_mode():
                logits = functional_call(self.model, (params, self.buffers), (x[s : s + batch],))
            if self.loss is None:
                total_loss += float(F.cross_entropy(logits, y[s : s + batch], reduction="sum"))
            else:
                total_loss += float(self.loss(logits, y[s : s + batch])) * logits.shape[0]
            correct += int((logits.argmax(dim=1) == y[s : s + batch]).sum())
        n = max(1, x.shape[0])
        loss = total_loss / n
        return correct / n, loss if loss == loss else float("inf")
