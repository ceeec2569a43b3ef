"""Training: the round algorithm, the server's aggregation and optimizer, the transports and the one loop.

Nothing here reads or writes files: run directories, checkpoints and reports are callbacks and functions of
:mod:`phalanx.experiments`, which also builds experiments from configs (names become objects there).
"""

from phalanx.training.algorithms.dsgd import DSGD
from phalanx.training.experiment import Experiment
from phalanx.training.loop import Callback, Evaluate, Loop, OnRound, RoundInfo, run
from phalanx.training.optim import SGD, ServerOptimizer
from phalanx.training.problem import Problem
from phalanx.training.schedule import LRSchedule
from phalanx.training.server import BoundRule, RoundResult, Server
from phalanx.training.state import Received, RoundAborted, RoundState, Snapshot
from phalanx.training.transport import InProcess, Transport

__all__ = [
    "DSGD",
    "SGD",
    "BoundRule",
    "Callback",
    "Evaluate",
    "Experiment",
    "InProcess",
    "LRSchedule",
    "Loop",
    "OnRound",
    "Problem",
    "Received",
    "RoundAborted",
    "RoundInfo",
    "RoundResult",
    "RoundState",
    "Server",
    "ServerOptimizer",
    "Snapshot",
    "Transport",
    "run",
]
