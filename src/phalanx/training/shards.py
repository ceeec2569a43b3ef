"""The training samples and each worker's shard of them, and the per-round draw of every worker's batch.

The samples may live on a CUDA device (:mod:`phalanx.training.devices`); the shards, the batch positions and the
random draws stay on the CPU, and each round moves only its ``W·B`` sample indices to the samples' device for one
gather — the same draws, and the same batches, on either device."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class WorkerData:
    """Training samples ``x``, labels ``y`` and each worker's shard (indices into them)."""

    x: Tensor
    y: Tensor
    shards: list[Tensor]
    num_classes: int

    def __post_init__(self) -> None:
        # All shards in one index tensor, so that a round's batches are one gather, not a loop over workers.
        self._flat = torch.cat(self.shards) if self.shards else torch.zeros(0, dtype=torch.long)
        sizes = torch.tensor([s.numel() for s in self.shards], dtype=torch.long)
        self._sizes = sizes
        self._starts = torch.cumsum(sizes, 0) - sizes

    @property
    def workers(self) -> int:
        """The number of shards."""
        return len(self.shards)

    def batches_of(self, ids: Tensor, batch: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        """The workers ``ids`` (any subset, in the given order) each draw ``batch`` samples uniformly (with
        replacement) from their own shard: ``(x (len(ids), B, ...), y (len(ids), B))``, one draw of ``gen``."""
        sizes = self._sizes[ids]
        u = torch.rand(ids.numel(), batch, generator=gen, dtype=torch.float64)
        pos = torch.minimum((u * sizes[:, None]).long(), sizes[:, None] - 1)
        idx = self._flat[self._starts[ids][:, None] + pos].reshape(-1).to(self.x.device)
        xb = self.x.index_select(0, idx).view(ids.numel(), batch, *self.x.shape[1:])
        return xb, self.y.index_select(0, idx).view(ids.numel(), batch)


def _batch_indices(data: WorkerData, workers: int, batch: int, gen: torch.Generator) -> Tensor:
    """The ``(W, B)`` sample indices of workers ``0 … W−1``: one draw of ``gen`` for all of them."""
    sizes = data._sizes[:workers]
    u = torch.rand(workers, batch, generator=gen, dtype=torch.float64)
    pos = torch.minimum((u * sizes[:, None]).long(), sizes[:, None] - 1)
    return data._flat[data._starts[:workers, None] + pos]


def sample_batches(data: WorkerData, workers: int, batch: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """Workers ``0 … workers−1`` each draw ``batch`` samples uniformly (with replacement) from their shard.

    Returns ``(x (W, B, ...), y (W, B))``; one random draw and one gather for all workers.
    """
    idx = _batch_indices(data, workers, batch, gen).reshape(-1).to(data.x.device)
    # index_select on the flat index: cheaper than advanced indexing with a 2-D index (same values)
    xb = data.x.index_select(0, idx).view(workers, batch, *data.x.shape[1:])
    return xb, data.y.index_select(0, idx).view(workers, batch)


def sample_batch_of(
    data: WorkerData, workers: int, batch: int, gen: torch.Generator, row: int,
) -> tuple[Tensor, Tensor]:
    """Worker ``row``'s batch of :func:`sample_batches`, ``(x (1, B, ...), y (1, B))``: the same draw of ``gen`` (all
    workers' positions, so the stream advances alike), but only this worker's samples are gathered — one process of
    a distributed run does not copy the other n − 1 batches."""
    idx = _batch_indices(data, workers, batch, gen)[row].to(data.x.device)
    return data.x.index_select(0, idx)[None], data.y.index_select(0, idx)[None]


def sample_batches_of(data: WorkerData, ids: Tensor, batch: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """The workers ``ids`` (any subset, in the given order) each draw ``batch`` samples uniformly (with replacement)
    from their own shard: ``(x (len(ids), B, ...), y (len(ids), B))``, one draw of ``gen`` for all of them
    (:meth:`WorkerData.batches_of`; a client population's own: :mod:`phalanx.training.population`)."""
    return data.batches_of(ids, batch, gen)
