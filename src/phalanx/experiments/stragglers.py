"""The simulated wall-clock time of a synchronous federated run whose rounds wait for their slowest sampled worker,
on the speeds the asynchronous algorithms' clock draws (:mod:`phalanx.training.algorithms.clock`) — the straggler
model of ``phalanx experiment async`` (:mod:`phalanx.studies.asynchrony`, docs/async.md).

Round r of federated averaging samples K of the n workers uniformly without replacement from the run's ``clients``
stream (:meth:`phalanx.training.algorithms.fedavg.FedAvgClients.sample`); worker i takes 1/vᵢ per update, vᵢ drawn
once from the run's ``clock`` stream (:meth:`~phalanx.training.algorithms.clock.Speeds.draw`). A synchronous round
lasts maxᵢ∈Sᵣ 1/vᵢ (McMahan et al., AISTATS 2017, Alg. 1 waits for every sampled client; no timeout).
"""

from __future__ import annotations

import torch

from phalanx.training.algorithms.clock import Speeds
from phalanx.training.streams import generator


def sync_times(speeds: str, workers: int, per_round: int, rounds: int, seed: int, instant: int = 0) -> list[float]:
    """The simulated time after each of ``rounds`` synchronous rounds: round r lasts maxᵢ∈Sᵣ 1/vᵢ over its sampled
    workers Sᵣ, drawn as federated averaging draws them (K of n uniformly without replacement from the run's
    ``clients`` stream); the last ``instant`` workers take no time (always-first attackers: the round waits for its
    slowest other worker). The speeds are the asynchronous runs' draw (the run's ``clock`` stream)."""
    v = Speeds.parse(speeds).draw(workers, seed)
    duration = 1.0 / v
    if instant:
        duration[workers - instant:] = 0.0
    gen = generator(seed, "clients")
    out, now = [], 0.0
    for _ in range(rounds):
        ids = torch.randperm(workers, generator=gen)[:per_round]
        now += float(duration[ids].max())
        out.append(now)
    return out
