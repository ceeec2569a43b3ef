"""Turn the workers' JSON records into one combined table (rich on the terminal, Markdown in a file)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from _bench_peers import PEER_COLUMNS

SHORT = {"ByzFL": "BZ", "ByzPy": "BP", "Flower legacy": "FL", "Flower msg": "FM"}
SPEEDUP_TARGET = 2.0
FLOOR_TARGET_SMALL_N = 3.0  # issue 37: coordinate-wise rules within 3 passes at n <= 64 …
FLOOR_TARGET_LARGE_N = 6.0  # … and within 6 at n = 1,000 (applied to every n > 64: our reading)
NORM_FLOOR_TARGET = 2.5  # issue 37: norm rules (clip, arc, cge) within 2.5× — here of their own floor: one pass,
# or a fresh copy for clip / arc called as pre(x), which return n new rows (our reading; docs/benchmarks.md)


def floor_target(n: int) -> float:
    """Issue 37's × floor target of the coordinate-wise rules at ``n`` rows."""
    return FLOOR_TARGET_SMALL_N if n <= 64 else FLOOR_TARGET_LARGE_N


def fmt_time(t: float | None) -> str:
    """Seconds in a readable unit."""
    if t is None or not math.isfinite(t):
        return "-"
    if t < 1e-3:
        return f"{t * 1e6:.0f} µs"
    if t < 1.0:
        return f"{t * 1e3:.3g} ms"
    return f"{t:.3g} s"


def fmt_diff(v: float | None) -> str:
    if v is None:
        return "?"
    if v == 0:
        return "0"
    return f"{v:.1e}"


def peer_name(p: dict[str, Any]) -> str:
    return p["column"] + (f" {p['variant']}" if p.get("variant") else "")


def setting_label(st: dict[str, Any]) -> str:
    d = st["d"]
    exp = round(math.log10(d)) if d > 0 else 0
    dtxt = f"10^{exp}" if 10**exp == d else str(d)
    return f"n={st['n']} d={dtxt} f={st['f']} · {st['threads']} thr"


@dataclass
class Row:
    """One table row, as plain strings plus the flags used for colouring."""

    setting: str
    rule: str
    phalanx: str
    peers: dict[str, str]
    fastest: str
    speedup: str
    floor: str
    agreement: str
    target: str
    status_ok: bool = True
    target_ok: bool | None = None
    flagged: bool = False
    disagreements: list[dict[str, Any]] = field(default_factory=list)


def build_rows(settings: list[tuple[dict[str, Any], list[dict[str, Any]]]]) -> list[list[Row]]:
    """Rows of the combined table, one list per setting."""
    out: list[list[Row]] = []
    for st, cases in settings:
        label = setting_label(st)
        floors = [rec["floor_parts"]["pass"] for rec in cases if rec.get("floor_parts")]
        floor = statistics.median(floors) if floors else st.get("floor")
        rows: list[Row] = []
        for i, rec in enumerate(cases):
            head = f"{label}\npass {fmt_time(floor)}" if i == 0 else ""
            rows.append(_row(head, label, rec, rec.get("floor") or floor, floor_target(int(st["n"]))))
        if st.get("worker_error"):
            rows.append(Row(f"{label}" if not rows else "", "(worker)", st["worker_error"], {}, "", "", "", "", "",
                            status_ok=False))
        out.append(rows)
    return out


