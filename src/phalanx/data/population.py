"""Client populations whose data are produced on demand: up to millions of clients, none of them held in memory.

Cross-device federated learning samples ~100 clients a round from populations of millions (Kairouz et al.,
"Advances and open problems in federated learning", FnTML 14(1–2), 2021, Table 1). A :class:`Population` gives the
data of client ``k`` when it is asked for it, deterministically from what the population is (its parameters, its
seed, or its files) and ``k`` alone — not from which clients were asked for before — and holds nothing per client:
what it costs in memory is its evaluation clients' data and the clients of one request, whatever the population's
size. The training side (:class:`phalanx.training.population.PopulationData`) keeps the current round's clients only.

:class:`SyntheticPopulation` is the synthetic(α, β) family of FedProx (Li, Sahu, Zaheer, Sanjabi, Talwalkar & Smith,
"Federated optimization in heterogeneous networks", MLSys 2020, §5.1; LEAF's and FedProx's ``generate_niid.py``),
client ``k``'s draws made from its own generator (SHA-256 of ``phalanx:population:<seed>:<k>``):

* its number of samples nₖ = ⌊exp(4 + 2 zₖ)⌋ + 50 (log-normal(4, 2) + 50, a power law's heavy tail), capped at
  ``max_samples`` (a cap FedProx's script does not have: it keeps one client's draw bounded);
* uₖ ~ N(0, α²) and Bₖ ~ N(0, β²) (α, β the standard deviations, as numpy's ``normal(0, alpha)`` there);
* Wₖ ∈ ℝ^{60×10} and bₖ ∈ ℝ^{10} entrywise N(uₖ, 1); vₖ ∈ ℝ^{60} entrywise N(Bₖ, 1);
* xₖⱼ ~ N(vₖ, Σ), Σ diagonal with Σⱼⱼ = j^{−1.2} (j = 1 … 60); yₖⱼ = argmax softmax(xₖⱼ Wₖ + bₖ);
* the first ⌊0.9 nₖ⌋ samples are client k's training data, the rest its test data (FedProx's 90/10 split).

α controls how much the clients' models differ, β how much their inputs do; synthetic(0, 0), (0.5, 0.5) and
(1, 1) are the paper's three heterogeneity levels.

The natural-data population reads LEAF's FEMNIST files lazily: :mod:`phalanx.data.leaf_population`.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from phalanx.errors import ConfigError
from phalanx.validate import check_int, check_real

__all__ = ["DIMENSION", "MAX_SAMPLES", "SYNTHETIC_CLASSES", "Population", "SyntheticPopulation", "client_seed"]

DIMENSION = 60
"""The synthetic inputs' dimension (FedProx §5.1)."""
SYNTHETIC_CLASSES = 10
"""The synthetic labels' number of classes (FedProx §5.1)."""
MAX_SAMPLES = 100_000
"""The largest per-client cap ``max_samples`` a synthetic population accepts (a client's draw is at most
``max_samples × 60`` float64 numbers, 48 MB at this cap)."""
TRAIN_SHARE = 0.9
"""Each synthetic client's training share of its samples (FedProx's generator: 90 % train, 10 % test)."""


