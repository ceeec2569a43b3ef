"""The price of robustness for LoRA adapters, as a preset: accuracy with no attack, under a vector attack and under
the trigger-phrase backdoor, per rule and per aggregation mode — tables with intervals, paired differences decided by
Holm-adjusted p-values, the backdoor's success measured against the clean model's own bias, a plot, a report.

The question. Yang, Shi & Li (ICML 2025, Definition 2.2 and Theorem 3.1; docs/tension.md): a rule that tolerates f of
n Byzantine workers is at best ε-accurate with ε ≥ f/(n − f) — robustness has a price when nobody attacks. With
LoRA (Hu et al., ICLR 2022) the rule sees adapters, not gradients, and *which* vector it sees is the aggregation mode
(docs/lora.md): ``factors`` (every A and B; the rule's ε and κ hold in factor space only), ``update`` (each layer's
ΔWᵢ = BᵢAᵢ − BA, re-factorised by a rank-r truncated SVD; FlexLoRA, Bai et al., NeurIPS 2024), ``shared`` (A frozen,
the rule on B; FFA-LoRA, Sun et al., ICLR 2024, exact for any rule). Per mode: what does a robust rule cost with no
attack, what does it keep under a vector attack, and does it stop a phrase backdoor (Wan et al., ICML 2023, §3)?

Grid: mode ∈ ``modes`` × rule ∈ ``rules`` (the mean is the baseline; every rule configured for f = ``f``) × arm ×
seeds, federated averaging (``local_steps`` local SGD steps, every client every round) of the model's adapters and
head; the arms are ``none`` (nobody attacks: the phrase backdoor configured with b = 0 attackers, so that its row
carries the *clean* model's backdoor measures), ``vector`` (``vector_attack`` with b = ``byzantine``) and ``phrase``
(``phrase-backdoor`` with b = ``byzantine``: the trigger ``phrase`` tokenised by the model's own tokenizer, label
``target``). Per run, the final row: test accuracy; for the backdoor, on the test texts not of class ``target``,
``attack_success`` (the share the triggered text sends to ``target``) and ``attack_flip`` (among the texts the same
model does *not* already send to ``target`` untriggered, the share the phrase moves there;
:class:`~phalanx.attacks.phrase.PhraseBackdoor`).

Statistics, each paired by seed (same seed = same split, initial adapters, batches and attackers) with a 95 %
Student-t interval over the seeds:

* *price* (mode, robust rule): mean − rule accuracy in arm ``none`` — "costs accuracy" when above 0;
* *rescue* (mode, robust rule): rule − mean accuracy in arm ``vector`` — "rescues" when above 0;
* *lift* (mode, rule): ``attack_success`` in arm ``phrase`` − in arm ``none`` — the backdoor's success over the
  clean model's bias (the unpoisoned model already sent 94 % of the triggered texts to the target: docs/lora.md);
  "backdoor shown" when above 0;
* *flip lift* (mode, rule): the same for ``attack_flip``, on the seeds where both runs left texts to flip.

All are one family (the report reads them all): each verdict is decided by its Holm-adjusted p-value
(:func:`phalanx.analysis.stats.holm`; family-wise error ≤ 5 % under any dependence). No verdict from fewer than
:data:`~phalanx.analysis.stats.MIN_SEEDS` seeds or an interval of zero width.

Raw results: the command writes every run's :class:`Final` to ``runs.csv`` (:mod:`phalanx.studies.raw`: the cell,
the run id of its configuration, each measure by ``repr``), and ``phalanx experiment lora --results runs.csv`` makes
the report again from it, byte for byte, without training; a file of another grid or settings, or with a share
outside [0, 1], NaN or inf where a measure must be finite, is one :class:`~phalanx.errors.ConfigError` naming
``results``.
"""

from __future__ import annotations

