r"""Heterogeneous learning problems for the no-attack convergence bounds (:mod:`phalanx.analysis.convergence`), and
full-batch gradient descent with a robust rule on them.

A :class:`Problem` is n workers' objectives :math:`F_i(\theta) = \sum_s W_{is}\, \ell_s(\theta) + \frac\lambda2
\|\theta\|^2` over one sample pool (row i of W: weight :math:`1/N_i` on worker i's :math:`N_i` samples, 0 elsewhere)
and :math:`F = \frac1n\sum_i F_i`. Three models:

* ``least-squares`` — :math:`\ell_s = \frac12\|\Theta^\top \tilde x_s - e_{y_s}\|^2` (one-hot targets,
  :math:`\tilde x = (x, 1)`): a quadratic; μ and L are the extreme eigenvalues of its constant Hessian (exact), F* is
  the solution of one linear system.
* ``logistic`` — softmax cross-entropy of :math:`\Theta^\top \tilde x_s`: λ-strongly convex, hence μ-PL with
  μ = λ (global, the constant the bound may use everywhere); L ≤ λ + ½ λ_max(the weighted Gram matrix) (Böhning's
  bound on the softmax Hessian, Ann. Inst. Stat. Math. 1992); F* by Newton's method (with backtracking) to
  ‖∇F‖ ≤ 1e-12‖θ‖.
* ``mlp`` — one tanh hidden layer, softmax cross-entropy: non-convex (smooth); its bound is on ‖∇F‖².

:func:`descend` runs :math:`\theta_{t+1} = \theta_t - \eta\,\mathrm{Agg}(\nabla F_1(\theta_t), \dots,
\nabla F_n(\theta_t))` in float64 with a real rule and records, per round, F, ‖∇F‖², the heterogeneity
:math:`\zeta^2(\theta_t) = \frac1n\sum_i\|\nabla F_i - \nabla F\|^2` and the rule's realised aggregation error
:math:`\|\mathrm{Agg} - \nabla F\|^2/\zeta^2`. The n worker gradients of a round are one
forward pass over the pool and, per worker, one product per parameter block (:meth:`Problem.worker_gradients`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F_
from torch import Tensor

from phalanx.aggregators.base import Aggregator
from phalanx.errors import ConfigError
from phalanx.validate import check_choice, check_int, check_real

MODELS = ("least-squares", "logistic", "mlp")


@dataclass
class Problem:
    """n workers' objectives over one sample pool (module docstring); float64."""

    model: str
    x: Tensor
    """(N, p) features."""
    y: Tensor
    """(N,) int64 labels in 0 … classes − 1."""
    owner: Tensor
    """(N,) int64: the worker that holds each sample."""
    sample_weight: Tensor
    """(N,): 1/N_i for a sample of worker i."""
    segments: list[tuple[int, int]]
    """Worker i's samples are rows ``segments[i][0] … segments[i][1] − 1`` (the pool is sorted by worker)."""
    workers: int
    classes: int
    lam: float
    hidden: int = 32
    theta0: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))
    """The start (zeros for the linear models, a seeded draw for the MLP)."""

    @property
    def weights(self) -> Tensor:
        """(n, N): row i puts 1/N_i on worker i's samples (W in the module docstring)."""
        w = torch.zeros(self.workers, self.x.shape[0], dtype=torch.float64)
        w[self.owner, torch.arange(self.x.shape[0])] = self.sample_weight
        return w

    @property
    def params(self) -> int:
        return int(self.theta0.numel())

    def _logits(self, theta: Tensor) -> Tensor:
        n_feat = self.x.shape[1]
        if self.model == "mlp":
            h, c = self.hidden, self.classes
            w1 = theta[: n_feat * h].view(n_feat, h)
            b1 = theta[n_feat * h: n_feat * h + h]
            rest = theta[n_feat * h + h:]
            w2 = rest[: h * c].view(h, c)
            b2 = rest[h * c:]
            return torch.tanh(self.x @ w1 + b1) @ w2 + b2
        w = theta.view(n_feat + 1, self.classes)
        return self.x @ w[:-1] + w[-1]

    def losses(self, theta: Tensor) -> Tensor:
        """Per-sample losses ℓ_s(θ), shape (N,)."""
        z = self._logits(theta)
        if self.model == "least-squares":
            return 0.5 * (z - F_.one_hot(self.y, self.classes).to(z.dtype)).square().sum(dim=1)
        return F_.cross_entropy(z, self.y, reduction="none")

    def value(self, theta: Tensor) -> float:
        """F(θ)."""
        with torch.no_grad():
            ell = self.losses(theta)
            return float(self.sample_weight @ ell) / self.workers + 0.5 * self.lam * float(theta @ theta)

    def worker_gradients(self, theta: Tensor) -> tuple[Tensor, float]:
        """(∇F_i(θ) for every worker, shape (n, P); F(θ)).

        ℓ_s depends on θ only through sample s, and each sample belongs to one worker, so ∇F_i = Σ_{s of i}
        ∇ℓ_s/N_i + λθ: the per-sample gradients (outer products of inputs and back-propagated errors, written out
        here; the tests check them against autograd), weighted and summed per worker (``index_add_``)."""
        with torch.no_grad():
            xt = self.x
            big_n, n_feat, c = xt.shape[0], xt.shape[1], self.classes
            if self.model == "mlp":
                h = self.hidden
                w1 = theta[: n_feat * h].view(n_feat, h)
                b1 = theta[n_feat * h: n_feat * h + h]
                w2 = theta[n_feat * h + h: n_feat * h + h + h * c].view(h, c)
                b2 = theta[n_feat * h + h + h * c:]
                hid = torch.tanh(xt @ w1 + b1)
                z = hid @ w2 + b2
            else:
                w = theta.view(n_feat + 1, c)
                z = xt @ w[:-1] + w[-1]
            onehot = F_.one_hot(self.y, c).to(z.dtype)
            if self.model == "least-squares":
                r = z - onehot
                ell = 0.5 * r.square().sum(dim=1)
            else:
                logp = torch.log_softmax(z, dim=1)
                r = logp.exp() - onehot
                ell = -(logp * onehot).sum(dim=1)
            r = r * self.sample_weight[:, None]  # each sample's output error, weighted 1/N_i
            ones = torch.ones(big_n, 1, dtype=xt.dtype)
            if self.model == "mlp":
                delta = (r @ w2.T) * (1 - hid.square())  # (N, h)
                pairs = [(torch.cat([xt, ones], dim=1), delta), (torch.cat([hid, ones], dim=1), r)]
            else:
                pairs = [(torch.cat([xt, ones], dim=1), r)]
            # the samples are sorted by worker (make_problem): worker i's block of Σ_s a_s b_sᵀ is A[i]ᵀ B[i]
            g = torch.stack([torch.cat([(a[lo:hi].T @ b[lo:hi]).reshape(-1) for a, b in pairs])
                             for lo, hi in self.segments])
            value = float(self.sample_weight @ ell) / self.workers + 0.5 * self.lam * float(theta @ theta)
            return g + self.lam * theta, value


