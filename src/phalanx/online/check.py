r"""The numerical check of the corruption-robust learner's regret bound (Zhang & Cutkosky, ICML 2025), which can fail.

The learners (:mod:`phalanx.online.mutants`: the real one and the mutants it must reject) play the synthetic games
of :mod:`phalanx.online.game`; each one's true regret is compared with the bound of :mod:`phalanx.online.bound`,
whose constants were calibrated once on a disjoint grid and are read from the committed ``bound_constants.json``,
never refitted here. A cell *breaks* the bound when :math:`R_T(u) > B(T, k, u)`; a learner is *rejected* when any
cell it ran breaks it.

``python -m phalanx.online.check`` runs a grid and prints, per cell, the bound and each learner's regret and
R/B, then which learners the check rejects; it exits with 1 when the real learner (``robust``) breaks the bound.
``--plot PATH`` draws the regret against T with the fixed bound. ``--calibrate PATH`` fits A₁ and A₂ on the grid
run (:func:`phalanx.online.bound.fit`) and writes them with the command; a checked grid must not share a seed with
the calibration's (:func:`check_disjoint`). With ``--held-out-seeds`` the calibration also runs its grid on those
seeds, which the fit never sees (:func:`split`), and checks them against the constants the ``--seeds`` fixed
(:func:`calibration_report`; exit 1 if one breaks the bound). ``--out DIR`` also writes the grid's raw results
(``points.csv``; a calibration's with each point's role, ``fit`` or ``held-out``) and the printed report
(``report.md``) there; ``--results FILE`` makes that report again from a committed ``points.csv`` of the same grid,
without running a game (:mod:`phalanx.online.results`) — for a calibration, by fitting the file's ``fit`` rows again.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import shlex
import sys
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from phalanx.errors import ConfigError
from phalanx.online import bound as bounds
from phalanx.online import mutants
from phalanx.online import results as raw
from phalanx.online.game import ATTACKS, PROBLEMS, regret

__all__ = ["DIM", "Cell", "Point", "calibrate", "calibration_report", "cells", "check_disjoint", "main", "measure",
           "plan", "plot", "rejected", "report", "split", "summary", "table", "violations"]

DIM = 5
G = 1.0

Cell = tuple[str, str, int, int, float]
"""(problem, attack, T, k, ‖u‖)."""


@dataclass(frozen=True)
class Point:
    """One learner's regret on one cell and seed."""

    problem: str
    attack: str
    T: int
    k: int
    norm_u: float
    seed: int
    learner: str
    regret: float
    epsilon: float = 1.0

    @property
    def cell(self) -> Cell:
        return (self.problem, self.attack, self.T, self.k, self.norm_u)

    def bound(self, constants: bounds.Constants) -> float:
        """B(T, k, ‖u‖) with the fixed constants (G = 1)."""
        return bounds.bound(self.T, self.k, self.norm_u, constants, G, self.epsilon)

    def ratio(self, constants: bounds.Constants) -> float:
        """R / B: above 1 the cell breaks the bound."""
        return self.regret / self.bound(constants)