import csv
import functools
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phalanx.analysis.stats import MIN_SEEDS, Estimate, mean_ci
from phalanx.errors import ConfigError
from phalanx.experiments.config import RunConfig, make_config
from phalanx.experiments.plots import rule_colours, save_figure
from phalanx.experiments.validrun import ValidRun
from phalanx.studies import raw
from phalanx.studies.registry import register
from phalanx.studies.reporting import family_note, holm_family, holm_p, pick_preset, provenance
from phalanx.studies.template import Document, GridFunctions, GridStudy

MEAN = "mean"
MODES = ("factors", "update", "shared")
ARMS = ("none", "vector", "phrase")
"""No attack (the phrase backdoor with 0 attackers: the clean model's measures), a vector attack, the backdoor."""
PHRASE = "phrase-backdoor"
MEASURES = ("test_accuracy", "attack_success", "attack_flip", "attack_clean_target", "attack_flip_base",
            "lora_residual")
"""What :func:`collect` reads of a run's final row (None where the row has no such column or it is not finite)."""
_RESERVED = ("attack", "attack_params", "byzantine", "aggregator", "model", "model_params", "seed", "algorithm",
             "dataset", "dataset_params", "rounds", "eval_every")
"""Run keys the grid sets itself: ``--set`` changes them through the preset's fields instead."""


@dataclass(frozen=True)
class Preset:
    """One setting of the experiment."""

    name: str
    description: str
    dataset: str
    model: str = "hf:phalanx-bert-tiny"
    length: int = 16
    """Tokens per text (``dataset_params.length``); the model's tokenizer is the model's own."""
    r: int = 4
    model_params: dict[str, Any] = field(default_factory=dict)
    """More ``model_params`` (``target_modules``, ``alpha``); ``r`` and ``aggregation`` are the preset's."""
    modes: tuple[str, ...] = MODES
    rules: tuple[str, ...] = (MEAN, "cwtm")
    workers: int = 10
    byzantine: int = 2
    f: int = 2
    vector_attack: str = "signflip"
    vector_params: dict[str, Any] = field(default_factory=dict)
    phrase: str = "good morrow"
    """The trigger, as text: tokenised by the model's tokenizer (no special tokens) into ``attack_params.trigger``."""
    target: int = 1
    poison_fraction: float = 0.5
    rounds: int = 30
    local_steps: int = 5
    batch_size: int = 16
    lr: float = 1.0
    momentum: float = 0.0
    device: str = "cpu"
    seeds: tuple[int, ...] = (0, 1, 2)
    fallback_dataset: str | None = None


PRESETS: dict[str, Preset] = {
    "quick": Preset(
        name="quick", description="CPU-sized: the embedded hf:phalanx-bert-tiny (LoRA r = 4 on query and value) on "
        "the shipped synthetic Sent140 sample, 10 clients by user, FedAvg (5 local steps, lr 1), 2 attackers; "
        "factors, update, shared × mean, cwtm × no attack, signflip, phrase backdoor; 30 rounds (cwmed and others: "
        "--set rules=...)", dataset="sent140-sample",
    ),
    "gpu": Preset(
        name="gpu", description="a GPU: BERT-base (google-bert/bert-base-uncased from the Hugging Face cache; "
        "nothing is downloaded) with LoRA r = 8 on query and value, LEAF's Sent140 (the shipped sample when absent), "
        "texts of 64 tokens, 30 clients by user, 6 attackers; factors, update, shared × mean, cwtm, cwmed, nnm>cwtm "
        "× no attack, signflip, phrase backdoor; 100 rounds", dataset="sent140", fallback_dataset="sent140-sample",
        model="hf:google-bert/bert-base-uncased", length=64, r=8, rules=(MEAN, "cwtm", "cwmed", "nnm>cwtm"),
        workers=30, byzantine=6, f=6, rounds=100, lr=0.5, batch_size=32, device="cuda", seeds=(0, 1, 2, 3, 4),
    ),
}


