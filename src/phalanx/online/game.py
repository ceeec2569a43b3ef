r"""The synthetic online games on which the corruption-robust learner's regret theorem is checked
(:mod:`phalanx.online.check`): problems with a known comparator u, adversaries that corrupt the learner's feedback
within the budget k of Zhang & Cutkosky (ICML 2025), and the regret measured with the *true* gradients,
:math:`R_T(u) = \sum_t\langle g_t, w_t - u\rangle`.

Problems (both with :math:`\|g_t\| = G`; the comparator is :math:`u = \|u\|\,e_1`, and ‖u‖ = 0 is allowed):

- ``linear``: online linear optimisation with zero-mean gradients :math:`g_t = G\,\sigma_t e_{i_t}` (a random sign on a
  random coordinate; every u is a comparator of an OLO problem).
- ``convex``: the absolute loss :math:`f_t(w) = G\,|\langle a_t, w - u\rangle|` with :math:`a_t` uniform on the unit
  sphere (optimum u); its (sub)gradient :math:`G\operatorname{sign}(\langle a_t, w_t - u\rangle)\,a_t`, and the
  linearised regret, which bounds the convex one.

Corruptions (the adversary sees :math:`w_t` and :math:`g_t`; every attack keeps within the paper's budget: at most k
rounds with :math:`\|g_t - \tilde g_t\| \ge G`, and :math:`\sum_t\min(\|g_t-\tilde g_t\|, G)/G \le k`):

- ``none``: :math:`\tilde g_t = g_t`.
- ``flip``: :math:`\tilde g_t = -100\,g_t` in k rounds spread evenly over the run (large flips).
- ``bias``: :math:`\tilde g_t = g_t - \tfrac{kG}{T}\,w_t/\|w_t\|` in every round (a small persistent push outwards).
- ``push``: :math:`\tilde g_t = -100\,G\,w_t/\|w_t\|` ("go further out") in k consecutive rounds from T/4 on. It is
  *adaptive* (it reads :math:`w_t`) and the one that separates the learners: a betting learner's wealth compounds
  on the fake gains, and only the regulariser's weight c = 2kG stops it (docs/online.md, "What the k-term does").
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from phalanx.errors import ConfigError
from phalanx.online.base import DTYPE, OnlineLearner
from phalanx.validate import check_int, check_real

__all__ = ["ATTACKS", "FLIP", "PROBLEMS", "reach", "regret"]

FLIP = 100.0

Gradient = Callable[[int, Tensor], Tensor]


def _unit(w: Tensor) -> Tensor:
    n = float(torch.linalg.vector_norm(w))
    if n > 0:
        return w / n
    e = torch.zeros_like(w)
    e[0] = 1.0
    return e


def _linear(T: int, G: float, u: Tensor, gen: torch.Generator) -> Gradient:
    coords = torch.randint(0, u.numel(), (T,), generator=gen)
    signs = torch.randint(0, 2, (T,), generator=gen).to(DTYPE) * 2 - 1

    def grad(t: int, w: Tensor) -> Tensor:
        g = torch.zeros(u.numel(), dtype=DTYPE)
        g[int(coords[t])] = G * float(signs[t])
        return g

    return grad


def _convex(T: int, G: float, u: Tensor, gen: torch.Generator) -> Gradient:
    a = torch.randn(T, u.numel(), generator=gen, dtype=DTYPE)
    a = a / torch.linalg.vector_norm(a, dim=1, keepdim=True)

    def grad(t: int, w: Tensor) -> Tensor:
        s = float(a[t] @ (w - u))
        return (G * (1.0 if s > 0 else -1.0 if s < 0 else 0.0)) * a[t]

    return grad


PROBLEMS: dict[str, Callable[[int, float, Tensor, torch.Generator], Gradient]] = {
    "linear": _linear, "convex": _convex,
}

Attack = Callable[[int, Tensor, Tensor, int, int, float], Tensor]


def _none(t: int, g: Tensor, w: Tensor, T: int, k: int, G: float) -> Tensor:
    return g


def _flip(t: int, g: Tensor, w: Tensor, T: int, k: int, G: float) -> Tensor:
    if k and t in {(T * (i + 1)) // (k + 1) for i in range(k)}:
        return -FLIP * g
    return g


def _bias(t: int, g: Tensor, w: Tensor, T: int, k: int, G: float) -> Tensor:
    return g - (k * G / T) * _unit(w)


def _push(t: int, g: Tensor, w: Tensor, T: int, k: int, G: float) -> Tensor:
    if T // 4 <= t < T // 4 + k:
        return -FLIP * G * _unit(w)
    return g


ATTACKS: dict[str, Attack] = {"none": _none, "flip": _flip, "bias": _bias, "push": _push}


def regret(learner: OnlineLearner, problem: str, attack: str, T: int, k: int, norm_u: float, G: float = 1.0,
           seed: int = 0) -> float:
    """The true regret :math:`\\sum_t\\langle g_t, w_t - u\\rangle` of ``learner`` over T rounds of ``problem`` with
    ``attack`` corrupting within the budget k (``PROBLEMS``, ``ATTACKS``); u = ‖u‖·e₁ (‖u‖ ≥ 0); the problem's
    randomness from ``seed``. A ``push`` needs k ≤ T − T/4 rounds to fit (``ConfigError`` otherwise)."""
    if problem not in PROBLEMS:
        raise ConfigError("problem", problem, ", ".join(PROBLEMS))
    if attack not in ATTACKS:
        raise ConfigError("attack", attack, ", ".join(ATTACKS))
    T = check_int("T", T, low=1)
    k = check_int("k", k, low=0)
    norm_u = check_real("norm_u", norm_u, low=0.0)
    G = check_real("G", G, low=0.0, low_open=True)
    if attack == "push" and k > T - T // 4:
        raise ConfigError("k", k, f"<= {T - T // 4} (push corrupts k consecutive rounds from T/4 on)")
    u = torch.zeros(learner.dim, dtype=DTYPE)
    u[0] = norm_u
    grad = PROBLEMS[problem](T, G, u, torch.Generator().manual_seed(seed))
    corrupt = ATTACKS[attack]
    total = 0.0
    for t in range(T):
        w = learner.predict()
        g = grad(t, w)
        total += float(g @ (w - u))
        learner.update(corrupt(t, g, w, T, k, G))
    return total


def reach(learner: OnlineLearner, problem: str, T: int, norm_u: float, fraction: float = 0.5, G: float = 1.0,
          seed: int = 0) -> int | None:
    """The first round t at which the learner's point reaches ``fraction``·‖u‖ (‖w_t‖ ≥ fraction·‖u‖) on
    ``problem`` without attack, or None if it does not within T rounds: how long a learner whose regulariser limits
    its growth takes to leave 0 for a far comparator (docs/online.md, "The T = 16,000 ratio")."""
    if problem not in PROBLEMS:
        raise ConfigError("problem", problem, ", ".join(PROBLEMS))
    T = check_int("T", T, low=1)
    norm_u = check_real("norm_u", norm_u, low=0.0, low_open=True)
    fraction = check_real("fraction", fraction, low=0.0, low_open=True)
    u = torch.zeros(learner.dim, dtype=DTYPE)
    u[0] = norm_u
    grad = PROBLEMS[problem](T, G, u, torch.Generator().manual_seed(seed))
    for t in range(T):
        w = learner.predict()
        if float(torch.linalg.vector_norm(w)) >= fraction * norm_u:
            return t
        learner.update(grad(t, w))
    return None
