"""The report of benchmarks/federated.py: its JSON records turned into the main table, the memory table and the
notes under them (rich on the terminal, Markdown in a file)."""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

from _bench_common import all_threads, fmt_time, md_row, package_version
from _bench_federated_task import ALLOCATORS, Task

TARGET = 20.0
"""Phalanx's rounds per second should be at least this many times Flower's (``FedTrimmedAvg``)."""
TITLE = "Federated rounds: Phalanx vs Flower's simulation and ByzFL's FedAvg"


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()



def fmt_ratio(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:,.0f}×" if x >= 100 else (f"{x:.1f}×" if x >= 10 else f"{x:.2f}×")


def fmt_gib(b: float | None) -> str:
    return "—" if b is None else f"{b / 2**30:.2f} GiB"


IMPL_LABELS = {
    "phalanx": "Phalanx (Loop.step, fedavg)",
    "byzfl": "ByzFL 0.0.11 FedAvg (its train.py loop)",
    "flower_trimmed": "Flower 1.42 run_simulation + FedTrimmedAvg",
    "flower_phalanx": "Flower 1.42 run_simulation + PhalanxFedAvg",
}
MAIN_HEADERS = ("implementation", "threads / CPUs", "s/round (median)", "rounds/s", "× Flower FedTrimmedAvg",
                "× Flower + PhalanxFedAvg", "timed rounds", "test acc. (after rounds)")


