"""Client-level differential privacy at the worker, a worker stage: every honest update clipped to norm C, then
Gaussian noise of standard deviation σC added by the worker itself, before anything leaves it.

For a worker's update u (a DSGD worker's stochastic gradient gᵢ = ∇ℓ(θ; batchᵢ) + λθ, *before* its momentum, which
is then post-processing of the noisy gradients; a FedAvg client's pseudo-gradient θ − θᵢ after its local steps)::

    ũ = u · min(1, C / ‖u‖₂) + σC · ξ,    ξ ~ N(0, I_d)

— per-example clipping and noise of DP-SGD (Abadi et al., "Deep learning with differential privacy", CCS 2016,
Algorithm 1) applied per *client*, as DP-FedAvg does (McMahan, Ramage, Talwar & Zhang, ICLR 2018, Algorithm 1), with
the noise added at each client instead of once at a trusted server: the server, the other clients and the Byzantine
ones never see an unprotected update. The price is more noise in the aggregate (m clients' noise, variance m·σ²C²
in a sum, where central DP-FedAvg adds σ²C² once). The budget (ε, δ) this buys, and against whom, is
:mod:`phalanx.analysis.privacy`.

Who is bound: every worker that *computes* an update — the honest ones, and the Byzantine workers of a data attack,
which follow the protocol on poisoned data (a boosted backdoor scales its privatized update afterwards: the attacker
is not bound by the clipping). A vector attack's rows are whatever the attack makes; it sees the honest rows after
their noise.

Where the noise comes from is ``source`` (the config's ``dp_noise_source``):

* ``"seed"`` — the run's ``dp`` stream (:mod:`phalanx.training.streams`), derived from the run's seed: one ``(W, d)``
  draw a round for the W computing workers in index order, on the CPU; a process that runs one worker draws the whole
  matrix and keeps its own row, so that it adds what the in-process run adds to that worker, and the stream's state is
  checkpointed with the others (a resumed run is the uninterrupted one bit for bit). Anyone who knows the seed (the
  server, every worker, a reader of the config or of the run id) regenerates the noise and removes it: the ε is an
  upper bound on the mechanism's (the RDP accountant's), not a protection of this run. For simulation studies; the
  simulated engine's default.
* ``"secret"`` — a generator seeded per process and session from 64 bits of the operating system's randomness
  (:func:`phalanx.training.streams.secret_generator`), drawing only the rows of the workers this process runs: on the
  ``torchrun`` engine each rank its own worker's noise, which no other rank, the server or any file of the run
  (checkpoint, run files, manifest, tracker) ever holds. A resumed session draws new seeds, so a run with secret noise
  is not bit-for-bit resumable. The real-process engine's default.

A config that leaves ``dp_noise_source`` unset gets its engine's default (:func:`resolved_source`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from phalanx.analysis import privacy as accounting
from phalanx.errors import ConfigError
from phalanx.training.stages.base import Evaluation, Plan, Stage, WorkerStage, WorkerUpdate
from phalanx.validate import Key, Section, check_real

STREAM = "dp"
"""The named random stream the noise is drawn from."""

SOURCES = ("seed", "secret")
"""Where the noise comes from: the run's seed (reproducible, public) or a per-session secret (see the module)."""


def resolved_source(source: str | None, engine: str) -> str:
    """The noise source of a config: ``dp_noise_source`` when set, else its engine's default — ``"secret"`` on the
    real-process ``torchrun`` engine (every rank a real worker whose noise must stay its own), ``"seed"`` on the
    simulated engine (a run is a reproducible instance of the mechanism, bit for bit)."""
    if source is not None:
        return source
    return "secret" if engine == "torchrun" else "seed"



COLUMNS = ("dp_epsilon", "dp_epsilon_local")
"""The budget spent so far, on every metric row (:meth:`ClientDP.budget`)."""