def client_seed(seed: int, k: int) -> int:
    """A 63-bit seed for client ``k`` of the population of ``seed`` (SHA-256 of ``phalanx:population:<seed>:<k>``):
    independent of every other client's."""
    digest = hashlib.sha256(f"phalanx:population:{seed}:{k}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class Population(ABC):
    """Clients whose training data are produced on demand (see the module's docstring).

    Attributes: ``name``; ``size`` (the number of clients, None for an unbounded family: any k ≥ 0 is a client);
    ``num_classes``; ``input_shape``; ``train_x`` / ``train_y`` and ``test_x`` / ``test_y`` — the pooled training
    and test data of the ``eval_clients`` evaluation clients only (the server's own small sample: FLTrust's root
    data, a data attack's preparation, the run's test accuracy), never the population's."""

    name: str
    size: int | None
    num_classes: int
    input_shape: tuple[int, ...]
    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor
    has_users = False
    """Not a :class:`~phalanx.data.base.Dataset` of samples with user ids: a client *is* a user here."""

    @abstractmethod
    def clients(self, ids: Sequence[int]) -> list[tuple[Tensor, Tensor]]:
        """The training data ``(x (nₖ, *input_shape) float32, y (nₖ,) int64)`` of each client of ``ids``, in order;
        each a function of the population and its id alone."""

    def check_size(self, workers: int) -> None:
        """Refuse (one line) a run of ``workers`` clients that this population does not have."""
        if self.size is not None and workers > self.size:
            raise ConfigError("workers", workers, f"<= {self.size:,} (the clients of the population {self.name!r})")

    def eval_ids(self, count: int) -> list[int]:
        """The evaluation clients: ``count`` evenly spaced ids of a bounded population, the first ``count`` of an
        unbounded one (its clients are i.i.d. draws of one generative model: any ``count`` of them are a sample)."""
        if self.size is None:
            return list(range(count))
        count = min(count, self.size)
        return sorted({k * self.size // count for k in range(count)})


class SyntheticPopulation(Population):
    """FedProx's synthetic(α, β) clients, generated per client from (seed, k) (see the module's docstring).

    ``alpha``, ``beta`` ≥ 0: the heterogeneity of the clients' models and inputs; ``seed``: the population's (not
    the run's: two runs with different seeds train on the same clients); ``max_samples``: the cap on a client's
    number of samples (50 … :data:`MAX_SAMPLES`); ``eval_clients``: the clients whose test data are the run's test
    set (1 … 10,000)."""

    def __init__(self, alpha: float = 0.5, beta: float = 0.5, seed: int = 0, max_samples: int = 1000,
                 eval_clients: int = 100) -> None:
        self.alpha = check_real("alpha", alpha, low=0.0, high=1e3)
        self.beta = check_real("beta", beta, low=0.0, high=1e3)
        self.seed = check_int("seed", seed, low=0)
        self.max_samples = check_int("max_samples", max_samples, low=50, high=MAX_SAMPLES)
        self.eval_clients = check_int("eval_clients", eval_clients, low=1, high=10_000)
        self.name = f"synthetic({self.alpha:g},{self.beta:g})"
        self.size = None
        self.num_classes = SYNTHETIC_CLASSES
        self.input_shape = (DIMENSION,)
        self._scale = torch.arange(1, DIMENSION + 1, dtype=torch.float64).pow(-0.6)  # √Σⱼⱼ = j^{−0.6}
        pooled = [self.client_data(k) for k in self.eval_ids(self.eval_clients)]
        self.train_x = torch.cat([p[0] for p in pooled])
        self.train_y = torch.cat([p[1] for p in pooled])
        self.test_x = torch.cat([p[2] for p in pooled])
        self.test_y = torch.cat([p[3] for p in pooled])

    def client_data(self, k: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Client ``k``'s ``(train_x, train_y, test_x, test_y)``: its draws from its own generator, in a fixed order
        (nₖ, uₖ, Bₖ, vₖ, Wₖ, bₖ, its inputs)."""
        g = torch.Generator().manual_seed(client_seed(self.seed, k))
        z = torch.randn(3, generator=g, dtype=torch.float64)
        n = min(int(torch.exp(4.0 + 2.0 * z[0]).clamp(max=1e9)) + 50, self.max_samples)
        u, b_mean = self.alpha * z[1], self.beta * z[2]
        v = b_mean + torch.randn(DIMENSION, generator=g, dtype=torch.float64)
        w = u + torch.randn(DIMENSION, SYNTHETIC_CLASSES, generator=g, dtype=torch.float64)
        b = u + torch.randn(SYNTHETIC_CLASSES, generator=g, dtype=torch.float64)
        x = v + torch.randn(n, DIMENSION, generator=g, dtype=torch.float64) * self._scale
        # argmax of the softmax is the argmax of the logits; einsum's plain loop sums in one fixed order (a BLAS
        # product's order depends on the machine and its threads, and could flip a near-tie's label)
        y = torch.from_numpy(np.einsum("ij,jk->ik", x.numpy(), w.numpy()) + b.numpy()).argmax(dim=1)
        cut = int(TRAIN_SHARE * n)
        xf = x.float()
        return xf[:cut], y[:cut], xf[cut:], y[cut:]

    def clients(self, ids: Sequence[int]) -> list[tuple[Tensor, Tensor]]:
        """The training data of the clients ``ids`` (each from its own generator)."""
        out = []
        for k in ids:
            x, y, _, _ = self.client_data(int(k))
            out.append((x, y))
        return out

    def __repr__(self) -> str:
        return (f"SyntheticPopulation(alpha={self.alpha:g}, beta={self.beta:g}, seed={self.seed}, "
                f"max_samples={self.max_samples}, eval_clients={self.eval_clients})")