def make_problem(model: str, x: Tensor, y: Tensor, parts: list[Tensor], *, lam: float, hidden: int = 32,
                 seed: int = 0) -> Problem:
    """A :class:`Problem` from a sample pool (``x`` (N, p), ``y`` (N,)) split into ``parts`` (each worker's sample
    indices); the MLP's start is drawn from ``seed`` (PyTorch's default initialisation scale 1/√fan_in)."""
    model = check_choice("model", model, MODELS)
    lam = check_real("lam", lam, low=0.0)
    if model != "mlp" and lam == 0.0 and model == "logistic":
        raise ConfigError("lam", lam, "a finite number > 0 for logistic", "without it the problem is not PL")
    hidden = check_int("hidden", hidden, low=1)
    if not parts or any(len(p) == 0 for p in parts):
        raise ConfigError("parts", [len(p) for p in parts], "a non-empty list of non-empty index sets")
    xd = x.reshape(x.shape[0], -1).to(torch.float64)
    n, big_n = len(parts), xd.shape[0]
    owner = torch.full((big_n,), -1, dtype=torch.int64)
    sample_weight = torch.zeros(big_n, dtype=torch.float64)
    for i, idx in enumerate(parts):
        if bool((owner[idx] >= 0).any()):
            raise ConfigError("parts", "overlapping index sets", "disjoint index sets (each sample one worker's)")
        owner[idx] = i
        sample_weight[idx] = 1.0 / len(idx)
    held = torch.nonzero(owner >= 0).squeeze(1)  # samples no worker holds are left out of the pool
    order = held[torch.argsort(owner[held], stable=True)]  # sorted by worker
    xd, y, owner, sample_weight = xd[order], y[order], owner[order], sample_weight[order]
    ends = torch.cumsum(torch.tensor([len(p) for p in parts]), 0).tolist()
    segments = [(0 if i == 0 else int(ends[i - 1]), int(ends[i])) for i in range(n)]
    classes = int(y.max()) + 1
    p = xd.shape[1]
    if model == "mlp":
        gen = torch.Generator().manual_seed(seed)

        def draw(fan_in: int, *shape: int) -> Tensor:
            return (2 * torch.rand(*shape, generator=gen, dtype=torch.float64) - 1) / math.sqrt(fan_in)

        theta0 = torch.cat([draw(p, p * hidden), draw(p, hidden), draw(hidden, hidden * classes),
                            draw(hidden, classes)])
    else:
        theta0 = torch.zeros((p + 1) * classes, dtype=torch.float64)
    return Problem(model, xd, y.to(torch.int64), owner, sample_weight, segments, n, classes, lam, hidden, theta0)


