"""FedBN: every client keeps its BatchNorm layers — affine γ, β *and* running statistics — to itself; the server
aggregates and broadcasts the other parameters only.

Li, Jiang, Zhang, Kamp & Dou, "FedBN: Federated Learning on Non-IID Features via Local Batch Normalization", ICLR
2021 (arXiv 2102.07623), Algorithm 1; code https://github.com/med-air/FedBN (``communication()`` under
``--mode fedbn`` averages every state-dict entry whose name does not contain ``bn``). With a model whose
normalisation layers are :class:`~phalanx.models.norm.FedNorm2d` in ``"fedbn"`` mode (``norm = "fedbn"``), the
parameter vector splits into the shared coordinates θ_S and the BatchNorm coordinates θ_B (every such layer's γ and
β), and every client i holds its own row of a ``(clients, 4·channels)`` table::

    rowᵢ = (γᵢ, βᵢ of every layer, in θ's order ‖ running means μᵢ ‖ running variances σ²ᵢ)

initialised from the initial model (γ = 1, β = 0, μ = 0, σ² = 1) and kept as federated averaging's own state in the
round state (``own["local_norms"]``, checkpointed as ``algorithm.local_norms``). Round t of federated averaging
(:mod:`phalanx.training.algorithms.fedavg`) then runs:

1. every sampled client starts from its *own* model θᵢ = (θ_S, θ_B := (γᵢ, βᵢ)), takes its local steps (BatchNorm in
   training mode: each batch's statistics), and after every step blends the step's batch statistics into its
   running ones as PyTorch's ``BatchNorm2d`` does (momentum 0.1, the authors' setting):
   μᵢ ← 0.9 μᵢ + 0.1 μ_b,  σ²ᵢ ← 0.9 σ²ᵢ + 0.1 · n/(n − 1) · σ²_b  (n = N·H·W values per channel);
2. it sends the shared coordinates of its pseudo-gradient only, θ_S − θᵢ,S; the rule — any Phalanx rule or chain —
   sees vectors of the shared coordinates only (as do the attacks, centered clipping's centre and FLTrust's
   reference gradient), and the server steps θ_S; θ's BatchNorm entries are never used by anyone;
3. an honest sampled client writes its new γᵢ, βᵢ, μᵢ, σ²ᵢ into its row; a client that was not sampled keeps its
   row. A Byzantine client's row is never written: its BatchNorm layers are its own and reach nobody, so what it
   does with them is irrelevant (a data attack's clients train from their initial row; a vector attack sends rows
   of shared coordinates like everyone).

Evaluation: FedBN has no global model — each client's model is (θ_S, its row). The authors test client i's model on
client i's own test split (their data sets come with one per client); with one global test set and label skew, the
equivalent is the test set re-weighted to the client's label distribution: with p_ic the share of class c in client
i's training shard and acc_i(c) its model's accuracy on the test samples of class c,

    acc_i = Σ_c p_ic · acc_i(c).

:meth:`LocalNorms.metrics` reports ``test_accuracy`` = the mean of acc_i over the evaluated honest clients (and
``test_loss`` likewise re-weighted), ``global_test_accuracy`` = the mean over them of their plain accuracy on the
whole test set, ``worst_client_accuracy`` = min_i acc_i and ``clients_evaluated``: every honest client, or an evenly
spaced subset of ``eval_clients`` of them when there are more. All evaluated models run as one ``vmap`` over
clients, in chunks of test samples; clients whose rows are equal (never sampled yet) are evaluated once.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from phalanx.models.norm import FedNorm2d, evaluating, recording

if TYPE_CHECKING:

    from phalanx.training.algorithms.base import Run
    from phalanx.training.problem import ParamLayout, Problem
    from phalanx.training.server import RoundResult, Server
    from phalanx.training.shards import WorkerData
    from phalanx.training.state import Received

STATE_KEY = "local_norms"
"""The table's name in the round algorithm's own state (and, prefixed ``algorithm.``, in a checkpoint)."""
MOMENTUM = 0.1
"""The running statistics' momentum: PyTorch's ``BatchNorm2d`` default, which the FedBN authors' models use."""
EVAL_BUDGET = 2048
"""Model-sample pairs per evaluation call: the clients evaluated together × the test samples of a chunk (the batch
of :meth:`~phalanx.training.problem.Problem.evaluate` for one model, so evaluation peaks at the same memory)."""
EVAL_GROUP = 16
"""At most this many clients' models per evaluation call: 16 models × 128 samples a call ran fastest on the 2-core
development CPU (the ``quick`` preset's CNN, 4,096 test samples: 0.57–0.78 s per model, against 0.80–0.93 s with one
model a call and 0.73–1.0 s with 64)."""