def cells(problems: Iterable[str], attacks: Iterable[str], horizons: Iterable[int], budgets: Iterable[int],
          norms: Iterable[float]) -> list[Cell]:
    """Every combination, in order, without the duplicates: with k = 0 every attack is ``none``, and a ``push``
    that does not fit in T (k > T − T/4) is left out."""
    out: list[Cell] = []
    for problem in problems:
        for attack in attacks:
            for T in horizons:
                for k in budgets:
                    for nu in norms:
                        a = "none" if k == 0 else attack
                        c = (problem, a, int(T), int(k), float(nu))
                        if (a == "push" and k > T - T // 4) or c in out:
                            continue
                        out.append(c)
    return out


def _one(job: tuple[Cell, int, str, float]) -> Point:
    (problem, attack, T, k, nu), seed, learner, eps = job
    r = regret(mutants.make(learner, DIM, G, k, T, eps), problem, attack, T, k, nu, G, seed)
    return Point(problem, attack, T, k, nu, seed, learner, r, eps)


def plan(grid: Sequence[Cell], seeds: Iterable[int], learners: Iterable[str]) -> list[raw.Planned]:
    """The points a grid runs, in the order :func:`measure` runs and returns them: cell, then seed, then learner."""
    names = list(learners)
    return [(*c, int(s), n) for c in grid for s in seeds for n in names]


def measure(grid: Sequence[Cell], seeds: Iterable[int], learners: Iterable[str] = ("robust",), epsilon: float = 1.0,
            jobs: int = 1) -> list[Point]:
    """Every learner (told the cell's k and T) on every cell and seed; ``jobs`` > 1 spreads them over processes."""
    names = list(learners)
    for n in names:
        if n not in mutants.LEARNERS:
            raise ConfigError("learner", n, ", ".join(mutants.LEARNERS))
    work = [(c, int(s), n, float(epsilon)) for c in grid for s in seeds for n in names]
    if jobs <= 1 or len(work) <= 1:
        return [_one(j) for j in work]
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(_one, work, chunksize=1))


def calibrate(points: Iterable[Point], margin: float, command: str) -> bounds.Constants:
    """A₁, A₂ fitted on the ``robust`` points (:func:`phalanx.online.bound.fit`) with the declared ``margin``, the
    grid and seeds recorded."""
    pts = [p for p in points if p.learner == "robust"]
    if not pts:
        raise ConfigError("learners", [], "the robust learner among those calibrated on")
    eps = {p.epsilon for p in pts}
    if len(eps) != 1:
        raise ConfigError("epsilon", sorted(eps), "one scale ε for the whole calibration grid")
    a1, a2 = bounds.fit([(p.T, p.k, p.norm_u, p.regret) for p in pts], G, pts[0].epsilon)
    worst = max(pts, key=lambda p: p.regret / bounds.bound(p.T, p.k, p.norm_u, bounds.Constants(a1, a2, 1.0)))
    grid = {
        "problems": sorted({p.problem for p in pts}), "attacks": sorted({p.attack for p in pts}),
        "horizons": sorted({p.T for p in pts}), "budgets": sorted({p.k for p in pts}),
        "norms": sorted({p.norm_u for p in pts}), "seeds": sorted({p.seed for p in pts}), "cells": len(pts),
        "epsilon": pts[0].epsilon, "G": G, "dim": DIM, "tightest_cell": [*list(worst.cell), worst.seed],
    }
    return bounds.Constants(a1, a2, margin, grid, command)


def check_disjoint(points: Iterable[Point], constants: bounds.Constants) -> None:
    """Refuse a checked grid that shares a seed with the calibration (the constants would have seen its data)."""
    shared = sorted({p.seed for p in points} & constants.seeds())
    if shared:
        raise ConfigError("seeds", shared, f"seeds other than the calibration's {sorted(constants.seeds())}")


def violations(points: Iterable[Point], constants: bounds.Constants) -> list[Point]:
    """The points whose regret exceeds the bound."""
    return [p for p in points if p.regret > p.bound(constants)]


def rejected(points: Iterable[Point], constants: bounds.Constants) -> dict[str, int]:
    """Per learner: how many of its points break the bound (0: not rejected)."""
    out: dict[str, int] = {}
    for p in points:
        out[p.learner] = out.get(p.learner, 0) + (p.regret > p.bound(constants))
    return out


