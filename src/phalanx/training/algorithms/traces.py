"""Worker speeds from a device trace in FedScale's format (Lai et al., "FedScale: Benchmarking Model and System
Performance of Federated Learning at Scale", ICML 2022; its documented device-capacity trace).

FedScale's device-capacity trace is a pickled dict ``{client_id: {"computation": float, "communication": float}}``:
``computation`` is the client's compute latency (FedScale's simulated completion time grows linearly in it: higher is
slower) and ``communication`` its bandwidth. Here client i of the trace, in increasing ``client_id`` order, is
worker i, and its speed is ``median(computation) / computation_i`` (median speed 1, the scale of the other
distributions of :mod:`~phalanx.training.algorithms.clock`): an update's time is its computation.

With ``algorithm_params.trace_bandwidth = true`` (:func:`load_with_bandwidth`) an update's time is FedScale's
completion time, computation plus communication, as its client reports it (``Client.getCompletionTime`` in FedScale's
``fedscale/cloud/internal/client_metadata.py``, read, not copied)::

    Tᵢ = 3 · B · Q · latencyᵢ / 1000  +  (upload + download) / bandwidthᵢ        (seconds)

with FedScale's augmentation factor 3, B the batch size, Q = 1 local step (an update here is one minibatch
gradient), latencyᵢ the trace's ``computation``, upload = download = the model's size in kbit (FedScale measures
the pickled model, ``bytes / 1024 · 8``; here 4 bytes per float32 parameter: d / 32 kbit) and bandwidthᵢ the
trace's ``communication`` in kbit/s. The speed is then ``median(T) / Tᵢ`` over the trace's clients, so that the
median update still takes one simulated time unit: a client with a fast processor on a slow link becomes slow, the
more so the larger the model. FedScale's availability trace (``client_behave_trace``: active/inactive intervals)
is read by :mod:`~phalanx.training.algorithms.availability` (``algorithm_params.availability``).

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
import reprlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from phalanx import files
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


def _not_regular(error: Callable[[Path, str], ConfigError]) -> Callable[[Path, str], ConfigError]:
    """``error``, with :func:`phalanx.files.open_regular`'s "not a regular file" worded for a trace's reader."""
    def refuse(path: Path, problem: str) -> ConfigError:
        if problem == "not a regular file":
            problem = "not a regular file (a device, a FIFO or a directory)"
        return error(path, problem)
    return refuse


def read_table(path: Path, max_bytes: int, shape: str,
               error: Callable[[Path, str], ConfigError]) -> tuple[dict[Any, Any], list[Any]]:
    """A FedScale trace file at ``path`` as a hostile file: at most ``max_bytes`` (refused from its size before it is
    read), unpickled with no globals, a non-empty dict (``shape`` names its expected form in the error), and its
    client ids in increasing order; any defect is ``error(path, problem)`` — one line naming the file. Shared by the
    device-capacity trace (here) and the behaviour trace (:mod:`~phalanx.training.algorithms.availability`)."""
    try:  # one descriptor, opened without blocking (a FIFO in its place), checked with fstat: a regular file of at
        # most max_bytes (/dev/zero was read until memory ran out; a FIFO blocked for ever), read with max_bytes + 1
        raw = files.read_regular(path, max_bytes, follow=True, error=_not_regular(error))
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
    except (TypeError, RecursionError):
        raise error(path, "client ids of mixed types or nested too deeply") from None
    return table, ids


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 2, 40, 40


def shown(value: Any) -> str:
    """A value read from a hostile file, for a one-line error: its repr cut short (a list nested 200,000 deep made
    ``repr`` raise ``RecursionError``: an attacker's review)."""
    try:
        return _SHOWN.repr(value)
    except RecursionError:
        return type(value).__name__


def load(spec: str) -> tuple[float, ...]:
    """The speeds of every client of the trace ``spec`` names, in increasing client-id order."""
    path = path_of(spec)
    table, ids = read_table(path, MAX_BYTES, "{client_id: {'computation': ..., 'communication': ...}}", trace_error)
    latency = [_positive(path, cid, table[cid], "computation") for cid in ids]
    middle = sorted(latency)[len(latency) // 2]
    return tuple(middle / v for v in latency)


AUGMENTATION = 3.0
"""FedScale's ``augmentation_factor`` (its client's default): the computation term's constant."""


def _positive(path: Path, cid: Any, entry: Any, key: str) -> float:
    """``entry[key]`` as a finite number > 0, else one line naming the file and the client."""
    value = entry.get(key) if isinstance(entry, dict) else None
    if not (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0):
        raise trace_error(path, f"client {shown(cid)}: {key!r} must be a finite number > 0, got {shown(value)}")
    return float(value)


def completion_seconds(latency: float, bandwidth: float, dim: int, batch_size: int) -> float:
    """FedScale's completion time of one update (the module's docstring): ``3·B·latency/1000 + 2·(d/32)/bandwidth``
    seconds for one local step of batch ``batch_size`` on a model of ``dim`` float32 parameters."""
    return AUGMENTATION * batch_size * latency / 1000.0 + 2.0 * (dim / 32.0) / bandwidth


def load_with_bandwidth(spec: str, dim: int, batch_size: int) -> tuple[float, ...]:
    """The speeds of every client of the trace ``spec`` names with its bandwidth counted: ``median(T) / Tᵢ`` for
    FedScale's completion time Tᵢ (:func:`completion_seconds`), in increasing client-id order; both fields of every
    entry checked (finite, > 0) — a trace without ``communication`` is refused in one line."""
    path = path_of(spec)
    table, ids = read_table(path, MAX_BYTES, "{client_id: {'computation': ..., 'communication': ...}}", trace_error)
    seconds = [completion_seconds(_positive(path, cid, table[cid], "computation"),
                                  _positive(path, cid, table[cid], "communication"), dim, batch_size) for cid in ids]
    middle = sorted(seconds)[len(seconds) // 2]
    return tuple(middle / t for t in seconds)

