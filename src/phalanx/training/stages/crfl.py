r"""CRFL: certifiably robust federated learning against backdoors, by clipping and smoothing the global model's
parameters (Xie, Chen, Chen & Li, "CRFL: Certifiably robust federated learning against backdoor attacks", ICML
2021, its training procedure and its certification theorem).

**Training** (a :class:`~phalanx.training.projection.ServerProjection`, a server stage): after the server's step of
round t, the global model is clipped to norm ρ_t and, in every round but the last, perturbed:

.. math:: \theta_t \leftarrow \frac{\theta_t}{\max(1, \|\theta_t\|_2/\rho_t)},\qquad
          \theta_t \leftarrow \theta_t + \epsilon_t,\ \epsilon_t \sim \mathcal N(0, \sigma_t^2 I)\quad (t < T)

with ρ_t = ``clip`` + ``clip_growth``·t (the paper's experiments grow the bound linearly) and σ_t = ``noise``. The
noise is the run's ``projection`` stream: one ``(d,)`` draw a round, on the CPU. The aggregation is any rule (the
paper's is the weighted mean); CRFL composes with it.

**Testing** (:func:`certify`): the smoothed classifier h_s(θ_T; x) is the class the base model predicts most often
under M noisy copies θ_T + ε^k, ε^k ~ N(0, σ_T² I) (σ_T = ``test_noise``, default σ). From the vote counts of the
top class A and the runner-up B, Hoeffding bounds

.. math:: \underline{p_A} = \hat p_A - \sqrt{\ln(2C/\alpha)/(2M)},\qquad
          \overline{p_B} = \hat p_B + \sqrt{\ln(2C/\alpha)/(2M)}

— two one-sided bounds for each of the C classes at 1 − α/(2C), so that all hold together at 1 − α whichever
classes the same counts then pick as A and B (the authors' released certification code bounds the two picked
classes at 1 − α each, which does not account for the pick; ours is the stricter statement), and the
certification theorem's radius

.. math:: \mathrm{RAD} = \sqrt{\frac{-\ln\big(1 - (\sqrt{\underline{p_A}} - \sqrt{\overline{p_B}})^2\big)\,
          \sigma_{t_{adv}}^2}{2\,S^2\,\prod_{t=t_{adv}+1}^{T}\big(2\Phi(\rho_t/\sigma_t) - 1\big)}},\qquad
          S^2 = R\sum_{i=1}^{R}\big(p_i\,\gamma_i\,\tau_i\,\eta_i\,q_{B_i}/n_{B_i}\big)^2 L_Z^2

(σ_T in the product's last factor is the test noise; σ_{t_adv} is σ_T when t_adv = T). The prediction
h_s(θ_T; x) is then *certified*: a backdoor whose trigger has norm ‖δ‖ < RAD, inserted by R attackers in round
t_adv, cannot change it. Where the vote is not confident (:math:`\underline{p_A} \le \overline{p_B}`) the radius is
0: nothing is certified. With attackers in several rounds a ∈ A (the default: every round they poison) the
per-round divergences add (the chain rule of the KL divergence); a round's divergence is contracted only by the
*unattacked* rounds after it (there the clean and the attacked runs apply the same clip-and-noise kernel; at an
attacked round the chain rule adds that round's term and contracts nothing), so

.. math:: \mathrm{RAD}^2 = \frac{-\ln\big(1 - (\sqrt{\underline{p_A}} - \sqrt{\overline{p_B}})^2\big)}
          {2\,S^2\sum_{a\in A}\sigma_a^{-2}\prod_{t>a,\ t\notin A}^{T}\big(2\Phi(\rho_t/\sigma_t) - 1\big)}

— the theorem itself for one attacked round; the sum over rounds is this module's extension, not the paper's
statement.

**What the certificate assumes** (and does not): S bounds how far one attacked round can move the aggregate per
unit of trigger norm, the paper's Lemma for R attackers of aggregation weight p_i = ``weight`` (1/m for the mean of
m vectors a round), model-replacement scale γ = ``scale``, τ = ``local_steps`` local SGD steps at rate η =
``client_lr`` on batches with a share q/n = ``poison_fraction`` poisoned, and a loss whose gradient is L_Z-Lipschitz
in the input (``lipschitz``; the paper's Assumption holds with a known L_Z for generalized linear models, e.g.
logistic regression, with a convex, smooth loss). For a neural network with no known L_Z, for a robust rule whose
weights are not p_i, or for DSGD with worker momentum, the reported radius is the formula evaluated at the
parameters given, not a guarantee. It certifies the *smoothed* classifier's prediction on one clean input against
a bounded trigger — not the base model θ_T, not a larger trigger, not an attack of another kind — with
probability 1 − α over the M test-time draws.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.errors import ConfigError
from phalanx.training.problem import Problem
from phalanx.training.projection import AttackMetrics, ServerProjection
from phalanx.training.stages.base import Plan, Stage
from phalanx.training.streams import generator as stream_generator
from phalanx.validate import check_int, check_real

__all__ = ["CRFL", "Certificate", "certify", "hoeffding_bounds", "radius", "votes"]

SMOOTHING_STREAM = "crfl-smoothing"
"""The named stream the test-time copies are drawn from: seeded afresh at every certification (the same M copies
for the clean and the triggered inputs), so evaluating changes no training draw and keeps no state."""

COLUMNS = ("crfl_accuracy", "crfl_certified_accuracy", "crfl_certified_rate", "crfl_radius_median")
"""The metric columns of the final row (None on every earlier row)."""


def votes(predict: Callable[[Tensor, Tensor], Tensor], theta: Tensor, x: Tensor, num_classes: int, samples: int,
          sigma: float, generator: torch.Generator) -> Tensor:
    """``(N, C)`` vote counts: how many of ``samples`` noisy copies θ + σξ (ξ ~ N(0, I), drawn on the CPU from
    ``generator``) predict each class for each input (``predict(θ', x)``: class indices)."""
    counts = torch.zeros(x.shape[0], num_classes, dtype=torch.long, device=x.device)
    for _ in range(samples):
        xi = torch.randn(theta.shape, generator=generator, dtype=theta.dtype).to(theta.device)
        pred = predict(theta + sigma * xi, x).long().clamp(0, num_classes - 1)
        counts.scatter_add_(1, pred[:, None], torch.ones_like(pred[:, None]))
    return counts


def hoeffding_bounds(counts: Tensor, alpha: float) -> tuple[Tensor, Tensor, Tensor]:
    """The top class A of every row of ``counts`` (ties: the lowest index), the lower bound of p_A and the upper
    bound of the runner-up's p_B, clamped to [0, 1]: Hoeffding's two one-sided bounds for every one of the C
    classes at 1 − α/(2C) each, so that all hold together at 1 − α (a union bound) — whichever two classes the
    same counts then pick as A and B."""
    m = counts.sum(dim=1).clamp(min=1).double()
    c = counts.shape[1]
    score = counts.double() * (c + 1) - torch.arange(c, dtype=torch.float64, device=counts.device)
    top = score.argmax(dim=1)
    p_a = counts.gather(1, top[:, None]).squeeze(1).double() / m
    rest = counts.double().scatter(1, top[:, None], -1.0)
    p_b = rest.max(dim=1).values.clamp(min=0) / m if c > 1 else torch.zeros_like(p_a)
    margin = torch.sqrt(math.log(2 * c / alpha) / (2 * m))
    return top, (p_a - margin).clamp(0.0, 1.0), (p_b + margin).clamp(0.0, 1.0)


def _phi2(z: float) -> float:
    """2Φ(z) − 1 (Φ the standard normal CDF) = erf(z/√2)."""
    return math.erf(z / math.sqrt(2.0))


def radius(p_a: Tensor, p_b: Tensor, *, sensitivity: float, attack_rounds: Sequence[int], rounds: int,
           clip: Callable[[int], float], noise: float, test_noise: float) -> Tensor:
    """The certification theorem's radius of every input (the module's docstring) from the bounds ``p_a``
    (lower) and ``p_b`` (upper): 0 where ``p_a`` ≤ ``p_b``, and where no attacked round is at most ``rounds``.
    ``clip(t)`` is ρ_t, ``noise`` σ_t for t < T, ``test_noise`` σ_T."""
    sigma = [noise] * (rounds - 1) + [test_noise]  # sigma[t - 1] = σ_t, t = 1 … T (σ_T: the test noise)
    contraction = [_phi2(clip(t) / sigma[t - 1]) for t in range(1, rounds + 1)]
    attacked = {a for a in attack_rounds if 1 <= a <= rounds}
    tail = [1.0] * (rounds + 1)  # tail[a] = Π_{t=a+1, t ∉ A}^{T} (2Φ(ρ_t/σ_t) − 1): only unattacked rounds contract
    for a in range(rounds - 1, -1, -1):
        tail[a] = tail[a + 1] * (1.0 if a + 1 in attacked else contraction[a])
    total = sum(tail[a] / sigma[a - 1] ** 2 for a in sorted(attacked))
    out = torch.zeros_like(p_a, dtype=torch.float64)
    if total <= 0 or sensitivity <= 0:
        return out
    sure = p_a > p_b
    gap = (p_a.double().sqrt() - p_b.double().sqrt()) ** 2
    budget = -torch.log1p(-gap.clamp(max=1.0))  # −ln(1 − (√p_A − √p_B)²); inf when p_A = 1, p_B = 0
    value = torch.sqrt(budget / (2 * sensitivity**2 * total))
    return torch.where(sure, value, out)


@dataclass(frozen=True)
class Certificate:
    """What :func:`certify` found for every input: the smoothed prediction, the bounds of p_A and p_B, the certified
    radius (0: not certified) and the raw vote counts ``(N, C)``."""

    prediction: Tensor
    p_a: Tensor
    p_b: Tensor
    radius: Tensor
    counts: Tensor


class CRFL(ServerProjection):
    """CRFL's clipping and parameter smoothing of the global model, and its certificate (the module's docstring).

    - ``clip`` (ρ > 0) and ``clip_growth`` (≥ 0): the norm bound ρ_t = ρ + growth·t of round t.
    - ``noise`` (σ > 0): the training noise's standard deviation; ``test_noise`` (σ_T > 0, default σ) the smoothing's.
    - ``samples`` (M ≥ 1): noisy copies of θ_T that vote; ``alpha`` (0 < α < 1): the certificate's confidence 1 − α.
    - The certificate's threat (the certification theorem): ``attackers`` (R ≥ 1), ``weight`` (p_i, 0 < p ≤ 1),
      ``scale`` (γ > 0), ``local_steps`` (τ ≥ 1), ``client_lr`` (η > 0), ``poison_fraction`` (q/n, 0 < q/n ≤ 1),
      ``lipschitz`` (L_Z > 0), and ``attack_rounds`` (the rounds t ≥ 1 they poison; None: every round).
    """

    name: ClassVar[str] = "crfl"
    reference: ClassVar[str] = ("C. Xie, M. Chen, P.-Y. Chen, B. Li, 'CRFL: Certifiably robust federated learning "
                                "against backdoor attacks', ICML 2021: its training procedure and its certification "
                                "theorem")
    parameters: ClassVar[Mapping[str, str]] = {
        "clip": "ρ > 0: the norm bound of θ after round t is ρ + clip_growth·t",
        "noise": "σ > 0: the training noise's standard deviation (every round but the last)",
        "clip_growth": "≥ 0: how much ρ_t grows a round (default 0)",
        "test_noise": "σ_T > 0: the smoothing noise of the certificate (default σ)",
        "samples": "M ≥ 1: noisy copies of θ_T that vote (default 1000)",
        "alpha": "0 < α < 1: the certificate holds with probability 1 − α (default 0.001)",
        "attackers": "R ≥ 1: attackers the certificate assumes (default: the run's byzantine, at least 1)",
        "weight": "0 < p ≤ 1: an attacker's aggregation weight (default 1 / the vectors a round)",
        "scale": "γ > 0: model-replacement scale (default: the attack's boost, else 1)",
        "local_steps": "τ ≥ 1: the attackers' local steps (default: the algorithm's local_steps, else 1)",
        "client_lr": "η > 0: their local learning rate (default: the run's lr)",
        "poison_fraction": "0 < q/n ≤ 1: the poisoned share of their batches (default: the attack's, else 1)",
        "lipschitz": "L_Z > 0: the loss gradient's Lipschitz constant in the input (default 1)",
        "attack_rounds": "rounds t ≥ 1 the attackers poison (default: 1 … the attack's stop_round, else every round)",
    }

    def __init__(
        self, clip: float = 10.0, noise: float = 0.01, *, clip_growth: float = 0.0, test_noise: float | None = None,
        samples: int = 1000, alpha: float = 0.001, attackers: int = 1, weight: float = 1.0, scale: float = 1.0,
        local_steps: int = 1, client_lr: float = 0.1, poison_fraction: float = 1.0, lipschitz: float = 1.0,
        attack_rounds: Sequence[int] | None = None,
    ) -> None:
        self.clip = check_real("clip", clip, low=0.0, low_open=True)
        self.noise = check_real("noise", noise, low=0.0, low_open=True)
        self.clip_growth = check_real("clip_growth", clip_growth, low=0.0)
        self.test_noise = self.noise if test_noise is None else check_real("test_noise", test_noise, low=0.0,
                                                                           low_open=True)
        self.samples = check_int("samples", samples, low=1)
        self.alpha = check_real("alpha", alpha, low=0.0, low_open=True, high=1.0, high_open=True)
        self.attackers = check_int("attackers", attackers, low=1)
        self.weight = check_real("weight", weight, low=0.0, low_open=True, high=1.0)
        self.scale = check_real("scale", scale, low=0.0, low_open=True)
        self.local_steps = check_int("local_steps", local_steps, low=1)
        self.client_lr = check_real("client_lr", client_lr, low=0.0, low_open=True)
        self.poison_fraction = check_real("poison_fraction", poison_fraction, low=0.0, low_open=True, high=1.0)
        self.lipschitz = check_real("lipschitz", lipschitz, low=0.0, low_open=True)
        if attack_rounds is None:
            self.attack_rounds: tuple[int, ...] | None = None
        else:
            if isinstance(attack_rounds, str | bytes) or not isinstance(attack_rounds, Sequence) or not attack_rounds:
                raise ConfigError("attack_rounds", attack_rounds, "a non-empty list of rounds >= 1 (or unset: every "
                                  "round)")
            self.attack_rounds = tuple(sorted({check_int("attack_rounds", a, low=1) for a in attack_rounds}))

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "clip": self.clip, "noise": self.noise, "clip_growth": self.clip_growth, "test_noise": self.test_noise,
            "samples": self.samples, "alpha": self.alpha, "attackers": self.attackers, "weight": self.weight,
            "scale": self.scale, "local_steps": self.local_steps, "client_lr": self.client_lr,
            "poison_fraction": self.poison_fraction, "lipschitz": self.lipschitz,
        }
        if self.attack_rounds is not None:
            out["attack_rounds"] = list(self.attack_rounds)
        return out

    @classmethod
    def configure(cls, section: Mapping[str, Any], plan: Plan) -> Stage:
        """CRFL with the certificate's threat taken from the run where the section leaves it: R = the attackers
        (``byzantine``, at least 1), p = 1 / the vectors a round, τ = the algorithm's local steps, η = the run's
        ``lr``, γ and q/n = the attack's ``boost`` and ``poison_fraction`` (1 without), the attacked rounds = 1 …
        ``stop_round`` (every round without)."""
        params = dict(section)
        own = plan.attack.params() if hasattr(plan.attack, "params") else {}
        algorithm = plan.algorithm
        if "local_steps" not in params and getattr(algorithm, "local_epochs", None) is not None:
            raise ConfigError("local_steps", None, "the local steps τ of the certificate, set when the clients train "
                              "for local_epochs")
        params.setdefault("attackers", max(1, plan.byzantine))
        params.setdefault("weight", 1.0 / algorithm.per_round(plan.workers))
        params.setdefault("local_steps", getattr(algorithm, "local_steps", 1))
        if plan.lr is not None:
            params.setdefault("client_lr", plan.lr)
        params.setdefault("scale", float(own.get("boost", 1.0)))
        params.setdefault("poison_fraction", float(own.get("poison_fraction", 1.0)))
        stop = own.get("stop_round")
        if "attack_rounds" not in params and isinstance(stop, int):
            params["attack_rounds"] = list(range(1, min(stop, plan.rounds) + 1))
        given = params.get("attack_rounds")
        late = [a for a in given if isinstance(a, int) and a > plan.rounds] if isinstance(given, list) else []
        if late:
            raise ConfigError("attack_rounds", late, f"rounds in [1, rounds = {plan.rounds}]")
        return super().configure(params, plan)

    def clip_at(self, round: int) -> float:
        """ρ_t of round ``round`` (1-based)."""
        return self.clip + self.clip_growth * round

    @property
    def sensitivity(self) -> float:
        """S = √R · √(Σᵢ (pᵢγτηq/n)²) · L_Z with every attacker alike: R·p·γ·τ·η·(q/n)·L_Z."""
        one = self.weight * self.scale * self.local_steps * self.client_lr * self.poison_fraction
        return self.attackers * one * self.lipschitz

    def apply(self, theta: Tensor, round: int, rounds: int, generator: torch.Generator) -> Tensor:
        """Clip θ to norm ρ_t, then (t < T) add N(0, σ²I) drawn from ``generator``. A non-finite θ (a Byzantine
        aggregate under a non-robust rule) is left as it is, noise added: the run's divergence check sees it."""
        norm = torch.linalg.vector_norm(theta.double())
        rho = self.clip_at(round)
        out = theta
        if bool(torch.isfinite(norm)) and float(norm) > rho:
            out = theta * (rho / float(norm))
            over = torch.linalg.vector_norm(out.double())
            if float(over) > rho:  # the rounding of the product: scale down by the excess, once
                out = out * (rho / float(over))
        if round < rounds:
            xi = torch.randn(theta.shape, generator=generator, dtype=theta.dtype).to(theta.device)
            out = out + self.noise * xi
        return out

    def certify(self, problem: Problem, theta: Tensor, x: Tensor, num_classes: int, rounds: int, seed: int,
                ) -> Certificate:
        """The smoothed predictions of ``x`` under θ_T and their certificate (the test-time copies from the
        ``crfl-smoothing`` stream of ``seed``)."""
        gen = stream_generator(seed, SMOOTHING_STREAM)
        counts = votes(problem.predict, theta, x, num_classes, self.samples, self.test_noise, gen)
        return certify(counts, self.alpha, sensitivity=self.sensitivity, rounds=rounds,
                       attack_rounds=self.attack_rounds or range(1, rounds + 1), clip=self.clip_at, noise=self.noise,
                       test_noise=self.test_noise)

    def smoothed(self, problem: Problem, theta: Tensor, num_classes: int, seed: int) -> Callable[[Tensor], Tensor]:
        """The smoothed classifier as ``predict(x)`` (the same M copies at every call)."""
        def predict(x: Tensor) -> Tensor:
            gen = stream_generator(seed, SMOOTHING_STREAM)
            counts = votes(problem.predict, theta, x, num_classes, self.samples, self.test_noise, gen)
            return hoeffding_bounds(counts, self.alpha)[0]
        return predict

    def column_names(self) -> tuple[str, ...]:
        return COLUMNS

    def final_columns(
        self, problem: Problem, theta: Tensor, test_x: Tensor, test_y: Tensor, num_classes: int,
        attack: AttackMetrics | None, seed: int, rounds: int,
    ) -> dict[str, Any]:
        """``crfl_accuracy`` (the smoothed classifier's test accuracy), ``crfl_certified_rate`` (the share of test
        inputs with a radius > 0), ``crfl_certified_accuracy`` (correct and certified), ``crfl_radius_median`` (the
        median radius, 0 for the uncertified), and the attack's own measure under the smoothed classifier, prefixed
        ``crfl_`` (``crfl_attack_success``); all None for a non-finite θ."""
        if not bool(torch.isfinite(theta).all()):
            return dict.fromkeys(COLUMNS)
        cert = self.certify(problem, theta, test_x, num_classes, rounds, seed)
        right = cert.prediction == test_y
        sure = cert.radius > 0
        out: dict[str, Any] = {
            "crfl_accuracy": float(right.double().mean()),
            "crfl_certified_accuracy": float((right & sure).double().mean()),
            "crfl_certified_rate": float(sure.double().mean()),
            "crfl_radius_median": float(cert.radius.median()),
        }
        if attack is not None:
            measured = attack(self.smoothed(problem, theta, num_classes, seed), test_x, test_y)
            out.update({f"crfl_{k}": v for k, v in measured.items()})
        return out


def certify(counts: Tensor, alpha: float, *, sensitivity: float, rounds: int, attack_rounds: Sequence[int],
            clip: Callable[[int], float], noise: float, test_noise: float) -> Certificate:
    """The certificate of vote ``counts`` ``(N, C)``: Hoeffding's bounds (:func:`hoeffding_bounds`) and the
    certification theorem's radius (:func:`radius`)."""
    top, p_a, p_b = hoeffding_bounds(counts, alpha)
    rad = radius(p_a, p_b, sensitivity=sensitivity, attack_rounds=list(attack_rounds), rounds=rounds, clip=clip,
                 noise=noise, test_noise=test_noise)
    return Certificate(top, p_a, p_b, rad, counts)
