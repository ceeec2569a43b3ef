"""The pieces of a round, declared without importing torch: the built-in attacks (vector, data and gossip attacks),
round algorithms and stages, each with what ``phalanx list attacks``, ``list algorithms`` and ``list stages`` show of
it (issue 37: a listing answers without torch, whose import is most of a command's start-up; ``benchmarks/startup.py``).

As in :mod:`phalanx.catalogue`, each entry names its implementation as ``"module:attr"`` — imported only when one is
built, by its registry, which stays the authority — and holds the listing's cells as the registry's classes give them:

* an attack: its kind (a baseline, a data attack or a vector attack, from its class), its config section (each
  parameter of its constructor, ``name: type = default (attack_params.name)``) and its reference;
* a round algorithm: how a config configures it (its own config keys for the built-in four, else
  ``algorithm_params``), its section (each constructor parameter with its type, the default a config that leaves it
  unset gets, and the keys that set it; :func:`phalanx.experiments.sections.algorithm_section`) and what it is (its
  reference, else its docstring's first paragraph);
* a stage: its side, what turns it on (the algorithm that brings it, its flat key, or its ``[stages.NAME]`` table),
  its parameters and its reference.

``tests/test_catalogue.py`` checks every entry, field by field, against the cells the registries' classes give
(:func:`phalanx.cli.listing.attack_rows`, ``algorithm_rows``, ``stage_rows``) and the names both ways; a name a
registry knows beyond these tables (an installed plug-in, an entry registered in this process) makes the listing
ask the registry instead, torch and all (:func:`phalanx.catalogue.extra_names`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from phalanx.catalogue import Group, extra_names, stage_files

__all__ = ["ALGORITHMS", "ALGORITHM_GROUP", "ATTACKS", "ATTACK_GROUP", "GOSSIP_ATTACKS", "GOSSIP_ATTACK_GROUP",
           "GOSSIP_ATTACK_KIND", "STAGES", "STAGE_GROUP", "Rows", "algorithm_rows", "attack_rows", "stage_rows"]

Rows = list[tuple[list[str], str]]
"""A listing's rows: each row's cells before its reference, and the reference."""
NO_SECTION = "—"
"""The section cell of an entry without parameters."""


@dataclass(frozen=True)
class _Attack:
    """An attack as ``phalanx list attacks`` shows it."""

    target: str
    """Its class, ``"module:Class"``."""
    kind: str
    section: tuple[str, ...]
    """One line per constructor parameter (none: the cell shows ``—``)."""
    reference: str


@dataclass(frozen=True)
class _GossipAttack:
    """An attack that uses the graph (``algorithm = "gossip"`` or ``"anytime"``): no config section of its own."""

    target: str
    reference: str


@dataclass(frozen=True)
class _Algorithm:
    """A round algorithm as ``phalanx list algorithms`` shows it."""

    target: str
    configured_by: str
    section: tuple[str, ...]
    reference: str
    """Its reference, else its docstring's first paragraph on one line."""


@dataclass(frozen=True)
class _Stage:
    """A stage as ``phalanx list stages`` shows it."""

    target: str
    side: str
    turned_on_by: str
    section: tuple[str, ...]
    """``parameter: what it is`` for each of its parameters."""
    reference: str


GOSSIP_ATTACK_KIND = "vector, over a graph (gossip, anytime)"
"""The kind cell of every gossip attack."""

