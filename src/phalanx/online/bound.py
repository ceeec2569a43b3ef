r"""The regret bound the check holds the corruption-robust learner to, with every constant fixed before the checked
data are seen.

**The paper's theorem, as far as it can be read.** Zhang & Cutkosky, "Unconstrained robust online convex
optimization", ICML 2025 (PMLR 267:74756–74786; arXiv:2506.12781), the guarantee for a known gradient bound
(Section 4, Algorithm 1). Assumptions: online linear optimisation on :math:`\mathbb{R}^d`; the learner plays
:math:`w_t` and receives :math:`\tilde g_t` instead of the true :math:`g_t`; :math:`G \ge \max_t\|g_t\|` is known;
the learner is given k with :math:`|B| \le k` for :math:`B = \{t : \|g_t - \tilde g_t\| \ge G\}` and
:math:`\tfrac1G\sum_t\min(\|g_t - \tilde g_t\|, G) \le k`. Bound: for every :math:`u \in \mathbb{R}^d`,
:math:`R_T(u) = \sum_t\langle g_t, w_t - u\rangle \le \tilde O(\|u\|G(\sqrt T + k))` — the statement of the abstract
and introduction. The theorem's number, its logarithms and its constants are in the body of the paper, which no
source available to us shows (docs/online.md, "About the sources"); nothing here quotes a constant we have not seen.

**This construction's bound** (:mod:`phalanx.online.robust`: direction × magnitude, clipping at G, the soft-maximum
regulariser of weight c = 2kG with α = ε, the implicit step, coin-betting base learners). Write :math:`x_t` for the
direction, :math:`y_t` for the magnitude, :math:`s_t = \langle g_t, x_t\rangle` and :math:`\ell_t` for the clipped
scalar the magnitude is fed. Clipping is the projection onto the ball of radius G, which holds :math:`g_t`, so
:math:`|s_t - \ell_t| \le \|g_t - \tilde g^c_t\| \le 2\min(\|g_t - \tilde g_t\|, G)` and the bias is
:math:`\sum_t |s_t - \ell_t| \le 2kG`.

1. *Against u = 0, proved here, no unknown constant:*

   .. math:: R_T(0) \le (2 + 6k)\,G\epsilon .

   Proof. :math:`R_T(0) = \sum_t s_t y_t \le \sum_t \ell_t y_t + 2kG\max_t|y_t|`. With the composite gradient
   :math:`\hat g_t = \ell_t + r_t'(y_t)` and the implicit step :math:`y_t = x^X_t - \psi_t r_t'(y_t)` (X and the
   half-line learner Ψ, :mod:`phalanx.online.robust`), :math:`\sum_t \hat g_t y_t = \sum_t \hat g_t x^X_t +
   \sum_t(-\hat g_t r_t'(y_t))\psi_t \le H\epsilon + (Hc)(\epsilon/c)` — a coin bettor loses at most its initial
   wealth times its gradient bound, and the half-line loses no more than its inner learner — with H = G + c.
   And :math:`r_t'(y_t)y_t = c|y_t|^p/S_t^{1-1/p} \ge c(S_t^{1/p} - S_{t-1}^{1/p})` (as :math:`x^{1/p} \ge x` on
   [0, 1]), so :math:`\sum_t r_t'(y_t)y_t \ge c(\max_t|y_t| - \alpha)`. Hence
   :math:`R_T(0) \le 2H\epsilon + c\alpha + (2kG - c)\max_t|y_t|`, which is :math:`(2 + 6k)G\epsilon` for
   c = 2kG, α = ε. The last term is why the weight must carry k: with c = 2G (the ``no-k-term`` mutant,
   :mod:`phalanx.online.mutants`) :math:`2(k-1)G\max_t|y_t|` is left, and nothing bounds :math:`\max_t|y_t|`.

2. *Against every u, the form of the bound:* the same decomposition against :math:`U = \|u\|`, plus the direction
   learner's regret (:math:`2\sqrt2\,G\sqrt T` for adaptive OGD on the unit ball, and :math:`4kG` of bias), plus
   :math:`U\sum_t|r_t'(y_t)| \le cU e\,(p\ln(S_T^{1/p}/\alpha))^{1-1/p}` (Hölder, with :math:`T^{1/p} = e`) and the
   coin bettor's second-order regret over composite gradients of bound H, gives

   .. math:: R_T(u) \le (2 + 6k)\,G\epsilon + \|u\|\,G\,\big(A_1\sqrt{T\Lambda} + A_2\,(1 + k)\,p\,\Lambda\big),
             \qquad \Lambda = \ln(1 + \|u\|T/\epsilon),\quad p = \max(\ln T, 1).

   :math:`A_1` and :math:`A_2` stand for the base learners' constants (coin betting with ONS fractions: Cutkosky &
   Orabona, COLT 2018), which we cannot state exactly. They are **calibrated once**, on a grid of seeds and cells
   disjoint from every checked one (:func:`fit`, ``python -m phalanx.online.check --calibrate``), multiplied by a
   margin declared before any checked cell was run, and committed in ``bound_constants.json`` with the command
   that produced them. The check reads them (:func:`load`) and never refits. The k-term carries p = ln T: a
   learner that must not grow faster than its regulariser allows spends of the order of :math:`p\ln(\|u\|/\epsilon)
   (2k)^{p/(p-1)}` rounds before it reaches a far comparator (docs/online.md, "The T = 16,000 ratio").
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from phalanx.errors import ConfigError
from phalanx.files import write_atomic
from phalanx.validate import check_int, check_real

__all__ = ["CONSTANTS_FILE", "Constants", "bound", "fit", "load", "log_term", "power", "save", "zero_term"]

CONSTANTS_FILE = "bound_constants.json"
"""The committed calibration, next to this module."""


def zero_term(k: int, G: float = 1.0, epsilon: float = 1.0) -> float:
    """The proven bound against u = 0: (2 + 6k)·G·ε (item 1 of the module)."""
    return (2.0 + 6.0 * k) * G * epsilon


def log_term(T: int, norm_u: float, epsilon: float = 1.0) -> float:
    """Λ = ln(1 + ‖u‖T/ε)."""
    return math.log1p(norm_u * T / epsilon)


def power(T: int) -> float:
    """p = max(ln T, 1), the regulariser's exponent (:class:`~phalanx.online.robust.RobustMagnitude`)."""
    return max(math.log(T), 1.0)