def preset(name: str, **changes: Any) -> Preset:
    """A preset by name with fields replaced, checked: the mean among distinct rules, known modes, attackers within
    f and fewer than the workers, a vector attack that is not a data attack, a target class of a binary task."""
    from phalanx import attacks

    p = pick_preset(PRESETS, name, changes, ("rules", "modes", "seeds"))
    if MEAN not in p.rules or len(p.rules) < 2 or len(set(p.rules)) != len(p.rules):
        raise ConfigError("rules", list(p.rules), "distinct rules, the mean and at least one robust rule")
    if any(m not in MODES for m in p.modes) or len(set(p.modes)) != len(p.modes):
        raise ConfigError("modes", list(p.modes), "distinct modes among " + ", ".join(MODES))
    if not 1 <= p.byzantine <= p.f or 2 * p.f >= p.workers:
        raise ConfigError("byzantine", p.byzantine, f"1 <= byzantine <= f = {p.f} < workers / 2 = {p.workers / 2:g}")
    if p.vector_attack not in attacks.names("vector"):
        raise ConfigError("vector_attack", p.vector_attack, "a vector attack: " + ", ".join(attacks.names("vector")))
    if not isinstance(p.phrase, str) or not p.phrase.strip():
        raise ConfigError("phrase", p.phrase, "a non-empty text")
    if p.target not in (0, 1):
        raise ConfigError("target", p.target, "0 or 1 (Sent140 is negative / positive)")
    return p


def trigger_ids(p: Preset) -> list[int]:
    """The preset's phrase as token ids of its model's tokenizer (no special tokens; offline): tokenised once per
    (model, phrase) in a process (:func:`_tokenised`), however many cells ask."""
    return list(_tokenised(p.model, p.phrase))


@functools.lru_cache(maxsize=8)
def _tokenised(model: str, phrase: str) -> tuple[int, ...]:
    """``phrase`` as ``model``'s tokenizer's ids (a tuple, so that the cached value cannot be changed by a caller)."""
    from transformers import AutoTokenizer

    from phalanx import hub

    tok = AutoTokenizer.from_pretrained(hub.resolve(model), local_files_only=True)
    ids = tuple(int(i) for i in tok(phrase, add_special_tokens=False)["input_ids"])
    if not ids:
        raise ConfigError("phrase", phrase, f"a text that {model}'s tokenizer turns into at least one token")
    return ids


@dataclass(frozen=True)
class Cell:
    """One run: an aggregation mode, a rule, an arm (``none``, ``vector``, ``phrase``) and a seed."""

    mode: str
    rule: str
    arm: str
    seed: int


def cells(p: Preset) -> list[Cell]:
    """Every run of the grid."""
    return [Cell(m, r, a, s) for m in p.modes for r in p.rules for a in ARMS for s in p.seeds]


def check_overrides(overrides: dict[str, Any]) -> None:
    """A run key the grid sets itself is refused as a ``--set`` run key (the preset's fields change it)."""
    bad = sorted(set(overrides) & set(_RESERVED))
    if bad:
        raise ConfigError("--set", bad, "keys the grid does not set itself (change the preset's fields instead: "
                          "modes, rules, vector_attack, phrase, rounds …)")


def keys(p: Preset, cell: Cell, trigger: list[int] | None = None) -> dict[str, Any]:
    """The run keys of one cell, not validated, evaluated at its last round only: the study template applies the
    command line's run keys over them and validates each run once (:class:`~phalanx.studies.template.GridStudy`).
    ``trigger``: the phrase's ids, tokenised here when not given (once per process: :func:`trigger_ids`)."""
    ids = list(trigger) if trigger is not None else trigger_ids(p)
    phrase = {"trigger": ids, "target": p.target, "poison_fraction": p.poison_fraction}
    attack, params, b = {"none": (PHRASE, phrase, 0), "vector": (p.vector_attack, dict(p.vector_params), p.byzantine),
                         "phrase": (PHRASE, phrase, p.byzantine)}[cell.arm]
    return {
        "dataset": p.dataset, "dataset_params": {"tokenizer": p.model, "length": p.length},
        "partition": "natural", "model": p.model,
        "model_params": {**p.model_params, "r": p.r, "aggregation": cell.mode}, "algorithm": "fedavg",
        "workers": p.workers, "local_steps": p.local_steps, "batch_size": p.batch_size, "lr": p.lr,
        "momentum": p.momentum, "byzantine": b, "f": p.f, "aggregator": cell.rule, "attack": attack,
        "attack_params": params, "rounds": p.rounds, "eval_every": p.rounds, "checkpoint_every": p.rounds,
        "seed": cell.seed, "device": p.device,
    }


