"""Kardam: asynchronous SGD with a Lipschitz filter and staleness-aware dampening, on the simulated clock.

Damaskinos, El Mhamdi, Guerraoui, Patra & Taziki, "Asynchronous Byzantine Machine Learning (the case of SGD)",
ICML 2018. The paper's statement (its abstract; the equations below are Phalanx's reading, their numbers in the
paper not checked here): Kardam "consists of two complementary components: a filtering and a dampening
component. The first is scalar-based and ensures resilience against 1/3 Byzantine workers [...] this filter
leverages the Lipschitzness of cost functions [...]. The dampening component bounds the convergence rate by
adjusting to stale information through a generic gradient weighting scheme"; it guarantees almost sure convergence
for n ≥ 3f + 1 under the paper's assumptions (a Lipschitz-smooth cost, bounded staleness τ ≤ τ_max, honest
gradients unbiased with bounded variance, and the Robbins–Monro step sizes), with a slowdown "less than f/n".

What Phalanx implements, per update g of worker p computed at θ (version v, staleness τ = t − v):

* **The Lipschitz filter.** The update's empirical Lipschitz coefficient compares it with the last update the
  server accepted, ĝ, computed at θ̂ (as the authors' reference simulation does: the candidate against the last
  gradient the server used):

      k = ‖g − ĝ‖ / ‖θ − θ̂‖

  (when θ = θ̂ — two updates from the same version — the latest accepted update computed at another θ is the
  reference). The server keeps the latest coefficient of every worker (the "recent ones": one per worker, so a
  fast worker cannot flood the set) and accepts g iff k ≤ K̂, the ((n − f)/n)-quantile of that set (its
  ⌈(n − f)/n · m⌉-th smallest of the m workers that have one; f = ``filter_f``, 3f < n checked). With at most f
  Byzantine entries in a full set, K̂ is at most the largest honest coefficient; honest updates above the
  quantile are rejected too — the paper's "slowdown less than f/n". g's coefficient enters the set whether or not
  g is accepted (an infinite one for a non-finite g, which is always rejected).
* **The dampening.** An accepted update is weighted by Λ(τ) = exp(−β τ) (β = ``beta``), the paper's
  staleness-aware dampening; x ← x − η · Agg(Λ(τ₁)·g₁, …) with Agg the run's rule over the buffer — with the
  default ``buffer_size = 1`` and the mean, the paper's x ← x − η Λ(τ) g applied on each arrival.

* **The frequency filter** (off unless ``frequency_window`` W > 0). The paper's second filter bounds how many of
  the most recently accepted updates may come from one worker, so that a fast (or always-first) Byzantine worker
  cannot dominate the server's progress. Its exact definition (the window's length and the bound, as the paper
  states them) could not be retrieved with this session's search tool and is not quoted here. **Phalanx's variant
  (its own):** the server keeps the workers of the last W updates it accepted (``kardam_recent``); an update that
  passes the Lipschitz filter is nevertheless rejected when its worker already has q = ``frequency_max`` of those W
  (default 1); a rejected one does not enter the window, so the window slides only on accepted updates. It needs
  W < q · n (n the computing workers: on processes n − 1), checked, else every worker could hold q places and
  nothing would ever be accepted again. Within any W consecutive accepted updates at most q are one worker's
  (tests/test_kardam_frequency.py::test_a_worker_faster_than_the_others_is_throttled, with its mutant W = 0).

What it keeps and drops. Kept: the Lipschitz filter with the (n − f)/n quantile, the dampening, the bounded
staleness (``max_staleness``: older updates are dropped by the clock, counted), a frequency filter (Phalanx's
variant above, off by default so that runs made before it are unchanged). Dropped: the learning-rate schedule of its
proof (the run's ``lr`` and schedule are used). Undefined coefficients: the run's first update has no reference and is
accepted unjudged (a finite one: an always-first attacker's first update is applied); an update computed at the
same θ as every reference (before θ has moved twice) is rejected, and its coefficient does not enter the set. What
the filter does not stop (docs/async.md, measured): always-first sign flippers ×10 (n = 10, b = 2, K = 4) — it
rejects 15–26 of their 60 updates and the model stays at chance (why is not established). The filter bounds how
fast the applied gradients change, not where they point.

Config: ``algorithm = "kardam"``, ``algorithm_params = {filter_f = f, beta = β, frequency_window = W,
frequency_max = q, buffer_size = K, max_staleness = S, speeds = "...", byzantine_timing = "..."}``; the run's
``aggregator`` (``mean`` with ``f = 0`` for the paper).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from phalanx.aggregators.base import Aggregator
from phalanx.attacks.base import Attack, DataAttack
from phalanx.errors import ConfigError
from phalanx.training.algorithms.base import Run, register
from phalanx.training.algorithms.fedbuff import FedBuff
from phalanx.validate import check_int, check_real

KEYS = ("kardam_ref_grad", "kardam_ref_theta", "kardam_refs", "kardam_lip")
"""The filter's state: the last two accepted updates computed at different θ and those θ (row 0 the latest), how
many of them there are, and every worker's latest Lipschitz coefficient (NaN: none yet)."""
RECENT = "kardam_recent"
"""With the frequency filter (``frequency_window`` W > 0): the workers of the last W accepted updates, oldest first
(−1: an empty place); absent otherwise, so a checkpoint of a run without it is what it was."""


