"""What a metric row is: one flat JSON object of scalars, checked where it is made and where it is read back.

A row (one per evaluated round, ``metrics.jsonl``) holds the round, the measurements (``test_accuracy``,
``test_loss``, ``agg_error``, ``byz_share``, ``detection_auc``, the stages' and the algorithm's columns) and the
config's columns (``dataset``, ``aggregator``, ``seed`` …): every value a number, a string, a boolean or ``null``.
The writer (:class:`phalanx.training.loop.Loop`'s metrics) checks each row it makes, so a column of a plug-in that is
not a scalar is one error when it is made, not a run that cannot be read back; the reader
(:func:`phalanx.experiments.store.rows_upto`) holds a file it did not write to the same shape, so a row can neither
crash the report (a string accuracy, a round of 4,000 digits, a dict where a setting is expected: an attacker's review)
nor cost more memory than the densest honest shape:

* at most :data:`MAX_KEYS` keys of at most :data:`MAX_KEY_CHARS` characters; strings of at most
  :data:`MAX_TEXT_CHARS`, with no control character (an escape sequence printed to a terminal); integers within
  ±2⁶³ (every one converts to a float); the round in 0 … 2⁶²;
* :data:`NUMERIC` columns are numbers (``NaN`` and infinities included: a diverged run's loss) or ``null``;
* before a line is parsed, it may hold at most :data:`MAX_BRACKETS` ``{`` and ``[`` (those of its strings): a line of
  ``[{},{},…]`` would otherwise cost 47× its size while ``json.loads`` builds it.

Keys and short strings are shared between the rows of one file (:class:`Interner`): every honest row repeats the
same names and config values, so a file of a million rows keeps one copy of each; a file naming more than 1,024
distinct columns is not a run's, and strings beyond the shared ones may take at most 64 MiB. Measured
(``tests/test_metric_rows.py``), the kept rows of the densest shapes these checks let through cost at most 4× what
honest rows of the same size do, plus 256 bytes a row and those 64 MiB (before: a row of ``[],[],…`` kept 25× its
size).
"""

from __future__ import annotations

import re
import sys
from typing import Any

MAX_KEYS = 256
"""The most keys a row may hold (an honest one: 20–60)."""
MAX_KEY_CHARS = 64
MAX_TEXT_CHARS = 4096
"""The longest key and string value (an honest row's longest: a rule's chain or a plug-in's ``module:attr(…)``, a
model's ``hf:/path``; the config's are refused longer when the run is built, :mod:`phalanx.experiments.specs`). A long
string costs about one byte a character kept: the per-byte bound below is set by the shortest ones."""
MAX_INT = 1 << 63
MAX_ROUND = 1 << 62
MAX_BRACKETS = 1 + 256 * 256
"""The most ``{`` plus ``[`` a line may hold before it is parsed: the row's own brace and as many in its strings as
256 strings of 256 brackets (an honest row: one, a plug-in's ``module:attr([…])`` a few more). A line of
``[{},{},…]`` costs 47× its size while ``json.loads`` builds it; this bounds that to a few MiB."""
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
"""Control characters (C0, DEL, C1): no honest row holds one, and printed by ``phalanx report`` an escape sequence
would clear the terminal, set its title or forge a line of the report (an attacker's review)."""
NUMERIC = ("test_accuracy", "test_loss", "agg_error", "byz_share", "detection_auc")
"""The columns that the report and the plots compute with: numbers or ``null``."""
CORE = ("round", *NUMERIC, "byzantine_sampled", "rounds_since_stop")
"""The columns the loop itself fills on a metric row (:meth:`phalanx.training.loop.Evaluate.row`), beside the
algorithm's, the attack's and the config's own: a stage that declares one is refused when the run is built."""


def _scalar_problem(key: str, value: Any) -> str | None:
    if value is None or isinstance(value, bool):
        return f"column {key!r} is a boolean, not a number" if key in NUMERIC and value is not None else None
    if isinstance(value, int):
        return None if -MAX_INT <= value <= MAX_INT else f"column {key!r} is an integer beyond ±2^63"
    if isinstance(value, float):
        return None
    if isinstance(value, str):
        if key in NUMERIC:
            return f"column {key!r} is a string, not a number"
        if len(value) > MAX_TEXT_CHARS:
            return f"column {key!r} is longer than {MAX_TEXT_CHARS} characters"
        return f"column {key!r} holds a control character" if _CONTROL.search(value) else None
    return f"column {key[:MAX_KEY_CHARS]!r} is a {type(value).__name__}, not a number, string, boolean or null"