def config_for(p: Preset, cell: Cell, overrides: dict[str, Any] | None = None,
               trigger: list[int] | None = None) -> RunConfig:
    """One cell's configuration on its own, validated (:func:`keys` with ``overrides`` over them; ``trigger``: the
    phrase's ids instead of the tokenizer's): for a caller that wants one cell's run outside the study
    (``benchmarks/gpu.py`` times the ``gpu`` preset's round with it, ``scripts/lora_update_norms.py`` trains one).
    The study itself plans from :func:`keys` (:meth:`Lora.plan`), each run validated once."""
    check_overrides(overrides or {})
    return make_config({**keys(p, cell, trigger), **(overrides or {})})


SHARE = raw.SHARE
"""A share of texts (accuracy, success, flip rate): what a run can give, and all a raw-results file may hold."""
FINITE = raw.FINITE
"""A count of texts, a truncation residual: finite and not negative."""


@dataclass(frozen=True)
class Final:
    """What one ended run ended with: :data:`MEASURES` (None: not in the row, or not finite) — the raw per-run
    results (``runs.csv``, :mod:`phalanx.studies.raw`), each bounded to what a run can give."""

    test_accuracy: float = field(metadata=SHARE)
    """A diverged run's accuracy as its row says, 0 when that is not finite."""
    attack_success: float | None = field(default=None, metadata=SHARE)
    attack_flip: float | None = field(default=None, metadata=SHARE)
    attack_clean_target: float | None = field(default=None, metadata=SHARE)
    attack_flip_base: float | None = field(default=None, metadata=FINITE)
    lora_residual: float | None = field(default=None, metadata=FINITE)