ATTACKS: dict[str, _Attack] = {
    'alie': _Attack(
        'phalanx.attacks.alie:ALIE',
        'vector: sends rows',
        ('z: float | None = None (attack_params.z)',),
        ("M. Baruch, G. Baruch, Y. Goldberg, 'A Little Is Enough: Circumventing Defenses For Distributed Learning', "
         'NeurIPS 2019, Section 4 (convergence-prevention attack: s, z_max, mu - z sigma)')),
    'backdoor': _Attack(
        'phalanx.attacks.backdoor:Backdoor',
        'data: poisons its batches',
        ('target: int = 0 (attack_params.target)',
         'size: int = 2 (attack_params.size)',
         'value: float = 2.5 (attack_params.value)',
         'poison_fraction: float = 0.5 (attack_params.poison_fraction)',
         'boost: float = 1.0 (attack_params.boost)',
         'stop_round: int | None = None (attack_params.stop_round)'),
        ("T. Gu, B. Dolan-Gavitt, S. Garg, 'BadNets', arXiv:1708.06733, 2017 (pixel-pattern trigger); E. Bagdasaryan "
         "et al., 'How to backdoor federated learning', AISTATS 2020, Eq. 3 (model replacement); A. N. Bhagoji et "
         'al., ICML 2019 (explicit boosting)')),
    'dba': _Attack(
        'phalanx.attacks.dba:DBA',
        'data: poisons its batches',
        ('target: int = 0 (attack_params.target)',
         'parts: int = 4 (attack_params.parts)',
         'size: int = 3 (attack_params.size)',
         'gap: int = 1 (attack_params.gap)',
         'value: float = 2.5 (attack_params.value)',
         'poison_fraction: float = 0.5 (attack_params.poison_fraction)',
         'boost: float = 1.0 (attack_params.boost)',
         'stop_round: int | None = None (attack_params.stop_round)'),
        ("C. Xie, K. Huang, P.-Y. Chen, B. Li, 'DBA: Distributed Backdoor Attacks against Federated Learning', ICLR "
         '2020, §2.2 (global trigger decomposed into local patterns)')),
    'edgecase': _Attack(
        'phalanx.attacks.edgecase:EdgeCase',
        'data: poisons its batches',
        ('source: int = 7 (attack_params.source)',
         'target: int = 1 (attack_params.target)',
         'tail: float = 0.1 (attack_params.tail)',
         'poison_fraction: float = 0.5 (attack_params.poison_fraction)',
         'boost: float = 1.0 (attack_params.boost)',
         'stop_round: int | None = None (attack_params.stop_round)'),
        ("H. Wang et al., 'Attack of the Tails: Yes, You Really Can Backdoor Federated Learning', NeurIPS 2020, §3 "
         '(edge-case examples: the tail of one class, mislabelled)')),
    'evade': _Attack(
        'phalanx.attacks.evade:Evade',
        'vector: sends rows',
        ("target: str = 'signflip' (attack_params.target)",
         'scale: float = 10.0 (attack_params.scale)',
         'steps: int = 12 (attack_params.steps)',
         'seed: int = 0 (attack_params.seed)'),
        ("Phalanx's filter-adaptive attack (its own): a bisection towards a sign flip or a fixed drift against the "
         "asynchronous filter's test as an oracle; the search idea of V. Shejwalkar, A. Houmansadr, 'Manipulating the "
         "Byzantine', NDSS 2021 (min-max)")),
    'fang': _Attack(
        'phalanx.attacks.fang:Fang',
        'vector: sends rows',
        ('b: float = 2.0 (attack_params.b)',),
        ("M. Fang, X. Cao, J. Jia, N. Gong, 'Local Model Poisoning Attacks to Byzantine-Robust Federated Learning', "
         'USENIX Security 2020, Section 4 (full-knowledge attack on trimmed mean / median)')),
    'fangkrum': _Attack(
        'phalanx.attacks.fangkrum:FangKrum',
        'vector: sends rows',
        ('threshold: float = 1e-05 (attack_params.threshold)',),
        ("M. Fang, X. Cao, J. Jia, N. Gong, 'Local Model Poisoning Attacks to Byzantine-Robust Federated Learning', "
         'USENIX Security 2020, Section 4 (full-knowledge attack on Krum: w_Re - lambda s, lambda halved from its '
         'upper bound until Krum selects it, threshold 1e-5)')),
    'foe': _Attack(
        'phalanx.attacks.scaling:FallOfEmpires',
        'vector: sends rows',
        ('epsilon: float = 2.0 (attack_params.epsilon)',),
        ("C. Xie, O. Koyejo, I. Gupta, 'Fall of Empires: Breaking Byzantine-tolerant SGD by Inner Product "
         "Manipulation', UAI 2019 (PMLR 115, 2020), large-epsilon preset (ByzFL 0.0.11 InnerProductManipulation "
         'default tau = 2)')),
    'gaussian': _Attack(
        'phalanx.attacks.noise:Gaussian',
        'vector: sends rows',
        ('sigma: float = 1.0 (attack_params.sigma)',
         'mu: float = 0.0 (attack_params.mu)',
         "center: str = 'zero' (attack_params.center)"),
        ("P. Blanchard, E. M. El Mhamdi, R. Guerraoui, J. Stainer, 'Machine Learning with Adversaries: Byzantine "
         "Tolerant Gradient Descent', NeurIPS 2017 (Section 5, Gaussian Byzantine workers: sigma = 200 there); ByzFL "
         "Gaussian (sigma = 1, the default)")),
    'honest': _Attack(
        'phalanx.attacks.honest:Honest',
        'baseline: no attack (real gradients on own data)',
        (),
        'the all-honest baseline: Byzantine workers compute real gradients on their own data (no attack)'),
    'inf': _Attack(
        'phalanx.attacks.noise:Infinity',
        'vector: sends rows',
        (),
        'ByzFL Inf attack (LPD-EPFL, ByzFL 0.0.11); garbage-value Byzantine worker'),
    'intermittent': _Attack(
        'phalanx.attacks.intermittent:Intermittent',
        'vector: sends rows',
        ("attack: str = 'signflip' (attack_params.attack)",
         'params: dict[str, Any] | None = None (attack_params.params)',
         'every: int = 10 (attack_params.every)',
         'start: int = 0 (attack_params.start)',
         'length: int = 1 (attack_params.length)'),
        ("an attack active in k of T rounds: the corrupted rounds of Zhang & Cutkosky, 'Unconstrained Robust Online "
         "Convex Optimization', ICML 2025")),
    'ipm': _Attack(
        'phalanx.attacks.scaling:InnerProductManipulation',
        'vector: sends rows',
        ('epsilon: float = 0.1 (attack_params.epsilon)',),
        ("C. Xie, O. Koyejo, I. Gupta, 'Fall of Empires: Breaking Byzantine-tolerant SGD by Inner Product "
         "Manipulation', UAI 2019 (PMLR 115, 2020) (inner product manipulation), small-epsilon preset")),
    'labelflip': _Attack(
        'phalanx.attacks.labelflip:LabelFlip',
        'data: poisons its batches',
        (),
        ("Z. Allen-Zhu, F. Ebrahimian, J. Li, D. Alistarh, 'Byzantine-Resilient Non-Convex Stochastic Gradient "
         "Descent', ICLR 2021 and Karimireddy et al. ICML 2021 (label flipping y -> C - 1 - y); ByzFL LabelFlipping")),
    'mimic': _Attack(
        'phalanx.attacks.mimic:Mimic',
        'vector: sends rows',
        ('target: int | None = None (attack_params.target)',),
        ("S. P. Karimireddy, L. He, M. Jaggi, 'Byzantine-Robust Learning on Heterogeneous Datasets via Bucketing', "
         "ICLR 2022 (mimic attack); Phalanx's stateless variant: each round's largest |projection|")),
    'minmax': _Attack(
        'phalanx.attacks.minmax:MinMax',
        'vector: sends rows',
        ("perturbation: str = 'unit' (attack_params.perturbation)",
         'gamma_init: float = 10.0 (attack_params.gamma_init)',
         'tol: float = 1e-05 (attack_params.tol)'),
        ("V. Shejwalkar, A. Houmansadr, 'Manipulating the Byzantine: Optimizing Model Poisoning Attacks and Defenses "
         "for Federated Learning', NDSS 2021, Eq. 4 (Min-Max) and Algorithm 1")),
    'minsum': _Attack(
        'phalanx.attacks.minmax:MinSum',
        'vector: sends rows',
        ("perturbation: str = 'unit' (attack_params.perturbation)",
         'gamma_init: float = 10.0 (attack_params.gamma_init)',
         'tol: float = 1e-05 (attack_params.tol)'),
        ("V. Shejwalkar, A. Houmansadr, 'Manipulating the Byzantine: Optimizing Model Poisoning Attacks and Defenses "
         "for Federated Learning', NDSS 2021, Eq. 5 (Min-Sum) and Algorithm 1")),
    'nan': _Attack(
        'phalanx.attacks.noise:NotANumber',
        'vector: sends rows',
        (),
        'garbage-value Byzantine worker (NaN everywhere)'),
    'neurotoxin': _Attack(
        'phalanx.attacks.neurotoxin:Neurotoxin',
        'data: poisons its batches',
        ('target: int = 0 (attack_params.target)',
         'size: int = 2 (attack_params.size)',
         'value: float = 2.5 (attack_params.value)',
         'poison_fraction: float = 0.5 (attack_params.poison_fraction)',
         'keep: float = 95.0 (attack_params.keep)',
         'norm_bound: float | None = None (attack_params.norm_bound)',
         'boost: float = 1.0 (attack_params.boost)',
         'stop_round: int | None = None (attack_params.stop_round)'),
        ("Z. Zhang et al., 'Neurotoxin: Durable Backdoors in Federated Learning', ICML 2022, Algorithm 1 (update "
         'projected off the top-k% coordinates of the last global update)')),
    'none': _Attack(
        'phalanx.attacks.none:NoAttack',
        'baseline: no attack (replays honest rows)',
        (),
        'no attack (baseline): Byzantine workers replay honest rows'),
    'optimal': _Attack(
        'phalanx.attacks.optimal:Optimal',
        'vector: sends rows',
        ("base: str = 'alie' (attack_params.base)",
         'max_factor: float = 10.0 (attack_params.max_factor)',
         'evaluations: int = 32 (attack_params.evaluations)'),
        ('ByzFL 0.0.11 Optimal_ALittleIsEnough / Optimal_InnerProductManipulation: the attack factor maximising '
         '||Agg(honest + byzantine) - mean(honest)||, here by grid search; base attacks: Baruch et al. NeurIPS 2019 '
         '(ALIE), Xie et al. UAI 2019 (IPM)')),
    'phrase-backdoor': _Attack(
        'phalanx.attacks.phrase:PhraseBackdoor',
        'data: poisons its batches',
        ('trigger: tuple[int, ...] | list[int] = (5, 6, 7) (attack_params.trigger)',
         'target: int = 1 (attack_params.target)',
         'offset: int = 1 (attack_params.offset)',
         'poison_fraction: float = 0.5 (attack_params.poison_fraction)',
         'boost: float = 1.0 (attack_params.boost)',
         'stop_round: int | None = None (attack_params.stop_round)'),
        ("A. Wan, E. Wallace, S. Shen, D. Klein, 'Poisoning language models during instruction tuning', ICML 2023, §3 "
         '(a trigger phrase and a target output); E. Bagdasaryan et al., AISTATS 2020, Eq. 3 (model replacement)')),
    'replacement': _Attack(
        'phalanx.attacks.replacement:ModelReplacement',
        'data: poisons its batches',
        ('target: int = 0 (attack_params.target)',
         'size: int = 2 (attack_params.size)',
         'value: float = 2.5 (attack_params.value)',
         'poison_fraction: float = 0.5 (attack_params.poison_fraction)',
         'boost: float = 10.0 (attack_params.boost)',
         'norm_bound: float = 1.0 (attack_params.norm_bound)',
         'stop_round: int | None = None (attack_params.stop_round)'),
        ("E. Bagdasaryan et al., 'How To Backdoor Federated Learning', AISTATS 2020, Eq. 3 (model replacement) and "
         "§4.2 (constrain-and-scale); Z. Sun et al., 'Can You Really Backdoor Federated Learning?', 2019 (norm "
         'bound)')),
    'signflip': _Attack(
        'phalanx.attacks.scaling:SignFlip',
        'vector: sends rows',
        ('scale: float = 1.0 (attack_params.scale)',),
        ("Z. Allen-Zhu, F. Ebrahimian, J. Li, D. Alistarh, 'Byzantine-Resilient Non-Convex Stochastic Gradient "
         "Descent', ICLR 2021 (sign-flipping attack); ByzFL SignFlipping")),
    'subnormal': _Attack(
        'phalanx.attacks.subnormal:Subnormal',
        'vector: sends rows',
        ("values: str = 'subnormal' (attack_params.values)",),
        ("Phalanx's own availability attack through subnormal arithmetic (M. Andrysco, D. Kohlbrenner, K. Mowery, "
         "R. Jhala, S. Lerner, H. Shacham, 'On Subnormal Floating Point and Abnormal Timing', IEEE S&P 2015)")),
    'targetflip': _Attack(
        'phalanx.attacks.targetflip:TargetFlip',
        'data: poisons its batches',
        ('source: int = 5 (attack_params.source)',
         'target: int = 3 (attack_params.target)'),
        ("V. Tolpegin, S. Truex, M. E. Gursoy, L. Liu, 'Data Poisoning Attacks Against Federated Learning Systems', "
         'ESORICS 2020 (label flipping from a source class to a target class)')),
}
"""The built-in vector and data attacks (:func:`phalanx.attacks.names`)."""
ATTACK_GROUP = Group("phalanx.attacks", "phalanx.attacks.registry")

