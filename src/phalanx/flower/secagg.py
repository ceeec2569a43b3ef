"""Flower's secure aggregation (SecAgg+) and legacy workflows, refused by :class:`~phalanx.flower.PhalanxFedAvg`.

Under SecAgg+ (Bell et al., "Secure single-server aggregation with (poly)logarithmic overhead", CCS 2020) the
server learns only the sum Σᵢ Δᵢ of the clients' updates; a robust rule needs the rows Δᵢ themselves, so no robust
rule can run on what SecAgg+ leaves. Flower 1.42 runs SecAgg+ through its legacy ``DefaultWorkflow``, which calls the
legacy Strategy API (``initialize_parameters``, ``configure_fit``, ``aggregate_fit``): the strategy refuses those calls
with a :class:`~phalanx.errors.ConfigError` naming the workflow (:func:`legacy_refusal`), and recognises the error
reply of a ClientApp running ``secaggplus_mod`` on a plain instruction (:func:`is_secagg_error`).
"""

from __future__ import annotations

import inspect
from typing import Any

from flwr.app import Message
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS

from phalanx.errors import ConfigError

__all__ = ["RECORD_KEY_CONFIGS", "SECAGG", "calling_workflow", "is_secagg_error", "legacy_refusal"]

SECAGG = "under SecAgg+ a strategy sees only the sum of the clients' updates, which no robust rule can use"


def calling_workflow() -> Any:
    """The Flower SecAgg(+) workflow up the call stack (itself, or a ``DefaultWorkflow``'s ``fit_workflow``), else the
    ``DefaultWorkflow``, else None."""
    try:
        from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow  # SecAggWorkflow is a subclass
    except ImportError:  # pragma: no cover - shipped with every Flower 1.42
        return None
    frame = inspect.currentframe()
    try:
        for _ in range(32):
            if frame is None:
                return None
            owner = frame.f_locals.get("self")
            if isinstance(owner, SecAggPlusWorkflow):
                return owner
            if isinstance(owner, DefaultWorkflow):
                fit = getattr(owner, "fit_workflow", None)
                return fit if isinstance(fit, SecAggPlusWorkflow) else owner
            frame = frame.f_back
        return None
    finally:
        del frame


def legacy_refusal(method: str) -> ConfigError:
    """The error for a legacy (``flwr.server``) workflow calling ``method``: SecAgg+ named when it is the caller."""
    workflow = calling_workflow()
    name = type(workflow).__name__
    allowed = "strategy.start(grid=..., initial_arrays=...), Flower's Message API, without secure aggregation"
    if name in ("SecAggPlusWorkflow", "SecAggWorkflow"):
        return ConfigError("fit_workflow", name, allowed, f"{name} called PhalanxFedAvg.{method}; {SECAGG}")
    caller = name if workflow is not None else "DefaultWorkflow, SecAggPlusWorkflow"
    return ConfigError("strategy", "PhalanxFedAvg", allowed, f"a legacy workflow ({caller}) called {method}: "
                       f"PhalanxFedAvg has no legacy Strategy API, and {SECAGG}")


def is_secagg_error(msg: Message) -> bool:
    """Whether ``msg`` is the error reply of a ClientApp running ``secaggplus_mod`` (or ``secagg_mod``) on an
    instruction without SecAgg+'s config record: Flower's reason names the missing ``secaggplus_configs`` key."""
    try:
        return msg.has_error() and RECORD_KEY_CONFIGS in str(msg.error.reason)
    except Exception:  # a malformed reply is judged elsewhere
        return False