@dataclass(frozen=True)
class ClientDP(WorkerStage):
    """Clip every computing worker's update to ``clip`` (C > 0) and add N(0, (noise·clip)²·I) (noise multiplier
    σ = ``noise`` > 0); ``delta`` (0 < δ < 1) is the δ of the reported budget."""

    clip: float
    noise: float
    delta: float = 1e-5
    source: str = "seed"
    name: ClassVar[str] = "dp"
    privatizes: ClassVar[bool] = True
    streams: ClassVar[tuple[str, ...]] = (STREAM,)
    reference: ClassVar[str] = ("M. Abadi et al., 'Deep learning with differential privacy', CCS 2016, Algorithm 1; "
                                "H. B. McMahan, D. Ramage, K. Talwar, L. Zhang, 'Learning differentially private "
                                "recurrent language models', ICLR 2018, Algorithm 1 (per client, noise at the client)")
    config_section: ClassVar[Section] = Section("stages.dp", (
        Key("noise", "dp_noise", float | None, None, "client-level differential privacy: the noise multiplier σ — "
            "every computing worker clips its update to norm dp_clip = C and adds N(0, σ²C²·I) itself (dsgd: its "
            "gradient, before momentum; fedavg: its pseudo-gradient); the metric rows carry the budget ε (dp_epsilon, "
            "dp_epsilon_local); needs phalanx[privacy]; off by default (docs/privacy.md)", gt=0),
        Key("clip", "dp_clip", float | None, None, "differential privacy: the clipping norm C of every worker's update "
            "(set with dp_noise)", gt=0),
        Key("delta", "dp_delta", float, 1e-5, "differential privacy: the δ of the reported (ε, δ)", gt=0, lt=1),
        Key("source", "dp_noise_source", Literal["seed", "secret"] | None, None, "differential privacy: where each "
            "worker's noise comes from — 'seed' (the run's seed: reproducible, and anyone who knows the seed removes "
            "it; for simulation studies) or 'secret' (a per-session secret seed of each process, written nowhere; not "
            "bit-for-bit resumable); unset: 'seed' on the simulated engine, 'secret' on torchrun (docs/privacy.md)"),
    ), "client-level differential privacy, turned on by the flat dp_noise")
    """The flat keys of earlier releases that configure it (``[stages.dp] noise`` is ``dp_noise``: the adapter,
    :data:`phalanx.experiments.legacy.DP`), each with its type, default, range and description: the run config's
    fields are made from them and a config's values checked once against them, before the stage is built
    (:func:`phalanx.experiments.declare.check`; its own check below is the object's, for a stage built directly)."""
    parameters: ClassVar[Mapping[str, str]] = {
        "clip": "C > 0: every computing worker's update is clipped to norm C",
        "noise": "σ > 0: the noise multiplier; each worker adds N(0, σ²C²·I) itself",
        "delta": "0 < δ < 1: the δ of the reported budget (ε, δ) (default 1e-5)",
        "source": "'seed' (the run's seed: reproducible, removable by whoever knows it) or 'secret' (a per-session "
                  "secret seed of each process: not resumable bit for bit) (default 'seed'; a torchrun config: "
                  "'secret')",
    }

    def __post_init__(self) -> None:
        """Each parameter checked under its own name; a config's errors name its key (``dp_clip`` …) through the
        adapter that turned the stage on (:func:`phalanx.training.stages.registry.build`)."""
        object.__setattr__(self, "clip", check_real("clip", self.clip, low=0.0, low_open=True))
        object.__setattr__(self, "noise", check_real("noise", self.noise, low=0.0, low_open=True))
        object.__setattr__(self, "delta", check_real("delta", self.delta, low=0.0, low_open=True, high=1.0,
                                                     high_open=True))
        if self.source not in SOURCES:
            raise ConfigError("source", self.source, "'seed' or 'secret'")

    def params(self) -> dict[str, Any]:
        return {"clip": self.clip, "noise": self.noise, "delta": self.delta, "source": self.source}

    def secret_streams(self) -> tuple[str, ...]:
        """With secret noise, the ``dp`` stream is a per-session secret generator: never seeded from the run's seed,
        never checkpointed."""
        return (STREAM,) if self.source == "secret" else ()

    def check(self, plan: Plan) -> None:
        """An algorithm whose workers pass every update they send through the worker stages, a model whose
        normalisation statistics stay with the clients, a rule that reads no server-side gradient of training data
        (FLTrust's ``reference``: an unnoised statistic of the clients' raw data would reach the released model), an
        attack that trains on its own shards (not the edge-case pool drawn from every client's data), and the
        accountant (the ``privacy`` extra) installed."""
        algorithm = plan.algorithm
        if not getattr(type(algorithm), "runs_worker_stages", False):
            raise ConfigError(self.parameter("privacy"), self.noise, f"unset with algorithm {algorithm.name!r} "
                              "(client-level differential privacy is applied by the workers of distributed SGD and "
                              "federated averaging: they pass every update they send through the worker stages)")
        if plan.norm is not None:
            raise ConfigError(plan.norm_key, plan.norm_value, "a model without BatchNorm / Hybrid BN / FedBN layers "
                              "('group' or 'none') with differential privacy (the clients' normalisation statistics "
                              "would leave them without noise)")
        if "reference" in getattr(plan.rule, "context_keys", ()):
            spec = getattr(plan.rule, "spec", getattr(plan.rule, "name", repr(plan.rule)))  # a chain's is 'nnm>fltrust'
            raise ConfigError("aggregator", spec, "a rule that reads no "
                              "server-side gradient with differential privacy (not fltrust: its reference gradient is "
                              "computed, unclipped and unnoised, on root samples drawn from the clients' training "
                              "data, so the released model is no longer post-processing of the noisy updates and no "
                              "ε holds)")
        if getattr(plan.attack, "samples_others_data", False):
            raise ConfigError("attack", getattr(plan.attack, "name", repr(plan.attack)), "an attack whose Byzantine "
                              "workers train on their own shards with differential privacy (not edgecase: its pool "
                              "is drawn from the whole training set, honest clients' samples included, so one "
                              "client's data would enter other clients' releases and the accounted sensitivity 2C "
                              "would not hold)")
        accounting.require(self.parameter("privacy"))

    def update(self, rows: Tensor, u: WorkerUpdate) -> Tensor:
        """Clip and noise the rows (:meth:`privatize`), from the run's ``dp`` stream; with secret noise, from this
        process's secret generator, drawing only the rows it has (no other worker's noise)."""
        if self.source == "secret":
            return self.privatize(rows, rows.shape[0], u.generators[STREAM])
        return self.privatize(rows, u.workers, u.generators[STREAM], u.positions)

    def clip_rows(self, rows: Tensor) -> Tensor:
        """``rows`` ``(W, d)`` with each row scaled to norm at most C (in place; returned)."""
        norms = torch.linalg.vector_norm(rows, dim=1, keepdim=True)
        return rows.mul_(torch.clamp(self.clip / norms.clamp_min(torch.finfo(rows.dtype).tiny), max=1.0))

    def noise_rows(self, workers: int, dim: int, gen: torch.Generator) -> Tensor:
        """One round's standard normal draws for ``workers`` computing workers, ``(workers, dim)`` float32 on the
        CPU (every shape of the worker side draws this same matrix)."""
        return torch.randn(workers, dim, generator=gen)

    def privatize(self, rows: Tensor, workers: int, gen: torch.Generator, positions: slice = slice(None)) -> Tensor:
        """Clip ``rows`` and add their noise, in place (returned): the round has ``workers`` computing workers, the
        noise is drawn for all of them (``(workers, d)``, so that the stream advances alike in every process), and
        ``rows`` are those at ``positions`` (all of them by default; one process's own worker, or none in a round it
        computes nothing)."""
        xi = self.noise_rows(workers, rows.shape[1], gen)[positions]
        if rows.shape[0] == 0:
            return rows
        self.clip_rows(rows)
        return rows.add_(xi.to(device=rows.device, dtype=rows.dtype), alpha=self.noise * self.clip)

    def budget(self, rounds: int, population: int, sampled: int) -> accounting.Budget:
        """The (ε, δ) after ``rounds`` rounds, ``sampled`` of ``population`` clients a round
        (:func:`phalanx.analysis.privacy.budget`)."""
        return accounting.budget(self.noise, self.delta, rounds, population, sampled)

    def column_names(self) -> tuple[str, ...]:
        return COLUMNS

    def columns(self, ev: Evaluation) -> dict[str, Any]:
        """The budget after the row's round: ``dp_epsilon`` (the released models) and ``dp_epsilon_local``
        (against the server and the other clients). A rule that reads which client sent each row (``ids`` in its
        context keys: FoolsGold, FLDetector, a chain or wrapper of either), or a server stage whose effect on the run
        does (``reads_ids``: ``fail_closed``, which stops the run naming the suspected clients), makes what is
        released depend on who was sampled, which the amplification by a secret sample assumes it does not: its
        ``dp_epsilon`` is the local budget, without amplification."""
        run = ev.run
        b = self.budget(ev.round, run.workers, run.algorithm.per_round(run.workers))
        released = b.epsilon_local if reveals_sample(run) else b.epsilon
        return {"dp_epsilon": released, "dp_epsilon_local": b.epsilon_local}


def reads_ids(rule: Any) -> bool:
    """Whether a rule's output depends on which clients sent its rows (``ids`` among its context keys): then the
    round's sample is not hidden from an observer of the released models, and no amplification by sampling holds."""
    return "ids" in getattr(rule, "context_keys", ())


def reveals_sample(run: Any) -> bool:
    """Whether the run's rule or one of its server stages (``reads_ids``) acts on who was sampled."""
    return reads_ids(run.rule) or any(getattr(s, "reads_ids", False) for s in run.server_stages)


def run_note(stages: Iterable[Stage]) -> str | None:
    """The one line a run with secret DP noise prints when it starts (None for any other run): where its noise comes
    from, and that it is not bit-for-bit resumable."""
    if not any(isinstance(s, ClientDP) and s.source == "secret" for s in stages):
        return None
    return ("differential privacy: every worker's noise is drawn from a secret seed of its own process, written "
            "nowhere; a resumed run draws new noise, so this run is not bit-for-bit resumable "
            "(dp_noise_source = 'secret', docs/privacy.md)")
