"""The privacy budget (ε, δ) of client-level differential privacy, from Google's ``dp-accounting`` (its Rényi DP
accountant) — the accounting of :class:`phalanx.training.privacy.ClientDP`, which says what the workers do.

The mechanism being accounted. Every round, each participating honest client i releases

    ỹᵢ = clip_C(uᵢ) + N(0, σ²C²·I),     clip_C(u) = u · min(1, C / ‖u‖₂),

its own update (a DSGD worker's gradient, a FedAvg client's pseudo-gradient) clipped to norm C, with Gaussian noise
of standard deviation σC added *by the client itself* (the local, distributed-noise variant of DP-FedAvg: McMahan,
Ramage, Talwar & Zhang, "Learning differentially private recurrent language models", ICLR 2018, Algorithm 1, with
the noise moved to the clients). Everything else — the attack's vectors, the robust rule, the server optimizer, the
model — is post-processing of those releases, as long as nothing else of the clients' data reaches the server: a rule
with a server-side gradient on training data (FLTrust's ``reference``, its root samples drawn from the clients' data)
is refused with DP (:meth:`phalanx.training.privacy.ClientDP.check`).

Neighbouring data sets: one client's whole local data set *replaced* by any other (``REPLACE_ONE``), so the
L2 sensitivity of ``clip_C(uᵢ)`` is 2C and the Gaussian's noise multiplier relative to it is z = σC / 2C = σ/2.
(Under the add/remove-one-client relation the sensitivity is C and z = σ; replace-one is used because federated
rounds sample a *fixed* number of clients, which the add/remove accountants of Poisson sampling do not cover.)

Two budgets after T rounds, both from the Rényi DP accountant (Mironov, "Rényi differential privacy", CSF 2017;
Abadi et al., "Deep learning with differential privacy", CCS 2016, the moments accountant it generalises):

* ``epsilon_local`` — against anyone who sees every client's release and knows who was sampled (the server, the
  Byzantine workers, whose omniscient attacks read the honest vectors): T Gaussian mechanisms of multiplier z
  (``GaussianDpEvent(z)`` self-composed T times; a client sampled in fewer rounds loses less) — as long as that
  adversary holds no client's raw data (on torchrun every rank loads every shard today: docs/privacy.md);
* ``epsilon`` — against an observer of the released models θ₁ … θ_T only, the clients of each round being a
  secret uniform sample of m of the n without replacement: T subsampled Gaussian mechanisms
  (``SampledWithoutReplacementDpEvent(n, m, GaussianDpEvent(z))``: Wang, Balle & Kasiviswanathan, "Subsampled
  Rényi differential privacy and analytical moments accountant", AISTATS 2019), or ``epsilon_local`` when that is
  smaller (the models are post-processing of the releases; with m = n, as in DSGD, both are the same). The
  amplification assumes the rule treats the round's vectors alike (a rule that reads which client sent a row,
  FoolsGold's history or FLDetector's, reveals who was sampled: the metric rows of such a run carry
  ``epsilon_local`` as their ``dp_epsilon``, :meth:`phalanx.training.privacy.ClientDP.columns`).

``dp-accounting`` is an optional extra (``pip install 'phalanx[privacy]'``): :func:`require` is a one-line
:class:`~phalanx.errors.ConfigError` naming it when it is missing.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from types import ModuleType

from phalanx.errors import ConfigError

EXTRA = "phalanx[privacy]"
"""The optional extra that installs the accountant."""


@dataclass(frozen=True)
class Budget:
    """The (ε, δ) of T rounds: ``epsilon`` for the released models, ``epsilon_local`` against the server and the
    other clients (the module's docstring)."""

    epsilon: float
    epsilon_local: float
    delta: float
    rounds: int


def require(parameter: str = "noise") -> ModuleType:
    """The ``dp_accounting`` package, or a one-line :class:`ConfigError` naming ``parameter`` (what turned privacy
    on: the config key of the privacy stage's noise) and the extra that installs it."""
    try:
        import dp_accounting
    except ImportError:
        raise ConfigError(parameter, "set", f"only with the accountant installed: pip install '{EXTRA}' "
                          "(Google's dp-accounting)") from None
    return dp_accounting


def multiplier(noise: float) -> float:
    """The Gaussian's noise multiplier relative to the replace-one sensitivity 2C of a clipped update: σ / 2."""
    return noise / 2.0


@functools.lru_cache(maxsize=4096)
def budget(noise: float, delta: float, rounds: int, population: int, sampled: int) -> Budget:
    """(ε, δ) after ``rounds`` rounds of client-level DP with noise multiplier ``noise`` (σ: the noise's standard
    deviation over the clipping norm), ``sampled`` of ``population`` clients a round (the module's docstring).
    Round 0 is ε = 0."""
    if rounds < 0 or not 1 <= sampled <= population:
        raise ConfigError("rounds", (rounds, sampled, population), "rounds >= 0 and 1 <= sampled <= population")
    if rounds == 0:
        return Budget(0.0, 0.0, delta, 0)
    dpa = require()
    from dp_accounting import rdp

    z = multiplier(noise)
    replace_one = dpa.NeighboringRelation.REPLACE_ONE
    local = rdp.RdpAccountant(neighboring_relation=replace_one)
    local.compose(dpa.GaussianDpEvent(z), rounds)
    eps_local = float(local.get_epsilon(delta))
    eps = eps_local
    if sampled < population:
        amplified = rdp.RdpAccountant(neighboring_relation=replace_one)
        amplified.compose(dpa.SampledWithoutReplacementDpEvent(population, sampled, dpa.GaussianDpEvent(z)), rounds)
        eps = min(eps, float(amplified.get_epsilon(delta)))
    return Budget(eps, eps_local, delta, rounds)


def exact_gdp_epsilon(mu: float, delta: float) -> float:
    r"""The exact ε(δ) of a μ-GDP mechanism, computed without dp-accounting: the root in ε of

    .. math:: \delta = \Phi(-\varepsilon/\mu + \mu/2) - e^{\varepsilon}\,\Phi(-\varepsilon/\mu - \mu/2)

    (Balle & Wang, "Improving the Gaussian mechanism for differential privacy", ICML 2018, Thm 8), both terms taken
    in logs (scipy's normal log-CDF) and the root found by Brent's method. With every worker every round (q = 1), a
    client's T releases of noise σC on an update of replace-one sensitivity 2C are exactly μ-GDP with
    μ = √T/(σ/2) (Dong, Roth & Su, "Gaussian differential privacy", JRSS-B 2022, Cor. 3.3): the independent check
    :func:`budget` is held to (``tests/test_privacy_exact.py``; ``scripts/privacy_exact.py`` prints both)."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    def excess(e: float) -> float:
        a = float(norm.logcdf(-e / mu + mu / 2))
        b = e + float(norm.logcdf(-e / mu - mu / 2))
        return math.exp(a) * -math.expm1(b - a) - delta

    return float(brentq(excess, 0.0, 10 * mu * mu + 100, xtol=1e-12, rtol=1e-12))
