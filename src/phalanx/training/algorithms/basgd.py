"""BASGD: buffered asynchronous SGD for Byzantine learning — a robust rule over B buffer means, on the simulated
clock.

Yang & Li, "BASGD: Buffered Asynchronous SGD for Byzantine Learning", ICML 2021, Algorithm 1. The server keeps B
buffers; an update from worker j goes to buffer j mod B, which holds the mean of the updates it received since
the last step. When every buffer holds at least one update the server steps

    x ← x − η · Agg( h₁, …, h_B ),    h_b = mean of buffer b's updates,

with ``Agg`` a robust rule over the B buffer means (the paper: median, trimmed mean), and empties the buffers.
The guarantee, over buffers: each worker is hashed to one buffer, so b Byzantine workers touch at most b buffers
(exactly min(b, B) here: they are the last b indices, consecutive residues mod B); a buffer mean with one
Byzantine update in it may be anything, so the rule sees B vectors of which at most b are arbitrary — the rule's
own assumption with f = b, which needs f < B/2 (and B ≥ the rule's ``min_workers``), checked before anything runs.
However the attacker times its updates (always first, say), it cannot touch more buffers than it has workers
(tests/test_async.py). Staleness assumption: the paper's bounded delay; here updates older than ``max_staleness``
versions are dropped (counted, never aggregated), and buffer means are unweighted, as in the paper.

Config: ``algorithm = "basgd"``, ``algorithm_params = {buffers = B, max_staleness = S, speeds = "...",
byzantine_timing = "honest" | "always_first", batch_size = …}``, the rule and its f as for any run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from phalanx.errors import ConfigError
from phalanx.training.algorithms.asynchronous import Asynchronous
from phalanx.training.algorithms.base import Run, register
from phalanx.validate import check_int


def buffer_of(ids: Tensor, buffers: int) -> Tensor:
    """The buffer of each worker: j mod B (Yang & Li, ICML 2021, Alg. 1)."""
    return ids % buffers


@register
@dataclass(frozen=True)
class BASGD(Asynchronous):
    """BASGD (see the module's docstring): ``buffers`` buffers, the run's rule over their means."""

    buffers: int = 5
    name = "basgd"
    population_key = "algorithm_params.buffers"
    real_processes = True
    reference = "Yang & Li, BASGD: Buffered Asynchronous SGD for Byzantine Learning, ICML 2021, Alg. 1"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("algorithm_params.buffers", self.buffers, low=1)

    def per_round(self, workers: int) -> int:
        """The rule aggregates B buffer means (refused when B > workers: a buffer would never fill)."""
        if self.buffers > workers:
            raise ConfigError("algorithm_params.buffers", self.buffers, f"<= workers = {workers} (every buffer needs "
                              "a worker hashed to it)")
        return self.buffers

    def full(self, workers: int, order: Tensor, accepted: Tensor) -> int:
        """The shortest prefix in which every buffer has an accepted update: one past the latest of the buffers' first
        accepted positions, 0 when a buffer has none (in NumPy on the CPU tensors' views: a per-step cost)."""
        pos = np.flatnonzero(accepted.detach().cpu().numpy())
        hit = order.detach().cpu().numpy()[pos] % self.buffers
        _, first = np.unique(hit, return_index=True)  # each buffer's first accepted delivery, among the accepted
        return int(pos[first].max()) + 1 if first.size == self.buffers else 0

    def assemble(self, run: Run, ids: Tensor, updates: Tensor, staleness: Tensor) -> tuple[Tensor, None, Tensor]:
        """Row b is buffer b's mean; a buffer is Byzantine-touched when a Byzantine update is in it (at most as many
        buffers as Byzantine workers)."""
        which = buffer_of(ids, self.buffers).to(updates.device)
        sums = updates.new_zeros(self.buffers, updates.shape[1]).index_add_(0, which, updates)
        counts = torch.bincount(which, minlength=self.buffers).to(updates)
        touched = torch.zeros(self.buffers, dtype=torch.bool)
        touched[buffer_of(ids[ids >= run.workers - run.byzantine], self.buffers)] = True
        return sums / counts[:, None], None, touched
