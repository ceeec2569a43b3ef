"""The ``population`` workload of ``benchmarks/gpu.py``: the million-client federated run of ``benchmarks/scale.py``
on a device (issue 37, item 7; docs/federated.md "A population of clients").

The run is scale.py's, through :func:`scale.run_populations` (each population size in a fresh interpreter):
FedProx's synthetic(0.5, 0.5) population, 10 % Byzantine under ALIE, C = 100 clients a round, 5 local steps of batch
10, logistic regression, the trimmed mean for f = 10, 3 warm-up rounds then 10 timed ones (each ending with
``torch.cuda.synchronize`` on CUDA), at N = 10³ and N = 10⁶ clients. ``--quick``: N = 100 and 10⁵, C = 10, 1 warm-up
round, 2 timed, 1 local step (scale.py's own smoke test, tests/test_population.py).

Reported per device and N: the median round time (min, max), the peak memory — on CUDA the peak the allocator held
(``torch.cuda.max_memory_allocated``), on the CPU the process's peak RSS (``scale.peak_rss``, interpreter and torch
included), both recorded on either — and per device the two ratios, N = 10⁶ ÷ N = 10³, that docs/federated.md
targets at ≤ 1.5× each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from _bench_common import fmt_time, md_row


@dataclass(frozen=True)
class Plan:
    sizes: tuple[int, ...]
    per_round: int
    rounds: int
    warm_up: int
    local_steps: int


FULL = Plan((1000, 1_000_000), 100, 10, 3, 5)
QUICK = Plan((100, 100_000), 10, 2, 1, 1)


def run(device: str, quick: bool, threads: int = 1) -> dict[str, Any]:
    """The populations of the plan on ``device``: ``{"device", "plan", "records"}`` or, when a child failed,
    ``{"device", "plan", "error"}`` (never raised: the other workloads' figures still print)."""
    import scale

    p = QUICK if quick else FULL
    out: dict[str, Any] = {"device": device, "plan": p.__dict__}
    try:
        out["records"] = scale.run_populations(list(p.sizes), p.per_round, p.rounds, p.warm_up, p.local_steps,
                                               threads, device)
    except RuntimeError as exc:
        out["error"] = str(exc)
    return out


def peak(rec: dict[str, Any]) -> tuple[int, str]:
    """The peak memory reported for a record and what it is: the device's allocator on CUDA, the RSS on the CPU."""
    if rec.get("device_peak") is not None:
        return int(rec["device_peak"]), "max_memory_allocated"
    return int(rec["rss"]), "peak RSS"


def ratios(res: dict[str, Any]) -> tuple[float, float] | None:
    """(median round time, peak memory) at the largest population ÷ at the smallest; None without records."""
    recs = res.get("records")
    if not recs:
        return None
    lo, hi = recs[0], recs[-1]
    return hi["median"] / lo["median"], peak(hi)[0] / peak(lo)[0]


def table(results: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: one row per (device, population), then the device's ratios."""
    lines = [md_row(["device", "clients", "median round", "min", "max", "peak memory", "of"]),
             md_row(["---", "---:", "---:", "---:", "---:", "---:", "---"])]
    for res in results:
        if "error" in res:
            lines.append(md_row([res["device"], "—", res["error"], "", "", "", ""]))
            continue
        for r in res["records"]:
            mem, what = peak(r)
            lines.append(md_row([r["device"], f"{r['population']:,}", fmt_time(r["median"]), fmt_time(r["min"]),
                                 fmt_time(r["max"]), f"{mem / 2**20:.1f} MiB", what]))
        got = ratios(res)
        assert got is not None
        lo, hi = res["records"][0]["population"], res["records"][-1]["population"]
        lines.append(md_row([res["records"][-1]["device"], f"{hi:,} ÷ {lo:,}", f"{got[0]:.3f}×", "", "",
                             f"{got[1]:.3f}×", "ratio"]))
    return lines


def notes(results: list[dict[str, Any]]) -> list[str]:
    out = []
    for res in results:
        p = res["plan"]
        steps = f"{p['local_steps']} local step{'s' if p['local_steps'] != 1 else ''}"
        out.append(f"population on {res['device']}: synthetic(0.5, 0.5), {p['per_round']} clients a round, "
                   f"{steps} of batch 10, logreg, cwtm f = {p['per_round'] // 10}, 10 % ALIE; "
                   f"median of {p['rounds']} rounds after {p['warm_up']} (benchmarks/scale.py, one interpreter per N)")
    return out
