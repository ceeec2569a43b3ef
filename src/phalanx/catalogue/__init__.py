"""What Phalanx provides, declared without importing torch: the built-in data sets, models, aggregation rules,
robust gossip rules and studies — and, in :mod:`phalanx.catalogue.rounds`, the attacks, round algorithms and
stages — each with what the command line shows of it (issue 37: ``phalanx list …``,
``phalanx tension --help`` and ``phalanx experiment --help`` answer without torch, whose import is most of a
command's start-up; ``benchmarks/startup.py``).

Each entry names its implementation as ``"module:attr"``, imported only when one is built, by the kind's registry
(:mod:`phalanx.plugins`), which stays the authority: this table declares what the registries hold, and
``tests/test_catalogue.py`` checks it against them — every name, target, kind, requirement, reference and help text,
and the rules' ε and κ over a grid of (n, f) — so that a rule changed without its entry here fails a test instead of
being listed with stale text. A name a registry knows beyond the table (an installed plug-in's entry point, an entry
registered in this process) is found by :func:`extra_names` without loading it; a listing that needs such an entry's
class (``phalanx list aggregators``) then falls back to the registry, torch and all.

The ε and κ formulas are those the rules' :meth:`~phalanx.aggregators.base.Aggregator.epsilon` and
:meth:`~phalanx.aggregators.base.Aggregator.kappa` return, each with its statement there:

* trimmed mean (``cwtm``): ε = f/(n − f) (Yang, Shi & Li, ICML 2025, Theorem 3.6, tight), κ = 6r(1 + r) with
  r = f/(n − 2f) (Allouah et al., "Fixing by Mixing", AISTATS 2023, Table 1), both for n > 2f;
* coordinate-wise median (``cwmed``): ε = m/(n − m), m = ⌊(n − 1)/2⌋ (Yang, Shi & Li, Table 2), κ = 4(1 + f/(n − 2f))²
  for n > 2f (Allouah et al., Table 1); geometric median (``geomed``): ε = 1 (Yang, Shi & Li, Table 2), the same κ;
* Krum: κ = 6(1 + f/(n − 2f)) for n > 2f (Allouah et al., Table 1); the mean: ε = 0 (Yang, Shi & Li, Definition 2.2).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

__all__ = ["AGGREGATORS", "DATASETS", "GOSSIP_REQUIREMENT", "GOSSIP_RULES", "MODELS", "STUDIES", "Group",
           "extra_names", "names", "rule_rows"]

Bound = Callable[[int, int], "float | None"]
"""ε or κ of a rule configured for f, at n inputs: ``(n, f) → value`` (None where nothing is proven)."""


def _none(n: int, f: int) -> float | None:
    return None


def _zero(n: int, f: int) -> float | None:
    return 0.0


def _one(n: int, f: int) -> float | None:
    return 1.0


def _trimmed_epsilon(n: int, f: int) -> float | None:
    return f / (n - f) if n > 2 * f else None


def _trimmed_kappa(n: int, f: int) -> float | None:
    if n <= 2 * f:
        return None
    r = f / (n - 2 * f)
    return 6.0 * r * (1.0 + r)


def _median_epsilon(n: int, f: int) -> float | None:
    m = (n - 1) // 2
    return m / (n - m)


def _median_kappa(n: int, f: int) -> float | None:
    return None if n <= 2 * f else 4.0 * (1.0 + f / (n - 2 * f)) ** 2


def _krum_kappa(n: int, f: int) -> float | None:
    return None if n <= 2 * f + 2 else 6.0 * (1.0 + f / (n - 2 * f))  # none where Krum cannot run (n > 2f + 2)


def _majority(f: int) -> int:
    return 2 * f + 1


def _any_n(f: int) -> int:
    return 1


def _krum_n(f: int) -> int:
    return 2 * f + 3


def _bulyan_n(f: int) -> int:
    return 4 * f + 3


@dataclass(frozen=True)
class _Rule:
    """A rule or pre-aggregator as ``phalanx list aggregators`` shows it, configured with its default parameters."""

    target: str
    """Its class, ``"module:Class"``."""
    kind: str
    """``"rule"`` or ``"pre"``."""
    requirement: str
    reference: str
    epsilon: Bound = _none
    kappa: Bound = _none
    min_workers: Callable[[int], int] = _majority
    """The smallest n it is defined at for f (its class's ``min_workers``, with its default parameters)."""


@dataclass(frozen=True)
class _Gossip:
    """A robust gossip rule (a node's rule over its graph neighbourhood)."""

    target: str
    reference: str


@dataclass(frozen=True)
class _Study:
    """A study: the command ``phalanx experiment NAME`` and the paragraph its ``--help`` shows."""

    target: str
    help: str


@dataclass(frozen=True)
class Group:
    """Where a registry's names come from besides this table: its entry-point ``group`` (and an older
    ``legacy_group`` still read) and the ``module`` whose ``names()`` is the registry's own, used when that module is
    already loaded (entries registered in this process)."""

    group: str
    module: str
    legacy_group: str | None = None


DATASETS: tuple[str, ...] = ("cifar10", "digits", "fashion-mnist", "femnist", "femnist-population", "mnist",
                             "sent140", "sent140-sample", "shakespeare", "synthetic")
"""The built-in data sets (:func:`phalanx.data.names`)."""
DATASET_SOURCES: dict[str, str] = {
    "cifar10": "your files (data_root), or download = true",
    "digits": "built in: shipped inside Phalanx, no network",
    "fashion-mnist": "your files, the Debian package dataset-fashion-mnist, or download = true",
    "femnist": "LEAF's JSON files, or download = true (phalanx[hf])",
    "femnist-population": "LEAF's JSON files, read a writer at a time (path = …)",
    "mnist": "your files (data_root), or download = true",
    "sent140": "LEAF's JSON files",
    "sent140-sample": "built in: a small Sent140 sample shipped inside Phalanx, no network",
    "shakespeare": "LEAF's JSON files, or download = true (phalanx[hf])",
    "synthetic": "built in: generated per client (FedProx's synthetic(α, β)), no network",
}
"""Where each built-in data set comes from, for ``phalanx list datasets`` (docs/data.md's table): which load with
no file and no network (a first-hour review could not tell)."""
DATASET_GROUP = Group("phalanx.datasets", "phalanx.data.loaders")

MODELS: tuple[str, ...] = ("char-lstm", "cnn", "logreg", "mlp", "resnet20")
"""The built-in models (:func:`phalanx.models.names`; the ``hf:NAME`` models are :mod:`phalanx.hub`'s)."""
MODEL_GROUP = Group("phalanx.models", "phalanx.models.registry")

AGGREGATORS: dict[str, _Rule] = {
    'bulyan': _Rule(
        "phalanx.aggregators.bulyan:Bulyan", "rule",
        'n >= 4f + 3',
        ("E. M. El Mhamdi, R. Guerraoui, S. Rouault, 'The Hidden Vulnerability of Distributed Learning in "
         "Byzantium', ICML 2018, Section 4 (Bulyan over Krum)"),
        min_workers=_bulyan_n),
    'caf': _Rule(
        "phalanx.aggregators.caf:CAF", "rule",
        'n > 2f',
        ("Y. Allouah, R. Guerraoui, J. Stephan, 'Towards trustworthy federated learning with untrusted "
         "participants', ICML 2025, Algorithm 2 (CAF)")),
    'cc': _Rule(
        "phalanx.aggregators.cc:CenteredClipping", "rule",
        'n > 2f',
        'Karimireddy, He & Jaggi, Learning from history for Byzantine robust optimization, ICML 2021 (Eq. 3)'),
    'cge': _Rule(
        "phalanx.aggregators.cge:CGE", "rule",
        'n > 2f',
        ("N. Gupta, S. Liu, N. H. Vaidya, 'Byzantine fault-tolerant distributed machine learning using SGD and "
         "norm-based comparative gradient elimination (CGE)', arXiv:2008.04699, 2020; S. Liu, N. Gupta, N. H. "
         "Vaidya, 'Approximate Byzantine fault-tolerance in distributed optimization', PODC 2021")),
    'clippedclustering': _Rule(
        "phalanx.aggregators.clippedclustering:ClippedClustering", "rule",
        'n > 2f (honest majority; f itself is not used by the rule)',
        ("S. Li, E. C.-H. Ngai, T. Voigt, 'An experimental study of Byzantine-robust aggregation schemes in "
         "federated learning', IEEE Transactions on Big Data, 2023 (arXiv 2302.07173), ClippedClustering")),
    'cwmed': _Rule(
        "phalanx.aggregators.coordinatewise:CoordinateWiseMedian", "rule",
        'n > 2f',
        ('Yin, Chen, Ramchandran & Bartlett, Byzantine-robust distributed learning: towards optimal statistical '
         'rates, ICML 2018 (Definition 1)'),
        epsilon=_median_epsilon, kappa=_median_kappa),
    'cwtm': _Rule(
        "phalanx.aggregators.coordinatewise:CoordinateWiseTrimmedMean", "rule",
        'n > 2f',
        ('Yin, Chen, Ramchandran & Bartlett, Byzantine-robust distributed learning: towards optimal statistical '
         'rates, ICML 2018 (Definition 2)'),
        epsilon=_trimmed_epsilon, kappa=_trimmed_kappa),
    'dnc': _Rule(
        "phalanx.aggregators.dnc:DnC", "rule",
        'n > 2f and n - ceil(c*f) >= 1 (honest majority; keeps n - ceil(c*f) rows)',
        ("V. Shejwalkar, A. Houmansadr, 'Manipulating the Byzantine: optimizing model poisoning attacks and "
         "defenses for federated learning', NDSS 2021, Algorithm 3 (DnC)")),
    'flame': _Rule(
        "phalanx.aggregators.flame:FLAME", "rule",
        'n > 2f (honest majority for the n/2 + 1 cluster; f itself is not used by the rule)',
        ('T. D. Nguyen, P. Rieger, H. Chen, H. Yalame, H. Möllering, H. Fereidooni, S. Marchal, M. Miettinen, A. '
         "Mirhoseini, S. Zeitouni, F. Koushanfar, A.-R. Sadeghi, T. Schneider, 'FLAME: Taming backdoors in "
         "federated learning', USENIX Security 2022 (arXiv 2101.02281), Algorithm 1")),
    'fldetector': _Rule(
        "phalanx.aggregators.fldetector:FLDetector", "rule",
        'n > 2f (the base rule cwmed); window >= 1; keeps a history per client',
        ("Z. Zhang, X. Cao, J. Jia, N. Z. Gong, 'FLDetector: Defending federated learning against model poisoning "
         "attacks via detecting malicious clients', KDD 2022, Algorithms 1-2")),
    'fltrust': _Rule(
        "phalanx.aggregators.fltrust:FLTrust", "rule",
        'any n >= 1; needs a trusted reference gradient g0 per call (reference=g0); f is not used',
        ("X. Cao, M. Fang, J. Liu, N. Z. Gong, 'FLTrust: Byzantine-robust federated learning via trust "
         "bootstrapping', NDSS 2021, Eqs. (1)-(4)"),
        min_workers=_any_n),
    'foolsgold': _Rule(
        "phalanx.aggregators.foolsgold:FoolsGold", "rule",
        'any n >= 1 (f is not used: no bound on the number of sybils); keeps a history per client',
        ("C. Fung, C. J. M. Yoon, I. Beschastnikh, 'The limitations of federated learning in sybil settings', RAID "
         '2020, Algorithm 1'),
        min_workers=_any_n),
    'geomed': _Rule(
        "phalanx.aggregators.geomed:GeometricMedian", "rule",
        'n > 2f',
        ('Pillutla, Kakade & Harchaoui, Robust aggregation for federated learning, IEEE TSP 2022 (RFA, smoothed '
         'Weiszfeld, Algorithm 3)'),
        epsilon=_one, kappa=_median_kappa),
    'krum': _Rule(
        "phalanx.aggregators.krum:Krum", "rule",
        'n > 2f + 2',
        ("P. Blanchard, E. M. El Mhamdi, R. Guerraoui, J. Stainer, 'Machine Learning with Adversaries: Byzantine "
         "Tolerant Gradient Descent', NeurIPS 2017, Section 4 (the Krum function, Proposition 1)"),
        kappa=_krum_kappa,
        min_workers=_krum_n),
    'mda': _Rule(
        "phalanx.aggregators.mda:MDA", "rule",
        'n > 2f',
        ("E. M. El Mhamdi, R. Guerraoui, S. Rouault, 'The Hidden Vulnerability of Distributed Learning in "
         "Byzantium', ICML 2018 (minimum-diameter averaging, 'Brute'); P. J. Rousseeuw, 'Multivariate estimation "
         "with high breakdown point', 1985")),
    'meamed': _Rule(
        "phalanx.aggregators.coordinatewise:MeaMed", "rule",
        'n > 2f',
        'Xie, Koyejo & Gupta, Generalized Byzantine-tolerant SGD, arXiv:1802.10116, 2018 (Definition 5)'),
    'mean': _Rule(
        "phalanx.aggregators.mean:Mean", "rule",
        'n >= 1; tolerates no Byzantine worker',
        'arithmetic mean (federated averaging, McMahan et al., AISTATS 2017)',
        epsilon=_zero,
        min_workers=_any_n),
    'multikrum': _Rule(
        "phalanx.aggregators.krum:MultiKrum", "rule",
        'n > 2f + 2 and 1 <= m <= n (default m = n - f)',
        ("P. Blanchard, E. M. El Mhamdi, R. Guerraoui, J. Stainer, 'Machine Learning with Adversaries: Byzantine "
         "Tolerant Gradient Descent', NeurIPS 2017, Section 4 (Krum) and Section 5 (the Multi-Krum variant)"),
        min_workers=_krum_n),
    'rlr': _Rule(
        "phalanx.aggregators.rlr:RobustLR", "rule",
        'n >= max(2f + 1, θ); θ = f + 1 by default (more agreeing signs than the f Byzantine rows can cast)',
        ("M. S. Ozdayi, M. Kantarcioglu, Y. R. Gel, 'Defending against backdoors in federated learning with robust "
         "learning rate', AAAI 2021 (arXiv 2007.03767)")),
    'signguard': _Rule(
        "phalanx.aggregators.signguard:SignGuard", "rule",
        'n > 2f (honest majority; f itself is not used by the rule)',
        ("J. Xu, S.-L. Huang, L. Song, T. Lan, 'SignGuard: Byzantine-robust federated learning through "
         "collaborative malicious gradient filtering', ICDCS 2022 (arXiv 2109.05872), Algorithm 1")),
    'signmaj': _Rule(
        "phalanx.aggregators.signmaj:SignMajority", "rule",
        'n > 2f',
        ('Bernstein, Zhao, Azizzadenesheli & Anandkumar, signSGD with majority vote is communication efficient and '
         'fault tolerant, ICLR 2019 (Algorithm 1)')),
    'smea': _Rule(
        "phalanx.aggregators.smea:SMEA", "rule",
        'n > 2f and C(n, f) <= max_subsets = 1000000',
        ("Y. Allouah, R. Guerraoui, N. Gupta, R. Pinot, J. Stephan, 'On the privacy-robustness-utility trilemma in "
         "distributed learning', ICML 2023 (SMEA)")),
    'arc': _Rule(
        "phalanx.aggregators.pre.arc:ARC", "pre",
        'n > 2f',
        ("Y. Allouah, R. Guerraoui, N. Gupta, A. Jellouli, G. Rizk, J. Stephan, 'Adaptive gradient clipping for "
         "robust federated learning', ICLR 2025 (arXiv 2405.14432), Algorithm 1 (ARC)")),
    'bucketing': _Rule(
        "phalanx.aggregators.pre.bucketing:Bucketing", "pre",
        'n >= 1; the rule after it sees ceil(n/s) rows, at most f of them influenced by Byzantine rows',
        ("S. P. Karimireddy, L. He, M. Jaggi, 'Byzantine-robust learning on heterogeneous datasets via bucketing', "
         'ICLR 2022, Algorithm 1'),
        min_workers=_any_n),
    'clip': _Rule(
        "phalanx.aggregators.pre.clip:Clip", "pre",
        'n >= 1',
        ("static clipping; see Y. Allouah, R. Guerraoui, N. Gupta, A. Jellouli, G. Rizk, J. Stephan, 'Adaptive "
         "gradient clipping for robust federated learning', ICLR 2025 (arXiv 2405.14432), the static clipping "
         'baseline'),
        min_workers=_any_n),
    'nnm': _Rule(
        "phalanx.aggregators.pre.nnm:NNM", "pre",
        'n > 2f',
        ("Y. Allouah, S. Farhadkhani, R. Guerraoui, N. Gupta, R. Pinot, J. Stephan, 'Fixing by Mixing: A Recipe "
         "for Optimal Byzantine ML under Heterogeneity', AISTATS 2023, Algorithm 1 (nearest neighbor mixing)")),
}
"""The built-in rules and pre-aggregators (:func:`phalanx.aggregators.names`)."""
AGGREGATOR_GROUP = Group("phalanx.aggregators", "phalanx.aggregators.registry")

GOSSIP_RULES: dict[str, _Gossip] = {
    'clipped_gossip': _Gossip(
        "phalanx.decentralized.robust_gossip:ClippedGossip",
        ("L. He, S. P. Karimireddy, M. Jaggi, 'Byzantine-robust decentralized learning via ClippedGossip', arXiv "
         '2202.01545, 2022 (self-centred clipping, practical adaptive tau)')),
    'cs_plus': _Gossip(
        "phalanx.decentralized.robust_gossip:CSPlus",
        ("R. Gaucher, A. Dieuleveut, H. Hendrikx, 'Unified breakdown analysis for Byzantine robust gossip', ICML "
         '2025, arXiv 2410.10418 (CS+-RG)')),
    'ios': _Gossip(
        "phalanx.decentralized.robust_gossip:IOS",
        ("Z. Wu, T. Chen, Q. Ling, 'Byzantine-resilient decentralized stochastic optimization with robust "
         "aggregation rules', IEEE Trans. Signal Processing 71, 2023, arXiv 2206.04568 (iterative outlier scissor)")),
    'monna': _Gossip(
        "phalanx.decentralized.robust_gossip:MoNNA",
        ("S. Farhadkhani, R. Guerraoui, N. Gupta, L. N. Hoang, R. Pinot, J. Stephan, 'Robust collaborative "
         "learning with linear gradient overhead', ICML 2023, arXiv 2209.10931 (MoNNA: momentum + "
         'nearest-neighbour averaging)')),
}
"""The built-in robust gossip rules (:func:`phalanx.decentralized.robust_gossip.names`)."""
GOSSIP_REQUIREMENT = "gossip only; 2f+1 ≤ deg+1"
"""What a robust gossip rule requires (a node's rule over its graph neighbourhood of degree deg)."""
GOSSIP_GROUP = Group("phalanx.gossip_rules", "phalanx.decentralized.robust_gossip")

STUDIES: dict[str, _Study] = {
    'async': _Study(
        "phalanx.studies.asynchrony:Asynchrony",
        ('Simulated wall-clock time to a target accuracy, synchronous FedAvg (each round waits for its slowest '
         'sampled worker) vs buffered asynchronous FedBuff and BASGD, with stragglers and attackers (none, a '
         'vector attack, always-first timing), per rule; accuracy at a fixed simulated time; Holm-corrected paired '
         'verdicts; plot.')),
    'backdoor': _Study(
        "phalanx.studies.backdoor:BackdoorDefences",
        ('Backdoor defences (foolsgold, flame, rlr, fldetector, clip, crfl; mean and cwtm as baselines) against '
         'backdoor attacks (backdoor, dba, neurotoxin, edgecase, replacement) across heterogeneity α: clean '
         "accuracy, attack success at the round the attackers stop and its durability after, and each defence's "
         'price with no attack — the tension of Yang, Shi & Li (ICML 2025) asked of backdoor defences. Tables with '
         'intervals, paired differences, plot.')),
    'byzantine-neighbours': _Study(
        "phalanx.studies.neighbours:ByzantineNeighbours",
        ('Robust gossip vs the number of Byzantine neighbours: every rule at f = b under the dissensus and '
         'spectral attacks, and its price with no attack; tables with intervals, paired prices, plot.')),
    'convergence': _Study(
        "phalanx.studies.convergence:ConvergenceStudy",
        ("Where GD with a robust rule stalls with no attack (Yang, Shi & Li, ICML 2025): the paper's Theorem 4.5 "
         'construction run with every rule of the registry (stalls at (f/(n−f))G²/(2μ), or escapes and why), '
         "Phalanx's own exact construction for equivariant rules (Proposition 3, closed form to the dtype's "
         'precision), and least squares, softmax regression and an MLP over Dirichlet splits, measured floors '
         'beside εζ²/(2μ) and εζ² with a proven ε, with 95 % intervals; table, plot, report. Every GD run is in '
         'process on one thread: --jobs and the executor options do not apply.')),
    'corrupted-rounds': _Study(
        "phalanx.studies.corrupted:CorruptedRounds",
        ('An attack that succeeds only now and then (active in k of T rounds) and a second line of defence after '
         'aggregation: server SGD vs the corruption-robust online learner (robust-online; Zhang & Cutkosky, ICML '
         '2025), each behind the mean and robust rules, with and without the attack, beside the controls (SGD on '
         'the aggregate clipped to the same G, the learner without its robustness term) — what the learner buys, '
         'what clipping alone buys, what each costs. Tables with intervals, Holm-adjusted paired differences, '
         'plot.')),
    'hbn': _Study(
        "phalanx.studies.hbn:HBN",
        ('BatchNorm under heterogeneity (Chen et al., ICML 2025): GroupNorm vs BatchNorm vs FedBN vs Hybrid BN in '
         'federated training over Dirichlet splits, with the mean and a robust rule; table, paired differences, '
         'plot.')),
    'lora': _Study(
        "phalanx.studies.lora:Lora",
        ('The price of robustness for LoRA adapters (Yang, Shi & Li, ICML 2025): accuracy with no attack, under a '
         'vector attack and under a trigger-phrase backdoor, per rule and per aggregation mode (factors, update, '
         "shared); price and rescue paired by seed, the backdoor's lift over the clean model, Holm-corrected "
         'verdicts; tables, plot, per-run CSV, and the raw per-run results (runs.csv) that --results makes the '
         'report from again without training.')),
    'parallelism': _Study(
        "phalanx.studies.parallelism:Parallelism",
        ('The parallelism threshold (Eisen, Dorfman & Levy, ICML 2025): D-SGD vs Decentralized Anytime SGD as the '
         'number of nodes grows at a fixed sample budget, on a ring and a torus against the centralized reference; '
         'tables with intervals, paired differences, plot.')),
    'privacy': _Study(
        "phalanx.studies.privacy:Privacy",
        ('Client-level differential privacy next to robustness: final accuracy vs the DP budget ε (noise '
         "multipliers σ at every worker, dp-accounting's RDP accountant) with and without an attack, for the mean "
         'and robust rules; does DP noise raise the price of robustness (Yang, Shi & Li, ICML 2025)? Tables with '
         'intervals, paired differences, plot.')),
    'tension': _Study(
        "phalanx.studies.tension:Tension",
        ('Yang, Shi & Li (ICML 2025), no attack, n = 16: Tables 3-6 (rows f or f_NNM, columns α), plot, trend '
         'verdicts.')),
}
"""The built-in studies (:func:`phalanx.studies.names`)."""
STUDY_GROUP = Group("phalanx.studies", "phalanx.studies.registry")


def _installed(group: str) -> list[EntryPoint]:
    """The installed entry points of ``group``, none while ``PHALANX_NO_PLUGINS`` is set to anything but ``0``
    (:func:`phalanx.plugins.plugins_disabled`'s rule, repeated here: this layer imports nothing of Phalanx's)."""
    if os.environ.get("PHALANX_NO_PLUGINS", "") not in ("", "0"):
        return []
    return list(entry_points(group=group))


def extra_names(declared: Iterable[str], where: Group) -> set[str]:
    """The names the registry of ``where`` knows beyond ``declared``: installed entry points of its group (and of its
    legacy group), read from the installed packages' metadata with nothing loaded, and, when the registry's module
    is already imported, the names its ``names()`` gives (entries registered in this process)."""
    known = {ep.name for ep in _installed(where.group)}
    if where.legacy_group:
        known |= {ep.name for ep in _installed(where.legacy_group)}
    module = sys.modules.get(where.module)
    if module is not None:
        known |= set(module.names())
    return known - set(declared)


def names(declared: Iterable[str], where: Group) -> list[str]:
    """Every name the registry of ``where`` lists — ``declared`` and :func:`extra_names` — sorted, as the registry's
    own ``names()`` does."""
    declared = tuple(declared)
    return sorted(set(declared) | extra_names(declared, where))


Row = tuple[str, str, str, "float | None", "float | None", str]
"""A row of ``phalanx list aggregators``: name, kind, requirement, ε, κ, reference."""


def rule_rows(n: int, f: int) -> list[Row] | None:
    """``phalanx list aggregators``' rows at (n, f): every rule and pre-aggregator (rules first, each part sorted, as
    :func:`phalanx.aggregators.names` orders them), then the robust gossip rules (kind ``"gossip"``, no ε or κ);
    None when a registry knows a name beyond the table (a plug-in), whose row only its
    class can give."""
    if extra_names(AGGREGATORS, AGGREGATOR_GROUP) or extra_names(GOSSIP_RULES, GOSSIP_GROUP):
        return None
    ordered = sorted(AGGREGATORS, key=lambda name: (AGGREGATORS[name].kind == "pre", name))
    rows: list[Row] = [(name, AGGREGATORS[name].kind, AGGREGATORS[name].requirement, AGGREGATORS[name].epsilon(n, f),
                        AGGREGATORS[name].kappa(n, f), AGGREGATORS[name].reference) for name in ordered]
    return rows + [(name, "gossip", GOSSIP_REQUIREMENT, None, None, GOSSIP_RULES[name].reference)
                   for name in sorted(GOSSIP_RULES)]