def _sqrt_part(T: int, norm_u: float, G: float, epsilon: float) -> float:
    return norm_u * G * math.sqrt(T * log_term(T, norm_u, epsilon))


def _k_part(T: int, k: int, norm_u: float, G: float, epsilon: float) -> float:
    return norm_u * G * (1 + k) * power(T) * log_term(T, norm_u, epsilon)


@dataclass(frozen=True)
class Constants:
    """The calibrated constants: ``sqrt_term`` (A₁) and ``k_term`` (A₂) as fitted, the ``margin`` both are held
    with, and where they came from (``calibration``: the grid and seeds; ``command``: how to reproduce them)."""

    sqrt_term: float
    k_term: float
    margin: float
    calibration: dict[str, Any] = field(default_factory=dict)
    command: str = ""

    @property
    def a1(self) -> float:
        """A₁ as the check uses it: fitted × margin."""
        return self.sqrt_term * self.margin

    @property
    def a2(self) -> float:
        """A₂ as the check uses it: fitted × margin."""
        return self.k_term * self.margin

    def seeds(self) -> set[int]:
        """The seeds the calibration ran (a checked grid must use others)."""
        return {int(s) for s in self.calibration.get("seeds", [])}


def bound(T: int, k: int, norm_u: float, constants: Constants, G: float = 1.0, epsilon: float = 1.0) -> float:
    """The bound of item 2 at (T, k, ‖u‖) with the calibrated constants (margin included); at ‖u‖ = 0 it is the
    proven (2 + 6k)Gε."""
    return zero_term(k, G, epsilon) + constants.a1 * _sqrt_part(T, norm_u, G, epsilon) + constants.a2 * _k_part(
        T, k, norm_u, G, epsilon)


