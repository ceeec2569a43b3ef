"""TensorBoard: the run's metric rows as scalars in TensorBoard event files, its config in the HParams tab and as
text — written with PyTorch's ``torch.utils.tensorboard.SummaryWriter`` (which needs the ``tensorboard`` package:
``pip install 'phalanx[tensorboard]'``).

Where: ``RUN_DIR/tensorboard`` by default, so ``tensorboard --logdir OUT`` shows every run of a grid by its run id;
with ``uri = DIR``, ``DIR/<run id>``. A resumed run writes a new event file in the same directory, from the round
after the last one it logged (TensorBoard reads a directory's event files as one run).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from phalanx.experiments.tracking.base import TrackedRun, Tracker


class TensorBoard(Tracker):
    """Scalars per round (``test_accuracy``, ``agg_error``, …, step = round), the config as hyper-parameters."""

    name = "tensorboard"
    summary = "event files: a scalar per metric and round, the config as hyper-parameters"
    package = "tensorboard"
    extra = "tensorboard"

    def __init__(self, uri: str | None = None) -> None:
        super().__init__(uri)
        self.writer: Any = None
        self.log_dir: Path | None = None

    def directory(self, run: TrackedRun) -> Path:
        """The run's log directory (see the module's docstring)."""
        if self.uri is not None:
            return Path(self.uri).expanduser() / run.name
        if run.run_dir is not None:
            return run.run_dir / "tensorboard"
        return Path("tensorboard") / run.name

    def start(self, run: TrackedRun) -> Mapping[str, Any]:
        self.library()
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        self.log_dir = self.directory(run)
        self.writer = SummaryWriter(log_dir=str(self.log_dir))
        if not run.kept:  # the first session that tracks the run: its configuration, once
            shown = {k: v if isinstance(v, bool | int | float | str) else json.dumps(v) for k, v in run.params.items()}
            for summary in hparams(shown, {"test_accuracy": 0.0}):
                self.writer.file_writer.add_summary(summary)
            self.writer.add_text("config", "```\n" + json.dumps(run.params, indent=1, sort_keys=True) + "\n```")
            self.writer.flush()
        return {"log_dir": str(self.log_dir.absolute())}

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()  # on disk as the row is made: a live TensorBoard shows it

    def finish(self, end: str) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
