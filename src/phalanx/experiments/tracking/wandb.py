"""Weights & Biases: each run of a grid one W&B run — its config as the run's config, every metric row logged at
``step = round``, its end as the run's exit code (``pip install 'phalanx[wandb]'``).

``mode`` is ``"offline"`` by default: the run is written to ``DIR/wandb/offline-run-<time>-<id>/run-<id>.wandb``
and nothing touches the network (``wandb sync DIR/wandb/offline-run-*`` uploads it later); ``"online"`` streams to
W&B (after ``wandb login``). ``uri`` is that directory ``DIR`` (default: the output directory, shared by the grid's
runs — not the run directory, whose files a signature covers and where W&B's symbolic links would not be allowed);
``project`` (default ``"phalanx"``), ``entity`` and ``group`` (default: the output directory's name) are W&B's.

A resumed run continues the same W&B run: its id is kept in the run directory's ``tracking.json`` and W&B is asked to
resume it (offline, a second ``offline-run-…`` directory with the same id; ``wandb sync`` merges them).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from phalanx.experiments.tracking.base import TrackedRun, Tracker, text_param

MODES = ("offline", "online")
EXIT_CODES = {"finished": 0, "diverged": 1, "failed": 1, "interrupted": 130}
"""An end of a run as the W&B run's exit code (0: finished; otherwise W&B shows it as failed)."""
QUIET = {"silent": True, "console": "off", "x_disable_stats": True, "disable_git": True, "save_code": False,
         "x_save_requirements": False, "disable_job_creation": True, "reinit": "create_new"}
"""W&B settings that keep a run to what Phalanx sends: no capture of the terminal (the progress bar stays), no
system metrics, git state, code or pip freeze, and several runs in one process (a grid). Those this version of W&B
does not know are left out."""


def _wait_for_a_fresh_second(folder: Path, run_id: str) -> None:
    """W&B names a session's folder ``{mode}-run-YYYYmmdd_HHMMSS-{id}`` from its start, to the second: a resumed run
    that starts in the second its last session started would share that folder and overwrite the last session's
    record of its rounds. Wait for the next second then (at most one second, only on a quick resume)."""
    while True:
        now = time.time()
        stamp = datetime.fromtimestamp(now).strftime("%Y%m%d_%H%M%S")
        if not any(folder.glob(f"*-{stamp}-{run_id}")):
            return
        time.sleep(1.0 - now % 1.0 + 1e-3)


class WandB(Tracker):
    """One W&B run per Phalanx run (see the module's docstring)."""

    name = "wandb"
    summary = "one W&B run per run (offline by default: no network)"
    package = "wandb"
    extra = "wandb"

    def __init__(self, uri: str | None = None, project: str | None = None, entity: str | None = None,
                 mode: str | None = None, group: str | None = None) -> None:
        super().__init__(uri)
        self.project = text_param(self.name, "project", project) or "phalanx"
        self.entity = text_param(self.name, "entity", entity)
        self.mode = text_param(self.name, "mode", mode, MODES) or "offline"
        self.group = text_param(self.name, "group", group)
        self.run: Any = None

    def directory(self, run: TrackedRun) -> Path:
        """The directory W&B writes its ``wandb/`` folder in (see the module's docstring)."""
        if self.uri is not None:
            return Path(self.uri).expanduser()
        return run.home if run.home is not None else Path(".")

    def start(self, run: TrackedRun) -> Mapping[str, Any]:
        wandb = self.library()
        assert wandb is not None
        known = getattr(wandb.Settings, "model_fields", {})
        settings = wandb.Settings(**{k: v for k, v in QUIET.items() if k in known})
        where = self.directory(run)
        where.mkdir(parents=True, exist_ok=True)
        kept = run.kept.get("id")
        if isinstance(kept, str):
            _wait_for_a_fresh_second(where / "wandb", kept)
        self.run = wandb.init(
            project=self.project, entity=self.entity, group=self.group or run.group, name=run.name,
            id=kept if isinstance(kept, str) else None, resume="allow" if isinstance(kept, str) else None,
            config=dict(run.params), dir=str(where), mode=self.mode, settings=settings,
        )
        return {"id": self.run.id, "dir": str(where.absolute())}

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def finish(self, end: str) -> None:
        if self.run is not None:
            self.run.finish(exit_code=EXIT_CODES.get(end, 1))
            self.run = None
