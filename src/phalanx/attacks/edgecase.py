"""The edge-case backdoor: mislabelled samples from a rare sub-population (the tail) of one class."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor

from phalanx.attacks.base import DataAttack
from phalanx.attacks.registry import register
from phalanx.errors import ConfigError, InputError
from phalanx.validate import check_int, check_real

__all__ = ["EdgeCase"]


@register
class EdgeCase(DataAttack):
    r"""Edge-case backdoor: the Byzantine workers train on rare examples of class ``source`` labelled ``target``.

    Wang, Sreenivasan, Rajput, Vishwakarma, Agarwal, Sohn, Lee & Papailiopoulos, "Attack of the Tails: Yes, You
    Really Can Backdoor Federated Learning", NeurIPS 2020, §3: a backdoor on *edge-case* inputs — examples from the
    tail of the input distribution (their ARDIS sevens labelled "1", Southwest airliners labelled "truck") — needs no
    trigger and survives defences, because honest clients hold almost no such examples to counter it.

    The tail here (the data set offers no second source of digits): the class-``source`` training inputs whose
    Euclidean distance to their class mean :math:`\mu_s` is among the largest ``tail`` fraction,

    .. math:: E = \{x : y = s,\ \|x - \mu_s\| \ge q_{1-\text{tail}}\},

    :math:`q` the quantile of those distances over the training set (float64). :meth:`prepare` picks :math:`E`
    once from the training set; in each poisoned batch ``poison_fraction`` of the samples (positions drawn from the
    attack stream) are replaced by samples of :math:`E` (drawn with replacement, likewise) labelled ``target`` — the
    attacker's own edge-case data set, as in the paper; the honest workers still hold their few tail samples with
    the true label (a harder setting than the paper's, whose edge cases come from outside the training set). E holds
    honest clients' samples, so client-level differential privacy refuses this attack
    (:attr:`~phalanx.attacks.base.DataAttack.samples_others_data`).
    ``boost`` scales a federated update (model replacement); ``stop_round`` ends the attack (durability).

    Metric: ``attack_success`` — the share of the *test* inputs of class ``source`` beyond the same distance
    threshold that the model classifies as ``target`` (NaN when the test set has none).
    """

    name: ClassVar[str] = "edgecase"
    reference: ClassVar[str] = (
        "H. Wang et al., 'Attack of the Tails: Yes, You Really Can Backdoor Federated Learning', NeurIPS 2020, §3 "
        "(edge-case examples: the tail of one class, mislabelled)"
    )
    threat: ClassVar[str] = "data and its own update: trains on rare inputs of one class, labelled as another"
    samples_others_data: ClassVar[bool] = True  # E is picked from the whole training set, honest shards included

    def __init__(
        self, source: int = 7, target: int = 1, tail: float = 0.1, poison_fraction: float = 0.5, boost: float = 1.0,
        stop_round: int | None = None,
    ) -> None:
        self.source = check_int("source", source, low=0)
        self.target = check_int("target", target, low=0)
        if self.source == self.target:
            raise ConfigError("target", target, f"a class other than source = {source}")
        self.tail = check_real("tail", tail, low=0.0, low_open=True, high=1.0)
        self.poison_fraction = check_real("poison_fraction", poison_fraction, low=0.0, low_open=True, high=1.0)
        self.boost = check_real("boost", boost, low=0.0, low_open=True)
        self.stop_round = None if stop_round is None else check_int("stop_round", stop_round, low=1)
        self.centre: Tensor | None = None
        self.threshold: float | None = None
        self.pool: Tensor | None = None

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source": self.source, "target": self.target, "tail": self.tail,
                               "poison_fraction": self.poison_fraction, "boost": self.boost}
        if self.stop_round is not None:
            out["stop_round"] = self.stop_round
        return out

    def _distances(self, x: Tensor) -> Tensor:
        assert self.centre is not None
        flat = x.detach().reshape(x.shape[0], -1).to(device="cpu", dtype=torch.float64)
        return torch.linalg.vector_norm(flat - self.centre, dim=1)

    def prepare(self, train_x: Tensor, train_y: Tensor, num_classes: int) -> None:
        """Pick the edge cases: the ``tail`` fraction of the class-``source`` training inputs farthest from their
        mean (at least one)."""
        for key, value in (("source", self.source), ("target", self.target)):
            if value >= num_classes:
                raise ConfigError(key, value, f"a class in [0, {num_classes - 1}]")
        of_source = train_y.cpu() == self.source
        if not bool(of_source.any()):
            raise ConfigError("source", self.source, "a class with training samples")
        xs = train_x.detach().cpu()[of_source]
        self.centre = xs.reshape(xs.shape[0], -1).to(torch.float64).mean(0)
        dist = self._distances(xs)
        count = max(1, round(self.tail * dist.numel()))
        order = torch.argsort(dist, descending=True, stable=True)[:count]
        self.threshold = float(dist[order[-1]])
        self.pool = xs[order].clone()

    def _transform(
        self, x: Tensor, y: Tensor, num_classes: int, generator: torch.Generator | None,
    ) -> tuple[Tensor, Tensor]:
        pool = self.pool
        if pool is None:
            raise InputError("edgecase: its edge cases", "not picked", "prepare(train_x, train_y, num_classes) "
                             "first (an Experiment calls it)")
        if tuple(pool.shape[1:]) != tuple(x.shape[1:]):
            raise InputError("edgecase: x", f"inputs of shape {tuple(x.shape[1:])}",
                             f"the training inputs' shape {tuple(pool.shape[1:])}")
        b = y.shape[0]
        k = max(1, round(self.poison_fraction * b))
        chosen = torch.randperm(b, generator=generator)[:k]  # drawn on the CPU stream
        which = torch.randint(pool.shape[0], (k,), generator=generator)
        x2, y2 = x.clone(), y.clone()
        x2[chosen.to(x.device)] = pool[which].to(dtype=x.dtype, device=x.device)
        y2[chosen.to(y.device)] = self.target
        return x2, y2

    def edge_cases(self, x: Tensor, y: Tensor) -> Tensor:
        """The bool mask of the inputs of ``(x, y)`` that are edge cases: class ``source``, beyond the threshold."""
        if self.threshold is None:
            raise InputError("edgecase: its edge cases", "not picked", "prepare(train_x, train_y, num_classes) first")
        mask = (y.cpu() == self.source)
        if bool(mask.any()):
            mask[mask.clone()] = self._distances(x[mask.to(x.device)]) >= self.threshold
        return mask

    def metrics(self, predict: Callable[[Tensor], Tensor], test_x: Tensor, test_y: Tensor) -> dict[str, float]:
        """``attack_success``: the share of the test edge cases that ``predict`` puts in class ``target``."""
        mask = self.edge_cases(test_x, test_y)
        if not bool(mask.any()):
            return {"attack_success": float("nan")}
        predicted = predict(test_x[mask.to(test_x.device)])
        return {"attack_success": float((predicted == self.target).double().mean())}
