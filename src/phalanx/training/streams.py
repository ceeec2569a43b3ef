"""Named random streams: the run's one seed split into independent generators.

Changing one part of a run (the attack, the rule) must not change another's randomness (the data split, the initial
model), so every consumer draws from its own stream, seeded from the run's seed and the stream's name:

==============  =====================================================================================
``partition``   how the training samples are split between workers (once)
``init``        the model's initial weights (once)
``server``      the server's trusted root samples (FLTrust's reference batch; once)
``batches``     every worker's batch positions, every round (worker side)
``attack``      the Byzantine workers' draws (noise, poisoned labels), every round (worker side)
``aggregator``  a stochastic rule's draws (bucketing's permutation, DnC's / SignGuard's coordinates), every round
                (server side)
``clients``     which clients a federated round samples, every round
==============  =====================================================================================

and every stage's own (:attr:`phalanx.training.stages.base.Stage.streams`), in a checkpoint only for a run with
that stage: ``dp`` (the Gaussian noise every computing worker adds to its clipped update, every round, worker side:
client-level differential privacy, :mod:`phalanx.training.stages.privacy`; with its ``source = "secret"`` not a
stream of the seed at all but :func:`secret_generator`, and in no checkpoint), ``projection`` (the server projection's
draws after every step: CRFL's parameter noise, server side, :mod:`phalanx.training.stages.crfl`).

The simulated clock of an asynchronous run draws from ``clock`` (the workers' speeds, once) and, with FedBuff's
``concurrency``, from ``concurrency:<v>`` (which idle workers start on version v: a function of the seed and v, so
nothing to checkpoint; :mod:`phalanx.training.algorithms.clock`).

The per-round streams' states go into every checkpoint, so a resumed run draws exactly what an uninterrupted one
would. Every stream is a CPU generator whatever the run's ``device``: on CUDA the draws are made on the CPU and then
moved (:mod:`phalanx.training.devices`), so a run makes the same draws on either device.
"""

from __future__ import annotations

import hashlib
import secrets

import torch

ROUND_STREAMS = ("batches", "attack", "aggregator", "clients")
"""The streams drawn from every round, whose states a checkpoint holds (:func:`phalanx.training.loop.fresh_start`),
besides the stages' own."""
RESERVED = ("partition", "init", "server", *ROUND_STREAMS)
"""The streams of the run itself: no stage may declare one of these names."""


def stream_seed(seed: int, stream: str) -> int:
    """A 63-bit seed for a named random stream, derived from the run's seed (SHA-256 of ``phalanx:<seed>:<name>``)."""
    digest = hashlib.sha256(f"phalanx:{seed}:{stream}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def generator(seed: int, stream: str) -> torch.Generator:
    """A CPU generator for one named stream."""
    return torch.Generator().manual_seed(stream_seed(seed, stream))


def secret_generator() -> torch.Generator:
    """A CPU generator seeded from 64 bits of the operating system's randomness (:func:`secrets.randbits`): derived
    from nothing of the run, so no one else can regenerate its draws. torch's CPU generator (MT19937) is not a
    cryptographic one: the secret is the 64-bit seed, held in this process's memory only."""
    return torch.Generator().manual_seed(secrets.randbits(64))


def restored(state: torch.Tensor) -> torch.Generator:
    """A CPU generator set to a saved state (``torch.Generator.get_state()``)."""
    gen = torch.Generator()
    gen.set_state(state)
    return gen