def frequency_ok(recent: Tensor, worker: int, most: int) -> bool:
    """Phalanx's frequency filter: worker ``worker`` may have another accepted update iff it holds fewer than
    ``most`` of the places in ``recent`` (the workers of the last W accepted updates)."""
    return int((recent == worker).sum()) < most


def slid(recent: Tensor, worker: int) -> Tensor:
    """The window after an accepted update of ``worker``: the oldest place leaves, ``worker`` enters last."""
    return torch.cat([recent[1:], recent.new_tensor([worker])])


def dampening(staleness: Tensor, beta: float) -> Tensor:
    """Kardam's staleness-aware dampening Λ(τ) = exp(−β τ) (Damaskinos et al., ICML 2018), float64."""
    return torch.exp(-beta * staleness.to(torch.float64))


def quantile_bound(lips: Tensor, workers: int, f: int) -> float | None:
    """K̂: the ((n − f)/n)-quantile of the known coefficients (NaN: unknown) — the ⌈(n − f)/n · m⌉-th smallest of
    the m known ones; None when no worker has one yet."""
    known = lips[~torch.isnan(lips)]
    m = int(known.numel())
    if m == 0:
        return None
    rank = max(1, math.ceil((workers - f) / workers * m))
    return float(torch.sort(known).values[rank - 1])