@dataclass(frozen=True)
class Curvature:
    """μ (the PL constant the bound uses), L (a smoothness constant), F* and θ* of a convex :class:`Problem`."""

    mu: float
    L: float
    f_star: float
    theta_star: Tensor


def curvature(problem: Problem) -> Curvature:
    """μ, L, F* of a least-squares or logistic problem (module docstring); the MLP has none (a ConfigError)."""
    if problem.model == "mlp":
        raise ConfigError("model", problem.model, "least-squares or logistic (a PL problem)")
    xt = torch.cat([problem.x, torch.ones(problem.x.shape[0], 1, dtype=torch.float64)], dim=1)
    wbar = problem.sample_weight / problem.workers  # F = Σ_s w̄_s ℓ_s + (λ/2)‖θ‖²
    gram = xt.T @ (wbar[:, None] * xt)
    eig = torch.linalg.eigvalsh(gram)
    lam = problem.lam
    if problem.model == "least-squares":
        mu, big_l = float(eig[0]) + lam, float(eig[-1]) + lam
        if mu <= 0:
            raise ConfigError("lam", lam, "a number > 0 here", "the features' Gram matrix is singular: F is not PL")
        targets = F_.one_hot(problem.y, problem.classes).to(torch.float64)
        rhs = xt.T @ (wbar[:, None] * targets)
        w = torch.linalg.solve(gram + lam * torch.eye(gram.shape[0], dtype=torch.float64), rhs)
        theta = w.reshape(-1)
        return Curvature(mu, big_l, problem.value(theta), theta)
    mu, big_l = lam, lam + 0.5 * float(eig[-1])
    t = problem.theta0.clone()
    value = problem.value(t)
    for _ in range(50):  # Newton's method with backtracking: quadratic convergence to rounding
        g = problem.worker_gradients(t)[0].mean(dim=0)
        if float(g.norm()) <= 1e-12 * max(1.0, float(t.norm())):
            break
        step = torch.linalg.solve(_softmax_hessian(problem, t, xt, wbar), g)
        size = 1.0
        while size > 1e-8:
            trial = t - size * step
            if problem.value(trial) <= value:
                break
            size /= 2
        t, value = trial, problem.value(trial)
    theta = t
    return Curvature(mu, big_l, problem.value(theta), theta)


def _softmax_hessian(problem: Problem, theta: Tensor, xt: Tensor, wbar: Tensor) -> Tensor:
    """∇²F of softmax regression: Σ_s w̄_s (diag(p_s) − p_s p_sᵀ) ⊗ x̃_s x̃_sᵀ + λI, in θ's layout (feature, class)."""
    c = problem.classes
    prob = torch.softmax(xt @ theta.view(-1, c), dim=1)  # (N, C); xt has the ones column
    k = xt.shape[1]
    h4 = torch.zeros(k, c, k, c, dtype=torch.float64)
    for j in range(c):
        h4[:, j, :, j] = xt.T @ ((wbar * prob[:, j])[:, None] * xt)
    z = (xt[:, :, None] * prob[:, None, :]).reshape(xt.shape[0], k * c).float()
    # the largest product in float32: Newton's steps then contract by ~1e-6 each, the gradient stays exact (float64)
    cross = (z.T @ (wbar.float()[:, None] * z)).double()
    return h4.reshape(k * c, k * c) - cross + problem.lam * torch.eye(k * c, dtype=torch.float64)


@dataclass(frozen=True)
class Trace:
    """Per round t = 0 … steps of :func:`descend`: F, ‖∇F‖², ζ², and the rule's realised aggregation error."""

    value: Tensor
    grad_sq: Tensor
    zeta2: Tensor
    ratio: Tensor


def descend(problem: Problem, rule: Aggregator, eta: float, steps: int) -> Trace:
    """Full-batch GD with ``rule`` on ``problem`` for ``steps`` rounds from ``problem.theta0`` (module docstring)."""
    eta = check_real("eta", eta, low=0.0, low_open=True)
    steps = check_int("steps", steps, low=1)
    if problem.workers < rule.min_workers():
        raise ConfigError("workers", problem.workers, f"n >= {rule.min_workers()} for {rule!r} ({rule.requirement})")
    theta = problem.theta0.clone()
    rows = torch.empty(4, steps + 1, dtype=torch.float64)
    for t in range(steps + 1):
        g, value = problem.worker_gradients(theta)
        mean = g.mean(dim=0)
        zeta2 = float((g - mean).square().sum(dim=1).mean())
        agg = rule(g)
        err = float((agg - mean).square().sum())
        rows[:, t] = torch.tensor([value, float(mean.square().sum()), zeta2, err / zeta2 if zeta2 > 0 else 0.0])
        if not math.isfinite(value):
            rows[:, t + 1:] = float("nan")
            break
        if t < steps:
            theta = theta - eta * agg
    return Trace(rows[0], rows[1], rows[2], rows[3])
