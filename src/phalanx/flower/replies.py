"""Reading Flower replies into Phalanx vectors, without trusting them.

The server knows the global model it broadcast (an ``ArrayRecord``: named arrays, each with a shape and a dtype). A
client's reply is turned into its update ``Δᵢ = wᵢ − w``, flattened in the global record's key order into one float
vector, so that a round is an ``(n, d)`` tensor for a Phalanx rule. A reply is *dropped* (with the reason) when its
structure does not fit — an error message, no content, no ``ArrayRecord``, other keys, other shapes, an array that
is not real numbers, bytes that do not deserialise. Its *values* are never judged here: NaN, ±Inf and huge numbers
are an attack for the robust rule to survive (docs/design.md, "Conventions").

Records and messages: Flower's Message API (https://flower.ai/docs/framework/ref-api/flwr.app.html).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord

from phalanx.flower.identity import node_id_of
from phalanx.flower.metrics import _as_float

__all__ = ["Layout", "Reply", "metrics_of", "read_reply", "shorten"]

_REAL_KINDS = "biuf"  # bool, signed and unsigned integers, floats: what can be cast to a float update


@dataclass(frozen=True)
class Layout:
    """The global model's structure and its flattened value.

    ``keys`` in the record's order, each array's ``shape`` and ``dtype``; ``compute`` is the float dtype updates are
    formed and aggregated in (float64 if any array is float64, else float32); ``flat`` is ``w`` flattened in that
    dtype (``d`` values).
    """

    keys: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[np.dtype[Any], ...]
    compute: np.dtype[Any]
    flat: np.ndarray[Any, Any] = field(repr=False)
    arrays: tuple[np.ndarray[Any, Any], ...] = field(default=(), repr=False)
    """The broadcast arrays as they were: an integer array is given back as itself plus the rounded change, so that
    the compute dtype's rounding never reaches it (float32 turned 2²⁴ + 1 into 2²⁴ even on a round that kept the
    model: a review of the Flower strategy)."""

    @classmethod
    def of(cls, record: ArrayRecord) -> Layout:
        """The layout of the broadcast model (the server's own record: an unreadable array is a programming error)."""
        arrays = [record[k].numpy() for k in record]
        dtypes = tuple(a.dtype for a in arrays)
        compute = np.dtype(np.float64 if any(d == np.float64 for d in dtypes) else np.float32)
        flat = (
            np.concatenate([a.astype(compute).ravel() for a in arrays]) if arrays else np.zeros(0, dtype=compute)
        )
        return cls(tuple(record.keys()), tuple(tuple(a.shape) for a in arrays), dtypes, compute, flat, tuple(arrays))

    @property
    def size(self) -> int:
        """``d``: the number of values in the model."""
        return int(self.flat.shape[0])

    def record(self, flat: np.ndarray[Any, Any]) -> ArrayRecord:
        """The ``ArrayRecord`` with this layout's keys, shapes and dtypes holding the flat vector ``flat`` (integer
        and boolean arrays are rounded back)."""
        out: dict[str, Array] = {}
        start = 0
        for i, (key, shape, dtype) in enumerate(zip(self.keys, self.shapes, self.dtypes)):
            size = int(np.prod(shape, dtype=np.int64))
            part = flat[start:start + size].reshape(shape)
            if dtype.kind in "iu" and i < len(self.arrays):  # itself plus the rounded change, exactly, saturated
                change = np.rint(part.astype(np.float64) - self.flat[start:start + size].reshape(shape))
                part = self.arrays[i] if not change.any() else _saturated(self.arrays[i], change)
            elif dtype.kind in "iub":
                part = np.rint(part)
            start += size
            out[key] = Array(np.ascontiguousarray(part.astype(dtype)).reshape(shape))  # (a 0-d array stays 0-d)
        return ArrayRecord(out)


def _saturated(values: np.ndarray[Any, Any], change: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``values`` (an integer array) plus the whole-number ``change`` (float64), exactly, held to the dtype's range
    instead of wrapping around (int64 7 + 10³⁰ gave −2⁶³ + 7; uint8 250 + 10 gave 4: a review)."""
    info = np.iinfo(values.dtype)
    bounded = np.clip(np.nan_to_num(change), -(2.0 ** 65), 2.0 ** 65)
    total = values.astype(object) + np.vectorize(int, otypes=[object])(bounded)
    return np.clip(total, int(info.min), int(info.max)).astype(values.dtype)


@dataclass
class Reply:
    """One client's reply as the strategy sees it: ``update`` (``Δᵢ``, ``(d,)`` in the layout's compute dtype) or
    ``dropped`` (why it was not used, in words) and ``reason`` (the kind of drop: ``"error"`` for an error reply,
    ``"malformed"`` for a structure that does not fit; the strategy adds ``"duplicate"``, ``"unsampled"``,
    ``"stale"``, ``"impostor"`` and, with LoRA adapters, ``"adapter"``), its ``metrics`` record and ``num_examples``
    when it sent them."""

    node_id: int | None
    update: np.ndarray[Any, Any] | None = None
    dropped: str | None = None
    metrics: MetricRecord | None = None
    num_examples: float | None = None
    reason: str | None = None


def _one(records: Any, key: str) -> Any:
    """The record under ``key``, else the only record of its kind, else None."""
    if key in records:
        return records[key]
    if len(records) == 1:
        return next(iter(records.values()))
    return None


def shorten(text: Any, limit: int = 160) -> str:
    """``text`` on one line, at most ``limit`` characters: a reply's own words go into logs and JSON only so."""
    try:
        text = str(text)
    except Exception:  # an int of more than 4,300 digits, an object whose __str__ raises
        return "(unprintable)"
    text = " ".join(text[: 4 * limit].split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _flatten(record: ArrayRecord, layout: Layout) -> tuple[np.ndarray[Any, Any] | None, str | None]:
    """``(Δ, None)`` for a record that fits the layout, else ``(None, why)``."""
    got = set(record.keys())
    want = set(layout.keys)
    if got != want:
        missing = sorted(want - got)
        extra = sorted(got - want)
        why = ([f"missing {missing[:5]}"] if missing else []) + ([f"unexpected {extra[:5]}"] if extra else [])
        return None, shorten("wrong keys: " + ", ".join(why))
    parts: list[np.ndarray[Any, Any]] = []
    for key, shape in zip(layout.keys, layout.shapes):
        array = record[key]
        declared = tuple(getattr(array, "shape", ()))
        if declared != shape:  # checked before deserialising: a huge declared array is not read
            return None, f"wrong shape of {key!r}: got {shorten(declared, 60)}, expected {shape}"
        try:
            value = array.numpy()
        except Exception as exc:  # any unreadable payload is a dropped reply, never a crash
            return None, shorten(f"unreadable array {key!r}: {type(exc).__name__}: {exc}")
        if tuple(value.shape) != shape:
            return None, f"wrong shape of {key!r}: got {tuple(value.shape)}, expected {shape}"
        if value.dtype.kind not in _REAL_KINDS:
            return None, f"wrong dtype of {key!r}: {shorten(value.dtype, 60)} is not a real number type"
        parts.append(value.astype(layout.compute, copy=False).ravel())
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=layout.compute)
    with np.errstate(all="ignore"):  # inf − inf, overflow: values for the robust rule, not errors
        return flat - layout.flat, None


def _num_examples(metrics: MetricRecord | None, key: str) -> float | None:
    """The claimed number of examples, None when missing or no float (a bool, a string, an int too large for a float:
    10⁴⁰⁰ raised OverflowError and its whole valid update was dropped as unreadable — an attacker's review)."""
    if metrics is None or key not in metrics:
        return None
    value = _as_float(metrics[key])
    return None if math.isnan(value) else value


def read_reply(msg: Message, layout: Layout, arrayrecord_key: str, weighted_by_key: str) -> Reply:
    """Turn one reply into a :class:`Reply`: its update ``Δᵢ = wᵢ − w`` or why it is dropped. Never raises."""
    reply = Reply(node_id=node_id_of(msg))
    try:
        if msg.has_error():
            err = msg.error
            reply.dropped = f"error reply (code {shorten(err.code, 20)}): {shorten(err.reason, 120)}"
            reply.reason = "error"
            return reply
        if not msg.has_content():
            reply.dropped = "no content"
            return reply
        content = msg.content
        metrics = _one(content.metric_records, "metrics")
        if isinstance(metrics, MetricRecord):
            reply.metrics = metrics
            reply.num_examples = _num_examples(metrics, weighted_by_key)
        record = _one(content.array_records, arrayrecord_key)
        if not isinstance(record, ArrayRecord):
            count = len(content.array_records)
            reply.dropped = f"no ArrayRecord {arrayrecord_key!r}" + (f" (found {count})" if count else "")
            return reply
        reply.update, reply.dropped = _flatten(record, layout)
    except Exception as exc:  # a malformed reply must never end the run
        reply.update = None
        reply.dropped = shorten(f"unreadable reply: {type(exc).__name__}: {exc}")
    if reply.dropped is not None and reply.reason is None:
        reply.reason = "malformed"
    return reply


def metrics_of(msg: Message) -> MetricRecord | None:
    """The reply's ``MetricRecord`` (under ``"metrics"``, else its only one), or None. Never raises."""
    try:
        if msg.has_error() or not msg.has_content():
            return None
        record = _one(msg.content.metric_records, "metrics")
        return record if isinstance(record, MetricRecord) else None
    except Exception:  # a malformed reply must never end the run
        return None