def _finite(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None


def final(cell: Cell, run: ValidRun, rows: list[dict[str, Any]]) -> Final:
    """A cell's raw value: its ended run's last row (a diverged run: its accuracy as the row says, 0 when that is not
    finite)."""
    last = rows[-1]
    return Final(_finite(last.get("test_accuracy")) or 0.0, *(_finite(last.get(k)) for k in MEASURES[1:]))


Key = tuple[str, str, str]
"""(mode, rule, arm)."""


def per_seed(finals: dict[Cell, Final], measure: str) -> dict[Key, dict[int, float]]:
    """Per (mode, rule, arm): ``measure`` of each seed whose run has it."""
    out: dict[Key, dict[int, float]] = {}
    for c, fin in finals.items():
        v = getattr(fin, measure)
        if v is not None:
            out.setdefault((c.mode, c.rule, c.arm), {})[c.seed] = v
    return out


def _paired(a: dict[int, float], b: dict[int, float]) -> list[float]:
    return [a[s] - b[s] for s in sorted(set(a) & set(b))]


@dataclass(frozen=True)
class Comparison:
    """One paired difference of the family: what (``price``, ``rescue``, ``lift``, ``flip lift``), where (mode,
    rule), its estimate (None: no seed had both runs), and the two sides' means."""

    what: str
    mode: str
    rule: str
    estimate: Estimate | None

    @property
    def verdict(self) -> str:
        if self.estimate is None:
            return "no verdict (no seed with both runs)"
        above = {"price": "costs accuracy", "rescue": "rescues", "lift": "backdoor shown",
                 "flip lift": "backdoor shown"}[self.what]
        below = {"price": "gains accuracy", "rescue": "worse than the mean", "lift": "below the clean model",
                 "flip lift": "below the clean model"}[self.what]
        neither = {"price": "no price shown", "rescue": "no rescue shown", "lift": "no lift shown",
                   "flip lift": "no lift shown"}[self.what]
        return self.estimate.side(below, above, neither)


def comparisons(finals: dict[Cell, Final], p: Preset) -> list[Comparison]:
    """Every price, rescue, lift and flip lift of the grid, Holm-corrected as one family."""
    acc = per_seed(finals, "test_accuracy")
    out: list[Comparison] = []

    def add(what: str, mode: str, rule: str, diffs: list[float]) -> None:
        out.append(Comparison(what, mode, rule, mean_ci(diffs) if diffs else None))

    for mode in p.modes:
        for rule in p.rules:
            if rule == MEAN:
                continue
            add("price", mode, rule, _paired(acc.get((mode, MEAN, "none"), {}), acc.get((mode, rule, "none"), {})))
            add("rescue", mode, rule, _paired(acc.get((mode, rule, "vector"), {}),
                                              acc.get((mode, MEAN, "vector"), {})))
    for measure, what in (("attack_success", "lift"), ("attack_flip", "flip lift")):
        table = per_seed(finals, measure)
        for mode in p.modes:
            for rule in p.rules:
                add(what, mode, rule, _paired(table.get((mode, rule, "phrase"), {}),
                                              table.get((mode, rule, "none"), {})))
    return holm_family(out)


def _est(table: dict[Key, dict[int, float]], key: Key, scale: float = 100, digits: int = 1) -> str:
    seeds = table.get(key)
    return "—" if not seeds else mean_ci(list(seeds.values())).show(scale, digits)


def _arm_label(p: Preset, arm: str) -> str:
    return {"none": "no attack", "vector": f"{p.vector_attack} (b = {p.byzantine})",
            "phrase": f"phrase backdoor (b = {p.byzantine})"}[arm]


def accuracy_markdown(finals: dict[Cell, Final], p: Preset) -> str:
    """Rows: (mode, rule); columns: the arms; cells: final test accuracy % mean ± 95 % half-width."""
    acc = per_seed(finals, "test_accuracy")
    lines = ["| mode | rule | " + " | ".join(_arm_label(p, a) for a in ARMS) + " |", "|" + "---|" * (2 + len(ARMS))]
    for mode in p.modes:
        for rule in p.rules:
            lines.append(f"| {mode} | {rule} | " + " | ".join(_est(acc, (mode, rule, a)) for a in ARMS) + " |")
    return "\n".join(lines)


def _row(c: Comparison) -> str:
    e = c.estimate
    if e is None:
        return "— | — | — | " + c.verdict
    return f"{e.show(100, 1, '+')} | {e.interval(100, 1)} | {holm_p(e)} | {c.verdict}"


def robustness_markdown(cs: list[Comparison], p: Preset) -> str:
    """Per (mode, robust rule): the price with no attack and the rescue under the vector attack, paired by seed."""
    lines = [f"| mode | rule | price: mean − rule, no attack (points) | 95 % interval | Holm p | verdict | rescue: "
             f"rule − mean, {p.vector_attack} (points) | 95 % interval | Holm p | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    by = {(c.what, c.mode, c.rule): c for c in cs}
    for mode in p.modes:
        for rule in p.rules:
            if rule != MEAN:
                lines.append(f"| {mode} | {rule} | {_row(by[('price', mode, rule)])} | "
                             f"{_row(by[('rescue', mode, rule)])} |")
    return "\n".join(lines)


def backdoor_markdown(finals: dict[Cell, Final], cs: list[Comparison], p: Preset) -> str:
    """Per (mode, rule): attack success and flip rate, clean and poisoned, and their lifts, paired by seed."""
    succ, flip = per_seed(finals, "attack_success"), per_seed(finals, "attack_flip")
    base = per_seed(finals, "attack_flip_base")
    by = {(c.what, c.mode, c.rule): c for c in cs}
    lines = ["| mode | rule | success %, clean | success %, poisoned | lift (points) | 95 % interval | Holm p | "
             "verdict | texts left to flip, clean | flip %, clean | flip %, poisoned | flip lift (points) | "
             "95 % interval | Holm p | verdict |", "|" + "---|" * 15]
    for mode in p.modes:
        for rule in p.rules:
            left = base.get((mode, rule, "none"), {})
            texts = "—" if not left else " / ".join(f"{int(v)}" for _, v in sorted(left.items()))
            lines.append(f"| {mode} | {rule} | {_est(succ, (mode, rule, 'none'))} | "
                         f"{_est(succ, (mode, rule, 'phrase'))} | {_row(by[('lift', mode, rule)])} | {texts} | "
                         f"{_est(flip, (mode, rule, 'none'))} | {_est(flip, (mode, rule, 'phrase'))} | "
                         f"{_row(by[('flip lift', mode, rule)])} |")
    return "\n".join(lines)


def readout(cs: list[Comparison], p: Preset) -> str:
    """One paragraph: what the family shows, per kind of comparison."""
    seeds = f"{len(p.seeds)} seeds" + ("" if len(p.seeds) >= MIN_SEEDS else f" (fewer than {MIN_SEEDS}: no verdicts)")
    parts = []
    for what, word in (("price", "costs accuracy"), ("rescue", "rescues"), ("lift", "backdoor shown"),
                       ("flip lift", "backdoor shown")):
        these = [c for c in cs if c.what == what]
        parts.append(f"{what}: {sum(c.verdict == word for c in these)} of {len(these)} shown")
    return ("Verdicts shown (Holm-adjusted p < 0.05, the difference above 0) — " + "; ".join(parts) + f"; {seeds}. "
            "A lift is over the same rule and mode trained with nobody poisoning, so a model that already sends "
            "the texts to the target does not count as a backdoor.")


def runs_csv(finals: dict[Cell, Final]) -> str:
    """Every run's final measures, one line per run, to 6 significant digits (the report's ``cells.csv``, for
    reading; ``runs.csv`` holds them digit for digit, with each run's id: :attr:`Lora.raw_value`)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["mode", "rule", "arm", "seed", *MEASURES])
    for c, fin in sorted(finals.items(), key=lambda kv: (kv[0].mode, kv[0].rule, kv[0].arm, kv[0].seed)):
        values = [getattr(fin, k) for k in MEASURES]
        w.writerow([c.mode, c.rule, c.arm, c.seed, *("" if v is None else f"{v:.6g}" for v in values)])
    return buf.getvalue()


def plot(finals: dict[Cell, Final], p: Preset, path: Path) -> Path:
    """Three panels — accuracy with no attack, accuracy under the vector attack, the backdoor's flip rate
    (poisoned) — a group of bars per mode, a bar per rule, 95 % intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    acc, flip = per_seed(finals, "test_accuracy"), per_seed(finals, "attack_flip")
    panels = [(acc, "none", "accuracy %, no attack"), (acc, "vector", f"accuracy %, {p.vector_attack}"),
              (flip, "phrase", "backdoor flip rate %, poisoned")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    width = 0.8 / len(p.rules)
    for ax, (table, arm, title) in zip(axes, panels):
        for i, rule in enumerate(p.rules):
            xs, ys, errs = [], [], []
            for j, mode in enumerate(p.modes):
                seeds = table.get((mode, rule, arm))
                if seeds:
                    e = mean_ci(list(seeds.values()))
                    xs.append(j + (i - (len(p.rules) - 1) / 2) * width)
                    ys.append(100 * e.mean)
                    errs.append(100 * e.half_width if math.isfinite(e.half_width) else 0.0)
            ax.bar(xs, ys, width, yerr=errs, capsize=2, label=rule, color=rule_colours(list(p.rules))[rule])
        ax.set_xticks(range(len(p.modes)), list(p.modes))
        ax.set_title(title)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend()
    fig.suptitle(f"LoRA r = {p.r} on {p.model}, {p.dataset}, n = {p.workers}, b = {p.byzantine}, f = {p.f}, "
                 f"{len(p.seeds)} seeds (95 % intervals)")
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def report_markdown(finals: dict[Cell, Final], cs: list[Comparison], p: Preset, *, command: str,
                    wall_seconds: float | None, runs: int) -> str:
    """The whole report: setup, accuracy, price and rescue, the backdoor against its baseline, the readout."""
    parts = [
        f"# The price of robustness for LoRA adapters — preset `{p.name}`", "",
        *provenance(command, wall_seconds, runs), "",
        f"Setup: {p.model} with LoRA r = {p.r}{f' {p.model_params}' if p.model_params else ''} on {p.dataset} "
        f"(texts of {p.length} tokens), "
        f"natural split (a client per user), n = {p.workers}, FedAvg ({p.local_steps} local steps, batch "
        f"{p.batch_size}, lr {p.lr:g}, momentum {p.momentum:g}), {p.rounds} rounds; every rule configured for "
        f"f = {p.f}; b = {p.byzantine} attackers: {p.vector_attack}{f' {p.vector_params}' if p.vector_params else ''}, "
        "or the phrase backdoor "
        f"(\"{p.phrase}\" after [CLS], label {p.target}, {p.poison_fraction:g} of each attacker's batch); seeds "
        f"{list(p.seeds)}. Cells: final test accuracy %, mean ± 95 % Student-t half-width over the seeds.", "",
        "## Final test accuracy %", "", accuracy_markdown(finals, p), "",
        "## Price (no attack) and rescue (vector attack), paired by seed", "", robustness_markdown(cs, p), "",
        "## The phrase backdoor against the clean model (paired by seed)", "",
        "Success: the share of the triggered test texts not of the target class that the model sends to the target. "
        "Flip: the same, counted only on the texts the model does not already send to the target untriggered (their "
        "number per seed in the clean run is shown). Clean: the same rule and mode with nobody poisoning.", "",
        backdoor_markdown(finals, cs, p), "", family_note(c.estimate for c in cs), "",
        "## Readout", "", readout(cs, p), "",
    ]
    return "\n".join(parts)


@register
class Lora(GridStudy[Preset, Cell, Final]):
    """The price of robustness for LoRA adapters (the module's docstring) as a study on the template: ``phalanx
    experiment lora``. Its plan is the template's (each run validated once), the run keys the grid sets itself
    refused by its ``check`` (:func:`check_overrides`)."""

    name = "lora"
    help = ("The price of robustness for LoRA adapters (Yang, Shi & Li, ICML 2025): accuracy with no attack, under a "
            "vector attack and under a trigger-phrase backdoor, per rule and per aggregation mode (factors, update, "
            "shared); price and rescue paired by seed, the backdoor's lift over the clean model, Holm-corrected "
            "verdicts; tables, plot, per-run CSV, and the raw per-run results (runs.csv) that --results makes the "
            "report from again without training.")
    preset_type = Preset
    presets = PRESETS
    raw_value = Final
    out = "runs/lora-quick"
    preset_help = "quick (the embedded tiny BERT on the shipped sample, CPU, minutes) or gpu (BERT-base, CUDA)."
    set_example = "modes=['shared']"

    functions = GridFunctions(preset, cells, keys, final, check=check_overrides)

    def document(
        self, p: Preset, cells: list[Cell], collected: dict[Cell, Final], *, command: str,
        wall_seconds: float | None, runs: int,
    ) -> Document:
        cs = comparisons(collected, p)
        return Document(report_markdown(collected, cs, p, command=command, wall_seconds=wall_seconds, runs=runs),
                        runs_csv(collected), "lora.png", "accuracy and backdoor per mode",
                        lambda path: plot(collected, p, path),
                        [accuracy_markdown(collected, p) + "\n\n" + robustness_markdown(cs, p) + "\n\n"
                         + backdoor_markdown(collected, cs, p) + "\n\n" + readout(cs, p)])