def problem(row: Any) -> str | None:
    """Why ``row`` is not a metric row (see the module's docstring), or None."""
    if not isinstance(row, dict):
        return f"a JSON {type(row).__name__}, not an object"
    if len(row) > MAX_KEYS:
        return f"{len(row)} columns, more than {MAX_KEYS}"
    round_ = row.get("round")
    if isinstance(round_, bool) or not isinstance(round_, int) or not 0 <= round_ <= MAX_ROUND:
        return "its 'round' is not an integer in 0 … 2^62"
    for key, value in row.items():
        if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_CHARS:
            return f"a column name of {len(str(key))} characters, not 1 … {MAX_KEY_CHARS}"
        if _CONTROL.search(key):
            return "a column name holds a control character"
        if (why := _scalar_problem(key, value)) is not None:
            return why
    return None


def crowded(raw: bytes) -> bool:
    """Whether the line ``raw`` holds more ``{`` and ``[`` than a row can (checked before it is parsed)."""
    return raw.count(b"{") + raw.count(b"[") > MAX_BRACKETS


def written(row: dict[str, Any]) -> dict[str, Any]:
    """``row``, checked as it is made: a :class:`ValueError` naming the column that is not what a row holds (a
    plug-in's stage or algorithm returned a list, a string accuracy …)."""
    if (why := problem(row)) is not None:
        raise ValueError(f"a metric row that cannot be written: {why} (docs/extending.md, a stage's metric columns)")
    return row


def stage_columns(name: str, declared: tuple[str, ...], returned: dict[str, Any],
                  taken: dict[str, str]) -> dict[str, Any]:
    """``returned``, the metric columns stage ``name`` filled on a row, checked: each one it declares
    (``column_names()``) or named ``<name>_…`` (one that depends on the run: CRFL's ``crfl_attack_success``), and none
    in ``taken`` (column → who fills it: the row's columns so far, the loop's own (:data:`CORE`), the config's and
    the other stages' declared ones), which it would silently overwrite or be overwritten by on every row; else a
    :class:`ValueError` naming the stage and the column, at the first row (a plug-in's bug: not a run that finishes
    with another column's numbers)."""
    for key in returned:
        if key in taken:
            raise ValueError(f"stage {name!r} fills metric column {key!r}, which {taken[key]} fills (docs/extending.md,"
                             " a stage's metric columns)")
        if key not in declared and not (isinstance(key, str) and key.startswith(f"{name}_")):
            raise ValueError(f"stage {name!r} fills metric column {key!r}, which its column_names() does not "
                             f"declare (declare it, or name it {name}_…: docs/extending.md, a stage's metric columns)")
    return returned


class Interner:
    """One copy of each key and short string over the rows of a file. A file may name at most :data:`MAX_COLUMNS`
    distinct columns (an honest one: a few dozen, the same on every row): :meth:`row` returns why not once a row
    names more. String values are shared up to :data:`LIMIT` distinct ones, the rest kept as they are."""

    MAX_COLUMNS = 1024
    LIMIT = 4096
    UNSHARED_MAX = 64 << 20
    """The most memory (``sys.getsizeof``) the strings kept beyond the :data:`LIMIT` shared ones may take in one
    file (an honest file: none; a review filled the shared ones with strings used once, then sent 2-character
    strings, each costing 50 bytes kept for 3 bytes of the file: 5.6× what honest rows cost)."""

    def __init__(self) -> None:
        self.columns: dict[str, str] = {}
        self.seen: dict[str, str] = {}
        self.unshared = 0

    def _one(self, text: str) -> str:
        if (kept := self.seen.get(text)) is not None:
            return kept
        if len(self.seen) < self.LIMIT:
            self.seen[text] = text
            return text
        self.unshared += sys.getsizeof(text)
        if self.unshared > self.UNSHARED_MAX:
            raise ValueError(f"more than {self.UNSHARED_MAX >> 20} MiB of strings beyond the {self.LIMIT} a file "
                             "shares")
        return text

    def _column(self, key: str) -> str:
        if (kept := self.columns.get(key)) is None:
            if len(self.columns) >= self.MAX_COLUMNS:
                raise ValueError(f"more than {self.MAX_COLUMNS} distinct columns in one file")
            kept = self.columns[key] = key
        return kept

    def row(self, row: dict[str, Any]) -> dict[str, Any]:
        """``row`` with its keys and string values shared with the rows before; a :class:`ValueError` once the
        file names more than :data:`MAX_COLUMNS` columns."""
        return {self._column(k): (self._one(v) if isinstance(v, str) else v) for k, v in row.items()}