class LocalNorms:
    """A model's FedBN layers (:class:`~phalanx.models.norm.FedNorm2d`, mode ``"fedbn"``) and every client's own copy
    of them as one table (see the module's docstring). ``table`` is the current ``(clients, width)`` table, set by
    :meth:`load` (the loop loads the round state's)."""

    def __init__(self, model: nn.Module, layout: ParamLayout) -> None:
        named = [(n, m) for n, m in model.named_modules() if isinstance(m, FedNorm2d) and m.mode == "fedbn"]
        self.model = model
        self.layers = [m for _, m in named]
        self.channels = sum(m.weight.numel() for m in self.layers)
        offsets = dict(zip(layout.names, layout.offsets))
        index = [torch.arange(offsets[f"{n}.{leaf}"], offsets[f"{n}.{leaf}"] + m.weight.numel())
                 for n, m in named for leaf in ("weight", "bias")]
        self.bn_index = torch.cat(index).sort().values
        """θ's BatchNorm coordinates (every FedBN layer's γ and β), in θ's order."""
        keep = torch.ones(layout.dim, dtype=torch.bool)
        keep[self.bn_index] = False
        self.shared_index = keep.nonzero().flatten()
        """θ's shared coordinates: what the rule aggregates."""
        self.dim = layout.dim
        self.params = int(self.bn_index.numel())
        self.width = self.params + 2 * self.channels
        self.buffer_names = [f"{n}.global_mean" for n, _ in named] + [f"{n}.global_var" for n, _ in named]
        self.table: Tensor | None = None

    @classmethod
    def of(cls, model: nn.Module, layout: ParamLayout) -> LocalNorms | None:
        """The model's FedBN layers, or None when it has none."""
        has = any(isinstance(m, FedNorm2d) and m.mode == "fedbn" for m in model.modules())
        return cls(model, layout) if has else None

    # --- the table -------------------------------------------------------------------------------------------------

    def initial(self, theta: Tensor, clients: int) -> Tensor:
        """Every client's row before training, ``(clients, width)``: the initial model's γ, β and buffers."""
        means = [m.global_mean.reshape(-1) for m in self.layers]
        variances = [m.global_var.reshape(-1) for m in self.layers]
        row = torch.cat([theta[self.bn_index.to(theta.device)], *[t.to(theta) for t in means + variances]])
        return row.expand(clients, -1).clone()

    def load(self, table: Tensor) -> None:
        """Take ``table`` as every client's current rows (no copy: it is never written in place)."""
        if table.dim() != 2 or table.shape[1] != self.width:
            raise ValueError(f"the FedBN table must be (clients, {self.width}), got {tuple(table.shape)}")
        self.table = table

    def current(self) -> Tensor:
        """The loaded table."""
        if self.table is None:
            raise RuntimeError("no FedBN table loaded (Loop.open loads the round state's)")
        return self.table

    def models(self, theta: Tensor, rows: Tensor) -> Tensor:
        """The clients' own models ``(k, d)``: θ with its BatchNorm entries replaced by each row's γ, β."""
        out = theta.expand(rows.shape[0], -1).clone()
        out[:, self.bn_index.to(theta.device)] = rows[:, : self.params].to(out)
        return out

    def rows(self, models: Tensor, running: Tensor) -> Tensor:
        """Rows ``(k, width)`` from the clients' models' γ, β and their running statistics ``(k, 2·channels)``."""
        return torch.cat([models[:, self.bn_index.to(models.device)], running.to(models)], dim=1)

    def updated(self, clients: Tensor, rows: Tensor) -> Tensor:
        """A new table: the current one with ``rows`` written into the rows of ``clients`` (the current one is left
        as it is — it may be the round state being checkpointed)."""
        table = self.current().clone()
        if clients.numel():
            table[clients.to(table.device)] = rows.to(table)
        return table

    def shared(self, vectors: Tensor) -> Tensor:
        """The shared coordinates of ``(k, d)`` vectors, ``(k, d_shared)``."""
        return vectors[:, self.shared_index.to(vectors.device)]

    # --- local training --------------------------------------------------------------------------------------------

    def grads_each(self, problem: Problem, thetas: Tensor, xb: Tensor, yb: Tensor) -> tuple[Tensor, Tensor]:
        """Row i's gradient at ``thetas[i]`` on its batch, ``(W, d)`` (as :meth:`Problem.grads_each`), and the batch
        statistics every FedBN layer saw in that forward pass, ``(W, 2·channels)``: means ‖ unbiased variances — one
        ``vmap(grad)`` over the clients, the statistics as its auxiliary output."""
        w = thetas.shape[0]
        layout = problem.layout
        params = {n: thetas[:, o : o + s.numel()].detach().view(w, *s)
                  for n, s, o in zip(layout.names, layout.shapes, layout.offsets)}

        def loss(p: dict[str, Tensor], x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
            with recording(self.model, ("fedbn",)) as layers:
                logits = functional_call(self.model, (p, problem.buffers), (x,))
                seen = [(m.recorded, m.recorded_count) for m in layers]
            means = [r[0] for r, _ in seen if r is not None]
            variances = [r[1] * (n / (n - 1) if n > 1 else 1.0) for r, n in seen if r is not None]
            if len(means) != len(self.layers):
                raise RuntimeError("a FedBN layer was not run in training mode")
            value = F.cross_entropy(logits, y) if problem.loss is None else problem.loss(logits, y)
            return value, torch.cat(means + variances)

        g, stats = vmap(grad(loss, has_aux=True), in_dims=(0, 0, 0))(params, xb, yb)
        return layout.flatten(g, batch_dims=1), stats

    @staticmethod
    def track(running: Tensor, stats: Tensor, active: Tensor) -> None:
        """Blend one step's batch statistics into the running ones of the ``active`` rows, in place:
        r ← (1 − 0.1) r + 0.1 s (:data:`MOMENTUM`)."""
        if bool(active.all()):
            running.lerp_(stats.to(running), MOMENTUM)
        elif bool(active.any()):
            rows = active.to(running.device)
            running[rows] = torch.lerp(running[rows], stats[active.to(stats.device)].to(running), MOMENTUM)

    # --- the server ------------------------------------------------------------------------------------------------

    def server(self, inner: Server) -> SharedServer:
        """``inner`` (the run's server) seeing the shared coordinates only."""
        return SharedServer(inner, self.shared_index, self.dim)

    # --- evaluation ------------------------------------------------------------------------------------------------

    @staticmethod
    def evaluated_clients(honest: int, most: int) -> Tensor:
        """The honest clients whose models are evaluated: all of them, or ``most`` evenly spaced ones (the first and
        the last included) when there are more — the same every round."""
        if honest <= most:
            return torch.arange(honest)
        return torch.linspace(0, honest - 1, most, dtype=torch.float64).round().long().unique()

    def _evaluating(self) -> AbstractContextManager[nn.Module]:
        return evaluating(self.model)

    def _forward(self, problem: Problem) -> Callable[[dict[str, Tensor], dict[str, Tensor], Tensor], Tensor]:
        """``f(params, own_buffers, x)``: the model on ``x`` with the client's own running statistics."""
        shared = {k: v for k, v in problem.buffers.items() if k not in set(self.buffer_names)}

        def forward(p: dict[str, Tensor], own: dict[str, Tensor], x: Tensor) -> Tensor:
            out: Tensor = functional_call(self.model, (p, {**shared, **own}), (x,))
            return out

        return forward

    def _batched(self, problem: Problem, theta: Tensor, rows: Tensor) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The parameters and own buffers of the models of ``rows``, stacked: ``vmap``'s inputs."""
        models = self.models(theta, rows)
        k = models.shape[0]
        layout = problem.layout
        params = {n: models[:, o : o + s.numel()].view(k, *s)
                  for n, s, o in zip(layout.names, layout.shapes, layout.offsets)}
        running = rows[:, self.params :].to(theta)
        own, off = {}, 0
        for name, size in zip(self.buffer_names, [m.weight.numel() for m in self.layers] * 2):
            own[name] = running[:, off : off + size]
            off += size
        return params, own

    @torch.no_grad()
    def class_scores(
        self, problem: Problem, theta: Tensor, rows: Tensor, x: Tensor, y: Tensor, num_classes: int,
        budget: int = EVAL_BUDGET,
    ) -> tuple[Tensor, Tensor]:
        """Per model (row) and class: the correct predictions and the summed loss on the test samples of that class,
        two ``(k, num_classes)`` float64 tensors — the models of ``rows`` run together (``vmap``), ``budget``
        model-sample pairs per call."""
        k = rows.shape[0]
        correct = torch.zeros(k, num_classes, dtype=torch.float64)
        losses = torch.zeros(k, num_classes, dtype=torch.float64)
        forward = vmap(self._forward(problem), in_dims=(0, 0, None))
        group = max(1, min(k, EVAL_GROUP, budget))
        with self._evaluating():
            for a in range(0, k, group):
                params, own = self._batched(problem, theta, rows[a : a + group])
                g = rows[a : a + group].shape[0]
                chunk = max(1, budget // g)
                for s in range(0, x.shape[0], chunk):
                    xs, ys = x[s : s + chunk], y[s : s + chunk]
                    logits = forward(params, own, xs)  # (g, m, classes)
                    hit = (logits.argmax(dim=-1) == ys).double().cpu()
                    lost = self._sample_losses(problem, logits, ys).double().cpu()
                    index = ys.cpu()
                    correct[a : a + g].index_add_(1, index, hit)
                    losses[a : a + g].index_add_(1, index, lost)
        return correct, losses

    @staticmethod
    def _sample_losses(problem: Problem, logits: Tensor, y: Tensor) -> Tensor:
        """Every model's loss on every sample, ``(g, m)`` (a user's loss — a batch mean — is called per sample)."""
        g, m = logits.shape[:2]
        if problem.loss is None:
            return F.cross_entropy(logits.reshape(g * m, -1), y.repeat(g), reduction="none").view(g, m)
        loss = problem.loss
        return torch.stack([torch.stack([loss(logits[i, j : j + 1], y[j : j + 1]) for j in range(m)])
                            for i in range(g)])

    @torch.no_grad()
    def metrics(self, exp: Run, theta: Tensor, table: Tensor) -> dict[str, Any]:
        """The evaluation row's values of a FedBN run (see the module's docstring): ``test_accuracy``,
        ``test_loss``, ``global_test_accuracy``, ``worst_client_accuracy``, ``clients_evaluated`` and, for an
        attack that measures itself (a backdoor's ``attack_success``), its mean over the evaluated clients."""
        problem, test_x, test_y = exp.problem, exp.test_x, exp.test_y  # the test set on the run's device
        clients = self.evaluated_clients(exp.honest, exp.eval_clients)
        rows, which = torch.unique(table[clients.to(table.device)].cpu(), dim=0, return_inverse=True)
        classes = exp.dataset.num_classes
        correct, losses = self.class_scores(problem, theta, rows, test_x, test_y, classes)
        finite = torch.isfinite(rows).all(dim=1) & bool(torch.isfinite(self.shared(theta[None])).all())
        count = torch.bincount(test_y.cpu(), minlength=classes).double()
        seen = count > 0
        acc_c, loss_c = correct / count.clamp_min(1), losses / count.clamp_min(1)  # (models, classes)
        share = label_shares(exp.data, clients)[:, seen.nonzero().flatten()]
        total = share.sum(dim=1, keepdim=True)
        test_share = (count[seen] / count.sum()).expand_as(share)
        share = torch.where(total > 0, share / total.clamp_min(1e-300), test_share)  # no class of it in the test set
        acc = (share * acc_c[which][:, seen]).sum(dim=1)
        loss = (share * loss_c[which][:, seen]).sum(dim=1)
        plain = correct[which].sum(dim=1) / max(1.0, float(count.sum()))
        ok = finite[which]
        acc, plain = torch.where(ok, acc, 0.0), torch.where(ok, plain, 0.0)
        loss = torch.where(ok & (loss == loss), loss, float("inf"))
        out: dict[str, Any] = {
            "test_accuracy": float(acc.mean()), "test_loss": float(loss.mean()),
            "global_test_accuracy": float(plain.mean()), "worst_client_accuracy": float(acc.min()),
            "clients_evaluated": int(clients.numel()),
        }
        extra = getattr(exp.attack, "metrics", None)  # an attack's own measure, as the clients' models see it
        if callable(extra):
            per_model = [self._attack_metrics(extra, problem, theta, rows[i], test_x, test_y) if bool(finite[i])
                         else None
                         for i in range(rows.shape[0])]
            weights = torch.bincount(which, minlength=rows.shape[0]).double()
            keys = sorted({k for m in per_model if m for k in m})
            for key in keys:
                vals = [(float(weights[i]), m[key]) for i, m in enumerate(per_model) if m is not None]
                out[key] = (sum(w * v for w, v in vals) / sum(w for w, _ in vals)
                            if len(vals) == rows.shape[0] else None)
        return out

    def _attack_metrics(
        self, extra: Callable[..., dict[str, float]], problem: Problem, theta: Tensor, row: Tensor, test_x: Tensor,
        test_y: Tensor,
    ) -> dict[str, float]:
        params, own = self._batched(problem, theta, row[None])
        params = {k: v[0] for k, v in params.items()}
        own = {k: v[0] for k, v in own.items()}
        forward = self._forward(problem)

        def predict(x: Tensor) -> Tensor:
            with self._evaluating():
                out = [forward(params, own, x[s : s + EVAL_BUDGET]).argmax(dim=1)
                       for s in range(0, x.shape[0], EVAL_BUDGET)]
            return torch.cat(out) if out else torch.zeros(0, dtype=torch.long, device=x.device)

        return extra(predict, test_x, test_y)


_OF: WeakKeyDictionary[Any, LocalNorms | None] = WeakKeyDictionary()


def local_norms(problem: Problem) -> LocalNorms | None:
    """The FedBN layers of ``problem``'s model and every client's table of them (one per problem: the table it
    holds is the run's), or None when the model has none."""
    if problem not in _OF:
        _OF[problem] = LocalNorms.of(problem.model, problem.layout)
    return _OF[problem]


def label_shares(data: WorkerData, clients: Tensor) -> Tensor:
    """p_ic: the share of class c among client i's training samples, ``(len(clients), num_classes)`` float64 (a row
    of zeros for an empty shard)."""
    rows = []
    for i in clients.tolist():
        labels = data.y[data.shards[i].to(data.y.device)].cpu()
        counts = torch.bincount(labels, minlength=data.num_classes).double()
        rows.append(counts / max(1, labels.numel()))
    return torch.stack(rows) if rows else torch.zeros(0, data.num_classes, dtype=torch.float64)


class SharedServer:
    """The server of a FedBN run: ``inner`` (the run's :class:`~phalanx.training.server.Server`) on the shared
    coordinates only. The clients' vectors arrive as shared coordinates; the rule's context is restricted to them
    (the previous aggregate as centered clipping's centre, FLTrust's reference gradient); the aggregate goes back
    into θ's coordinates with zeros on the BatchNorm entries, which no client uses."""

    def __init__(self, inner: Server, shared: Tensor, dim: int) -> None:
        self.inner = inner
        self.shared = shared
        self.dim = dim

    @property
    def generator(self) -> torch.Generator:
        """The run's ``aggregator`` stream (the inner server's)."""
        return self.inner.generator

    def context(self, theta: Tensor, previous: Tensor | None) -> dict[str, Any]:
        """The inner server's context at θ, restricted to the shared coordinates."""
        index = self.shared.to(theta.device)
        context = self.inner.context(theta, None if previous is None else previous[index])
        if "reference" in context:
            context["reference"] = context["reference"][index]
        return context

    def aggregate(self, got: Received, context: dict[str, Any], measure: bool) -> tuple[Tensor, RoundResult | None]:
        """The inner server's aggregate of the shared vectors, as a vector of θ's size (zeros on BatchNorm)."""
        agg, result = self.inner.aggregate(got, context, measure)
        full = agg.new_zeros(self.dim)
        full[self.shared.to(agg.device)] = agg
        return full, result
