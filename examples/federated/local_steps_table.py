"""The tables of docs/federated.md ("The price of robustness under local steps", "At a fixed number of gradient
steps"): the no-attack cost of the trimmed mean and Multi-Krum against the mean, from a sweep of
examples/federated/local_steps.toml or local_steps_fixed.toml.

    python examples/federated/local_steps_table.py examples/federated/local_steps.toml --out runs/local-steps
    python examples/federated/local_steps_table.py examples/federated/local_steps.toml \\
        --results docs/results/local_steps_runs.csv
    python examples/federated/local_steps_table.py runs/local-steps      # a sweep already finished

With a config and ``--out DIR`` it runs the sweep (``python -m phalanx.cli sweep CONFIG --jobs 2 --out DIR``;
finished runs are skipped, as the sweep does), writes every run's raw result to ``DIR/runs.csv`` (the run id, α,
K, the rule, f, the seed, the final test accuracy and aggregation error, floats by ``repr``) and prints the table.
With ``--results CSV`` it prints the table from such a file without training: the file must hold exactly the runs
the config plans (the same run ids: a file of another grid or other settings is refused). With a finished sweep's
folder it reads the runs there.

Per cell: each seed's final accuracy of the mean minus the rule's (the no-attack cost, in points, paired by seed),
their mean, 95 % Student-t interval over the seeds (per comparison), the Holm-adjusted p-value of the t test of
mean 0 with the table's 24 costs as one family (:func:`phalanx.analysis.stats.holm`), the verdict read on that
p-value (``costs accuracy`` / ``gains accuracy`` / ``no difference shown``, or ``no verdict (why)``: fewer than 3
seeds, an interval of zero width), and ε̂, the rule's aggregation error ‖Agg − mean‖² / spread at the last round
averaged over the seeds. The accuracies are counts over the test set, so the costs are rounded to 1e-9 points:
seeds whose costs differ only by float rounding give the same cost, and an interval of zero width, not a verdict.
"""

from __future__ import annotations

import argparse
import csv
import glob
import io
import json
import math
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from phalanx.analysis.stats import ALPHA, Estimate, holm, mean_ci
from phalanx.errors import ConfigError
from phalanx.experiments import config, grid, store

Key = tuple[float, int, str, int, int]
"""(α, local steps K, aggregator, f, seed): one run."""
COLUMNS = ("run", "alpha", "local_steps", "aggregator", "f", "seed", "test_accuracy", "agg_error")
RULES = (("cwtm", "cwtm"), ("multikrum(strict=false)", "multikrum"))
FS = (1, 3)
MAX_BYTES = 1 << 20


def planned(cfg_path: str) -> dict[Key, str]:
    """The runs the config plans: each run's key and run id (its directory name)."""
    out: dict[Key, str] = {}
    for run in grid.runs(config.load_grid(cfg_path, [])):
        c = run.cfg
        out[(float(c.alpha), int(c.local_steps or 1), str(c.aggregator), int(c.f), int(c.seed))] = run.run_id
    return out


def read_run(run_dir: Path) -> tuple[Key, tuple[str, float, float]] | None:
    """A finished run's key and (run id, final test accuracy, final aggregation error); None if unfinished."""
    cfg = json.loads((run_dir / "config.json").read_text())
    done = store.finished_rows(run_dir)
    if not done:
        return None
    last = done[-1]
    key = (float(cfg["alpha"]), int(cfg.get("local_steps") or 1), str(cfg["aggregator"]), int(cfg["f"]),
           int(cfg["seed"]))
    return key, (run_dir.name, float(last["test_accuracy"]), float(last["agg_error"]))


def from_runs(root: Path, plan: dict[Key, str] | None = None) -> dict[Key, tuple[str, float, float]]:
    """The finished runs under ``root``: every one, or with ``plan`` the planned ones (each in its run directory)."""
    dirs = (sorted(Path(p).parent for p in glob.glob(f"{root}/*/config.json")) if plan is None
            else [root / run_id for run_id in plan.values() if (root / run_id / "config.json").exists()])
    rows: dict[Key, tuple[str, float, float]] = {}
    for d in dirs:
        got = read_run(d)
        if got is not None:
            rows[got[0]] = got[1]
    return rows