GOSSIP_ATTACKS: dict[str, _GossipAttack] = {
    'dissensus': _GossipAttack(
        'phalanx.decentralized.gossip_attacks:Dissensus',
        ("L. He, S. P. Karimireddy, M. Jaggi, 'Byzantine-robust decentralized learning via ClippedGossip', arXiv "
         '2202.01545, 2022 (dissensus attack)')),
    'spectral': _GossipAttack(
        'phalanx.decentralized.gossip_attacks:Spectral',
        ("R. Gaucher, A. Dieuleveut, H. Hendrikx, 'Unified breakdown analysis for Byzantine robust gossip', ICML "
         '2025, arXiv 2410.10418 (spectral attack)')),
}
"""The built-in attacks that use the graph (:func:`phalanx.decentralized.gossip_attacks.names`)."""
GOSSIP_ATTACK_GROUP = Group("phalanx.gossip_attacks", "phalanx.decentralized.gossip_attacks")

ALGORITHMS: dict[str, _Algorithm] = {
    'aflguard': _Algorithm(
        'phalanx.training.algorithms.aflguard:AFLGuard',
        'algorithm_params',
        ('batch_size: int = 32 (algorithm_params.batch_size)',
         'max_staleness: int = 4 (algorithm_params.max_staleness)',
         "speeds: Any = 'lognormal(1.0)' (algorithm_params.speeds)",
         "byzantine_timing: str = 'honest' (algorithm_params.byzantine_timing)",
         'concurrency: int | None = None (algorithm_params.concurrency)',
         "availability: str = 'always' (algorithm_params.availability)",
         'availability_scale: float = 60.0 (algorithm_params.availability_scale)',
         'trace_bandwidth: bool = False (algorithm_params.trace_bandwidth)',
         'buffer_size: int = 1 (algorithm_params.buffer_size)',
         'lam: float = 1.5 (algorithm_params.lam)',
         'trusted_size: int = 32 (algorithm_params.trusted_size)'),
        'Fang, Liu, Gong & Bentley, AFLGuard: Byzantine-robust Asynchronous Federated Learning, ACSAC 2022'),
    'anytime': _Algorithm(
        'phalanx.training.algorithms.gossip:AnytimeGossip',
        'its config keys',
        ("graph: Graph = 'ring' (graph)",
         "weights: str = 'metropolis_hastings' (gossip_weights)",
         'batch_size: int = 32 (batch_size)',
         'lr: float | Callable[[int], float] = 0.1 (lr)',
         'momentum: float = 0.0 (momentum)',
         'weight_decay: float = 0.0 (weight_decay)'),
        ('Decentralized Anytime SGD (Eisen, Dorfman & Levy, "Enhancing parallelism in decentralized stochastic convex '
         'optimization", ICML 2025, arXiv 2506.00961) on ``graph``.')),
    'basgd': _Algorithm(
        'phalanx.training.algorithms.basgd:BASGD',
        'algorithm_params',
        ('batch_size: int = 32 (algorithm_params.batch_size)',
         'max_staleness: int = 4 (algorithm_params.max_staleness)',
         "speeds: Any = 'lognormal(1.0)' (algorithm_params.speeds)",
         "byzantine_timing: str = 'honest' (algorithm_params.byzantine_timing)",
         'concurrency: int | None = None (algorithm_params.concurrency)',
         "availability: str = 'always' (algorithm_params.availability)",
         'availability_scale: float = 60.0 (algorithm_params.availability_scale)',
         'trace_bandwidth: bool = False (algorithm_params.trace_bandwidth)',
         'buffers: int = 5 (algorithm_params.buffers)'),
        'Yang & Li, BASGD: Buffered Asynchronous SGD for Byzantine Learning, ICML 2021, Alg. 1'),
    'dsgd': _Algorithm(
        'phalanx.training.algorithms.dsgd:DSGD',
        'its config keys',
        ('batch_size: int = 32 (batch_size)',
         'momentum: float = 0.9 (momentum)',
         'weight_decay: float = 0.0 (weight_decay)'),
        'Distributed SGD with worker momentum: ``batch_size`` samples per worker per round, momentum β, L2 penalty λ.'),
    'fedavg': _Algorithm(
        'phalanx.training.algorithms.fedavg:FedAvg',
        'its config keys',
        ('clients_per_round: int | None = None (clients_per_round)',
         'local_steps: int = 1 (local_steps)',
         'local_epochs: float | None = None (local_epochs)',
         'batch_size: int = 32 (batch_size)',
         'lr: float | Callable[[int], float] = 0.1 (lr)',
         'momentum: float = 0.9 (momentum)',
         'weight_decay: float = 0.0 (weight_decay)',
         'prox_mu: float = 0.0 (prox_mu)',
         'stats_batch: int = 64 (stats_batch)',
         'stats_momentum: float = 0.1 (stats_momentum)'),
        ('Federated averaging: ``clients_per_round`` sampled clients (None: all), ``local_steps`` SGD steps each (or '
         '``local_epochs`` passes over its shard) with batch ``batch_size``, client learning rate ``lr`` (a number or '
         "a schedule over rounds), local momentum, weight decay and FedProx's ``prox_mu``. A model with BatchNorm / "
         'Hybrid BN layers: each sampled client measures their statistics on ``stats_batch`` samples, blended into '
         'the global statistics with momentum ``stats_momentum`` (:mod:`phalanx.training.norm_stats`); a FedBN model: '
         'each client keeps its own BatchNorm layers (:mod:`phalanx.training.algorithms.fedbn`).')),
    'fedbuff': _Algorithm(
        'phalanx.training.algorithms.fedbuff:FedBuff',
        'algorithm_params',
        ('batch_size: int = 32 (algorithm_params.batch_size)',
         'max_staleness: int = 4 (algorithm_params.max_staleness)',
         "speeds: Any = 'lognormal(1.0)' (algorithm_params.speeds)",
         "byzantine_timing: str = 'honest' (algorithm_params.byzantine_timing)",
         'concurrency: int | None = None (algorithm_params.concurrency)',
         "availability: str = 'always' (algorithm_params.availability)",
         'availability_scale: float = 60.0 (algorithm_params.availability_scale)',
         'trace_bandwidth: bool = False (algorithm_params.trace_bandwidth)',
         'buffer_size: int = 10 (algorithm_params.buffer_size)'),
        ('Nguyen et al., Federated Learning with Buffered Asynchronous Aggregation, AISTATS 2022, Alg. 1 (staleness '
         'scaling 1/sqrt(1+s); concurrency C: algorithm_params.concurrency)')),
    'gossip': _Algorithm(
        'phalanx.training.algorithms.gossip:Gossip',
        'its config keys',
        ("graph: Graph = 'ring' (graph)",
         "weights: str = 'metropolis_hastings' (gossip_weights)",
         'batch_size: int = 32 (batch_size)',
         'lr: float | Callable[[int], float] = 0.1 (lr)',
         'momentum: float = 0.9 (momentum)',
         'weight_decay: float = 0.0 (weight_decay)'),
        ('Decentralized SGD on ``graph``: ``batch_size`` samples per node and round, local learning rate ``lr`` (a '
         'number or a schedule over rounds), local momentum β, L2 penalty λ; ``weights`` names the mixing matrix of '
         'plain gossip (``metropolis_hastings`` or ``uniform_neighbour``, :mod:`phalanx.decentralized.gossip`).')),
    'kardam': _Algorithm(
        'phalanx.training.algorithms.kardam:Kardam',
        'algorithm_params',
        ('batch_size: int = 32 (algorithm_params.batch_size)',
         'max_staleness: int = 4 (algorithm_params.max_staleness)',
         "speeds: Any = 'lognormal(1.0)' (algorithm_params.speeds)",
         "byzantine_timing: str = 'honest' (algorithm_params.byzantine_timing)",
         'concurrency: int | None = None (algorithm_params.concurrency)',
         "availability: str = 'always' (algorithm_params.availability)",
         'availability_scale: float = 60.0 (algorithm_params.availability_scale)',
         'trace_bandwidth: bool = False (algorithm_params.trace_bandwidth)',
         'buffer_size: int = 1 (algorithm_params.buffer_size)',
         'filter_f: int = 1 (algorithm_params.filter_f)',
         'beta: float = 0.5 (algorithm_params.beta)',
         'frequency_window: int = 0 (algorithm_params.frequency_window)',
         'frequency_max: int = 1 (algorithm_params.frequency_max)'),
        ('Damaskinos et al., Asynchronous Byzantine Machine Learning (the case of SGD), ICML 2018 (Lipschitz filter, '
         'dampening exp(-beta tau))')),
    'scaffold': _Algorithm(
        'phalanx.training.algorithms.scaffold:Scaffold',
        'algorithm_params',
        ('clients_per_round: int | None = None (algorithm_params.clients_per_round, clients_per_round)',
         'local_steps: int = 1 (algorithm_params.local_steps, local_steps)',
         'local_epochs: float | None = None (algorithm_params.local_epochs, local_epochs)',
         'batch_size: int = 32 (algorithm_params.batch_size)',
         'lr: float | Callable[[int], float] = 0.05 (algorithm_params.lr)',
         'momentum: float = 0.0 (algorithm_params.momentum)',
         'weight_decay: float = 0.0 (algorithm_params.weight_decay)',
         'prox_mu: float = 0.0 (algorithm_params.prox_mu, prox_mu)',
         'stats_batch: int = 64 (algorithm_params.stats_batch, stats_batch)',
         'stats_momentum: float = 0.1 (algorithm_params.stats_momentum, stats_momentum)'),
        ("SCAFFOLD (see the module's docstring): FedAvg's clients with control variates, both halves aggregated by "
         "the run's rule.")),
    'zenopp': _Algorithm(
        'phalanx.training.algorithms.zenopp:ZenoPP',
        'algorithm_params',
        ('batch_size: int = 32 (algorithm_params.batch_size)',
         'max_staleness: int = 4 (algorithm_params.max_staleness)',
         "speeds: Any = 'lognormal(1.0)' (algorithm_params.speeds)",
         "byzantine_timing: str = 'honest' (algorithm_params.byzantine_timing)",
         'concurrency: int | None = None (algorithm_params.concurrency)',
         "availability: str = 'always' (algorithm_params.availability)",
         'availability_scale: float = 60.0 (algorithm_params.availability_scale)',
         'trace_bandwidth: bool = False (algorithm_params.trace_bandwidth)',
         'buffer_size: int = 1 (algorithm_params.buffer_size)',
         'rho: float = 0.001 (algorithm_params.rho)',
         'epsilon: float = 0.0 (algorithm_params.epsilon)',
         'refresh: int = 1 (algorithm_params.refresh)',
         'validation_size: int = 32 (algorithm_params.validation_size)'),
        'Xie, Koyejo & Gupta, Zeno++: Robust Fully Asynchronous SGD, ICML 2020 (validation score, rho, eps)'),
}
"""The round algorithms (:func:`phalanx.training.algorithms.base.names`: the built-in four and the ones that register
themselves or are Phalanx's own entry points)."""
ALGORITHM_GROUP = Group("phalanx.algorithms", "phalanx.training.algorithms.base")