def build_rows(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One display row per (implementation, threads), Phalanx first; ratios of rounds/s against both Flower rows."""
    rows = [r for r in recs if r.get("type") == "row"]
    order = {k: i for i, k in enumerate(IMPL_LABELS)}
    rows.sort(key=lambda r: (order.get(r["impl"], 99), r["threads"]))
    ref = {r["impl"]: r.get("median_s") for r in rows if r["impl"].startswith("flower")}
    out = []
    for r in rows:
        t = r.get("median_s")
        row = dict(r)
        row["rps"] = 1 / t if t else None
        for k in ("flower_trimmed", "flower_phalanx"):
            row[f"x_{k}"] = ref[k] / t if t and ref.get(k) else None
        out.append(row)
    return out


def main_cells(row: dict[str, Any]) -> list[str]:
    acc = row.get("test_accuracy")
    threads = f"{row['threads']} (2 Ray actors × 1)" if row["impl"].startswith("flower") and row["threads"] == 2 \
        else str(row["threads"])
    return [IMPL_LABELS.get(row["impl"], row["impl"]), threads, fmt_time(row.get("median_s")),
            "—" if row["rps"] is None else f"{row['rps']:,.1f}", fmt_ratio(row["x_flower_trimmed"]),
            fmt_ratio(row["x_flower_phalanx"]), str(row.get("timed_rounds", "—")),
            "—" if acc is None else f"{100 * acc:.1f} % ({row.get('rounds_run', '?')})"]


MEMORY_HEADERS = ("model", "parameters", "clients", "per round", "local steps × batch", "threads", "allocator",
                  "peak RSS",
                  "RSS before round 1", "s/round (round 1, then the rest)", "finite θ")


def memory_cells(rec: dict[str, Any]) -> list[str]:
    """A row of the memory table: a finished run, or one that was stopped (its peak then is what the watchdog saw)."""
    failed = rec.get("type") == "memory_failed"
    part = rec.get("partial") if failed else rec
    allocator = ALLOCATORS.get(rec.get("allocator", ""), "?")
    if part is None:
        return ["ResNet-20 (GroupNorm)", "—", "—", str(rec["per_round"]), "—", "—", allocator,
                f"≥ {fmt_gib(rec.get('peak_seen'))} (stopped)", "—", "—", "—"]
    times = part["times"]
    later = f", {fmt_time(statistics.median(times[1:]))}" if len(times) > 1 else ""
    peak = f"≥ {fmt_gib(max(rec['peak_seen'], part['peak_rss']))} (stopped)" if failed else fmt_gib(part["peak_rss"])
    rounds = fmt_time(times[0]) + later + (f" (stopped in round {len(times) + 1})" if failed else "")
    return ["ResNet-20 (GroupNorm)", f"{part['dim']:,}", f"{part['clients']:,}", str(rec["per_round"]),
            f"{part['local_steps']} × {part['batch']}", str(part["threads"]), allocator, peak,
            fmt_gib(part["rss_ready"]), rounds, "yes" if part["finite"] else "NO"]


def setting_line(task: Task, recs: list[dict[str, Any]]) -> str:
    env = next((r for r in recs if r.get("type") == "env" and "features" in r), None)
    shape = f"{env['features']}-{task.hidden}-{env['classes']}" if env else f"?-{task.hidden}-?"
    return (f"{task.dataset} · MLP {shape} · {task.clients} clients, {task.per_round} per round · "
            f"{task.local_steps} local SGD steps of batch {task.batch}, lr {task.lr} · trimmed mean, f = {task.f} of "
            f"{task.per_round} (Flower beta = {task.beta:g}) · no Byzantine client · IID split, seed {task.seed}")


DIFFERENCES = (
    "What differs between the implementations (the computation is the same, see the check above): Phalanx trains "
    "the sampled clients as one batched computation in one process; Flower sends each sampled client a message "
    "through its simulation engine (the weights serialised into an ArrayRecord and back), runs the ClientApp in 2 "
    "Ray actors (1 CPU each; one client after another in each), and its engine polls for messages "
    "(InMemoryGrid.pull_interval = 0.1 s, and the engine's add_messages_to_queue checks for new messages every "
    "0.1 s), so a round also waits on these polls — that is Flower's simulation as its users run it; ByzFL runs its "
    "clients one after another with a torch DataLoader each (per-sample indexing, shuffled, without replacement, "
    "where Phalanx and the Flower client draw with replacement) and loads the new model into all clients every "
    "round (its design, timed). FedTrimmedAvg and ByzFL's TrMean average the clients' models, Phalanx and "
    "PhalanxFedAvg step by the trimmed mean of the updates: the same model (the trimmed mean commutes with the "
    "shift). ByzFL's benchmark defaults that differ from this task (weight decay 1e-4, fc_mnist's 100 hidden units) "
    "are set to the task's."
)


def notes(recs: list[dict[str, Any]], rows: list[dict[str, Any]], args: argparse.Namespace, wall: float,
          command: str) -> list[str]:
    out: list[str] = []
    for e in [r for r in recs if r.get("type") in ("error", "byzfl_missing")]:
        what = "ByzFL not available" if e["type"] == "byzfl_missing" else f"{e.get('part', 'worker')} failed"
        out.append(f"⚠ {what}: {e['error']}" + (" — log: " + " | ".join(e["log"]) if e.get("log") else ""))
    trimmed = {r["threads"]: r for r in rows if r["impl"] == "flower_trimmed"}
    phalanx_rows = [r for r in rows if r["impl"] == "phalanx"]
    if trimmed and phalanx_rows:
        measured = [r for r in phalanx_rows if r["x_flower_trimmed"] is not None]
        parts = [f"{r['threads']} thread(s) {fmt_ratio(r['x_flower_trimmed'])} "
                 f"{'✓' if r['x_flower_trimmed'] >= TARGET else '✗'}" for r in measured]
        best = max(measured, key=lambda r: r["x_flower_trimmed"], default=None)
        verdict = "—" if best is None else (
            f"{'met' if best['x_flower_trimmed'] >= TARGET else 'NOT met'} (best: {fmt_ratio(best['x_flower_trimmed'])}"
            f" at {best['threads']} thread(s))")
        out.append(f"Target ≥ {TARGET:.0f}× Flower's rounds/s (FedTrimmedAvg, same task): {verdict} — Phalanx at "
                   f"{'; '.join(parts)}.")
    ph = {r["impl"]: r for r in rows if r["impl"].startswith("flower")}
    if "flower_trimmed" in ph and "flower_phalanx" in ph:
        a, b = ph["flower_trimmed"], ph["flower_phalanx"]
        client = a.get("client_median_s")
        work = "" if client is None else (
            f" The clients' own work in the actors (load the weights, {args.task.local_steps} SGD steps, the state "
            f"dict) is {fmt_time(client)} per client (median), {fmt_time(client * args.task.per_round)} per round of "
            f"{args.task.per_round} clients over {args.ray_cpus} actors: the rest of Flower's round is messaging, "
            "serialisation and polling.")
        out.append(
            f"Inside Flower, PhalanxFedAvg's round is {fmt_time(b['median_s'])} against FedTrimmedAvg's "
            f"{fmt_time(a['median_s'])}; the strategies' own aggregate_train takes {fmt_time(b['agg_median_s'])} "
            f"(PhalanxFedAvg) and {fmt_time(a['agg_median_s'])} (FedTrimmedAvg) per round (median). Replies per "
            f"round: {a['replies']} and {b['replies']}.{work}"
        )
    checks = [r for r in recs if r.get("type") == "check"]
    if checks:
        c = checks[0]
        parts = []
        if "flower_max_abs" in c:
            parts.append(f"Flower's client + trim_mean {c['flower_max_abs']:.1e}"
                         + ("" if c.get("flower_same_theta0") else " (⚠ its θ₀ differs)"))
        if "byzfl_max_abs" in c:
            parts.append(f"ByzFL's clients + TrMean {c['byzfl_max_abs']:.1e}")
        worst = max((c.get(k, 0.0) for k in ("flower_max_abs", "byzfl_max_abs")), default=0.0)
        ok = worst <= 1e-4 * max(c["update_max_abs"], 1e-12) or worst < 1e-6
        verdict = "same round ✓" if ok and parts else "⚠ the rounds differ" if parts else "not checked"
        out.append(
            f"Equivalence ({verdict}): {c['dim']:,} parameters; Phalanx's first round (clients {c['clients']}) "
            f"replayed from the same θ₀ with the same batches, max |θ₁ − θ₁ Phalanx|: " + "; ".join(parts)
            + f" (largest |θ₁ − θ₀| coordinate {c['update_max_abs']:.1e})."
            + (f" Flower part not checked: {c['flower_error']}" if "flower_error" in c else "")
        )
    if rows:
        out.append(DIFFERENCES)
    fl = next((r for r in recs if r.get("type") == "flower"), None)
    left = next((r for r in recs if r.get("type") == "ray_leftovers"), None)
    inproc = [r for r in rows if not r["impl"].startswith("flower")]
    if inproc:
        out.append(
            f"Timing, Phalanx and ByzFL: {args.warmup} warm-up round(s), then the median of {args.rounds} rounds each, "
            "taking turns round by round, one subprocess per thread setting (the training engine's allocator setting "
            "applied, as phalanx run does). Test accuracy: after all rounds run (warm-up, check and timed), not timed."
        )
    if fl:
        out.append(
            f"Timing, Flower: one run_simulation with {args.task.clients} supernodes, Ray with {args.ray_cpus} CPUs, "
            f"1 CPU per client; excluded: Ray's and the actors' start and {args.flower_warmup} warm-up round(s) per "
            f"strategy ({fl['warmup_s']:.1f} s together), and the first round of each block; then "
            f"{args.flower_blocks} block(s) of {args.flower_block_rounds} rounds per strategy, taking turns; median "
            f"of the intervals between consecutive aggregate_train ends. The whole simulation took "
            f"{fl['wall_s']:.1f} s. Ray processes left after it: "
            + ("none" if left is not None and not left["pids"] else f"{left['pids'] if left else '?'} (killed)") + "."
        )
    mem = [r for r in recs if r.get("type") in ("memory", "memory_failed")]
    for m in mem:
        if m["type"] == "memory_failed":
            out.append(f"⚠ Memory part ({ALLOCATORS[m['allocator']]} allocator) with {m['per_round']} clients per "
                       f"round did not finish: {m['error']} ({m['rounds_done']} round(s) done).")
    done = [m for m in mem if m["type"] == "memory"]
    if done:
        mt = args.memory_task
        gib = (mt.n_train + mt.n_test) * 3 * 32 * 32 * 4 / 2**30
        runs = "; ".join(
            f"{ALLOCATORS[m['allocator']]} allocator: {m['per_round']} clients per round, peak "
            f"{fmt_gib(m['peak_rss'])} (after each round: {', '.join(fmt_gib(p) for p in m.get('peaks', []))}), "
            f"RSS before round 1 {fmt_gib(m['rss_ready'])}, after the last "
            f"{fmt_gib(m['rss_end'])}, rounds {', '.join(f'{t:.1f}' for t in m['times'])} s, load "
            f"{m['load_start']:.1f} → {m['load_end']:.1f}" for m in done)
        out.append(
            f"Memory part: Phalanx FedAvg, ResNet-20 (GroupNorm), {mt.clients:,} clients, {mt.local_steps} local "
            f"step of batch {mt.batch}, trimmed mean with f = a tenth of the clients per round, on synthetic "
            f"CIFAR-10-shaped data ({mt.n_train:,} + {mt.n_test:,} images of 3×32×32, {gib:.2f} GiB as "
            f"float32), {mt.rounds} rounds in a fresh process per allocator setting, {done[0]['threads']} "
            "threads. Peak RSS is ru_maxrss: the whole process — interpreter, torch, data, model, the clients' "
            f"stacked parameters and one local step's activations over all of the round's clients. {runs}."
        )
        by = {m["allocator"]: m for m in done}
        stopped = {(m["allocator"], m["per_round"]): m for m in mem if m["type"] == "memory_failed"}
        if "glibc" in by and ("phalanx", by["glibc"]["per_round"]) in stopped:
            m = stopped[("phalanx", by["glibc"]["per_round"])]
            out.append(
                f"With the allocator setting that phalanx run applies (phalanx.training.memory: mallopt "
                f"M_MMAP_THRESHOLD = 1 GiB, M_TRIM_THRESHOLD = 2 GiB), {m['per_round']} clients per round reached "
                f"{fmt_gib(m['peak_seen'])} and were stopped; with glibc's default the same run peaks at "
                f"{fmt_gib(by['glibc']['peak_rss'])}: freed blocks under 1 GiB stay in the process's heap for reuse "
                "instead of going back to the kernel (which spares page faults: see the training benchmark), so the "
                "peak counts memory the allocator keeps besides the live tensors."
            )
        if "phalanx" in by and "glibc" in by and by["phalanx"]["per_round"] == by["glibc"]["per_round"]:
            out.append(
                f"The allocator setting that phalanx run applies (phalanx.training.memory: mallopt M_MMAP_THRESHOLD = "
                f"1 GiB, M_TRIM_THRESHOLD = 2 GiB) raises this peak from {fmt_gib(by['glibc']['peak_rss'])} to "
                f"{fmt_gib(by['phalanx']['peak_rss'])}: freed blocks under 1 GiB stay in the process's heap for reuse "
                "instead of going back to the kernel (which spares page faults: see the training benchmark), so the "
                "peak counts memory the allocator keeps besides the live tensors."
            )
    envs = [r for r in recs if r.get("type") == "env"]
    torch_v = next((e["torch"] for e in [*envs, *mem] if "torch" in e), "?")
    ends = {(r["part"], r["threads"]): r for r in recs if r.get("type") == "env_end"}
    load = "; ".join(f"{e['part']} {e['threads']}: {e['load_start']:.1f} → "
                     f"{ends.get((e['part'], e['threads']), {}).get('load_end', float('nan')):.1f}" for e in envs)
    out.append(
        f"Machine: {cpu_model()}, {all_threads()} cores, {_mem_total()}, Python {platform.python_version()}, torch "
        f"{torch_v}, flwr {package_version('flwr')}, ray {package_version('ray')}, byzfl {package_version('byzfl')}"
        + (f"; 1-min load average (start → end of each part) {load}" if load else "")
        + f". Wall time {wall:.0f} s. Command: {command}"
    )
    return out


def _mem_total() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 2**20:.0f} GiB RAM"
    except (OSError, ValueError):
        pass
    return "? RAM"


def print_report(rows: list[dict[str, Any]], mem: list[dict[str, Any]], note_lines: list[str], width: int | None,
                 setting: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=width or (None if sys.stdout.isatty() else 200))
    if rows:
        t = Table(title=f"{TITLE}\n{setting}")
        for h in MAIN_HEADERS:
            t.add_column(h, justify="left" if h == "implementation" else "right")
        for r in rows:
            t.add_row(*main_cells(r))
        console.print(t)
    if mem:
        m = Table(title="Memory: Phalanx FedAvg, ResNet-20, synthetic CIFAR-10-shaped data")
        for h in MEMORY_HEADERS:
            m.add_column(h, justify="right")
        for rec in mem:
            m.add_row(*memory_cells(rec))
        console.print(m)
    for line in note_lines:
        console.print(line, highlight=False, markup=False)


def write_markdown(path: str, rows: list[dict[str, Any]], mem: list[dict[str, Any]], note_lines: list[str],
                   setting: str) -> None:
    lines = [f"## {TITLE}", "", setting, "", md_row(MAIN_HEADERS),
             md_row([":---", *["---:"] * (len(MAIN_HEADERS) - 1)])]
    lines += [md_row(main_cells(r)) for r in rows]
    if mem:
        lines += ["", "### Memory: Phalanx FedAvg, ResNet-20", "", md_row(MEMORY_HEADERS),
                  md_row(["---:"] * len(MEMORY_HEADERS))]
        lines += [md_row(memory_cells(r)) for r in mem]
    lines += [""] + [f"- {line}" for line in note_lines]
    Path(path).write_text("\n".join(lines) + "\n")

