r"""The numerical check of the corruption-robust learner's regret theorem (Zhang & Cutkosky, ICML 2025).

Synthetic online problems with a known comparator u and an adversary that corrupts the learner's feedback in k
rounds; the regret :math:`R_T(u) = \sum_t\langle g_t, w_t - u\rangle` is always measured with the *true* gradients.

Problems (both with :math:`\|g_t\| = G`):

- ``linear``: online linear optimisation with zero-mean gradients :math:`g_t = G\,\sigma_t e_{i_t}` (a random sign on a
  random coordinate); the comparator is :math:`u = \|u\|\,e_1` (every u is a comparator of an OLO problem).
- ``convex``: the absolute loss :math:`f_t(w) = G\,|\langle a_t, w - u^\star\rangle|` with :math:`a_t` uniform on the
  unit sphere (optimum :math:`u^\star = \|u\|\,e_1`); its (sub)gradient :math:`G\operatorname{sign}(\langle a_t,
  w_t - u^\star\rangle)\,a_t`, and the linearised regret, which bounds the convex one.

Corruptions (the adversary sees :math:`w_t` and :math:`g_t`; every attack keeps within the budget k of the paper:
at most k rounds with :math:`\|g_t - \tilde g_t\| \ge G` and :math:`\sum_t\min(\|g_t-\tilde g_t\|, G)/G \le k`):

- ``flip``: :math:`\tilde g_t = -100\,g_t` in k rounds spread evenly over the run (large flips);
- ``bias``: :math:`\tilde g_t = g_t - \tfrac{kG}{T}\,w_t/\|w_t\|` in every round (a small persistent push outwards);
- ``push``: :math:`\tilde g_t = -100\,G\,w_t/\|w_t\|` ("go further out") in k consecutive rounds from T/4 on — the
  worst moment for a betting learner, whose wealth then compounds on fake gains.

``python -m phalanx.online.check`` prints the table of docs/online.md: the robust learner's regret and the plain
(undefended) parameter-free learner's, divided by the bare rate :math:`\|u\|G(\sqrt T + k)` ("R/rate") and by
the rate with its logarithms (:func:`reference`, "R/ref"). With ``--plot PATH`` it also draws the regret against T
(:func:`plot`).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from phalanx.errors import ConfigError
from phalanx.online.base import DTYPE, OnlineLearner
from phalanx.online.reduction import parameter_free
from phalanx.online.robust import robust

__all__ = ["ATTACKS", "PROBLEMS", "Point", "fitted_constant", "grid", "main", "plot", "rate", "reference", "regret",
           "table"]

DIM = 5
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
    ``attack`` corrupting k rounds (``PROBLEMS``, ``ATTACKS``); u = ‖u‖·e₁; the problem's randomness from ``seed``."""
    if problem not in PROBLEMS:
        raise ConfigError("problem", problem, ", ".join(PROBLEMS))
    if attack not in ATTACKS:
        raise ConfigError("attack", attack, ", ".join(ATTACKS))
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


def rate(T: int, k: int, norm_u: float, G: float = 1.0) -> float:
    """The theorem's rate without its constant and logarithms: ‖u‖·G·(√T + k)."""
    return norm_u * G * (math.sqrt(T) + k)


def reference(T: int, k: int, norm_u: float, G: float = 1.0, epsilon: float = 1.0) -> float:
    """The rate with the logarithms the Õ hides, as this construction's bounds produce them:
    ‖u‖·G·(√(T·Λ) + (1 + 2k)·Λ), Λ = ln(1 + ‖u‖T/ε) — the base learner's second-order term over T gradients of norm
    ≤ G, and its additive term ‖u‖·H·Λ with the composite bound H = (1 + 2k)G (:mod:`phalanx.online.robust`)."""
    lam = math.log1p(norm_u * T / epsilon)
    return norm_u * G * (math.sqrt(T * lam) + (1 + 2 * k) * lam)


@dataclass(frozen=True)
class Point:
    """One cell of the grid: the robust and the plain learner's regret, and the reference rate."""

    problem: str
    attack: str
    T: int
    k: int
    norm_u: float
    robust: float
    plain: float

    @property
    def scale(self) -> float:
        """:func:`reference` at this cell (G = 1, ε = 1)."""
        return reference(self.T, self.k, self.norm_u)

    @property
    def robust_ratio(self) -> float:
        return self.robust / self.scale

    @property
    def plain_ratio(self) -> float:
        return self.plain / self.scale

    @property
    def robust_rate_ratio(self) -> float:
        """The robust regret over the bare rate ‖u‖G(√T + k)."""
        return self.robust / rate(self.T, self.k, self.norm_u)


def grid(problems: Iterable[str], attacks: Iterable[str], horizons: Iterable[int], budgets: Iterable[int],
         norms: Iterable[float], seed: int = 0, epsilon: float = 1.0) -> list[Point]:
    """Every combination, robust (told k and T) and plain learner on the same problem and seed, G = 1.

    With ``attack = "none"`` the robust learner is still told the budget k (the price of the defence)."""
    out = []
    for problem in problems:
        for attack in attacks:
            for T in horizons:
                for k in budgets:
                    for nu in norms:
                        r = regret(robust(DIM, 1.0, k, T, epsilon), problem, attack, T, k, nu, seed=seed)
                        p = regret(parameter_free(DIM, 1.0, epsilon), problem, attack, T, k, nu, seed=seed)
                        out.append(Point(problem, attack, T, k, nu, r, p))
    return out


