"""The round as a pipeline of stages (:mod:`phalanx.training.stages.base`): worker-side stages on every update
before it leaves its worker (client-level DP: :mod:`~phalanx.training.stages.privacy`), server-side stages on the
aggregate and on θ after the step (CRFL: :mod:`~phalanx.training.stages.crfl`; the pooling of BatchNorm statistics:
:mod:`~phalanx.training.stages.norm_stats`; fail closed: :mod:`~phalanx.training.stages.fail_closed`), one module
each, found by :mod:`~phalanx.training.stages.registry`."""

from phalanx.training.stages.base import (
    Evaluation,
    Plan,
    ServerRound,
    ServerStage,
    Stage,
    WorkerStage,
    WorkerStages,
    WorkerUpdate,
)

__all__ = ["Evaluation", "Plan", "ServerRound", "ServerStage", "Stage", "WorkerStage", "WorkerStages",
           "WorkerUpdate"]