def _fmt(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1e6 else f"{x:.2e}"


def _by_cell(points: Iterable[Point]) -> dict[Cell, dict[str, list[Point]]]:
    out: dict[Cell, dict[str, list[Point]]] = {}
    for p in points:
        out.setdefault(p.cell, {}).setdefault(p.learner, []).append(p)
    return out


def table(points: list[Point], constants: bounds.Constants) -> str:
    """Markdown: one row per cell with the bound B and, per learner, the mean regret over the seeds and the largest
    R/B (above 1: the cell breaks the bound)."""
    learners = list(dict.fromkeys(p.learner for p in points))
    head = "| problem | attack | T | k | ‖u‖ | bound B | " + " | ".join(f"{n} R | {n} max R/B" for n in learners) + " |"
    lines = [head, "|---|---|---:|---:|---:|---:|" + "---:|---:|" * len(learners)]
    for cell, per in _by_cell(points).items():
        problem, attack, T, k, nu = cell
        b = bounds.bound(T, k, nu, constants, G, next(iter(per.values()))[0].epsilon)
        cols = []
        for n in learners:
            ps = per.get(n, [])
            cols.append("— | —" if not ps else
                        f"{_fmt(sum(p.regret for p in ps) / len(ps))} | {_fmt(max(p.ratio(constants) for p in ps))}")
        lines.append(f"| {problem} | {attack} | {T} | {k} | {nu:g} | {_fmt(b)} | " + " | ".join(cols) + " |")
    return "\n".join(lines)


def summary(points: list[Point], constants: bounds.Constants) -> str:
    """One line per learner: points run, points that break the bound, the range of R/B."""
    lines = []
    bad = rejected(points, constants)
    for n in dict.fromkeys(p.learner for p in points):
        rs = [p.ratio(constants) for p in points if p.learner == n]
        verdict = f"REJECTED ({bad[n]} of {len(rs)} points break the bound)" if bad[n] else "keeps the bound"
        lines.append(f"{n}: R/B in [{_fmt(min(rs))}, {_fmt(max(rs))}] over {len(rs)} points: {verdict}")
    return "\n".join(lines)


def report(points: list[Point], constants: bounds.Constants, n_cells: int, n_seeds: int) -> str:
    """What the check prints (and ``report.md`` holds): the :func:`table`, a blank line, the bound's constants, then
    the :func:`summary` lines."""
    return (f"{table(points, constants)}\n\nbound: A1 = {constants.a1:.4g}, A2 = {constants.a2:.4g} (fitted × margin "
            f"{constants.margin:g}, seeds {sorted(constants.seeds())}); {n_cells} cells × {n_seeds} seeds, G = 1, "
            f"d = {DIM}\n{summary(points, constants)}\n")


def split(points: Iterable[Point], fit_seeds: Iterable[int]) -> tuple[list[Point], list[Point]]:
    """A calibration's points kept apart, each list in its order: those of a fitting seed (the only ones
    :func:`calibrate` may see) and the held-out rest (checked against the constants the first fitted)."""
    fs = {int(s) for s in fit_seeds}
    pts = list(points)
    return [p for p in pts if p.seed in fs], [p for p in pts if p.seed not in fs]


def calibration_report(fit: list[Point], held: list[Point], constants: bounds.Constants) -> str:
    """What ``--calibrate`` prints (and ``report.md`` holds): per cell, B with the constants as used (fitted ×
    margin) and the mean regret and largest R/B of the fit points and of the held-out points, apart; then the
    fitted constants with the seeds and number of points *the fit recorded seeing* (``constants.calibration``, not
    the command line), the constants as used, and one verdict line per role. A held-out seed among those the fit
    saw is said on the held-out line, and no held-out verdict is drawn: its data would have set the constants."""
    roles = [("fit", fit), ("held-out", held)] if held else [("fit", fit)]
    per: dict[Cell, dict[str, list[Point]]] = {}
    for role, pts in roles:
        for p in pts:
            per.setdefault(p.cell, {}).setdefault(role, []).append(p)
    lines = ["| problem | attack | T | k | ‖u‖ | bound B | " + " | ".join(f"{r} R | {r} max R/B" for r, _ in roles)
             + " |", "|---|---|---:|---:|---:|---:|" + "---:|---:|" * len(roles)]
    for cell, by in per.items():
        problem, attack, T, k, nu = cell
        first = next(iter(by.values()))[0]
        cols = []
        for r, _ in roles:
            ps = by.get(r, [])
            cols.append("— | —" if not ps else
                        f"{_fmt(sum(p.regret for p in ps) / len(ps))} | {_fmt(max(p.ratio(constants) for p in ps))}")
        lines.append(f"| {problem} | {attack} | {T} | {k} | {nu:g} | {_fmt(first.bound(constants))} | "
                     + " | ".join(cols) + " |")
    cal = constants.calibration
    seen = sorted(constants.seeds())
    tight = cal.get("tightest_cell", [])
    where = (f"{tight[0]}, {tight[1]}, T = {tight[2]}, k = {tight[3]}, ‖u‖ = {float(tight[4]):g}, seed {tight[5]}"
             if len(tight) == 6 else "—")
    lines += ["", f"fit: A1 = {constants.sqrt_term:.3g}, A2 = {constants.k_term:.3g} ({constants.sqrt_term!r}, "
                  f"{constants.k_term!r}), fitted on the {cal.get('cells', 0)} points of seeds {seen} (role fit) "
                  f"and no others; tightest: {where}",
              f"used: A1 = {constants.a1:.4g}, A2 = {constants.a2:.4g} (fitted × margin {constants.margin:g}), "
              f"the bound B of every row, G = {G:g}, d = {DIM}"]
    held_seeds = sorted({p.seed for p in held})
    entered = sorted(set(held_seeds) & constants.seeds())
    if not held:
        lines.append("held out: none (no --held-out-seeds)")
    elif entered:
        lines.append(f"held out: {len(held)} points of seeds {held_seeds}, but seeds {entered} ENTERED THE FIT: "
                     f"no held-out verdict")
    else:
        lines.append(f"held out: {len(held)} points of seeds {held_seeds} (role held-out), none of them in the fit")
    for role, pts in roles:
        if role == "held-out" and entered:
            continue
        rs = [p.ratio(constants) for p in pts]
        bad = sum(r > 1 for r in rs)
        verdict = f"REJECTED ({bad} of {len(rs)} points break the bound)" if bad else "keeps the bound"
        lines.append(f"{role}: R/B in [{_fmt(min(rs))}, {_fmt(max(rs))}] over {len(rs)} points: {verdict}")
    return "\n".join(lines) + "\n"


def _calibrate(a: argparse.Namespace, grid: Sequence[Cell], command: str) -> int:
    """``--calibrate PATH``: fit A₁, A₂ on the ``--seeds`` points only, check the ``--held-out-seeds`` points
    against them, print the :func:`calibration_report` and write the constants to PATH (and, with ``--out``, the
    raw results and the report; with ``--results``, every point read from a points file, no game run). Exit 1 when
    a held-out point breaks the bound."""
    shared = sorted(set(a.seeds) & set(a.held_out_seeds))
    if shared:
        raise ConfigError("held-out-seeds", shared, f"seeds other than the fitted ones {sorted(set(a.seeds))}")
    planned = [(p, "fit") for p in plan(grid, a.seeds, ["robust"])]
    planned += [(p, "held-out") for p in plan(grid, a.held_out_seeds, ["robust"])]
    if a.results:
        got = raw.read_calibration(Path(a.results), planned)
        pts = [Point(*p, r, a.epsilon) for (p, _), (r, _) in zip(planned, got)]
    else:
        pts = measure(grid, [*a.seeds, *a.held_out_seeds], ["robust"], a.epsilon, a.jobs)
    fit, held = split(pts, a.seeds)
    try:
        c = calibrate(fit, a.margin, command)
    except ConfigError as exc:
        if not a.results:
            raise
        raise ConfigError("results", a.results, f"regrets a calibration can fit ({exc})") from None
    if a.results:
        raw.check_bounds(Path(a.results), [p for p, _ in planned], [b for _, b in got], c, G, a.epsilon,
                         f"the constants its fit rows give (× margin {a.margin:g})")
    if held:
        c = bounds.Constants(c.sqrt_term, c.k_term, c.margin,
                             {**c.calibration, "held_out_seeds": sorted({p.seed for p in held})}, c.command)
    text = calibration_report(fit, held, c)
    print(text, end="")
    print(f"\nA1 = {c.sqrt_term:.4g}, A2 = {c.k_term:.4g} (fitted on {len(fit)} points), margin {c.margin:g}: "
          f"{bounds.save(c, a.calibrate)}")
    if a.out:
        rows = [((p.problem, p.attack, p.T, p.k, p.norm_u, p.seed, p.learner), role, p.regret, p.bound(c))
                for role, ps in (("fit", fit), ("held-out", held)) for p in ps]
        print(f"raw results and report: {raw.save(Path(a.out), raw.write_calibration(rows), text)}")
    return 1 if any(p.regret > p.bound(c) for p in held) else 0


def plot(points: list[Point], constants: bounds.Constants, path: str | Path) -> Path:
    """The regret against T on log axes into the PNG ``path``: a row per (problem, ‖u‖), a column per attack, a
    colour per k; the mean over the seeds of each learner (``robust`` solid, the others dotted or dash-dotted) and
    the fixed bound B (dashed, :func:`phalanx.online.bound.bound`: the same for every learner, not fitted to the
    points drawn). A regret ≤ 0 has no place on a log axis and is left out. Returns the path (its folder created)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    if not points:
        raise ConfigError("points", points, "at least one point")
    out = Path(path)
    attacks = list(dict.fromkeys(p.attack for p in points))
    rows = sorted({(p.problem, p.norm_u) for p in points})
    budgets = sorted({p.k for p in points})
    learners = list(dict.fromkeys(p.learner for p in points))
    styles = {n: s for n, s in zip(["robust", *[n for n in learners if n != "robust"]], ["o-", "s:", "^-.", "v:",
                                                                                             "d-."])}
    eps = points[0].epsilon
    fig, axes = plt.subplots(len(rows), len(attacks), figsize=(max(6.0, 4.6 * len(attacks)), 3.6 * len(rows)),
                             squeeze=False)
    colours = plt.get_cmap("viridis")([0.9 * i / max(1, len(budgets) - 1) for i in range(len(budgets))])
    horizons = sorted({p.T for p in points})
    for ax, (problem, nu, attack) in zip(axes.flat, [(pr, nu, a) for pr, nu in rows for a in attacks]):
        for colour, k in zip(colours, budgets):
            ts_drawn: list[int] = []
            for n in learners:
                per = sorted({p.T for p in points if (p.problem, p.attack, p.norm_u, p.k, p.learner) ==
                              (problem, attack, nu, k, n)})
                if not per:
                    continue
                ys = []
                for T in per:
                    rs = [p.regret for p in points if (p.problem, p.attack, p.norm_u, p.k, p.learner, p.T) ==
                          (problem, attack, nu, k, n, T)]
                    m = sum(rs) / len(rs)
                    ys.append(m if m > 0 else float("nan"))
                ax.plot(per, ys, styles.get(n, "x-"), color=colour, alpha=1.0 if n == "robust" else 0.75,
                        label=f"k = {k} {n}")
                ts_drawn = sorted(set(ts_drawn) | set(per))
            if ts_drawn:
                fine = [math.exp(math.log(ts_drawn[0]) + i * (math.log(ts_drawn[-1]) - math.log(ts_drawn[0])) / 49)
                        for i in range(50)] if ts_drawn[-1] > ts_drawn[0] else ts_drawn
                ax.plot(fine, [bounds.bound(max(1, round(t)), k, nu, constants, G, eps) for t in fine], "--",
                        color=colour, linewidth=1, label=f"k = {k} bound")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(horizons, [str(t) for t in horizons])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(f"{problem}, {attack}, ‖u‖ = {nu:g}", fontsize=10)
        ax.set_xlabel("T (rounds)")
        ax.set_ylabel("regret R_T(u)")
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.suptitle(f"Regret against T (mean over seeds); dashed: the fixed bound (2 + 6k)Gε + ‖u‖G(A₁√(TΛ) + "
                 f"A₂(1 + k)pΛ), A₁ = {constants.a1:.3g}, A₂ = {constants.a2:.3g} (calibrated on seeds "
                 f"{sorted(constants.seeds())}), G = 1, d = {DIM}", fontsize=9)
    fig.tight_layout()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(budgets), fontsize=8,
               frameon=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m phalanx.online.check``: the grid's table and verdicts; ``--plot``; ``--calibrate``; ``--out``;
    ``--results``."""
    ap = argparse.ArgumentParser(prog="python -m phalanx.online.check", description=__doc__.splitlines()[0])
    ap.add_argument("--problems", nargs="+", default=["convex"], choices=list(PROBLEMS))
    ap.add_argument("--attacks", nargs="+", default=["none", "push"], choices=list(ATTACKS))
    ap.add_argument("--horizons", nargs="+", type=int, default=[250, 1000, 4000])
    ap.add_argument("--budgets", nargs="+", type=int, default=[0, 8, 32, 128])
    ap.add_argument("--norms", nargs="+", type=float, default=[0.0, 1.0, 10.0])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--learners", nargs="+", default=["robust", "plain"], choices=list(mutants.LEARNERS))
    ap.add_argument("--epsilon", type=float, default=1.0, help="the learners' scale ε (default 1)")
    ap.add_argument("--jobs", type=int, default=1, help="processes to spread the runs over")
    ap.add_argument("--constants", default=None, help="a constants file other than the committed one")
    ap.add_argument("--plot", metavar="PATH", default=None, help="also draw the regret against T with the fixed bound")
    ap.add_argument("--calibrate", metavar="PATH", default=None,
                    help="fit A1, A2 on this grid (robust learner) and write them to PATH instead of checking")
    ap.add_argument("--margin", type=float, default=1.25, help="with --calibrate: the factor A1, A2 are held with")
    ap.add_argument("--held-out-seeds", nargs="+", type=int, default=[], metavar="SEED",
                    help="with --calibrate: also run the grid on these seeds, never fitted, and check them against "
                         "the constants the --seeds fitted")
    ap.add_argument("--out", metavar="DIR", default=None,
                    help="also write the raw results (points.csv) and the report (report.md) into DIR")
    ap.add_argument("--results", metavar="CSV", default=None,
                    help="make the report from this points.csv of the same grid instead of running it")
    a = ap.parse_args(argv)
    if a.held_out_seeds and not a.calibrate:
        raise ConfigError("held-out-seeds", a.held_out_seeds, "with --calibrate only (a check's seeds are all "
                                                              "held out)")
    grid = cells(a.problems, a.attacks, a.horizons, a.budgets, a.norms)
    if a.calibrate:
        cmd = "python -m phalanx.online.check " + " ".join(shlex.quote(x) for x in (argv if argv is not None
                                                                                      else sys.argv[1:]))
        return _calibrate(a, grid, cmd)
    constants = bounds.load(a.constants)
    check_disjoint([Point("", "", 1, 0, 0.0, s, "", 0.0) for s in a.seeds], constants)
    if a.results:
        planned = plan(grid, a.seeds, a.learners)
        regrets = raw.read(Path(a.results), planned, constants, G, a.epsilon)
        pts = [Point(*p, r, a.epsilon) for p, r in zip(planned, regrets)]
    else:
        pts = measure(grid, a.seeds, a.learners, a.epsilon, a.jobs)
    text = report(pts, constants, len(grid), len(a.seeds))
    head, tail = text.split("\n\n", 1)
    print(head)
    if a.plot:
        print(f"\nplot: {plot(pts, constants, a.plot)}")
    print("\n" + tail, end="")
    if a.out:
        rows = [((p.problem, p.attack, p.T, p.k, p.norm_u, p.seed, p.learner), p.regret, p.bound(constants))
                for p in pts]
        print(f"\nraw results and report: {raw.save(Path(a.out), raw.write(rows), text)}")
    return 1 if rejected(pts, constants).get("robust", 0) else 0


def _cli() -> int:
    """:func:`main` as a command: a refused input (a :class:`~phalanx.errors.ConfigError`: a hostile ``--results``
    file, seeds shared with the calibration) is one line on stderr and exit code 2, as with ``phalanx``."""
    try:
        return main()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(_cli())