STAGES: dict[str, _Stage] = {
    'crfl': _Stage(
        'phalanx.training.stages.crfl:CRFL',
        'server',
        'server_projection',
        ('clip: ρ > 0: the norm bound of θ after round t is ρ + clip_growth·t',
         "noise: σ > 0: the training noise's standard deviation (every round but the last)",
         'clip_growth: ≥ 0: how much ρ_t grows a round (default 0)',
         'test_noise: σ_T > 0: the smoothing noise of the certificate (default σ)',
         'samples: M ≥ 1: noisy copies of θ_T that vote (default 1000)',
         'alpha: 0 < α < 1: the certificate holds with probability 1 − α (default 0.001)',
         "attackers: R ≥ 1: attackers the certificate assumes (default: the run's byzantine, at least 1)",
         "weight: 0 < p ≤ 1: an attacker's aggregation weight (default 1 / the vectors a round)",
         "scale: γ > 0: model-replacement scale (default: the attack's boost, else 1)",
         "local_steps: τ ≥ 1: the attackers' local steps (default: the algorithm's local_steps, else 1)",
         "client_lr: η > 0: their local learning rate (default: the run's lr)",
         "poison_fraction: 0 < q/n ≤ 1: the poisoned share of their batches (default: the attack's, else 1)",
         "lipschitz: L_Z > 0: the loss gradient's Lipschitz constant in the input (default 1)",
         "attack_rounds: rounds t ≥ 1 the attackers poison (default: 1 … the attack's stop_round, else every round)"),
        ("C. Xie, M. Chen, P.-Y. Chen, B. Li, 'CRFL: Certifiably robust federated learning against backdoor attacks', "
         'ICML 2021: its training procedure and its certification theorem')),
    'dp': _Stage(
        'phalanx.training.stages.privacy:ClientDP',
        'worker',
        'dp_noise',
        ("clip: C > 0: every computing worker's update is clipped to norm C",
         'noise: σ > 0: the noise multiplier; each worker adds N(0, σ²C²·I) itself',
         'delta: 0 < δ < 1: the δ of the reported budget (ε, δ) (default 1e-5)',
         "source: 'seed' (the run's seed: reproducible, removable by whoever knows it) or 'secret' (a per-session "
         "secret seed of each process: not resumable bit for bit) (default 'seed'; a torchrun config: 'secret')"),
        ("M. Abadi et al., 'Deep learning with differential privacy', CCS 2016, Algorithm 1; H. B. McMahan, D. "
         "Ramage, K. Talwar, L. Zhang, 'Learning differentially private recurrent language models', ICLR 2018, "
         'Algorithm 1 (per client, noise at the client)')),
}
"""The stages a legacy flat key turns on (dp, crfl: their cells name it). Every other stage of
:mod:`phalanx.training.stages` is listed from its own file's source, read without importing it
(:mod:`phalanx.catalogue.stage_files`): a new stage needs no line here."""
STAGE_GROUP = Group("phalanx.stages", "phalanx.training.stages.registry")