@register
@dataclass(frozen=True)
class Kardam(FedBuff):
    """Kardam (see the module's docstring): FedBuff's buffer of ``buffer_size`` updates (1: each update applied on
    arrival), each passed through the Lipschitz filter (``filter_f``) and dampened by exp(−β τ)."""

    buffer_size: int = 1
    filter_f: int = 1
    beta: float = 0.5
    frequency_window: int = 0
    frequency_max: int = 1
    name = "kardam"
    screens = True
    screens_on_processes = True
    reference = ("Damaskinos et al., Asynchronous Byzantine Machine Learning (the case of SGD), ICML 2018 "
                 "(Lipschitz filter, dampening exp(-beta tau))")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("algorithm_params.filter_f", self.filter_f, low=0)
        check_real("algorithm_params.beta", self.beta, low=0.0)
        check_int("algorithm_params.frequency_window", self.frequency_window, low=0)
        check_int("algorithm_params.frequency_max", self.frequency_max, low=1)

    def check(self, run: Run) -> None:
        super().check(run)
        check_filter_f(self.filter_f, run.workers)
        check_frequency(self.frequency_window, self.frequency_max, run.workers)

    def check_config(self, cfg: Any, rule: Aggregator, attack: Attack | DataAttack) -> None:
        check_filter_f(self.filter_f, cfg.workers)
        check_frequency(self.frequency_window, self.frequency_max, cfg.workers)
        if getattr(cfg, "engine", "simulated") != "simulated":  # rank 0 serves: n − 1 workers compute
            check_filter_f(self.filter_f, cfg.workers - 1, " on processes, where rank 0 only serves")
            check_frequency(self.frequency_window, self.frequency_max, cfg.workers - 1,
                            " on processes, where rank 0 only serves")
        super().check_config(cfg, rule, attack)

    def assemble(self, run: Run, ids: Tensor, updates: Tensor, staleness: Tensor) -> tuple[Tensor, list[int], Tensor]:
        """Row i is Λ(sᵢ)·gᵢ (zero for a rejected update)."""
        w = dampening(staleness, self.beta).to(updates)
        return updates * w[:, None], ids.tolist(), ids >= run.workers - run.byzantine

    def screen_state(self, run: Run, theta: Tensor) -> dict[str, Tensor]:
        n, d = run.workers, run.problem.dim
        recent = {RECENT: torch.full((self.frequency_window,), -1, dtype=torch.int64)} if self.frequency_window else {}
        return {"kardam_ref_grad": theta.new_zeros(2, d), "kardam_ref_theta": theta.new_zeros(2, d),
                "kardam_refs": torch.zeros((), dtype=torch.int64),
                "kardam_lip": torch.full((n,), float("nan"), dtype=torch.float64), **recent}

    def check_screen_state(self, run: Run, own: dict[str, Tensor]) -> None:
        n, d = run.workers, run.problem.dim
        shapes = {"kardam_ref_grad": (2, d), "kardam_ref_theta": (2, d), "kardam_refs": (), "kardam_lip": (n,),
                  **({RECENT: (self.frequency_window,)} if self.frequency_window else {})}
        for key, shape in shapes.items():
            got = own.get(key)
            if got is None or tuple(got.shape) != shape:
                raise ConfigError("start", f"a Kardam state with {key} of shape "
                                  f"{None if got is None else tuple(got.shape)}", f"{shape} for {n} workers")
        if not 0 <= int(own["kardam_refs"]) <= 2:
            raise ConfigError("start", f"a Kardam state with {int(own['kardam_refs'])} references", "0, 1 or 2")
        refs = torch.cat([own["kardam_ref_grad"].flatten(), own["kardam_ref_theta"].flatten()])
        if not bool(torch.isfinite(refs).all()):
            raise ConfigError("start", "a Kardam state with a non-finite reference", "finite accepted updates and θ")
        recent = own.get(RECENT)
        if recent is not None and (recent.dtype != torch.int64 or bool(((recent < -1) | (recent >= n)).any())):
            raise ConfigError("start", "a Kardam state whose frequency window names no worker",
                              f"worker indices 0 … {n - 1} (or -1, an empty place)")

    def screen(self, run: Run, own: dict[str, Tensor], theta: Tensor, t: int, ids: Tensor, updates: Tensor,
               versions: Tensor, ring: Tensor, workers: int | None = None) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """The Lipschitz filter, then the frequency filter (with ``frequency_window`` > 0), update by update in
        delivery order (each one's coefficient enters the set, and an accepted one becomes the reference and takes a
        place in the window, before the next is judged)."""
        ref_g, ref_x = own["kardam_ref_grad"].clone(), own["kardam_ref_theta"].clone()
        refs, lips = int(own["kardam_refs"]), own["kardam_lip"].clone()
        recent = own.get(RECENT)
        keep = torch.zeros(ids.numel(), dtype=torch.bool)
        slots = self.max_staleness + 1
        for i, w in enumerate(ids.tolist()):
            g, x = updates[i], ring[int(versions[i]) % slots]
            if not bool(torch.isfinite(g).all()):
                lips[w] = math.inf
                continue
            if refs == 0:  # the run's first update: no reference to compare with, accepted (unjudged)
                keep[i] = True
            else:
                j = 0 if not torch.equal(x, ref_x[0]) else 1  # the latest accepted update computed at another θ
                if j < refs:
                    dx = float(torch.linalg.vector_norm((x - ref_x[j]).double()))
                    k = float(torch.linalg.vector_norm((g - ref_g[j]).double())) / dx
                    k = k if math.isfinite(k) else math.inf
                    bound = quantile_bound(lips, run.workers if workers is None else workers, self.filter_f)
                    keep[i] = bound is None or k <= bound
                    lips[w] = k
            if keep[i] and recent is not None:
                keep[i] = frequency_ok(recent, w, self.frequency_max)
                recent = slid(recent, w) if keep[i] else recent
            if keep[i]:
                if refs and not torch.equal(x, ref_x[0]):  # the old latest keeps its θ ≠ this one's as reference 1
                    ref_g[1], ref_x[1] = ref_g[0], ref_x[0]
                    refs = 2
                ref_g[0], ref_x[0], refs = g, x, max(refs, 1)
        window = {} if recent is None else {RECENT: recent}
        return updates, keep, {"kardam_ref_grad": ref_g, "kardam_ref_theta": ref_x,
                               "kardam_refs": torch.tensor(refs, dtype=torch.int64), "kardam_lip": lips, **window}


def check_filter_f(f: int, workers: int, where: str = "") -> None:
    """Kardam's filter tolerates f < n/3 (the paper's n ≥ 3f + 1; on processes n is the n − 1 worker ranks)."""
    if 3 * f >= workers:
        raise ConfigError("algorithm_params.filter_f", f, f"< {workers}/3 = {workers / 3:g} computing workers{where} "
                          "(Kardam's filter needs n >= 3f + 1)")


def check_frequency(window: int, most: int, workers: int, where: str = "") -> None:
    """Phalanx's frequency filter needs W < q · n: with W ≥ q · n every worker could hold q of the W places and no
    update would ever be accepted again (W = 0: the filter is off)."""
    if window and window >= most * workers:
        raise ConfigError("algorithm_params.frequency_window", window, f"0 (off) or < frequency_max × computing "
                          f"workers = {most} × {workers} = {most * workers}{where} (else every worker could be "
                          "throttled at once)")
