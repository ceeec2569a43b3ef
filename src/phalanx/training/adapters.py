"""The server's rule for a model with LoRA adapters, in the model's aggregation mode.

A model built by :mod:`phalanx.models.hf` says how its adapters are combined (``model.aggregation``): ``factors``
and ``shared`` keep the rule as it is (on the flat vector of A and B, or of B alone — A frozen is not in θ);
``update`` wraps it in :class:`~phalanx.aggregators.lora.AdapterUpdates`, which needs θ itself (the server's
context key ``theta``). ``phalanx.experiments.from_config`` applies this to a config's rule; with the Python API::

    model = models.make("hf:phalanx-bert-tiny", ds.input_shape, 2, r=4, aggregation="update")
    rule = adapters.rule_for(aggregators.make("cwtm", f=2), model)
"""

from __future__ import annotations

from typing import Any

from torch import nn

from phalanx.aggregators.base import Aggregator
from phalanx.aggregators.lora import AdapterUpdates, LoraLayout
from phalanx.errors import ConfigError
from phalanx.training.problem import ParamLayout

__all__ = ["aggregation", "check_step", "layout", "rule_for"]


def aggregation(model: Any) -> str | None:
    """The model's adapter aggregation mode (``factors`` / ``update`` / ``shared``), or None for a model without
    adapters."""
    mode = getattr(model, "aggregation", None)
    return mode if isinstance(mode, str) and isinstance(model, nn.Module) else None


def layout(model: nn.Module) -> LoraLayout:
    """The LoRA blocks of ``model``'s trainable vector θ (:class:`~phalanx.training.problem.ParamLayout`)."""
    params = ParamLayout.of(model)
    return LoraLayout.of(params.names, [tuple(s) for s in params.shapes], params.offsets)


def rule_for(rule: Aggregator, model: Any) -> Aggregator:
    """``rule`` as the server applies it to ``model``'s adapters: wrapped for mode ``update``, else itself."""
    if aggregation(model) != "update":
        return rule
    if isinstance(rule, AdapterUpdates):
        return rule
    return AdapterUpdates(rule, layout(model), sign=-1)


def check_step(mode: str | None, algorithm: str, optimizer: str, server_lr: float, momentum: float) -> None:
    """Mode ``update`` reads every row as a client's factors θ − xᵢ after local training and returns the step to the
    re-factorised adapters: federated averaging's pseudo-gradients, applied by plain SGD at rate 1. Anything else
    is one line naming the key."""
    if mode != "update":
        return
    if algorithm != "fedavg":
        raise ConfigError("algorithm", algorithm, "'fedavg' with model_params.aggregation = 'update' (its rows are the "
                          "clients' factors after local training; gradients are not factors)")
    if optimizer != "sgd" or momentum != 0.0:
        raise ConfigError("server_optimizer", f"{optimizer} (momentum {momentum})", "'sgd' without momentum with "
                          "aggregation 'update' (the aggregate is the step to the re-factorised adapters)")
    if server_lr != 1.0:
        raise ConfigError("server_lr", server_lr, "1.0 with aggregation 'update' (the step lands on the re-factorised "
                          "adapters; another rate would move part of the way in factor space)")
