"""The ``phalanx`` command line. Nothing in the package imports this module."""

from __future__ import annotations

import time
from typing import Annotated

import torch
import typer
from rich.console import Console
from rich.table import Table

from phalanx import __version__, aggregators
from phalanx.errors import PhalanxError

app = typer.Typer(
    name="phalanx", help="Byzantine-robust distributed learning: robust aggregators, attacks, price of robustness.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)
list_app = typer.Typer(help="List what Phalanx provides.", no_args_is_help=True)
app.add_typer(list_app, name="list")
console = Console()


def _fmt(v: float | None, digits: int = 3) -> str:
    if v is None:
        return "—"
    if v != v or v == float("inf"):
        return "∞" if v == float("inf") else "nan"
    return f"{v:.{digits}g}"


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False) -> None:
    if version:
        console.print(__version__)
        raise typer.Exit()


@list_app.command("aggregators")
def list_aggregators(
    workers: Annotated[int, typer.Option("--workers", "-n", min=1, help="n, for the ε and κ columns.")] = 16,
    f: Annotated[int, typer.Option("--f", min=0, help="f, the number of Byzantine workers tolerated.")] = 3,
) -> None:
    """Rules and pre-aggregators with their reference, requirement, ε and κ."""
    table = Table(title=f"Phalanx aggregators (ε, κ at n={workers}, f={f})")
    for col in ("name", "kind", "requirement", "ε", "κ", "reference"):
        table.add_column(col, overflow="fold")
    for name in aggregators.names():
        cls = aggregators.get_class(name)
        try:
            comp = cls(f=f)
        except PhalanxError as exc:
            table.add_row(name, "?", str(exc), "", "", cls.reference)
            continue
        info = comp.describe(workers)
        table.add_row(
            name, info["kind"], info["requirement"], _fmt(info.get("epsilon")), _fmt(info.get("kappa")),
            info["reference"],
        )
    console.print(table)


@app.command()
def demo(
    workers: Annotated[int, typer.Option("--workers", "-n", min=3, help="Number of workers n.")] = 20,
    byzantine: Annotated[int, typer.Option("--byzantine", "-b", min=0, help="Workers that actually attack.")] = 4,
    f: Annotated[int, typer.Option("--f", min=0, help="Byzantine workers the rules are configured for.")] = 4,
    dim: Annotated[int, typer.Option("--dim", "-d", min=1, help="Vector dimension d.")] = 100_000,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
) -> None:
    """Aggregation demo: every rule on the same honest vectors, with no attack, an ALIE attack and NaN rows.

    Prints, per rule, the error of its output against the honest mean (relative to the honest spread, the
    quantity whose worst case is ε), the share of the output it gave to the Byzantine rows, and its speed.
    """
    from phalanx.analysis import aggregation_error, lower_bound

    if byzantine >= workers:
        raise typer.BadParameter(f"--byzantine={byzantine} must be < --workers={workers}")
    gen = torch.Generator().manual_seed(seed)
    honest = torch.randn(workers - byzantine, dim, generator=gen) * 0.5 + torch.randn(dim, generator=gen)
    mu, sigma = honest.mean(0), honest.std(0)
    # ALIE (Baruch et al., NeurIPS 2019): every Byzantine row sends mean − z·std with z = 1.
    alie = torch.cat([honest, (mu - 1.0 * sigma).expand(byzantine, dim)])
    nan = torch.cat([honest, torch.full((byzantine, dim), float("nan"))])
    clean = torch.cat([honest, honest[:byzantine] + 0.01 * torch.randn(byzantine, dim, generator=gen)])
    console.print(
        f"[bold]Phalanx {__version__} aggregation demo[/bold]: n={workers}, {byzantine} Byzantine, rules configured "
        f"for f={f}, d={dim}. Lower bound on any f-robust rule's no-attack error ε ≥ f/(n−f) = "
        f"{lower_bound(workers, f):.3f} (Yang, Shi & Li, ICML 2025)."
    )
    table = Table(title="error = ‖Agg − honest mean‖² / honest spread (lower is better)")
    for col in ("rule", "ε (theory)", "error, no attack", "error, ALIE", "error, NaN rows", "Byz. share (ALIE)",
                "ms"):
        table.add_column(col, justify="right" if col != "rule" else "left")
    specs = [s for s in ("mean", "cwmed", "cwtm", "meamed", "krum", "multikrum", "geomed", "mda", "bulyan", "cc",
                         "nnm>cwtm", "bucketing>cwtm", "arc>cwtm", "dnc", "signguard", "clippedclustering")
             if s.split(">")[-1] in aggregators.names("rule") and all(p in aggregators.names() for p in s.split(">"))]
    for spec in specs:
        try:
            rule = aggregators.make(spec, f=f)
            rule(clean)  # warm-up (first call of a kernel)
            t0 = time.perf_counter()
            out_clean = rule(clean)
            ms = (time.perf_counter() - t0) * 1e3
            out_alie, contrib = rule.aggregate(alie)
            out_nan = rule(nan)
        except PhalanxError as exc:
            table.add_row(spec, "", f"[red]{exc}[/red]", "", "", "", "")
            continue
        byz_share = float(contrib[workers - byzantine:].sum()) if byzantine else 0.0
        table.add_row(
            spec, _fmt(rule.epsilon(workers)), _fmt(aggregation_error(out_clean, clean)),
            _fmt(aggregation_error(out_alie, honest)), _fmt(aggregation_error(out_nan, honest)), f"{byz_share:.2f}",
            f"{ms:.1f}",
        )
    console.print(table)


@app.command("epsilon")
def epsilon_cmd(
    spec: Annotated[str, typer.Argument(help="Aggregator spec, e.g. cwtm or nnm>krum.")],
    workers: Annotated[int, typer.Option("--workers", "-n", min=1, help="Number of workers n.")] = 16,
    f: Annotated[int, typer.Option("--f", min=0, help="Byzantine workers tolerated.")] = 3,
    trials: Annotated[int, typer.Option("--trials", min=0, help="Random inputs to try.")] = 200,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
) -> None:
    """Measure a rule's no-attack aggregation error factor ε (worst-case inputs + random search)."""
    from phalanx.analysis import epsilon

    est = epsilon(aggregators.make(spec, f=f), workers, trials=trials, seed=seed)
    console.print(
        f"{spec}: measured ε ≥ {est.value:.4f} (worst input: {est.worst_input}); theory {_fmt(est.theory, 4)}; "
        f"lower bound f/(n−f) = {est.lower_bound:.4f}"
    )


def main() -> None:
    """Entry point of the ``phalanx`` script: configuration errors become one clear line, exit code 2."""
    try:
        app()
    except PhalanxError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise SystemExit(2) from None


if __name__ == "__main__":  # pragma: no cover
    main()