def fit(cells: Iterable[tuple[int, int, float, float]], G: float = 1.0, epsilon: float = 1.0) -> tuple[float, float]:
    """A₁ and A₂ from the robust learner's regret on calibration cells ``(T, k, ‖u‖, R)``: A₁ the smallest with
    (2 + 6k)Gε + A₁‖u‖G√(TΛ) ≥ R on every cell with k = 0 and ‖u‖ > 0 (the A₂ term, which the bound also carries at
    k = 0, is left out of this fit: there it is slack), then A₂ the smallest with :func:`bound` ≥ R on every cell
    with k > 0 and ‖u‖ > 0 given A₁ (both ≥ 0; no margin — :class:`Constants` holds it). A cell with ‖u‖ = 0
    above the proven (2 + 6k)Gε is a defect of the learner, not data to fit: :class:`~phalanx.errors.ConfigError`.
    Both terms need cells (k = 0 and k > 0, with ‖u‖ > 0)."""
    rows = [(check_int("T", T, low=1), check_int("k", k, low=0), check_real("norm_u", u, low=0.0), float(r))
            for T, k, u, r in cells]
    for T, k, u, r in rows:
        if u == 0 and r > zero_term(k, G, epsilon) * (1 + 1e-9):
            raise ConfigError("calibration cell", {"T": T, "k": k, "regret": r},
                              f"regret <= (2 + 6k)Gε = {zero_term(k, G, epsilon):g} against u = 0 (proven)")
    plain = [(T, u, r) for T, k, u, r in rows if k == 0 and u > 0]
    attacked = [(T, k, u, r) for T, k, u, r in rows if k > 0 and u > 0]
    if not plain or not attacked:
        raise ConfigError("calibration cells", len(rows), "cells with ‖u‖ > 0 both with k = 0 and with k > 0")
    a1 = max(0.0, max((r - zero_term(0, G, epsilon)) / _sqrt_part(T, u, G, epsilon) for T, u, r in plain))
    a2 = max(0.0, max((r - zero_term(k, G, epsilon) - a1 * _sqrt_part(T, u, G, epsilon))
                      / _k_part(T, k, u, G, epsilon) for T, k, u, r in attacked))
    return a1, a2


def _default_path() -> Path:
    return Path(str(resources.files("phalanx.online").joinpath(CONSTANTS_FILE)))


def load(path: str | Path | None = None) -> Constants:
    """The constants in ``path`` (default: the committed ``bound_constants.json``). A missing, unreadable or
    malformed file is a :class:`~phalanx.errors.ConfigError` naming it."""
    p = Path(path) if path is not None else _default_path()
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        why = f"a readable JSON file written by --calibrate ({type(e).__name__})"
        raise ConfigError("constants file", str(p), why) from None
    if not isinstance(raw, dict):
        raise ConfigError("constants file", str(p), "a JSON object written by --calibrate")
    try:
        fitted = raw["fitted"]
        c = Constants(
            sqrt_term=check_real("sqrt_term", fitted["sqrt_term"], low=0.0),
            k_term=check_real("k_term", fitted["k_term"], low=0.0),
            margin=check_real("margin", raw["margin"], low=1.0),
            calibration=dict(raw.get("calibration", {})), command=str(raw.get("command", "")),
        )
    except (KeyError, TypeError) as e:
        why = f"fitted.sqrt_term, fitted.k_term and margin ({e!r} missing)"
        raise ConfigError("constants file", str(p), why) from None
    seeds = c.calibration.get("seeds", [])
    if not isinstance(seeds, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise ConfigError("constants file", str(p), "calibration.seeds a list of integers")
    return c


def save(constants: Constants, path: str | Path) -> Path:
    """Write ``constants`` as JSON (the format :func:`load` reads); returns the path."""
    d = asdict(constants)
    out = {"form": "R_T(u) <= (2 + 6k)G·eps + |u|G·(A1·sqrt(T·L) + A2·(1 + k)·p·L), L = ln(1 + |u|T/eps), "
                   "p = max(ln T, 1); A1 = fitted.sqrt_term·margin, A2 = fitted.k_term·margin",
           "fitted": {"sqrt_term": d["sqrt_term"], "k_term": d["k_term"]}, "margin": d["margin"],
           "calibration": d["calibration"], "command": d["command"]}
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(p, (json.dumps(out, indent=2) + "\n").encode())  # a crash leaves the old file or the new, never half
    return p
