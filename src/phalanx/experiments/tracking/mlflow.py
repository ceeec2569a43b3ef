"""MLflow: each run of a grid one MLflow run — its config as parameters, every metric row as metrics (step = round),
its end as the run's status — through ``mlflow.tracking.MlflowClient`` (``pip install 'phalanx[mlflow]'``: the
``mlflow-skinny`` client).

``uri`` is MLflow's tracking URI: a local directory (MLflow's file store; default ``OUT/mlruns``, shared by the
grid's runs), ``sqlite:///PATH.db`` (a database store: needs SQLAlchemy and Alembic, as the full ``mlflow`` package
has them) or a server's ``http(s)://`` address. ``experiment`` names the MLflow experiment (default: the output
directory's name). MLflow 3 keeps the file store in maintenance mode and refuses it unless
``MLFLOW_ALLOW_FILE_STORE=true``; for a local directory Phalanx sets that for its own process, and the store is
read with ``MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri OUT/mlruns``.

A resumed run continues the same MLflow run: its id is kept in the run directory's ``tracking.json``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from phalanx.experiments.tracking.base import TrackedRun, Tracker, finite, text_param, writable

STATUS = {"finished": "FINISHED", "diverged": "FAILED", "failed": "FAILED", "interrupted": "KILLED"}
"""An end of a run (:data:`~phalanx.experiments.tracking.base.ENDS`) as MLflow's run status; a diverged run is
``FAILED`` with the tag ``phalanx.end = diverged``."""
PARAMS_PER_BATCH = 100
"""MLflow takes at most 100 parameters in one ``log_batch`` call."""
METRICS_PER_BATCH = 1000
"""… and at most 1000 metrics."""
MAX_PARAM = 6000
"""… and parameter values of at most 6000 characters (a longer one is cut, with a trailing '…')."""


def is_local(uri: str) -> bool:
    """Whether a tracking URI is a local directory (MLflow's file store): a path, or a ``file:`` URI."""
    return "://" not in uri or uri.startswith("file:")


def local_path(uri: str) -> Path:
    """The directory of a local tracking URI."""
    return Path(uri.removeprefix("file://") if uri.startswith("file://") else uri.removeprefix("file:")).expanduser()


class MLflow(Tracker):
    """One MLflow run per Phalanx run, in experiment ``experiment`` of the store or server at ``uri``."""

    name = "mlflow"
    summary = "one MLflow run per run: parameters, every metric row, how it ended"
    package = "mlflow"
    extra = "mlflow"

    def __init__(self, uri: str | None = None, experiment: str | None = None) -> None:
        super().__init__(uri)
        self.experiment = text_param(self.name, "experiment", experiment)
        self.client: Any = None
        self.run_id: str | None = None

    def check(self) -> None:
        self.library()
        if self.uri is None:
            return
        if is_local(self.uri):
            writable(self.name, local_path(self.uri))
        elif self.uri.startswith("sqlite:///"):
            writable(self.name, Path(self.uri.removeprefix("sqlite:///")).expanduser().parent)

    def tracking_uri(self, run: TrackedRun) -> str:
        """Where the run is tracked: ``uri``, or ``OUT/mlruns`` (``./mlruns`` without a run directory)."""
        if self.uri is not None:
            uri = self.uri
        else:
            uri = str((run.home if run.home is not None else Path(".")) / "mlruns")
        if is_local(uri):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3: the file store, in our process
            return local_path(uri).absolute().as_uri()
        return uri

    def start(self, run: TrackedRun) -> Mapping[str, Any]:
        mlflow = self.library()
        assert mlflow is not None
        from mlflow.entities import Param, RunStatus
        from mlflow.tracking import MlflowClient

        uri = self.tracking_uri(run)
        self.client = MlflowClient(tracking_uri=uri)
        kept = run.kept.get("run_id")
        if isinstance(kept, str) and run.kept.get("uri") == uri and self._exists(kept):
            self.run_id = kept
            self.client.update_run(kept, status=RunStatus.to_string(RunStatus.RUNNING))
            return {"run_id": kept, "uri": uri}
        experiment = self._experiment(self.experiment or run.group)
        tags = {"phalanx.run_id": run.name, "phalanx.group": run.group}
        if run.run_dir is not None:
            tags["phalanx.run_dir"] = str(run.run_dir.resolve())
        self.run_id = self.client.create_run(experiment, run_name=run.name, tags=tags).info.run_id
        params = [Param(k, _shown(v)) for k, v in sorted(run.params.items())]
        for i in range(0, len(params), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[i:i + PARAMS_PER_BATCH])
        return {"run_id": self.run_id, "uri": uri}

    def _exists(self, run_id: str) -> bool:
        try:
            self.client.get_run(run_id)
        except Exception:  # deleted, or another store: a new run
            return False
        return True

    def _experiment(self, name: str) -> str:
        """The id of the experiment ``name``, created if needed (by whichever of a grid's processes comes first)."""
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        try:
            return str(self.client.create_experiment(name))
        except Exception:  # another worker process created it meanwhile
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return str(found.experiment_id)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        rows = [Metric(k, v, now, step) for k, v in finite(metrics).items()]
        for i in range(0, len(rows), METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=rows[i:i + METRICS_PER_BATCH])

    def finish(self, end: str) -> None:
        if self.client is None or self.run_id is None:
            return
        if end == "diverged":
            self.client.set_tag(self.run_id, "phalanx.end", "diverged")
        self.client.set_terminated(self.run_id, STATUS.get(end, "FAILED"))
        self.client = None


def _shown(value: Any) -> str:
    """A parameter's value as MLflow stores it (text, at most :data:`MAX_PARAM` characters)."""
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= MAX_PARAM else text[: MAX_PARAM - 1] + "…"