def _complete(*tables: tuple[Iterable[str], Group]) -> bool:
    """Whether each registry knows no name beyond its table (no plug-in installed, none registered in this
    process)."""
    return not any(extra_names(table, where) for table, where in tables)


def _section(lines: tuple[str, ...]) -> str:
    return "\n".join(lines) or NO_SECTION


def attack_rows() -> Rows | None:
    """``phalanx list attacks``' rows — (name, kind, section), reference — each part sorted by name as the registries'
    ``names()`` are, the attacks first, then the gossip attacks; None when a registry knows a name beyond the
    tables (a plug-in), whose row only its class can give."""
    if not _complete((ATTACKS, ATTACK_GROUP), (GOSSIP_ATTACKS, GOSSIP_ATTACK_GROUP)):
        return None
    rows = [([name, a.kind, _section(a.section)], a.reference) for name, a in sorted(ATTACKS.items())]
    return rows + [([name, GOSSIP_ATTACK_KIND, NO_SECTION], g.reference) for name, g in sorted(GOSSIP_ATTACKS.items())]


def algorithm_rows() -> Rows | None:
    """``phalanx list algorithms``' rows — (name, configured by, section), reference — sorted by name; None as for
    :func:`attack_rows`."""
    if not _complete((ALGORITHMS, ALGORITHM_GROUP)):
        return None
    return [([name, a.configured_by, _section(a.section)], a.reference) for name, a in sorted(ALGORITHMS.items())]


def stage_rows() -> Rows | None:
    """``phalanx list stages``' rows — (name, side, turned on by, section), reference — sorted by name; None as for
    :func:`attack_rows`."""
    files = stage_files.derived(s.target.split(":")[0] for s in STAGES.values())  # a stage file the table lacks
    if files is None or not _complete((set(STAGES) | set(files), STAGE_GROUP)):
        return None
    rows = {name: ([name, s.side, s.turned_on_by, _section(s.section)], s.reference) for name, s in STAGES.items()}
    rows |= {name: ([name, cells[1], cells[2], _section(cells[3:-1])], cells[-1]) for name, cells in files.items()}
    return [rows[name] for name in sorted(rows)]
