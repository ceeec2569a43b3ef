"""The report of benchmarks/training.py: its JSON records turned into the main table, the split of Phalanx's
round and the notes under them (rich on the terminal, Markdown in a file)."""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path
from typing import Any

from _bench_common import all_threads, fmt_time, md_row, package_version
from _bench_training_setting import (
    BATCH,
    BIG_N_BUDGET_S,
    DESIGN_BYZFL,
    FULL_NS,
    HIDDEN,
    LR,
    MOMENTUM,
    TARGET,
    TARGET_FROM_N,
)


def fmt_ratio(x: float) -> str:
    """``5.3×``; two decimals where one would round across the target (9.98 → ``9.98×``, not ``10.0×``)."""
    return f"{x:.2f}×" if (round(x, 1) >= TARGET) != (x >= TARGET) else f"{x:.1f}×"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None and b > 0 else None


def build_rows(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One display row per (n, threads): cells for the main table and for the split table."""
    rows = []
    for r in recs:
        if r.get("type") != "row":
            continue
        row: dict[str, Any] = {"n": r["n"], "threads": r["threads"], "b": r["b"]}
        for k in ("byzfl", "loop"):
            t, est = r.get(k), r.get(f"{k}_estimate")
            if t is not None:
                row[k], row[f"{k}_cell"] = t, fmt_time(t) + ("†" if r["n"] > max(FULL_NS) else "")
            elif est is not None:
                row[k], row[f"{k}_cell"] = est, "≈" + fmt_time(est)
            else:
                row[k], row[f"{k}_cell"] = None, "—"
            row[f"{k}_est"] = t is None and est is not None
        p = r.get("phalanx")
        row["phalanx"] = p
        row["phalanx_cell"] = fmt_time(p)
        row["rps"] = f"{1 / p:,.1f}" if p else "—"
        for k in ("byzfl", "loop"):
            x = _ratio(row[k], p)
            row[f"x_{k}"] = x
            row[f"x_{k}_cell"] = "—" if x is None else ("≈" if row[f"{k}_est"] else "") + fmt_ratio(x)
        v = r.get("vmap")
        row["vmap"] = v
        row["vmap_cell"] = fmt_time(v)
        xv = _ratio(row["byzfl"], v)
        row["x_vmap_cell"] = "—" if xv is None else ("≈" if row["byzfl_est"] else "") + fmt_ratio(xv)
        xb = row["x_byzfl"]
        if r["n"] < TARGET_FROM_N:
            row["target"] = "— (n < 50)"
        elif xb is None:
            row["target"] = "—"
        else:
            row["target"] = ("✓" if xb >= TARGET else "✗") + (" (≈)" if row["byzfl_est"] else "")
        g, a = r.get("split_grads"), r.get("split_agg")
        if p and g is not None and a is not None:
            rest = max(0.0, p - g - a)
            row["split"] = [f"{fmt_time(v)} ({100 * v / p:.0f}%)" for v in (g, a, rest)]
        else:
            row["split"] = ["—"] * 3
        row["split"].insert(1, fmt_time(r.get("split_grads_vmap")))
        faults = r.get("faults")
        row["split"].append("—" if faults is None else f"{faults * 4096 / 2**20:,.0f} MiB")
        row["check"] = r.get("check")
        row["rounds"] = r.get("rounds", {})
        rows.append(row)
    rows.sort(key=lambda x: (x["n"], x["threads"]))
    return rows


MAIN_HEADERS = ("n", "threads", "ByzFL s/round", "loop s/round", "vmap s/round", "Phalanx s/round",
                "Phalanx rounds/s", "speed-up vs ByzFL", "speed-up vs loop", "vmap: speed-up vs ByzFL",
                f"≥{TARGET:.0f}× ByzFL (n≥{TARGET_FROM_N})")
SPLIT_HEADERS = ("n", "threads", "Phalanx round", "gradients + momentum", "(same by vmap)", "aggregation (cwtm)",
                 "rest (sampling, attack, step)", "page-faulted per round")


def main_cells(row: dict[str, Any]) -> list[str]:
    return [str(row["n"]), str(row["threads"]), row["byzfl_cell"], row["loop_cell"], row["vmap_cell"],
            row["phalanx_cell"], row["rps"], row["x_byzfl_cell"], row["x_loop_cell"], row["x_vmap_cell"],
            row["target"]]


def split_cells(row: dict[str, Any]) -> list[str]:
    return [str(row["n"]), str(row["threads"]), row["phalanx_cell"], *row["split"]]


DIFFERENCES = (
    "What differs between ByzFL's round and Phalanx's: (1) momentum start — ByzFL m₀ = 0 (its first "
    "vector is 0.1·g₀), Phalanx m₀ = g₀ (the equivalence check gives Phalanx ByzFL's m₀); (2) sampling — ByzFL: "
    "each client's torch DataLoader (shuffled, without replacement, 32 per-sample __getitem__ + collate in "
    "Python); Phalanx: 32 indices with replacement per worker, one gather for all workers; (3) input — ByzFL's "
    "own benchmark reads Fashion-MNIST as PIL images with RandomHorizontalFlip + ToTensor per sample; here it "
    "gets the same standardised float tensors as Phalanx (no augmentation), which favours ByzFL; (4) loss — "
    "ByzFL's fc_mnist ends in log_softmax with NLLLoss, Phalanx's mlp gives logits to cross_entropy: same value "
    "and gradient; (5) ByzFL's round also loads the new model into every client (load_state_dict) — part of "
    "its design, timed; (6) initial weights differ (each library's own init; same shapes); (7) weight decay 0 "
    "in both (ByzFL's benchmark default is 1e-4), no server momentum, lr 0.1 constant in both."
)
"""What differs between the ByzFL round and Phalanx's, printed under the table."""


def notes(recs: list[dict[str, Any]], rows: list[dict[str, Any]], args: argparse.Namespace, wall: float,
          command: str) -> list[str]:
    """The text under the tables: the equivalence check, what differs, how it was measured, the machine."""
    out: list[str] = []
    envs = {r["threads"]: r for r in recs if r.get("type") == "env"}
    ends = {r["threads"]: r for r in recs if r.get("type") == "env_end"}
    errors = [r for r in recs if r.get("type") in ("error", "byzfl_missing")]
    for e in errors:
        out.append(f"⚠ {'ByzFL not available' if e['type'] == 'byzfl_missing' else 'worker failed'}: {e['error']}")
    checks = [r["check"] for r in rows if r.get("check")]
    seen: set[int] = set()
    lines = []
    for c in checks:
        if c["n"] in seen:
            continue
        seen.add(c["n"])
        part = f"n={c['n']}: loop {c.get('loop_max_abs', float('nan')):.1e}"
        if "vmap_max_abs" in c:
            part += f", vmap {c['vmap_max_abs']:.1e}"
        if "byzfl_max_abs" in c:
            part += f", ByzFL {c['byzfl_max_abs']:.1e}"
        lines.append(part + f" (largest |θ₂−θ₀| coordinate {c['update_max_abs']:.1e})")
    if checks:
        c0 = checks[0]
        shapes = " + ".join("×".join(map(str, s)) for s in c0["shapes"])
        same = ""
        if "byzfl_dim" in c0:
            ok = c0["byzfl_shapes"] == c0["shapes"] and c0["byzfl_dim"] == c0["dim"]
            same = f"; ByzFL fc_mnist: {c0['byzfl_dim']:,} ({'same layout' if ok else 'DIFFERENT layout'})"
        worst = max((c.get(k, 0.0) for c in checks for k in ("loop_rel", "vmap_rel", "byzfl_rel")), default=0.0)
        verdict = "same round ✓" if worst < 1e-4 else "⚠ the rounds differ"
        out.append(
            f"Equivalence ({verdict}): parameters {c0['dim']:,} = {shapes}{same}. From the same θ₀ with the same "
            f"batches, 2 rounds (momentum m₀ = 0 for all), max |θ − θ_Phalanx|: " + "; ".join(lines) + "."
        )
    ran_byzfl = any(r["byzfl"] is not None for r in rows)
    if ran_byzfl:
        out.append(DIFFERENCES)
    else:
        out.append("The loop differs from Phalanx only in how the honest gradients are computed "
                   "(Problem.grads_loop: one torch.func.grad call per worker, vs all workers at once).")
    out.append("vmap differs from Phalanx only in the gradients: the generic vmap(grad) path (every model "
               "without a fast path takes it) instead of the MLP's explicit back-propagation.")
    est_rows = [r for r in rows if r["byzfl_est"] or r["loop_est"]]
    big_run = [r for r in rows if r["n"] > max(FULL_NS) and not (r["byzfl_est"] or r["loop_est"])
               and (r["byzfl"] is not None or r["loop"] is not None)]
    if est_rows:
        out.append(
            f"≈: extrapolated linearly from the largest n ≤ {max(FULL_NS)} measured in the same run (not run: 1 "
            f"warm-up + 2 rounds would take more than {BIG_N_BUDGET_S:.0f} s); ByzFL's sort grows faster than n, so "
            "the true time is at least this and the speed-up at least the one shown."
        )
    if big_run:
        out.append(f"†: n > {max(FULL_NS)}: ByzFL and the loop timed over 2 rounds after 1 warm-up round "
                   f"(Phalanx and vmap: {args.big_rounds} rounds).")
    out.append(
        f"Timing: {args.warmup} warm-up round(s), then the median of {args.rounds} rounds per implementation, the "
        "implementations taking turns round by round; speed-up = peer s/round ÷ Phalanx s/round; split measured in "
        "the same Phalanx rounds (rest = round − gradients − aggregation). Page-faulted per round: minor page faults "
        "of the process during one Phalanx round × 4 KiB — memory the kernel had to map and zero again because a block "
        "freed in the previous round was returned to it (glibc unmaps blocks above its mmap threshold, at most "
        "32 MiB by default, on free)."
    )
    malloc = {e.get("malloc", "") for e in envs.values()} - {""}
    if malloc:
        out.append(f"Allocator: every worker process applied {', '.join(sorted(malloc))} "
                   "(all three implementations alike; --no-tune-malloc skips it).")
    missed = [r for r in rows if r["n"] >= TARGET_FROM_N and r["x_byzfl"] is not None and r["x_byzfl"] < TARGET]
    if missed:
        worst_row = min(missed, key=lambda r: r["x_byzfl"])
        out.append(
            f"Target ≥{TARGET:.0f}× ByzFL at n ≥ {TARGET_FROM_N}: missed in {len(missed)} row(s) (lowest "
            f"{worst_row['x_byzfl']:.1f}× at n={worst_row['n']}, {worst_row['threads']} thr); see the split table "
            "and --profile N for where the time goes."
        )
    design = ", ".join(f"n={n}: {t} s" for n, t in DESIGN_BYZFL.items())
    out.append(f"Reference: ByzFL's round at 2 threads was first measured as {design} (docs/benchmarks.md).")
    load = "; ".join(
        f"{t} thr: {envs[t]['load_start']:.1f} → {ends.get(t, {}).get('load_end', float('nan')):.1f}"
        for t in sorted(envs)
    )
    torch_v = next(iter(envs.values()))["torch"] if envs else "?"
    stubbed = sorted({m for r in recs if r.get("type") == "stubs" for m in r["stubbed"]})
    stub = f"; stubbed for `import byzfl` (not installed): {', '.join(stubbed)}" if ran_byzfl and stubbed else ""
    out.append(
        f"Machine: {platform.processor() or platform.machine()}, {all_threads()} cores, Python "
        f"{platform.python_version()}, torch {torch_v}, byzfl {package_version('byzfl')}; 1-min load average "
        f"(start → end of each thread setting) {load}{stub}. Data: {args.dataset}. Wall time {wall:.0f} s. "
        f"Command: {command}"
    )
    return out


def setting_line(recs: list[dict[str, Any]]) -> str:
    """The model and round setting, from what the workers loaded."""
    env = next((r for r in recs if r.get("type") == "env"), {"features": "?", "classes": "?"})
    return (f"MLP {env['features']}-{HIDDEN}-{env['classes']} · batch {BATCH} per worker · cwtm/TrMean f = n/10 · "
            f"signflip on b = n/10 workers · momentum {MOMENTUM} · lr {LR}")


TITLE = "Phalanx training round vs ByzFL 0.0.11 and a per-worker loop"


def print_report(rows: list[dict[str, Any]], note_lines: list[str], width: int | None,
                 profiles: list[dict[str, Any]], setting: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=width or (None if sys.stdout.isatty() else 200))
    t = Table(title=f"{TITLE}\n{setting}")
    for h in MAIN_HEADERS:
        t.add_column(h, justify="right")
    for r in rows:
        t.add_row(*main_cells(r))
    console.print(t)
    s = Table(title="Where Phalanx's round goes (median per part)")
    for h in SPLIT_HEADERS:
        s.add_column(h, justify="right")
    for r in rows:
        s.add_row(*split_cells(r))
    console.print(s)
    for line in note_lines:
        console.print(line, highlight=False, markup=False)
    for p in profiles:
        console.print(f"\ntorch.profiler, 3 Phalanx rounds at n={p['n']}, {p['threads']} thr:", markup=False)
        console.print(p["table"], highlight=False, markup=False)


def write_markdown(path: str, rows: list[dict[str, Any]], note_lines: list[str],
                   profiles: list[dict[str, Any]], setting: str) -> None:
    lines = [f"## {TITLE}", "", setting, "", md_row(MAIN_HEADERS), md_row(["---:"] * len(MAIN_HEADERS))]
    lines += [md_row(main_cells(r)) for r in rows]
    lines += ["", "### Where Phalanx's round goes", "", md_row(SPLIT_HEADERS), md_row(["---:"] * len(SPLIT_HEADERS))]
    lines += [md_row(split_cells(r)) for r in rows]
    lines += [""] + [f"- {line}" for line in note_lines]
    for p in profiles:
        lines += ["", f"torch.profiler, 3 Phalanx rounds at n={p['n']}, {p['threads']} thr:", "", "```", p["table"],
                  "```"]
    Path(path).write_text("\n".join(lines) + "\n")

