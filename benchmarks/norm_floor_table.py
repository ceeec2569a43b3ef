"""The norm rules against their own floors, as docs/benchmarks.md tables them, from ``make bench``'s JSON.

    PYTHONPATH=src .venv/bin/python benchmarks/aggregators.py --sizes 10:1e6:2,50:1e6:10,200:1e5:40,1000:1e5:200 \\
        --rules "cge,clip,arc,signguard,clip in place,arc in place" --threads both --reps 7 --json /tmp/norm.json
    .venv/bin/python benchmarks/norm_floor_table.py /tmp/norm.json

One Markdown row per (setting, threads); a cell is Phalanx's median · its speed-up over the fastest peer (none for
a rule without a peer) · its ratio to its own floor (kind) · its ratio to one pass where the floor is not a pass ·
its ratio to one pass timed alone after the rotation (x then mostly in the caches: the floor before 2026-12-05).
The floor parts are the ones timed in each rule's rotation (``_bench_worker.floor_contenders``); the ``pass · pass
alone · copy`` column gives their medians over the setting's rules, with the pass timed alone after each rotation.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

RULES = ["clip", "arc", "clip in place", "arc in place", "cge", "signguard"]


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.3g} ms" if ms < 100 else f"{ms:.0f} ms"


def _cell(rec: dict[str, Any]) -> str:
    if rec.get("status") != "ok":
        return str(rec.get("status", "—"))
    mine = rec["phalanx"]["time"]
    parts = [_ms(mine)]
    peers = [p["time"] for p in rec.get("peers", []) if p.get("status") == "ok"]
    if peers:
        parts.append(f"{min(peers) / mine:.2f}×")
    kind = rec.get("floor_kind", "pass")
    parts.append(f"{mine / rec['floor']:.1f} ({kind})")
    if kind != "pass":
        parts.append(f"{mine / rec['floor_parts']['pass']:.1f} (pass)")
    if "pass_alone" in rec["floor_parts"]:
        parts.append(f"{mine / rec['floor_parts']['pass_alone']:.1f} (pass alone)")
    return " · ".join(parts)


def table(results: list[dict[str, Any]]) -> str:
    """The Markdown table of ``results`` (the list ``aggregators.py --json`` writes)."""
    lines = [f"| n, d | thr | pass · pass alone · copy | {' | '.join(f'`{r}`' for r in RULES)} |",
             "|---|---|---|" + "---|" * len(RULES)]
    for block in results:
        st = block["setting"]
        cases = {c["rule"]: c for c in block["cases"] if c.get("floor_parts")}
        med = {}
        for part in ("pass", "pass_alone", "copy"):
            values = [c["floor_parts"][part] for c in cases.values() if part in c["floor_parts"]]
            med[part] = _ms(statistics.median(values)) if values else "—"
        d = str(st["d"])
        power = str(len(d) - 1).translate(str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹"))
        head = f"{st['n']:,}, 10{power}" if d.strip("0") == "1" else f"{st['n']:,}, {st['d']:,}"
        cells = [_cell(cases[r]) if r in cases else "—" for r in RULES]
        lines.append(f"| {head} | {st['threads']} | {med['pass']} · {med['pass_alone']} · {med['copy']} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("json", help="the file aggregators.py --json wrote")
    args = ap.parse_args(argv)
    try:
        with open(args.json) as fh:
            results = json.load(fh)
        text = table(results)
    except (OSError, ValueError) as exc:
        ap.error(f"json: {args.json}: {type(exc).__name__}: {exc}")
    except (KeyError, TypeError, IndexError) as exc:
        ap.error(f"json: {args.json} is not a list of settings as aggregators.py --json writes ({exc!r})")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
