"""The task of benchmarks/federated.py: the federated round every implementation runs (:class:`Task`), the memory
part's setting (:class:`MemoryTask`) and its allocator settings (:data:`ALLOCATORS`)."""

from __future__ import annotations

from dataclasses import dataclass

SEED = 0


@dataclass(frozen=True)
class Task:
    """The federated task every implementation runs."""

    dataset: str = "fashion-mnist"
    clients: int = 100
    per_round: int = 10
    local_steps: int = 5
    batch: int = 32
    lr: float = 0.05
    hidden: int = 64
    f: int = 1
    seed: int = SEED

    @property
    def beta(self) -> float:
        """Flower's ``FedTrimmedAvg`` share trimmed from each side: f of the round's replies."""
        return self.f / self.per_round


FULL_TASK = Task()
QUICK_TASK = Task(dataset="digits", clients=10, per_round=4, local_steps=2)


@dataclass(frozen=True)
class MemoryTask:
    """The memory part: Phalanx FedAvg on ResNet-20 with many clients."""

    clients: int = 1000
    per_round: int = 100
    local_steps: int = 1
    batch: int = 32
    rounds: int = 2
    n_train: int = 50_000
    n_test: int = 10_000


ALLOCATORS = {"phalanx": "phalanx run's (mallopt)", "glibc": "glibc's default"}
"""The memory part's allocator settings: the training engine's (``phalanx.training.memory.tune_allocator``, which
``phalanx run`` applies) and glibc's default (``PHALANX_NO_MALLOC_TUNING=1``)."""