def _row(head: str, label: str, rec: dict[str, Any], floor: float | None, target_floor: float) -> Row:
    status = rec.get("status", "?")
    if status != "ok":
        return Row(head, rec["rule"], status, {c: "" for c in PEER_COLUMNS}, "", "", "", "", "", status_ok=False)
    ph = rec["phalanx"]
    ph_t = ph["time"]
    ph_txt = fmt_time(ph_t) + ("†" if ph.get("single") else "")
    cells: dict[str, list[str]] = {c: [] for c in PEER_COLUMNS}
    agree: list[str] = []
    candidates: list[tuple[float, str]] = []
    flagged: list[dict[str, Any]] = []
    for p in rec.get("peers", []):
        name = peer_name(p)
        prefix = f"{p['variant']}: " if p.get("variant") else ""
        if p.get("status") != "ok":
            cells[p["column"]].append(prefix + p.get("status", "?"))
            continue
        cells[p["column"]].append(prefix + fmt_time(p["time"]) + ("†" if p.get("single") else ""))
        short = SHORT.get(p["column"], p["column"]) + (f" {p['variant']}" if p.get("variant") else "")
        mark = " ⚠" if p.get("flag") else ""
        agree.append(f"{short} {fmt_diff(p.get('maxabs'))}{mark}")
        if p.get("flag"):
            why = p.get("compare_note") or p.get("known") or "not a documented difference"
            if p.get("ndiff") is not None:
                few = p["ndiff"] <= max(10, p["size"] // 10**4)
                why = (f"differs in {p['ndiff']} of {p['size']} entries"
                       + (" (so few: a tie broken differently at a selection boundary?)" if few else "") + "; " + why)
            f64 = p.get("f64")
            if f64 and "verdict" in f64:
                why += (f" [float64 check: {f64['verdict']}; Phalanx f32 vs f64 rel {f64['phalanx_rel']:.1e}, "
                        f"peer vs Phalanx f64 rel {f64['peer_rel']:.1e}]")
            elif f64:
                why += f" [float64 check failed: {f64.get('error')}]"
            flagged.append({"setting": label, "rule": rec["rule"], "peer": name, "maxabs": p.get("maxabs"),
                            "rel": p.get("rel"), "why": why})
        if not (p.get("approx") and p.get("flag")):
            candidates.append((p["time"], name))
    fastest, speedup, target, target_ok = "", "", "—", None
    if candidates:
        best_t, best_name = min(candidates)
        ratio = best_t / ph_t if ph_t > 0 else float("inf")
        fastest = f"{best_name} {fmt_time(best_t)}"
        speedup = f"{ratio:.2f}×"
    xfloor = ph_t / floor if floor else None
    floor_txt = f"{xfloor:.1f}× ({rec.get('floor_kind', 'pass')})" if xfloor is not None else ""
    goal = target_floor if rec.get("coordinatewise") else NORM_FLOOR_TARGET if rec.get("norm") else None
    if candidates:
        target_ok = ratio >= SPEEDUP_TARGET
        if goal is not None and xfloor is not None:
            target_ok = target_ok and xfloor <= goal
        target = "yes" if target_ok else "no"
    elif goal is not None and xfloor is not None:
        target_ok = xfloor <= goal
        target = ("yes" if target_ok else "no") + " (floor only)"
    return Row(head, rec["rule"], ph_txt, {c: "\n".join(v) for c, v in cells.items()}, fastest, speedup, floor_txt,
               "\n".join(agree), target, target_ok=target_ok, flagged=bool(flagged), disagreements=flagged)


HEADERS = ["setting", "rule", "Phalanx", *PEER_COLUMNS, "fastest peer", "speed-up", "× floor", "max |Δ| vs Phalanx",
           "target met"]


def rich_table(rows: list[list[Row]], title: str) -> Any:
    """The combined table as a rich Table."""
    from rich.table import Table

    table = Table(title=title, show_lines=False, header_style="bold")
    for h in HEADERS:
        table.add_column(h, no_wrap=h in ("rule", "Phalanx", "speed-up", "× floor", "target met"))
    for group in rows:
        for r in group:
            target = r.target
            if r.target_ok is True:
                target = f"[green]{target}[/green]"
            elif r.target_ok is False:
                target = f"[red]{target}[/red]"
            agreement = r.agreement.replace("⚠", "[bold red]⚠[/bold red]")
            ph = r.phalanx if r.status_ok else f"[yellow]{r.phalanx}[/yellow]"
            table.add_row(r.setting, r.rule, ph, *(_esc(r.peers.get(c, "")) for c in PEER_COLUMNS), _esc(r.fastest),
                          r.speedup, r.floor, agreement, target)
        table.add_section()
    return table


def _esc(text: str) -> str:
    return text.replace("[", r"\[")


def markdown_table(rows: list[list[Row]]) -> str:
    """The combined table in Markdown (GitHub flavour)."""
    lines = ["| " + " | ".join(h.replace("|", "\\|") for h in HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for group in rows:
        for r in group:
            cells = [r.setting, f"`{r.rule}`", r.phalanx, *(r.peers.get(c, "") for c in PEER_COLUMNS), r.fastest,
                     r.speedup, r.floor, r.agreement, r.target]
            lines.append("| " + " | ".join(c.replace("\n", "<br>").replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def disagreements(rows: list[list[Row]]) -> list[dict[str, Any]]:
    return [d for group in rows for r in group for d in r.disagreements]


def notes(settings: list[tuple[dict[str, Any], list[dict[str, Any]]]]) -> list[str]:
    """What was timed for every peer, and everything a reader needs to trust the numbers."""
    out: list[str] = []
    timed: dict[tuple[str, str], str] = {}
    extra: dict[str, list[str]] = {}
    for _, cases in settings:
        for rec in cases:
            for n in rec.get("notes", []):
                extra.setdefault(rec["rule"], [])
                if n not in extra[rec["rule"]]:
                    extra[rec["rule"]].append(n)
            for p in rec.get("peers", []):
                if p.get("timed") and p["timed"] != "-":
                    timed.setdefault((rec["rule"], peer_name(p)), p["timed"])
                for n in p.get("notes", []):
                    key = f"{rec['rule']} / {peer_name(p)}"
                    extra.setdefault(key, [])
                    if n not in extra[key]:
                        extra[key].append(n)
    if timed:
        out.append("Timed peer functions (inputs converted to the peer's format before timing):")
        for (rule, name), fn in timed.items():
            out.append(f"  {rule} / {name}: {fn}")
    if extra:
        out.append("Notes:")
        for key, items in extra.items():
            for n in items:
                out.append(f"  {key}: {n}")
    seen_errors: set[str] = set()
    for st, _ in settings:
        for e in st.get("import_errors", []):
            if e not in seen_errors:
                seen_errors.add(e)
                out.append(f"  import error (module skipped): {e}")
    return out