def write_csv(rows: dict[Key, tuple[str, float, float]]) -> str:
    """The raw per-run results as CSV (floats by ``repr``: read back digit for digit)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for key in sorted(rows):
        alpha, ls, agg, f, seed = key
        run, acc, err = rows[key]
        w.writerow([run, repr(alpha), ls, agg, f, seed, repr(acc), repr(err)])
    return buf.getvalue()


def read_csv(path: Path) -> dict[Key, tuple[str, float, float]]:
    """Raw per-run results written by :func:`write_csv`; a file that is too large, lacks a column, repeats a run or
    holds a value no run can give (an accuracy outside [0, 1], an error that is negative or not finite) is a
    :class:`ConfigError`."""
    if path.stat().st_size > MAX_BYTES:
        raise ConfigError("results", str(path), f"a file of at most {MAX_BYTES} bytes")
    reader = csv.DictReader(io.StringIO(path.read_text(encoding="utf-8")))
    if tuple(reader.fieldnames or ()) != COLUMNS:
        raise ConfigError("results", str(path), f"a CSV with the columns {', '.join(COLUMNS)}")
    rows: dict[Key, tuple[str, float, float]] = {}
    for i, r in enumerate(reader, start=2):
        try:
            key = (float(r["alpha"]), int(r["local_steps"]), r["aggregator"], int(r["f"]), int(r["seed"]))
            acc, err = float(r["test_accuracy"]), float(r["agg_error"])
        except (TypeError, ValueError):
            raise ConfigError("results", f"{path}:{i}", "numbers in the numeric columns") from None
        if not 0.0 <= acc <= 1.0 or not (math.isfinite(err) and err >= 0.0):
            raise ConfigError("results", f"{path}:{i}", "an accuracy in [0, 1] and a finite, non-negative error")
        if key in rows:
            raise ConfigError("results", f"{path}:{i}", "each run once")
        rows[key] = (r["run"], acc, err)
    return rows


def check_plan(rows: dict[Key, tuple[str, float, float]], plan: dict[Key, str], where: str) -> None:
    """``rows`` must hold exactly the planned runs, each under its planned run id."""
    missing = sorted(set(plan) - set(rows))
    extra = sorted(set(rows) - set(plan))
    if missing or extra:
        raise ConfigError("results", where, f"exactly the config's {len(plan)} runs (missing {missing[:3]}, "
                          f"not planned {extra[:3]})")
    for key, run_id in plan.items():
        if rows[key][0] != run_id:
            raise ConfigError("results", where, f"the run {run_id} for {key} (found {rows[key][0]}: another "
                              "config's run)")


def cost(base: float, acc: float) -> float:
    """The no-attack cost in points, rounded to 1e-9 (see the module's docstring)."""
    return round(100 * (base - acc), 9)


Row = tuple[float, int]
"""(α, K): one row group of the table."""
Cell = tuple[float, int, str, int]
"""(α, K, aggregator, f): one cost."""


def cells(rows: dict[Key, tuple[str, float, float]]) -> tuple[list[Row], dict[Row, Estimate], dict[Cell, Estimate],
                                                               dict[Cell, float]]:
    """The table's (α, K) rows, the mean's accuracy per row, each rule's cost (Holm-corrected as one family) and its
    mean aggregation error."""
    splits = sorted({(k[0], k[1]) for k in rows})
    seeds = sorted({k[4] for k in rows})
    base: dict[Row, Estimate] = {}
    raw: dict[Cell, Estimate] = {}
    errs: dict[Cell, float] = {}
    for alpha, ls in splits:
        b = [rows[(alpha, ls, "mean", 1, s)][1] for s in seeds]
        base[(alpha, ls)] = mean_ci([100 * x for x in b])
        for agg, _ in RULES:
            for f in FS:
                acc = [rows[(alpha, ls, agg, f, s)][1] for s in seeds]
                raw[(alpha, ls, agg, f)] = mean_ci([cost(bb, a) for a, bb in zip(acc, b)])
                errs[(alpha, ls, agg, f)] = sum(rows[(alpha, ls, agg, f, s)][2] for s in seeds) / len(seeds)
    keys = list(raw)
    adjusted = dict(zip(keys, holm([raw[k] for k in keys])))
    return splits, base, adjusted, errs


def table(rows: dict[Key, tuple[str, float, float]]) -> str:
    """The Markdown table and the sentence saying how its verdicts were decided."""
    splits, base, est, errs = cells(rows)
    out = ["| split | K | mean: accuracy % | rule | f | cost, points [95 % CI] | Holm p | verdict | ε̂ |",
           "|---|---|---|---|---|---|---|---|---|"]
    for alpha, ls in splits:
        for agg, name in RULES:
            for f in FS:
                e = est[(alpha, ls, agg, f)]
                out.append(f"| α = {alpha:g} | {ls} | {base[(alpha, ls)].show()} | {name} | {f} | "
                           f"{e.mean:+.1f} {e.interval(digits=1)} | {e.holm_text()} | "
                           f"{e.side('gains accuracy', 'costs accuracy')} | {errs[(alpha, ls, agg, f)]:.2f} |")
    family = max((e.family for e in est.values() if e.p_adjusted is not None), default=0)
    out.append("")
    out.append(f"Verdicts: Holm-adjusted p < {ALPHA:g} over the {family} costs of this table that decide something "
               "(family-wise error rate ≤ 5 %); intervals: per comparison, 95 %.")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", help="a config (examples/federated/local_steps*.toml) or a finished sweep's folder")
    ap.add_argument("--out", metavar="DIR", help="with a config: run the sweep into DIR and write DIR/runs.csv")
    ap.add_argument("--results", metavar="CSV", help="with a config: the table from this raw-results file, "
                    "nothing trained")
    ap.add_argument("--jobs", type=int, default=2, help="the sweep's processes (default 2)")
    a = ap.parse_args(argv)
    src = Path(a.source)
    if src.is_dir():
        rows = from_runs(src)
    else:
        plan = planned(a.source)
        if a.results:
            rows = read_csv(Path(a.results))
            check_plan(rows, plan, a.results)
        elif a.out:
            subprocess.run([sys.executable, "-m", "phalanx.cli", "sweep", a.source, "--jobs", str(a.jobs), "--out",
                            a.out], check=True, stdout=sys.stderr)
            rows = from_runs(Path(a.out), plan)
            check_plan(rows, plan, a.out)
            store.atomic_write_text(Path(a.out) / "runs.csv", write_csv(rows))
        else:
            ap.error("a config needs --out DIR (run the sweep) or --results CSV (read its raw results)")
    print(table(rows))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
