"""The analysis commands: ``phalanx demo``, ``phalanx epsilon``, ``phalanx kappa`` and ``phalanx tension theory``
— a rule's constants and the price of robustness, without training."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer

from phalanx import __version__
from phalanx.cli.common import _STDERR, SeedOption, _fmt, app, console
from phalanx.cli.output import FormatOption, Tabular, check_format, emit
from phalanx.cli.runs import _duration, _forewarn
from phalanx.cli.studies import tension_app
from phalanx.errors import PhalanxError


@app.command()
def demo(
    workers: Annotated[int, typer.Option("--workers", "-n", min=3, help="Number of workers n.")] = 20,
    byzantine: Annotated[int, typer.Option("--byzantine", "-b", min=0, help="Workers that actually attack.")] = 4,
    f: Annotated[int, typer.Option("--f", "-f", min=0, help="Byzantine workers the rules are configured for.")] = 4,
    dim: Annotated[int, typer.Option("--dim", "-d", min=1, help="Vector dimension d.")] = 100_000,
    seed: SeedOption = 0,
    fmt: FormatOption = "table",
) -> None:
    """Aggregation demo: every rule on the same honest vectors, with no attack, an ALIE attack and NaN rows.

    Prints, per rule, the error of its output against the honest mean (relative to the honest spread, the
    quantity whose worst case is ε), the share of the output it gave to the Byzantine rows, and its speed.
    """
    import torch

    from phalanx import aggregators
    from phalanx.analysis import aggregation_error, lower_bound

    fmt = check_format(fmt)
    if byzantine >= workers:
        raise typer.BadParameter(f"--byzantine={byzantine} must be < --workers={workers}")
    gen = torch.Generator().manual_seed(seed)
    honest = torch.randn(workers - byzantine, dim, generator=gen) * 0.5 + torch.randn(dim, generator=gen)
    mu, sigma = honest.mean(0), honest.std(0)
    # ALIE (Baruch et al., NeurIPS 2019): every Byzantine row sends mean − z·std with z = 1.
    alie = torch.cat([honest, (mu - 1.0 * sigma).expand(byzantine, dim)])
    nan = torch.cat([honest, torch.full((byzantine, dim), float("nan"))])
    clean = torch.cat([honest, honest[:byzantine] + 0.01 * torch.randn(byzantine, dim, generator=gen)])
    (console if fmt == "table" else _STDERR).print(
        f"[bold]Phalanx {__version__} aggregation demo[/bold]: n={workers}, {byzantine} Byzantine, rules configured "
        f"for f={f}, d={dim}. The errors below are on one random input; ε is a rule's worst case over every input, "
        f"and any f-robust rule's ε ≥ f/(n−f) = {lower_bound(workers, f):.3f} (Yang, Shi & Li, ICML 2025) — a "
        "bound on that worst case, which a typical input's error may lie far below."
    )
    cols = ("rule", "ε (proven)", "error, no attack", "error, ALIE", "error, NaN rows", "Byz. share (ALIE)",
            f"ms (median of {TIMED_CALLS})")
    table = Tabular("error = ‖Agg − honest mean‖² / honest spread (lower is better)", cols, right=cols[1:])
    specs = [s for s in ("mean", "cwmed", "cwtm", "meamed", "krum", "multikrum", "geomed", "mda", "bulyan", "cc",
                         "nnm>cwtm", "bucketing>cwtm", "arc>cwtm", "dnc", "signguard", "clippedclustering")
             if s.split(">")[-1] in aggregators.names("rule") and all(p in aggregators.names() for p in s.split(">"))]
    for spec in specs:
        try:
            rule = aggregators.make(spec, f=f)
            rule(clean)  # warm-up (first call of a kernel)
            ms = _median_ms(functools.partial(rule, clean), TIMED_CALLS)
            out_clean = rule(clean)
            out_alie, contrib = rule.aggregate(alie)
            out_nan = rule(nan)
        except PhalanxError as exc:
            table.add(spec, "", str(exc), "", "", "", "")
            continue
        byz_share = float(contrib[workers - byzantine:].sum()) if byzantine else 0.0
        table.add(
            spec, _fmt(rule.epsilon(workers)), _fmt(aggregation_error(out_clean, clean)),
            _fmt(aggregation_error(out_alie, honest)), _fmt(aggregation_error(out_nan, honest)), f"{byz_share:.2f}",
            f"{ms:.1f}",
        )
    emit(table, fmt, console)


TIMED_CALLS = 5
"""Calls of a rule the demo times, after a warm-up: one call read anything from 1 to 44 ms for the mean on a shared
machine, where the median of five stayed under a millisecond (a first-hour review)."""


def _median_ms(call: Any, k: int) -> float:
    """The median wall time of ``k`` calls of ``call``, in milliseconds."""
    times = []
    for _ in range(k):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[k // 2]


def _search_threads() -> None:
    """The ε and κ searches run at one intra-op thread: their tensors are tiny (n·d numbers), a second thread only
    waits, and on a busy 2-core machine CMA-ES's eigh spun 10-50× slower at 2 threads than at 1 (issue 38). One fixed
    count also makes a search's result the same on every machine (a large --dim would otherwise sum per thread), and
    the docs' tables were made at 1 (scripts/docs_check.py). The count the process had comes back when the command
    ends (a caller running commands in process, a test among them, keeps its own)."""
    import click
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    context = click.get_current_context(silent=True)
    if context is not None:
        context.call_on_close(lambda: torch.set_num_threads(before))


@app.command("epsilon")
def epsilon_cmd(
    spec: Annotated[str, typer.Argument(help="Aggregator spec, e.g. cwtm or nnm>krum.")],
    workers: Annotated[int, typer.Option("--workers", "-n", min=1, help="Number of workers n.")] = 16,
    f: Annotated[int, typer.Option("--f", "-f", min=0, help="Byzantine workers tolerated.")] = 3,
    trials: Annotated[int, typer.Option("--trials", min=0, help="Random inputs to try.")] = 200,
    budget: Annotated[int, typer.Option("--budget", min=0, help="Rule evaluations of the CMA-ES search.")] = 2000,
    dim: Annotated[int, typer.Option("--dim", "-d", min=1, help="Dimension of the inputs.")] = 8,
    seed: SeedOption = 0,
) -> None:
    """A certified lower bound on a rule's no-attack aggregation error factor ε (known constructions, random inputs
    and a CMA-ES search, the best input recomputed exactly), beside its proven ε or upper bound; exit status 1 when
    the measured value is above a proven bound (a bug)."""
    from phalanx import aggregators
    from phalanx.analysis import epsilon

    _search_threads()
    est = epsilon(aggregators.make(spec, f=f), workers, d=dim, trials=trials, seed=seed, budget=budget)
    proven = (f"ε = {est.theory:.4g} — {est.theory_source}" if est.theory is not None else
              f"nothing; ε ≤ {est.upper:.4g} — {est.upper_source}" if est.upper is not None else
              "nothing, and no upper bound")
    found = ("unbounded: an input makes the output non-finite" if math.isinf(est.value) else
             f"ε ≥ {est.value:.4g}, a certified lower bound (the ratio at the worst input found, recomputed exactly)"
             if est.exact else f"ε ≥ {est.value:.4g}, a lower bound (the ratio at the worst input found, in float64)")
    lines = [f"{spec} (n = {workers}, f = {f}): {found}",
             f"  worst input: {est.worst_input} ({est.evaluations} rule evaluations, seed {seed})",
             f"  proven: {proven}",
             f"  every (f, κ)-robust rule has ε ≥ f/(n−f) = {est.lower_bound:.4g}"]
    if est.above_upper:
        lines.append(f"  BUG: the measured value is above the proven bound by more than rounding ({est.slack:.3g})")
    for line in lines:
        console.print(line, soft_wrap=True, highlight=False, markup=False)
    if est.above_upper:
        raise typer.Exit(1)


def _ranges(rows: tuple[int, ...]) -> str:
    """Increasing row indices as ranges: ``0–7, 9``."""
    parts: list[str] = []
    start = prev = None
    for i in [*rows, None]:
        if i is not None and prev is not None and i == prev + 1:
            prev = i
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}–{prev}")
        start = prev = i
    return ", ".join(parts)


@app.command("kappa")
def kappa_cmd(
    spec: Annotated[str, typer.Argument(help="Aggregator spec, e.g. cwtm or nnm>krum.")],
    workers: Annotated[int, typer.Option("--workers", "-n", help="Number of workers n.")] = 10,
    f: Annotated[int, typer.Option("--f", "-f", help="Byzantine workers f (0 <= f < n/2).")] = 2,
    dim: Annotated[int, typer.Option("--dim", "-d", help="Dimension d of the inputs.")] = 10,
    seed: SeedOption = 0,
    budget: Annotated[int, typer.Option("--budget", help="Rule evaluations the search may spend.")] = 2000,
) -> None:
    """Measure a certified lower bound on a rule's (f, κ)-robustness coefficient (Allouah et al., AISTATS 2023):
    the worst input a search finds, beside the proven upper bound and the bound f/(n−2f) of every rule."""
    from phalanx import aggregators
    from phalanx.analysis import kappa
    from phalanx.analysis.kappa import check_setting

    check_setting(workers, f, dim, budget, seed)  # before the rule is built: an unknown rule comes after
    _search_threads()
    est = kappa(aggregators.make(spec, f=f), workers, d=dim, budget=budget, seed=seed)
    upper = "unknown" if est.upper_bound is None else f"{est.upper_bound:.4g}"
    measured = ("a non-finite output (the rule returned NaN or ∞)" if not est.output_finite else
                f"unbounded (the ratio reaches {est.value:.3g} and grows with the Byzantine rows' distance)"
                if est.unbounded else f"≥ {est.value:.3g} (float64 rounding: no larger error found)" if est.rounding
                else f"≥ {est.value:.4f} (certified)")
    if not est.unbounded_tested:
        measured += " — whether it is bounded was not tested: the budget ended before the far inputs (raise --budget)"
    console.print(
        f"{spec} (n={workers}, f={f}, d={dim}): measured κ {measured}; proven κ ≤ {upper}; every rule has "
        f"κ ≥ f/(n−2f) = {est.lower_bound:.4f}", soft_wrap=True, highlight=False)
    console.print(
        f"worst input: {est.worst_input}; set S = rows {_ranges(est.honest)}; "
        f"{'exact' if est.exact else 'float64'}, {est.evaluations} evaluations, seed {seed}",
        soft_wrap=True, highlight=False, markup=False)
    if est.above_upper and not est.output_finite:
        console.print(f"[red]BUG:[/red] the rule's output is not finite at the worst input, though its proven κ is "
                      f"{upper}", soft_wrap=True, highlight=False)
        raise typer.Exit(1)
    if est.above_upper:
        console.print(f"[red]BUG:[/red] the measured κ exceeds the proven bound {upper} by more than the float64 "
                      f"rounding {est.slack:.3g}", soft_wrap=True, highlight=False)
        raise typer.Exit(1)




_ECHO_ERR = functools.partial(typer.echo, err=True)


class _TheoryProgress:
    """``tension theory --measure``'s progress on stderr (stdout holds the table alone): after each (rule, f) one
    line — ``krum f=3: 12/32 (rule, f) measured in 0:01:05, ETA 0:01:48``. With ``costs`` (each pair's predicted
    seconds, :func:`phalanx.analysis.tension.cell_costs`) the ETA is the pairs left's predicted seconds, scaled by
    how the pairs done compare with theirs (the load now, the probe's error); without, the pairs done extrapolated
    over the pairs left. Rules differ tenfold in what a pair costs (at n = 16, d = 8 cwtm's took 0.07 s, geomed's
    0.6 s), so extrapolating cwtm's first pairs said 0:00:37 for a 5 min 14 s table (issue 38). ``clock`` gives
    seconds (monotonic), ``echo`` prints a line."""

    def __init__(self, total: int, *, clock: Callable[[], float] = time.monotonic,
                 echo: Callable[[str], None] = _ECHO_ERR, costs: Sequence[float] | None = None) -> None:
        self.total, self.clock, self.echo, self.costs = max(1, total), clock, echo, costs
        self.done = 0
        self.start = clock()

    def left(self, elapsed: float) -> float:
        """Seconds the pairs left should take, after ``elapsed`` seconds for the :attr:`done` first ones."""
        if self.costs is None:
            return elapsed / self.done * (self.total - self.done)
        done, left = sum(self.costs[:self.done]), sum(self.costs[self.done:])
        return left * elapsed / done if done > 0 else left

    def __call__(self, rule: str, f: int) -> None:
        self.done += 1
        elapsed = self.clock() - self.start
        eta = "" if self.done >= self.total else f", ETA {_duration(self.left(elapsed))}"
        self.echo(f"{rule} f={f}: {self.done}/{self.total} (rule, f) measured in {_duration(elapsed)}{eta}")


THEORY_RULES = ("cwtm", "cwmed", "geomed", "krum", "multikrum", "meamed", "nnm>cwtm")
"""``tension theory``'s rules by default (:data:`phalanx.analysis.tension.DEFAULT_RULES`, without importing torch)."""

THEORY_SMALLER = ("fewer rules (--rules), a smaller n (-n), a smaller --budget, --kappa-budget or --trials; Ctrl-C "
                  "stops it")
"""How to make ``tension theory --measure`` smaller, said with its estimate over the budget."""


def _theory_estimate(cost: Any) -> Any:
    """``cost`` (a :class:`phalanx.analysis.tension.CostEstimate`) as :func:`phalanx.cli.runs._forewarn` reads an
    estimate: ``seconds`` and ``text()`` — ``about 4.1 min for 56 (rule, f) (…)``."""
    from types import SimpleNamespace

    from phalanx.experiments.estimate import duration

    slowest = cost.slowest
    source = "" if slowest is None else (f"; the slowest rule, {slowest}, {cost.probed[slowest]:.2g} s a pair, from "
                                         f"{cost.probed[slowest] * cost.share:.2g} s for a {cost.share:g} share of one")
    text = (f"about {duration(cost.seconds)} for {len(cost.costs)} (rule, f) — each rule's {cost.share:g} share of "
            f"one (rule, f) timed here, now, and scaled up{source}")
    return SimpleNamespace(seconds=cost.seconds, text=lambda: text)


@tension_app.command("theory")
def tension_theory(
    workers: Annotated[int, typer.Option("--workers", "-n", min=2, help="Number of workers n.")] = 16,
    rules: Annotated[str, typer.Option(
        "--rules", show_default=False,  # the default in the help's words: as a default it was cropped (issue 38)
        help="Comma-separated aggregator specs (default: " + ", ".join(THEORY_RULES) + ").")] = ",".join(THEORY_RULES),
    measure: Annotated[bool, typer.Option("--measure", help="Also measure ε (worst cases + random search) and a "
                                          "certified lower bound on κ (phalanx kappa).")] = False,
    trials: Annotated[int, typer.Option("--trials", min=0, help="Random inputs per (rule, f) when measuring.")] = 100,
    kappa_budget: Annotated[int, typer.Option("--kappa-budget", min=1, help="Rule evaluations per (rule, f) of the "
                                              "κ search when measuring.")] = 300,
    budget: Annotated[int, typer.Option("--budget", min=0, help="Rule evaluations per (rule, f) of the ε search's "
                                        "CMA-ES when measuring.")] = 2000,
    dim: Annotated[int, typer.Option("--dim", "-d", min=1, help="Dimension of the measured inputs.")] = 8,
    fmt: FormatOption = "table",
) -> None:
    """For f = 0 … ⌊(n−1)/2⌋: each rule's ε and κ beside the lower bounds ε ≥ f/(n−f) and κ ≥ f/(n−2f) (and with
    --measure the measured ε and the certified lower bound on κ)."""
    from phalanx.analysis import tension

    fmt = check_format(fmt)
    specs = [r.strip() for r in rules.split(",") if r.strip()]
    progress = None
    if measure:
        _search_threads()
        progress = _TheoryProgress(tension.cells(workers, specs))
        progress.echo(f"Measuring ε ({trials} random inputs, then {budget} rule evaluations of CMA-ES) and a certified "
                      f"lower bound on κ ({kappa_budget} rule evaluations) for {len(specs)} rule(s) × every f at "
                      f"n = {workers}, d = {dim}: {progress.total} (rule, f), a line after each; Ctrl-C stops it")
        estimates: list[Any] = []

        def guess() -> Any:  # each rule's share of a pair, timed: the total, and the ETA's weights
            cost = tension.cell_costs(workers, specs, d=dim, trials=trials, budget=budget, kappa_budget=kappa_budget)
            progress.costs = cost.costs
            estimates.append(_theory_estimate(cost))
            return estimates[-1]

        _forewarn("measurement", f"a {tension.PROBE_SHARE:g} share of one (rule, f) of each rule", guess,
                  THEORY_SMALLER, err=True)  # (under the budget too: one dim line with the total)
        progress.start = progress.clock()  # the pairs' time, without the probe's
    try:
        rows = tension.theory_table(workers, specs, measure=measure, trials=trials, kappa_budget=kappa_budget,
                                    d=dim, budget=budget, progress=progress)
    except KeyboardInterrupt:
        if progress is None:
            raise
        progress.echo(f"interrupted after {progress.done} of {progress.total} (rule, f) measured, in "
                      f"{_duration(progress.clock() - progress.start)}: no table (fewer --rules, a smaller "
                      "--kappa-budget or --trials make it shorter)")
        raise typer.Exit(130) from None
    cols = ["rule", "f", "bound f/(n−f)", "ε proven"]
    cols += (["ε measured", "worst input", "κ bound f/(n−2f)", "κ proven", "κ measured"] if measure else
             ["κ proven"])
    table = Tabular(f"Price of robustness at n = {workers}: no-attack error ε vs the bound f/(n−f)", cols,
                    right=[c for c in cols if c not in ("rule", "worst input")])
    for r in rows:
        cells = [r.rule, str(r.f), _fmt(r.lower_bound, 4), tension.epsilon_cell(r)]
        if measure:
            cells += [tension.measured_cell(r) if r.note is None else "—", r.worst_input or (r.note or ""),
                      _fmt(r.kappa_bound, 4), _fmt(r.kappa, 4), tension.kappa_cell(r)]
        else:
            cells.append(_fmt(r.kappa, 4))
        table.add(*cells)
    table.notes.append("Measured values (≥) are certified lower bounds. Proven values:")
    table.notes.extend(f"  {line}" for line in tension.sources(rows))
    emit(table, fmt, console)  # every format the terminal's table (issue 38: md dropped a column, csv had others)
