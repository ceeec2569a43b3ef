"""Worker speeds from a device trace in FedScale's format (Lai et al., "FedScale: Benchmarking Model and System
Performance of Federated Learning at Scale", ICML 2022; its documented device-capacity trace).

FedScale's device-capacity trace is a pickled dict ``{client_id: {"computation": float, "communication": float}}``:
``computation`` is the client's compute latency (FedScale's simulated completion time grows linearly in it: higher is
slower) and ``communication`` its bandwidth. Here client i of the trace, in increasing ``client_id`` order, is
worker i, and its speed is ``median(computation) / computation_i`` (median speed 1, the scale of the other
distributions of :mod:`~phalanx.training.algorithms.clock`); the bandwidth is not used (an update's time is its
computation). FedScale's availability trace (``client_behave_trace``: active/inactive intervals) is read by
:mod:`~phalanx.training.algorithms.availability` (``algorithm_params.availability``).

A trace is a hostile file until read: it is at most :data:`MAX_BYTES`, and it is unpickled with no globals at all
(the standard library's "restricting globals" pattern with an empty allow-list: a pickle that names any class or
function — the only way a pickle runs code — is refused), then checked entry by entry; any defect is one line
naming the file (:func:`trace_error`). ``speeds = "fedscale:sample"`` reads a small sample shipped with Phalanx
(32 clients, generated in that format with seeded log-normal latencies: not measured devices).
"""

from __future__ import annotations

import io
import math
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

from phalanx.errors import ConfigError

PREFIX = "fedscale:"
MAX_BYTES = 16 * 2**20
"""The largest trace read (16 MiB: FedScale's full capacity trace of ~500k clients is about 10 MiB)."""
SAMPLE = Path(__file__).resolve().parents[2] / "data" / "_files" / "fedscale_device_capacity_sample.pkl"


def trace_error(path: str | Path, problem: str) -> ConfigError:
    """A device trace that cannot be read as FedScale's format: one line naming the file (a plain
    :class:`~phalanx.errors.ConfigError`, so that it pickles across a sweep's processes like every other)."""
    return ConfigError("algorithm_params.speeds", f"{PREFIX}{path}", f"a FedScale device-capacity trace ({problem})")


def sample_table(clients: int = 32, seed: int = 36) -> dict[int, dict[str, float]]:
    """The shipped sample's table (its file is ``pickle.dumps(sample_table(), protocol=4)``): ``clients`` client ids
    drawn from 0 … 99 999, log-normal compute latencies (median 100) and bandwidths (median 5000), seeded."""
    import torch

    g = torch.Generator().manual_seed(seed)
    lat = torch.exp(0.8 * torch.randn(clients, generator=g, dtype=torch.float64)) * 100
    bw = torch.exp(0.5 * torch.randn(clients, generator=g, dtype=torch.float64)) * 5000
    ids = sorted(int(x) for x in torch.randperm(100000, generator=g)[:clients])
    return {cid: {"computation": round(float(c), 1), "communication": round(float(b), 3)}
            for cid, c, b in zip(ids, lat, bw)}


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"the pickle names {module}.{name}; a trace holds only dicts, numbers and strings")


def path_of(spec: str) -> Path:
    """The file ``fedscale:PATH`` names (``fedscale:sample``: the shipped sample)."""
    rest = spec[len(PREFIX):]
    return SAMPLE if rest == "sample" else Path(rest)


def read_table(path: Path, max_bytes: int, shape: str,
               error: Callable[[Path, str], ConfigError]) -> tuple[dict[Any, Any], list[Any]]:
    """A FedScale trace file at ``path`` as a hostile file: at most ``max_bytes`` (refused from its size before it is
    read), unpickled with no globals, a non-empty dict (``shape`` names its expected form in the error), and its
    client ids in increasing order; any defect is ``error(path, problem)`` — one line naming the file. Shared by the
    device-capacity trace (here) and the behaviour trace (:mod:`~phalanx.training.algorithms.availability`)."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise error(path, f"{size} bytes, more than {max_bytes}")
        raw = path.read_bytes()[: max_bytes + 1]
    except OSError as exc:
        raise error(path, f"cannot be read: {exc.strerror or exc}") from None
    try:
        table = _NoGlobals(io.BytesIO(raw)).load()
    except Exception as exc:  # any defect of a hostile file is one line, never a traceback
        raise error(path, f"not a pickle of plain data: {type(exc).__name__}") from None
    if not isinstance(table, dict) or not table:
        raise error(path, f"not a non-empty dict {shape}")
    try:
        ids = sorted(table)
    except TypeError:
        raise error(path, "client ids of mixed types") from None
    return table, ids


def load(spec: str) -> tuple[float, ...]:
    """The speeds of every client of the trace ``spec`` names, in increasing client-id order."""
    path = path_of(spec)
    table, ids = read_table(path, MAX_BYTES, "{client_id: {'computation': ..., 'communication': ...}}", trace_error)
    latency = []
    for cid in ids:
        entry = table[cid]
        value = entry.get("computation") if isinstance(entry, dict) else None
        if not (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0):
            raise trace_error(path, f"client {cid!r}: 'computation' must be a finite number > 0, got {value!r}")
        latency.append(float(value))
    middle = sorted(latency)[len(latency) // 2]
    return tuple(middle / v for v in latency)