def _fmt(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1e6 else f"{x:.2e}"


def table(points: list[Point]) -> str:
    """The grid as a Markdown table."""
    lines = ["| problem | attack | T | k | ‖u‖ | robust R_T | R/rate | R/ref | plain R_T | plain R/ref |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p in points:
        lines.append(f"| {p.problem} | {p.attack} | {p.T} | {p.k} | {p.norm_u:g} | {_fmt(p.robust)} | "
                     f"{_fmt(p.robust_rate_ratio)} | {_fmt(p.robust_ratio)} | {_fmt(p.plain)} | "
                     f"{_fmt(p.plain_ratio)} |")
    return "\n".join(lines)


def fitted_constant(points: Iterable[Point]) -> float:
    """The smallest C with R_T(u) ≤ C·‖u‖G(√T + k) for the robust learner on every cell (G = 1): the largest
    robust R/rate; 0 for no cell."""
    return max((p.robust_rate_ratio for p in points), default=0.0)


def plot(points: list[Point], path: str | Path) -> Path:
    """Draw the regret against T, on log axes, into the PNG ``path``: one panel per (problem, attack, ‖u‖) — a row
    per (problem, ‖u‖), a column per attack — and one colour per k; the robust learner solid, the undefended base
    learner dotted, and the fitted bound C·‖u‖G(√T + k) dashed (C: :func:`fitted_constant` over all the cells
    drawn, so the dashed lines bound every robust point). A regret ≤ 0 has no place on a log axis and is left out
    (the learners can beat u on a short run). Returns the path written (its folder is created)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    if not points:
        raise ConfigError("points", points, "at least one cell of the grid")
    out = Path(path)
    attacks = list(dict.fromkeys(p.attack for p in points))  # columns, in the grid's order
    lines = sorted({(p.problem, p.norm_u) for p in points})  # rows
    budgets = sorted({p.k for p in points})
    c = fitted_constant(points)
    fig, axes = plt.subplots(len(lines), len(attacks), figsize=(max(6.0, 4.6 * len(attacks)), 3.6 * len(lines)),
                             squeeze=False)
    colours = plt.get_cmap("viridis")(torch.linspace(0.0, 0.9, len(budgets)).tolist())
    panels = [(problem, attack, nu) for problem, nu in lines for attack in attacks]
    for ax, (problem, attack, nu) in zip(axes.flat, panels):
        for colour, k in zip(colours, budgets):
            cell = sorted((p for p in points if (p.problem, p.attack, p.norm_u, p.k) == (problem, attack, nu, k)),
                          key=lambda p: p.T)
            if not cell:
                continue
            ts = [p.T for p in cell]
            rob = [p.robust if p.robust > 0 else float("nan") for p in cell]
            pla = [p.plain if p.plain > 0 else float("nan") for p in cell]
            ax.plot(ts, rob, "o-", color=colour, label=f"k = {k} robust")
            ax.plot(ts, pla, "s:", color=colour, alpha=0.8, label=f"k = {k} undefended")
            fine = torch.logspace(math.log10(ts[0]), math.log10(ts[-1]), 50, dtype=DTYPE).tolist()
            ax.plot(fine, [c * rate(int(t), k, nu) for t in fine], "--", color=colour, linewidth=1,
                    label=f"k = {k} bound")
        ax.set_xscale("log")
        ax.set_yscale("log")
        horizons = sorted({p.T for p in points})
        ax.set_xticks(horizons, [str(t) for t in horizons])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(f"{problem}, {attack}, ‖u‖ = {nu:g}", fontsize=10)
        ax.set_xlabel("T (rounds)")
        ax.set_ylabel("regret R_T(u)")
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.suptitle(f"Robust online learner (solid) vs the undefended base learner (dotted)\ndashed: the fitted bound "
                 f"{c:.3g}·‖u‖G(√T + k), G = 1, d = {DIM}", fontsize=10)
    fig.tight_layout()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(budgets), fontsize=8,
               frameon=False)  # one column per k: robust, undefended, bound
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m phalanx.online.check``: print the regret grid (Markdown); ``--plot PATH`` also draws it."""
    ap = argparse.ArgumentParser(prog="python -m phalanx.online.check", description=__doc__.splitlines()[0])
    ap.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=list(PROBLEMS))
    ap.add_argument("--attacks", nargs="+", default=["none", "flip", "bias", "push"], choices=list(ATTACKS))
    ap.add_argument("--horizons", nargs="+", type=int, default=[250, 1000, 4000])
    ap.add_argument("--budgets", nargs="+", type=int, default=[0, 2, 8, 32])
    ap.add_argument("--norms", nargs="+", type=float, default=[1.0, 10.0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", metavar="PATH", default=None,
                    help="also draw the regret against T (log axes, one line per k, robust vs undefended, the fitted "
                    "bound dashed) into this PNG")
    a = ap.parse_args(argv)
    pts = grid(a.problems, a.attacks, a.horizons, a.budgets, a.norms, a.seed)
    print(table(pts))
    if a.plot:
        print(f"\nplot: {plot(pts, a.plot)} (fitted C = {fitted_constant(pts):.3g})")
    rob = [p.robust_ratio for p in pts]
    pl = [p.plain_ratio for p in pts]
    print(f"\nmax R/ref: robust {_fmt(max(rob))}, plain {_fmt(max(pl))} over {len(pts)} cells (G = 1, d = {DIM})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
