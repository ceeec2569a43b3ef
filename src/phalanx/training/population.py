"""A federated run over a client population (:mod:`phalanx.data.population`): the round's sample of clients, their
batches, and nothing per client of the population.

What a run holds grows with the clients a round samples, C, not with the population N:

* the round's sample is drawn by Floyd's algorithm (Bentley & Floyd, "Programming pearls: a sample of brilliance",
  CACM 30(9), 1987): for j = N − C, …, N − 1 draw t uniform in 0 … j and add t to the sample, or j when t is in it
  already — every C-subset of the N clients equally likely, from one draw of C uniforms of the ``clients`` stream, in
  O(C) time and memory (``torch.randperm(N)`` would take O(N) of both);
* :class:`PopulationData` holds the data of the clients it was last asked for, and only theirs
  (:attr:`PopulationData.held`): asked for another set, it keeps the clients the two share and drops the rest;
* each client's number of local steps under ``local_epochs`` is computed from the sampled clients' sizes, not kept
  for all N.

A round's batches are drawn exactly as for a split data set (:func:`phalanx.training.shards.sample_batches_of`): one
draw of the ``batches`` stream, ``(C, B)`` uniforms u, client i's positions ⌊u · nᵢ⌋ in its own samples.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from phalanx.data.population import Population
from phalanx.errors import ConfigError
from phalanx.training.shards import WorkerData
from phalanx.validate import check_int

__all__ = ["PopulationData", "sample_clients"]


def sample_clients(n: int, c: int, gen: torch.Generator) -> Tensor:
    """C of the clients 0 … N−1, uniformly without replacement, in increasing order: Floyd's algorithm on one
    draw of ``c`` float64 uniforms of ``gen`` (see the module's docstring); O(C) time and memory."""
    check_int("clients_per_round", c, low=0, high=n)
    u = torch.rand(c, generator=gen, dtype=torch.float64).tolist()
    chosen: set[int] = set()
    for i, j in enumerate(range(n - c, n)):
        t = min(int(u[i] * (j + 1)), j)
        chosen.add(j if t in chosen else t)
    return torch.tensor(sorted(chosen), dtype=torch.long)


class PopulationData(WorkerData):
    """The training side of a :class:`~phalanx.data.population.Population` of ``workers`` clients: the data of the
    clients asked for last, on ``device`` (see the module's docstring). A :class:`WorkerData` with no shards: its
    ``x`` and ``y`` are the held clients' samples, and the rounds that may run over it (federated averaging's:
    ``RoundAlgorithm.samples_population``) draw their batches with :meth:`batches_of`."""

    def __init__(self, population: Population, workers: int, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        x = population.train_x.new_zeros(0, *population.input_shape).to(self.device)
        super().__init__(x, torch.zeros(0, dtype=torch.long, device=self.device), [], population.num_classes)
        self.population = population
        self.clients = check_int("workers", workers, low=1)
        population.check_size(workers)
        self._held: dict[int, tuple[Tensor, Tensor]] = {}
        self._key: tuple[int, ...] = ()

    @property
    def workers(self) -> int:
        """The population's number of clients."""
        return self.clients

    @property
    def held(self) -> int:
        """How many clients' data are in memory now: at most the clients of the last request."""
        return len(self._held)

    def _hold(self, ids: Sequence[int]) -> None:
        """Hold exactly the clients ``ids`` (those held already are kept, the others read), their samples in one
        flat tensor in the order of ``ids``."""
        key = tuple(ids)
        if key == self._key:
            return
        for k in key:
            if not 0 <= k < self.clients:
                raise ConfigError("client", k, f"0..{self.clients - 1} (the population's clients)")
        missing = [k for k in dict.fromkeys(key) if k not in self._held]
        got = dict(zip(missing, self.population.clients(missing), strict=True))
        self._held = {k: self._held[k] if k in self._held else got[k] for k in dict.fromkeys(key)}
        parts = [self._held[k] for k in key]
        for k, (x, y) in zip(key, parts, strict=True):  # one flat x sliced by the y sizes: never misaligned
            if y.ndim != 1 or x.shape[0] != y.shape[0]:
                raise ConfigError("dataset", self.population.name, f"a population whose clients hold one label per "
                                  f"input (client {k}: {x.shape[0]} inputs, labels of shape {tuple(y.shape)})")
        sizes = torch.tensor([int(p[1].numel()) for p in parts], dtype=torch.long)
        if bool((sizes == 0).any()):
            empty = key[int((sizes == 0).nonzero()[0])]
            raise ConfigError("dataset", self.population.name, f"a population whose clients hold samples (client "
                              f"{empty} has none)")
        self.x = torch.cat([p[0] for p in parts]).to(self.device) if parts else self.x[:0]
        self.y = torch.cat([p[1] for p in parts]).to(self.device) if parts else self.y[:0]
        self._sizes, self._starts = sizes, torch.cumsum(sizes, 0) - sizes
        self._key = key

    def sizes(self, ids: Tensor) -> Tensor:
        """The number of training samples of each client of ``ids`` (they are then held)."""
        self._hold(ids.tolist())
        return self._sizes.clone()

    def batches_of(self, ids: Tensor, batch: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        """The clients ``ids`` each draw ``batch`` samples uniformly (with replacement) from their own data:
        ``(x (len(ids), B, ...), y (len(ids), B))``, one draw of ``gen`` for all of them."""
        self._hold(ids.tolist())
        w = int(ids.numel())
        u = torch.rand(w, batch, generator=gen, dtype=torch.float64)
        sizes = self._sizes[:, None]
        pos = torch.minimum((u * sizes).long(), sizes - 1)
        idx = (self._starts[:, None] + pos).reshape(-1).to(self.device)
        xb = self.x.index_select(0, idx).view(w, batch, *self.x.shape[1:])
        return xb, self.y.index_select(0, idx).view(w, batch)
