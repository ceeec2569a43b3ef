"""Backdoor defences against backdoor attacks, as a preset: clean accuracy, attack success and durability for every
defence × backdoor attack × heterogeneity α, and what each defence costs when nobody attacks — tables with
intervals, paired differences, a plot, a report.

The question. Yang, Shi & Li (ICML 2025, Definition 2.2 and Theorem 3.1; docs/tension.md) show that robustness to
f of n Byzantine workers has a price when nobody attacks: a rule that tolerates them is at best ε-accurate with
ε ≥ f/(n − f), and that price grows with the honest workers' heterogeneity. They ask it of untargeted attacks and
robust aggregation; this study asks it of *backdoor* defences (FoolsGold, FLAME, RLR, FLDetector, norm clipping;
docs/aggregators.md, "Backdoor defences"; CRFL's clipped and perturbed global model, with the certificate of its
smoothed classifier, as the rule name ``crfl``) against backdoor attacks (BadNets pixel pattern, DBA, Neurotoxin,
edge-case, projected model replacement; docs/attacks.md): does a defence that cuts the backdoor's success cost clean
accuracy without an attack, and does that cost grow as the clients' data grow apart (smaller Dirichlet α)?

Grid: rule ∈ ``rules`` (the mean is the baseline) × attack ∈ {none, ``attacks``} × α ∈ ``alphas`` (Dirichlet label
split) × seeds; federated averaging (``local_steps`` local SGD steps, ``clients_per_round`` clients a round, all by
default). The attackers (``byzantine`` of the ``workers``) poison rounds 0 … s − 1 (s = ``stop_round``) and behave
honestly from round s on; each attacked run goes on ``after`` = k more rounds. Per attacked cell: the clean test
accuracy and the attack success (``attack_success``) at round s, and the **durability** — the attack success k
rounds after the attackers stopped (the row with ``rounds_since_stop = k``); a run with no attack stops at round s
and gives its clean accuracy there. Each is a mean with a 95 % Student-t interval over the seeds. Paired by seed
(same seed = same split, initial model, batches and attackers): the success cut of a defence, mean − rule attack
success at round s, with the verdict "cuts it" when it is shown above 0 (below: the Holm-adjusted p); and its
**price** with no attack, mean − rule clean accuracy at round s, "costs accuracy" when it is shown above 0. No verdict
from fewer than :data:`~phalanx.analysis.stats.MIN_SEEDS` seeds or an interval of zero width (every seed the same).

**Many verdicts, one family.** The report reads every cut, every price and every trend at once (175 in the full
preset: 140 cuts, 28 prices, 7 trends), so they are one family: each verdict is decided by its Holm-adjusted
p-value (Holm 1979; the family-wise error rate ≤ 0.05 under any dependence: :func:`phalanx.analysis.stats.holm`),
while the intervals shown
stay the per-comparison 95 % ones. **A trend is tested, not read off**: "the price grows with heterogeneity" is, per
defence, the per-seed least-squares slope of the price on log₁₀ α (paired by seed), with its t-interval over the
seeds — negative when the price grows as α shrinks — in the same family.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from phalanx.analysis.stats import MIN_SEEDS, Estimate, holm, mean_ci, slope
from phalanx.errors import ConfigError
from phalanx.experiments.plots import rule_colours, save_figure
from phalanx.experiments.validrun import ValidRun
from phalanx.studies import raw
from phalanx.studies.registry import register
from phalanx.studies.reporting import family_note, holm_p, pick_preset, provenance
from phalanx.studies.template import Document, GridFunctions, GridStudy

MEAN = "mean"
NONE = "none"
CRFL = "crfl"
"""Not a rule: CRFL (Xie et al., ICML 2021; :mod:`phalanx.training.crfl`) — the mean, with the global model clipped
and perturbed after every round (``server_projection = "crfl"`` with the preset's ``crfl_params``); its final rows
also carry the smoothed classifier's accuracy, attack success and certificate."""
CRFL_PARAMS: dict[str, Any] = {"clip": 5.0, "clip_growth": 0.02, "noise": 0.01}
"""CRFL's clipping and noise for the presets' MLP (4,810 parameters on digits): its norm is 4.9 at round 0 and
grows to ~7 by round 50 under the mean (measured on the quick setting, α = 0.5, seed 0), so ρ_t = 5 + 0.02·t binds
from the start and σ = 0.01 is the paper's MNIST noise (a noise vector of norm ~0.7 a round)."""
BACKDOORS = ("backdoor", "dba", "neurotoxin", "edgecase", "replacement")
"""The backdoor attacks the study knows (each logs ``attack_success`` and takes ``stop_round``)."""
_RESERVED = ("rounds", "eval_every", "attack", "attack_params", "byzantine", "aggregator", "partition", "alpha",
             "seed", "algorithm")
"""Run keys the grid sets itself: ``--set`` changes them through the preset's fields instead."""


@dataclass(frozen=True)
class Preset:
    """One setting of the experiment."""

    name: str
    description: str
    dataset: str
    model: str = "mlp"
    model_params: dict[str, Any] = field(default_factory=dict)
    workers: int = 20
    clients_per_round: int | None = None
    byzantine: int = 4
    f: int = 4
    rules: tuple[str, ...] = (MEAN, "cwtm", "foolsgold", "flame", "rlr")
    attacks: tuple[str, ...] = ("backdoor", "dba")
    attack_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    alphas: tuple[float, ...] = (0.5, 10.0)
    stop_round: int = 30
    after: int = 20
    eval_every: int = 10
    local_steps: int = 5
    batch_size: int = 16
    lr: float = 0.05
    momentum: float = 0.0
    seeds: tuple[int, ...] = (0, 1, 2)
    fallback_dataset: str | None = None
    crfl_params: dict[str, Any] = field(default_factory=lambda: dict(CRFL_PARAMS))
    """The ``server_projection_params`` of the ``crfl`` rule (when it is among ``rules``)."""


CLIP = 0.5
"""The full preset's static clipping threshold, and the norm the replacement attack projects onto (the attacker
knows the defence's bound: docs/attacks.md, ``replacement``). Measured on the quick setting (digits, α = 0.5, seed
0): honest update norms 0.12–0.48, median 0.34 in round 0 and 0.21 in round 29 — so 0.5 passes almost every honest
update and bounds a boosted one to ~1.5–2.5 × the median."""

PRESETS: dict[str, Preset] = {
    "quick": Preset(
        name="quick", description="CPU-sized: the default MLP on the built-in digits, FedAvg (5 local steps), "
        "n = 20 clients all sampled, 4 attackers; mean, cwtm, foolsgold, flame, rlr × backdoor, dba × α ∈ {0.5, 10}; "
        "attackers stop at round 30, durability at round 50", dataset="digits",
    ),
    "full": Preset(
        name="full", description="the default MLP on Fashion-MNIST (digits when absent), FedAvg, n = 30 clients, 6 "
        "attackers; mean, cwtm, foolsgold, flame, rlr, fldetector, clip, crfl × backdoor, dba, neurotoxin, edgecase, "
        "replacement × α ∈ {0.1, 0.5, 1, 10}; attackers stop at round 100, durability at round 150",
        dataset="fashion-mnist", fallback_dataset="digits", workers=30, byzantine=6, f=6,
        rules=(MEAN, "cwtm", "foolsgold", "flame", "rlr", "fldetector", f"clip(threshold={CLIP:g})>mean", CRFL),
        attacks=BACKDOORS, attack_params={"replacement": {"norm_bound": CLIP}}, alphas=(0.1, 0.5, 1.0, 10.0),
        stop_round=100, after=50, seeds=(0, 1, 2, 3, 4),
    ),
}


def preset(name: str, **changes: Any) -> Preset:
    """A preset by name with fields replaced, checked: the mean among the rules (success cut and price are measured
    against it), known backdoor attacks, α > 0, attackers, and rounds the evaluation lands on."""
    p = pick_preset(PRESETS, name, changes, ("rules", "attacks", "alphas", "seeds"))
    if "attacks" in changes and "attack_params" not in changes and isinstance(p.attack_params, dict):
        # the preset's own parameters of attacks the narrowed grid left out go with them (full: replacement's bound)
        p = replace(p, attack_params={a: v for a, v in p.attack_params.items() if a in p.attacks})
    if MEAN not in p.rules or len(p.rules) < 2:
        raise ConfigError("rules", list(p.rules), "the mean and at least one defence")
    if len(set(p.rules)) != len(p.rules):
        raise ConfigError("rules", list(p.rules), "distinct rules")
    unknown = [a for a in p.attacks if a not in BACKDOORS]
    if unknown or len(set(p.attacks)) != len(p.attacks):
        raise ConfigError("attacks", list(p.attacks), "distinct backdoor attacks among " + ", ".join(BACKDOORS))
    if not isinstance(p.attack_params, dict) or any(a not in p.attacks or not isinstance(v, dict)
                                                    or "stop_round" in v for a, v in p.attack_params.items()):
        raise ConfigError("attack_params", p.attack_params, "a table of parameters per attack of the grid "
                          "(stop_round is the preset's own field)")
    if any(isinstance(a, bool) or not isinstance(a, int | float) or not a > 0 or not math.isfinite(a)
           for a in p.alphas) or len(set(p.alphas)) != len(p.alphas):
        raise ConfigError("alphas", list(p.alphas), "distinct Dirichlet concentrations > 0")
    for key in ("stop_round", "after", "eval_every"):
        value = getattr(p, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(key, value, "an integer >= 1")
    if p.stop_round % p.eval_every or p.after % p.eval_every:
        raise ConfigError("eval_every", p.eval_every, f"a divisor of stop_round = {p.stop_round} and after = "
                          f"{p.after} (success is read at both)")
    if not isinstance(p.crfl_params, dict):
        raise ConfigError("crfl_params", p.crfl_params, "a table of CRFL's parameters (clip, noise, …)")
    if isinstance(p.byzantine, bool) or not isinstance(p.byzantine, int) or p.byzantine < 1:
        raise ConfigError("byzantine", p.byzantine, "an integer >= 1 (the attacked runs need attackers)")
    return p


@dataclass(frozen=True)
class Cell:
    """One run: a rule, an attack (``"none"``: the price), a Dirichlet α and a seed."""

    rule: str
    attack: str
    alpha: float
    seed: int


def cells(p: Preset) -> list[Cell]:
    """Every run of the grid."""
    return [Cell(r, a, float(al), s) for r in p.rules for a in (NONE, *p.attacks) for al in p.alphas for s in p.seeds]


def keys(p: Preset, cell: Cell) -> dict[str, Any]:
    """The run keys of one cell: an attacked run goes ``stop_round + after`` rounds, with the
    attack stopping at ``stop_round``; a run with no attack goes ``stop_round`` rounds."""
    attacked = cell.attack != NONE
    rounds = p.stop_round + p.after if attacked else p.stop_round
    data: dict[str, Any] = {
        "algorithm": "fedavg", "dataset": p.dataset, "model": p.model, "model_params": dict(p.model_params),
        "workers": p.workers, "aggregator": cell.rule, "f": p.f, "attack": cell.attack,
        "byzantine": p.byzantine if attacked else 0, "rounds": rounds, "eval_every": p.eval_every,
        "checkpoint_every": rounds, "local_steps": p.local_steps, "batch_size": p.batch_size, "lr": p.lr,
        "momentum": p.momentum, "partition": "dirichlet", "alpha": cell.alpha, "seed": cell.seed,
    }
    if p.clients_per_round is not None:
        data["clients_per_round"] = p.clients_per_round
    if attacked:
        data["attack_params"] = {**p.attack_params.get(cell.attack, {}), "stop_round": p.stop_round}
    if cell.rule == CRFL:  # the mean, the global model clipped and perturbed (not a rule: a server projection)
        data.update(aggregator=MEAN, server_projection=CRFL, server_projection_params=dict(p.crfl_params))
    return data


def check_overrides(overrides: dict[str, Any]) -> None:
    """A run key the grid sets itself is refused (set the preset's field)."""
    clash = sorted(set(overrides) & set(_RESERVED))
    if clash:
        raise ConfigError(clash[0], overrides[clash[0]], "left to the grid: set the preset's fields "
                          "(rules, attacks, attack_params, alphas, stop_round, after, eval_every, byzantine)")


@dataclass(frozen=True)
class Final:
    """What one ended run gave: clean accuracy at the stop round; for an attacked run the attack success there and
    ``after`` rounds later (None: not logged). A run that diverged before a round reads as its last row."""

    accuracy: float = field(metadata=raw.SHARE)
    success: float | None = field(default=None, metadata=raw.SHARE)
    durability: float | None = field(default=None, metadata=raw.SHARE)
    smoothed_accuracy: float | None = field(default=None, metadata=raw.SHARE)
    """CRFL's runs: the smoothed classifier's clean accuracy at the last round (and the three below)."""
    smoothed_success: float | None = field(default=None, metadata=raw.SHARE)
    certified_rate: float | None = field(default=None, metadata=raw.SHARE)
    radius: float | None = field(default=None, metadata=raw.FINITE)


def _row(rows: list[dict[str, Any]], round_: int) -> dict[str, Any]:
    """The row of ``round_``, or the last one before it (a diverged run)."""
    before = [r for r in rows if r["round"] <= round_]
    return before[-1] if before else rows[0]


def _success(row: dict[str, Any]) -> float | None:
    value = row.get("attack_success")
    return None if value is None else float(value)


def final(cell: Cell, run: ValidRun, rows: list[dict[str, Any]]) -> Final:
    """A cell's ended run: accuracy (and success) at the attack's ``stop_round``, success at the run's last round
    (``after`` rounds later); a run with no attack: its last round (the stop round)."""
    last = _row(rows, run.cfg.rounds)
    smoothed = {k: _value(last, col) for k, col in _SMOOTHED.items()}
    if cell.attack == NONE:
        return Final(float(last["test_accuracy"]), **smoothed)
    at = _row(rows, int(run.cfg.attack_params["stop_round"]))
    return Final(float(at["test_accuracy"]), _success(at), _success(last), **smoothed)


_SMOOTHED = {"smoothed_accuracy": "crfl_accuracy", "smoothed_success": "crfl_attack_success",
             "certified_rate": "crfl_certified_rate", "radius": "crfl_radius_median"}
"""CRFL's final-row columns, by the field of :class:`Final` that holds them."""


def _value(row: dict[str, Any], key: str) -> float | None:
    value = row.get(key)
    return None if value is None else float(value)


Key = tuple[str, str, float]
Metric = str  # "accuracy" | "success" | "durability"
METRICS: tuple[Metric, ...] = ("accuracy", "success", "durability", *_SMOOTHED)
LAST_ROUND: tuple[Metric, ...] = ("durability", *_SMOOTHED)
"""The metrics read at the run's last round (the others at the stop round)."""


def tabulate(finals: dict[Cell, Final]) -> dict[Key, dict[Metric, dict[int, float]]]:
    """Per (rule, attack, α) and metric: the value of each seed (a metric not logged is left out)."""
    out: dict[Key, dict[Metric, dict[int, float]]] = {}
    for c, fin in finals.items():
        per = out.setdefault((c.rule, c.attack, c.alpha), {m: {} for m in METRICS})
        for m in METRICS:
            value = getattr(fin, m)
            if value is not None:
                per[m][c.seed] = value
    return out


Table = dict[Key, dict[Metric, dict[int, float]]]


def estimate(table: Table, key: Key, metric: Metric) -> Estimate | None:
    """Mean and 95 % interval over the seeds of one metric of one (rule, attack, α); None without values."""
    values = table.get(key, {}).get(metric, {})
    return mean_ci(list(values.values())) if values else None


def _paired(a: dict[int, float], b: dict[int, float]) -> dict[int, float]:
    return {s: a[s] - b[s] for s in sorted(set(a) & set(b))}


def paired(table: Table, rule: str, attack: str, alpha: float, metric: Metric) -> Estimate | None:
    """mean − ``rule`` on ``metric`` at (attack, α), paired by seed: the success cut (attack success, an attack) or
    the price (accuracy, no attack); None without common seeds."""
    d = _paired(table.get((MEAN, attack, alpha), {}).get(metric, {}),
                table.get((rule, attack, alpha), {}).get(metric, {}))
    return mean_ci(list(d.values())) if d else None


def cut_verdict(e: Estimate | None) -> str:
    """Whether a defence cuts the attack success below the mean's (the paired difference mean − rule)."""
    if e is None:
        return "—"
    return e.side(below="raises it", above="cuts it", neither="no cut shown")


def price_verdict(e: Estimate | None) -> str:
    """Whether a defence costs clean accuracy with no attack (the paired difference mean − rule)."""
    if e is None:
        return "—"
    return e.side(below="gains accuracy", above="costs accuracy", neither="no price shown")


def _show(e: Estimate | None, sign: str = "") -> str:
    return "—" if e is None else e.show(100, 1, sign)


def attack_label(p: Preset, attack: str) -> str:
    params = p.attack_params.get(attack, {})
    return attack + ("(" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")" if params else "")


Comparison = tuple[str, ...]
"""A verdict's key in a report's family: ``("cut", rule, attack, α)``, ``("price", rule, α)`` or ``("trend", rule)``."""


def price_trend(table: Table, rule: str, alphas: tuple[float, ...]) -> Estimate | None:
    """Per seed, the least-squares slope of the price (mean − ``rule`` clean accuracy with no attack) on log₁₀ α;
    mean and 95 % interval over the seeds that have every α. Negative: the price grows as α shrinks (as the clients'
    data grow apart). None with fewer than two α or no such seed."""
    if len(alphas) < 2:
        return None
    per_alpha = [_paired(table.get((MEAN, NONE, a), {}).get("accuracy", {}),
                         table.get((rule, NONE, a), {}).get("accuracy", {})) for a in alphas]
    seeds = sorted(set.intersection(*(set(d) for d in per_alpha)))
    xs = [math.log10(a) for a in alphas]
    slopes = [slope(xs, [d[s] for d in per_alpha]) for s in seeds]
    return mean_ci(slopes) if slopes else None


def family(table: Table, p: Preset) -> dict[Comparison, Estimate | None]:
    """Every verdict the report reads — each defence's cut per (attack, α), its price per α and its price's trend
    across α — Holm-corrected as one family (the module's docstring)."""
    defences = [r for r in p.rules if r != MEAN]
    alphas = tuple(float(a) for a in p.alphas)
    keys: list[Comparison] = [("cut", r, a, str(al)) for r in defences for a in p.attacks for al in alphas]
    keys += [("price", r, str(al)) for r in defences for al in alphas]
    keys += [("trend", r) for r in defences] if len(alphas) > 1 else []
    unadjusted = [paired(table, k[1], k[2], float(k[3]), "success") if k[0] == "cut" else
           paired(table, k[1], NONE, float(k[2]), "accuracy") if k[0] == "price" else price_trend(table, k[1], alphas)
           for k in keys]
    return dict(zip(keys, holm(unadjusted)))


def trend_verdict(e: Estimate | None) -> str:
    """Whether a defence's price grows as α shrinks (the slope of the price on log₁₀ α below 0)."""
    if e is None:
        return "—"
    return e.side(below="grows with heterogeneity", above="shrinks with heterogeneity", neither="no trend shown")


def results_markdown(table: Table, p: Preset, fam: dict[Comparison, Estimate | None] | None = None) -> str:
    """Rows: (attack, α, rule); cells: clean accuracy, attack success at the stop round, durability, % mean ±
    half-width; the success cut vs the mean (paired by seed), its Holm-adjusted p and its verdict."""
    fam = family(table, p) if fam is None else fam
    k = f"{p.after} round{'s' if p.after != 1 else ''}"
    lines = [f"| attack | α | rule | clean accuracy % (round {p.stop_round}) | attack success % (round "
             f"{p.stop_round}) | durability % ({k} after) | success cut vs mean, points | 95 % interval | Holm p | "
             "verdict |", "|---|---|---|---|---|---|---|---|---|---|"]
    for attack in p.attacks:
        for alpha in p.alphas:
            for rule in p.rules:
                key = (rule, attack, float(alpha))
                cut = None if rule == MEAN else fam.get(("cut", rule, attack, str(float(alpha))))
                lines.append(
                    f"| {attack_label(p, attack)} | {alpha:g} | {rule} | {_show(estimate(table, key, 'accuracy'))} | "
                    f"{_show(estimate(table, key, 'success'))} | {_show(estimate(table, key, 'durability'))} | "
                    + ("(baseline) | | | |" if rule == MEAN else
                       f"{_show(cut, '+')} | {'—' if cut is None else cut.interval(100, 1)} | {holm_p(cut)} | "
                       f"{cut_verdict(cut)} |"))
    return "\n".join(lines)


def price_markdown(table: Table, p: Preset, fam: dict[Comparison, Estimate | None] | None = None) -> str:
    """Rows: (rule, α); the clean accuracy with no attack and the price (mean − rule, paired by seed); then, per
    defence, the price's trend across α (slope on log₁₀ α, per seed)."""
    fam = family(table, p) if fam is None else fam
    lines = [f"| rule | α | clean accuracy % with no attack (round {p.stop_round}) | price: mean − rule, points | "
             "95 % interval | Holm p | verdict |", "|---|---|---|---|---|---|---|"]
    for rule in p.rules:
        for alpha in p.alphas:
            acc = estimate(table, (rule, NONE, float(alpha)), "accuracy")
            if rule == MEAN:
                lines.append(f"| {rule} | {alpha:g} | {_show(acc)} | (baseline) | | | |")
                continue
            pr = fam.get(("price", rule, str(float(alpha))))
            lines.append(f"| {rule} | {alpha:g} | {_show(acc)} | {_show(pr, '+')} | "
                         f"{'—' if pr is None else pr.interval(100, 1)} | {holm_p(pr)} | {price_verdict(pr)} |")
    trends = [(r, fam.get(("trend", r))) for r in p.rules if r != MEAN and ("trend", r) in fam]
    if trends:
        lines += ["", "| rule | price's slope on log₁₀ α, points per decade | 95 % interval | Holm p | verdict |",
                  "|---|---|---|---|---|"]
        lines += [f"| {r} | {_show(e, '+')} | {'—' if e is None else e.interval(100, 1)} | {holm_p(e)} | "
                  f"{trend_verdict(e)} |" for r, e in trends]
    return "\n".join(lines)


def readout(table: Table, p: Preset, fam: dict[Comparison, Estimate | None] | None = None) -> str:
    """One paragraph: how many (defence, attack, α) cells cut the backdoor, how many (defence, α) pay a price, whose
    price grows with heterogeneity, and the tension — defences that cut the backdoor somewhere at an α where they
    cost accuracy. Every count is of Holm-corrected verdicts (:func:`family`)."""
    fam = family(table, p) if fam is None else fam
    cuts = {(k[1], k[2], float(k[3])): cut_verdict(e) for k, e in fam.items() if k[0] == "cut"}
    prices = {(k[1], float(k[2])): price_verdict(e) for k, e in fam.items() if k[0] == "price"}
    trends = {k[1]: trend_verdict(e) for k, e in fam.items() if k[0] == "trend"}
    n_cut = sum(v == "cuts it" for v in cuts.values())
    n_raise = sum(v == "raises it" for v in cuts.values())
    n_flat = sum(v == "no cut shown" for v in cuts.values())
    n_price = sum(v == "costs accuracy" for v in prices.values())
    n_gain = sum(v == "gains accuracy" for v in prices.values())
    n_free = sum(v == "no price shown" for v in prices.values())
    n_none = sum(v.startswith("no verdict") for v in [*cuts.values(), *prices.values(), *trends.values()])
    both = sorted({f"{r} at α = {al:g}" for (r, a, al), v in cuts.items()
                   if v == "cuts it" and prices.get((r, al)) == "costs accuracy"})
    seeds = f"{len(p.seeds)} seeds" + ("" if len(p.seeds) >= MIN_SEEDS else f" (fewer than {MIN_SEEDS}: no verdicts)")
    text = (f"Of {len(cuts)} (defence, attack, α) cells, the defence cut the attack success below the mean's at round "
            f"{p.stop_round} in {n_cut}, raised it in {n_raise}, and showed no difference in {n_flat}. Of "
            f"{len(prices)} (defence, α) pairs with no attack, {n_price} cost clean accuracy against the mean, "
            f"{n_gain} gained and {n_free} showed no difference. ")
    if trends:
        growing = sorted(r for r, v in trends.items() if v == "grows with heterogeneity")
        text += (f"The price grew with heterogeneity (slope on log₁₀ α below 0) for {len(growing)} of {len(trends)} "
                 "defences" + (f" ({', '.join(growing)}). " if growing else ". "))
    text += ("The tension — a backdoor cut and a price at the same α — shows for " + ", ".join(both) + "."
             if both else "No defence showed both a backdoor cut and a price at the same α.")
    text += f" {seeds}" + (f"; {n_none} comparisons gave no verdict (too few seeds, or every seed the same)."
                           if n_none else ".")
    return text + " " + family_note(fam.values())


def cells_csv(table: Table, p: Preset) -> str:
    """Every (rule, attack, α) and metric: the estimate and the per-seed values."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["rule", "attack", "alpha", "metric", "round", "mean", "low", "high", "per_seed"])
    for (rule, attack, alpha), per in sorted(table.items()):
        for m in METRICS:
            seeds = per.get(m, {})
            if not seeds:
                continue
            e = mean_ci(list(seeds.values()))
            rnd = p.stop_round + p.after if m in LAST_ROUND and attack != NONE else p.stop_round
            w.writerow([rule, attack, f"{alpha:g}", m, rnd, f"{e.mean:.6f}", f"{e.low:.6f}", f"{e.high:.6f}",
                        " ".join(f"{s}:{v:.6f}" for s, v in sorted(seeds.items()))])
    return buf.getvalue()


def _bars(es: list[Estimate], clip: bool) -> list[list[float]]:
    """Asymmetric error bars (in %) of the 95 % intervals; with ``clip``, cut at the scale [0, 100] an attack
    success lives on (a Student-t interval from three seeds may leave it)."""
    low, high = [], []
    for e in es:
        h = 100 * e.half_width if math.isfinite(e.half_width) else 0.0
        m = 100 * e.mean
        low.append(min(h, max(m, 0.0)) if clip else h)
        high.append(min(h, max(100 - m, 0.0)) if clip else h)
    return [low, high]


def plot(table: Table, p: Preset, path: Path) -> Path:
    """A panel per attack: attack success at the stop round (solid) and ``after`` rounds later (dashed) against α,
    a line per rule; a last panel: the price with no attack (mean − rule) against α; 95 % intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    alphas = sorted(float(a) for a in p.alphas)
    xs = list(range(len(alphas)))
    panels = len(p.attacks) + 1
    ncols = min(3, panels)
    nrows = -(-panels // ncols)
    fig, grid = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 4.4 * nrows), squeeze=False)
    axes = [list(grid.flat)[:panels]]
    for spare in list(grid.flat)[panels:]:
        spare.set_visible(False)
    width = 0.3 / max(1, len(p.rules))
    for ax, attack in zip(axes[0], p.attacks):
        for i, rule in enumerate(p.rules):
            shift = (i - (len(p.rules) - 1) / 2) * width
            for metric, style, label in (("success", "-", rule), ("durability", "--", None)):
                pts = [(x + shift, estimate(table, (rule, attack, a), metric)) for x, a in zip(xs, alphas)]
                got = [(x, e) for x, e in pts if e is not None]
                if got:
                    ax.errorbar([x for x, _ in got], [100 * e.mean for _, e in got],
                                yerr=_bars([e for _, e in got], True), marker="o" if metric == "success" else "x",
                                ls=style, capsize=3, color=rule_colours(list(p.rules))[rule], label=label)
        ax.set_title(f"{attack_label(p, attack)}, b = {p.byzantine}", fontsize=9)
        ax.set_ylabel("attack success %")
        ax.set_ylim(-5, 105)
    ax = axes[0][-1]
    for i, rule in enumerate(p.rules):
        if rule == MEAN:
            continue
        shift = (i - (len(p.rules) - 1) / 2) * width
        got = [(x + shift, e) for x, a in zip(xs, alphas) if (e := paired(table, rule, NONE, a, "accuracy"))]
        if got:
            ax.errorbar([x for x, _ in got], [100 * e.mean for _, e in got], yerr=_bars([e for _, e in got], False),
                        marker="o", capsize=3, color=rule_colours(list(p.rules))[rule], label=rule)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_title(f"price with no attack (round {p.stop_round})", fontsize=9)
    ax.set_ylabel("mean − rule clean accuracy, points")
    for a in axes[0]:
        a.set_xticks(xs, [f"{al:g}" for al in alphas])
        a.set_xlabel("Dirichlet α (smaller: more heterogeneous)")
        a.grid(alpha=0.3)
    # one legend under the panels (inside one it hid that panel's points): a colour per rule, then the two styles
    from matplotlib.lines import Line2D

    colours = rule_colours(list(p.rules))
    handles = [Line2D([], [], color=colours[rule], marker="o", label=rule) for rule in p.rules]
    handles += [Line2D([], [], color="k", ls="-", marker="o", label=f"round {p.stop_round} (attackers stop)"),
                Line2D([], [], color="k", ls="--", marker="x",
                       label=f"{p.after} round{'s' if p.after != 1 else ''} later (durability)")]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), fontsize=8, handlelength=3)
    fig.suptitle(f"{p.model} on {p.dataset}, FedAvg, n = {p.workers}, f = {p.f}, {len(p.seeds)} seeds (95 % "
                 "intervals; attack success's cut at [0, 100])")
    rows_of_legend = -(-len(handles) // min(len(handles), 5))
    fig.tight_layout(rect=(0, 0.035 * rows_of_legend / nrows + 0.01, 1, 1))
    return save_figure(fig, path, dpi=100)


def crfl_markdown(table: Table, p: Preset) -> str:
    """CRFL's smoothed classifier at the last round (``after`` rounds after the attackers stopped; the stop round
    with no attack): clean accuracy, attack success, the share of test inputs certified and the median radius."""
    lines = ["| attack | α | smoothed clean accuracy % | smoothed attack success % | certified % | median radius "
             "(trigger norm) |", "|---|---|---|---|---|---|"]
    for attack in (NONE, *p.attacks):
        for alpha in p.alphas:
            key = (CRFL, attack, float(alpha))
            r = estimate(table, key, "radius")
            lines.append(f"| {attack_label(p, attack)} | {alpha:g} | {_show(estimate(table, key, 'smoothed_accuracy'))}"
                         f" | {_show(estimate(table, key, 'smoothed_success'))} | "
                         f"{_show(estimate(table, key, 'certified_rate'))} | "
                         f"{'—' if r is None else f'{r.mean:.4f} ± {r.half_width:.4f}'} |")
    return "\n".join(lines)


def report_markdown(table: Table, p: Preset, *, command: str, wall_seconds: float | None, runs: int) -> str:
    """The whole report: setup, the attacked table, the price table, the readout."""
    fam = family(table, p)
    cpr = "all" if p.clients_per_round is None else str(p.clients_per_round)
    parts = [
        f"# Backdoor defences: success, durability and price — preset `{p.name}`", "",
        *provenance(command, wall_seconds, runs), "",
        f"Setup: {p.model}{f' {p.model_params}' if p.model_params else ''} on {p.dataset}, Dirichlet label split α ∈ "
        f"{[float(a) for a in p.alphas]}, n = {p.workers} clients ({cpr} a round), federated averaging "
        f"({p.local_steps} local steps, batch {p.batch_size}, lr {p.lr:g}, momentum {p.momentum:g}); f = {p.f} for "
        f"every rule; attacks with b = {p.byzantine} attackers who poison rounds 0 … {p.stop_round - 1} and train "
        f"honestly after; attack success = share of triggered test inputs (edgecase: of the edge-case test inputs) "
        f"classified as the target; durability = attack success {p.after} rounds after the attackers stopped. "
        f"Seeds {list(p.seeds)}; cells: mean ± 95 % Student-t half-width over the seeds; differences paired by seed.",
        "", "## Under attack", "", results_markdown(table, p, fam), "",
        "## The price with no attack (paired by seed)", "", price_markdown(table, p, fam), "",
        "## Readout", "", readout(table, p, fam), "",
    ]
    if CRFL in p.rules:
        parts += ["## CRFL's smoothed classifier and certificate (last round)", "",
                  f"M = {p.crfl_params.get('samples', 1000)} noisy copies of the final model vote; a test input is "
                  "certified when the vote's lead survives Hoeffding's bounds, and its radius bounds the norm of a "
                  "trigger that cannot change the vote — under the certificate's assumptions (a loss whose gradient "
                  "is L_Z-Lipschitz in the input, L_Z = 1 unless set; docs/aggregators.md, CRFL), which this MLP "
                  "does not satisfy: read the radius as the formula's value, not a guarantee.", "",
                  crfl_markdown(table, p), ""]
    return "\n".join(parts)


@register
class BackdoorDefences(GridStudy[Preset, Cell, Final]):
    """Backdoor defences against backdoor attacks (the module's docstring): ``phalanx experiment backdoor``."""

    name = "backdoor"
    help = ("Backdoor defences (foolsgold, flame, rlr, fldetector, clip, crfl; mean and cwtm as baselines) against "
            "backdoor attacks (backdoor, dba, neurotoxin, edgecase, replacement) across heterogeneity α: clean "
            "accuracy, attack success at the round the attackers stop and its durability after, and each "
            "defence's price with no attack — the tension of Yang, Shi & Li (ICML 2025) asked of backdoor "
            "defences. Tables with intervals, paired differences, plot.")
    preset_type = Preset
    presets = PRESETS
    out = "runs/backdoor-quick"
    preset_help = "quick (digits, CPU, minutes) or full (Fashion-MNIST, every defence and attack)."
    set_example = "alphas=[0.5]"

    functions = GridFunctions(preset, cells, keys, final, check=check_overrides)
    raw_value = Final

    def document(
        self, p: Preset, cells: list[Cell], collected: dict[Cell, Final], *, command: str,
        wall_seconds: float | None, runs: int,
    ) -> Document:
        table = tabulate(collected)
        fam = family(table, p)
        return Document(report_markdown(table, p, command=command, wall_seconds=wall_seconds, runs=runs),
                        cells_csv(table, p), "backdoor.png", "attack success, durability and price vs α",
                        lambda path: plot(table, p, path),
                        [results_markdown(table, p, fam) + "\n\n" + price_markdown(table, p, fam) + "\n\n"
                         + readout(table, p, fam)])
