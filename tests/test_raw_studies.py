"""Every study with raw results (``raw_value``) writes a ``runs.csv`` that reads back to exactly what it wrote, and
refuses, in one typed line naming ``results``, a file that is not its own: another study's, one missing a column,
one whose runs were made with other settings (a run id not the planned configuration's), NaN where a number must be.
The report made from a study's real runs.csv is the report made from its runs, byte for byte: each study's CLI test
(tests/test_*_study.py, tests/test_hbn_experiment.py, tests/test_convergence_study.py) calls
:func:`tests._raw.assert_rebuilt` on the grid it trained."""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
from tests._raw import fake_values

from phalanx import studies
from phalanx.errors import ConfigError
from phalanx.studies import raw

NAMES = ["privacy", "backdoor", "corrupted-rounds", "byzantine-neighbours", "hbn", "convergence", "tension",
         "parallelism", "async"]
if importlib.util.find_spec("transformers") and importlib.util.find_spec("peft"):  # its plan reads the tokenizer
    NAMES.append("lora")
SMALL: dict[str, dict[str, Any]] = {  # narrowed presets: the checks read the plan, never train
    "privacy": {"rules": ("mean", "cwtm"), "noises": (0.0, 1.0)},
    "backdoor": {"rules": ("mean", "cwtm"), "attacks": ("dba",), "alphas": (1.0,)},
    "corrupted-rounds": {},
    "byzantine-neighbours": {},
    "hbn": {"norms": ("batch", "fedbn"), "rules": (("mean", 0),), "alphas": (1.0,)},
    "convergence": {},
    "tension": {},
    "parallelism": {"nodes": (9,), "graphs": ("ring",), "lrs": {"gossip": (0.1,), "anytime": (0.01,)}},
    "async": {"rules": ("mean", "cwmed")},
    "lora": {"modes": ("update", "shared")},
}


def _planned(name: str, **changes: Any) -> tuple[Any, list[Any], list[str]]:
    study = studies.resolve(name)()
    p = study.preset("quick", seeds=(0, 1, 2), **{**SMALL[name], **changes})
    cells, cfgs = study.plan(p, {})
    raw_cells, ids = study.raw_cells(p, cells, cfgs)
    return study, raw_cells, ids


@pytest.mark.parametrize("name", NAMES)
def test_every_raw_value_reads_back_as_written(name: str, tmp_path: Path) -> None:
    study, cells, ids = _planned(name)
    assert study.raw_value is not None
    values = fake_values(study.raw_value, cells)
    path = tmp_path / "runs.csv"
    path.write_text(raw.write(cells, ids, values, study.raw_value))
    back = raw.read(path, cells, ids, study.raw_value)
    assert raw.write(cells, ids, back, study.raw_value) == path.read_text()
    assert back == values


def _rows(name: str) -> tuple[Any, list[Any], list[str], list[str]]:
    study, cells, ids = _planned(name)
    return study, cells, ids, raw.write(cells, ids, fake_values(study.raw_value, cells), study.raw_value).splitlines()


def _refused(path: Path, lines: list[str], study: Any, cells: list[Any], ids: list[str], says: str) -> None:
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=says) as exc:
        raw.read(path, cells, ids, study.raw_value)
    assert exc.value.parameter == "results" and str(path) in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("name", NAMES)
def test_a_file_that_is_not_the_studys_own_is_one_typed_line(name: str, tmp_path: Path) -> None:
    study, cells, ids, lines = _rows(name)
    path = tmp_path / "runs.csv"
    other = "privacy" if name != "privacy" else "hbn"
    _, _, _, foreign = _rows(other)
    _refused(path, foreign, study, cells, ids, "header")                                  # another study's file
    _refused(path, [",".join(r.split(",")[:-1]) for r in lines[:1]] + lines[1:], study, cells, ids, "header")
    # the same grid trained with other settings: every cell's run id is another
    other_ids = [f"{i}x" for i in ids]
    path.write_text("\n".join(raw.write(cells, other_ids, fake_values(study.raw_value, cells),
                                        study.raw_value).splitlines()) + "\n")
    with pytest.raises(ConfigError, match="run id of the planned configuration"):
        raw.read(path, cells, ids, study.raw_value)


def _nan_first(v: Any) -> Any:
    """``v`` (a parsed JSON curve) with its first number NaN."""
    if isinstance(v, list):
        return [_nan_first(v[0]), *v[1:]]
    return math.nan


@pytest.mark.parametrize("name", NAMES)
def test_nan_where_a_number_must_be_is_refused(name: str, tmp_path: Path) -> None:
    study, cells, ids, lines = _rows(name)
    header, row = next(csv.reader([lines[0]])), next(csv.reader([lines[1]]))
    first = header.index("run") + 1  # the first value column: a number (or a curve of numbers) that must be one
    row[first] = json.dumps(_nan_first(json.loads(row[first]))) if row[first].startswith("[") else "nan"
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow(row)
    _refused(tmp_path / "runs.csv", [lines[0], buf.getvalue(), *lines[2:]], study, cells, ids, "not NaN")


UNBOUNDED = {"convergence": "its measures (F(θ_T) − F*, ζ², ε, the bound, their ratio, the curves) may be slightly "
                            "negative by rounding, NaN where no ε is proven, infinite where a run diverges"}
"""The studies whose numbers carry no ``raw.within`` bound, and why (every other number a study records is bounded)."""


def _first_value(v: Any, x: float) -> Any:
    """``v`` (a parsed JSON curve) with its first number ``x``."""
    if isinstance(v, list):
        return [_first_value(v[0], x), *v[1:]]
    return x


def _unbounded(value_type: Any) -> Any:
    """The mutant: ``value_type`` with every bound removed (a plain float for a share)."""
    if value_type is raw.Share:
        return float
    return dataclasses.make_dataclass("Unbounded", [(f.name, f.type) for f in dataclasses.fields(value_type)],
                                      frozen=True)


@pytest.mark.parametrize("name", NAMES)
def test_every_number_a_study_records_has_its_range(name: str) -> None:
    """What a hostile runs.csv can make a report print is what a run can give: every numeric column (a number or a
    curve of numbers) of every study declares its range (``raw.within``, ``raw.Share``), but those of
    :data:`UNBOUNDED`, each with its reason."""
    study = studies.resolve(name)()
    numeric = [c for c in raw._columns(study.raw_value) if c.hint not in (str, bool)]
    assert numeric
    unbounded = [c.name for c in numeric if c.range is None]
    assert unbounded == ([c.name for c in numeric] if name in UNBOUNDED else [])


@pytest.mark.parametrize("name", [n for n in NAMES if n not in UNBOUNDED])
def test_a_number_outside_its_range_is_refused_and_the_unbounded_mutant_reads_it(name: str, tmp_path: Path) -> None:
    """The first value column (a share, a loss, a curve's first number) set to −1 — below every declared range — is
    one typed line; the same value type without its bounds (the mutant) reads the file."""
    study, cells, ids, lines = _rows(name)
    header, row = next(csv.reader([lines[0]])), next(csv.reader([lines[1]]))
    first = header.index("run") + 1
    row[first] = json.dumps(_first_value(json.loads(row[first]), -1.0)) if row[first].startswith("[") else "-1.0"
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow(row)
    path = tmp_path / "runs.csv"
    _refused(path, [lines[0], buf.getvalue(), *lines[2:]], study, cells, ids, "a number in")
    assert len(raw.read(path, cells, ids, _unbounded(study.raw_value))) == len(set(cells))


def test_the_run_ids_follow_the_settings() -> None:
    """A file made with other rounds is refused: the run column changes with what names a run (the mutant: an id
    that ignores the settings would let another preset's numbers through)."""
    for name, change in (("privacy", {"rounds": 7}), ("convergence", {"rounds": 7}), ("hbn", {"rounds": 7})):
        _, cells, ids = _planned(name)
        _, cells2, ids2 = _planned(name, **change)
        assert cells == cells2 and not set(ids) & set(ids2), name


def test_hbn_writes_its_fedbn_global_cells_with_the_fedbn_runs_id() -> None:
    _, cells, ids = _planned("hbn")
    by_cell = dict(zip(cells, ids))
    glob = [c for c in cells if c.norm == "fedbn-global"]
    assert glob and all(by_cell[c] == by_cell[dataclasses.replace(c, norm="fedbn")] for c in glob)


@dataclasses.dataclass(frozen=True)
class _Seed:
    seed: int


@dataclasses.dataclass(frozen=True)
class _Count:
    n: int


@pytest.mark.parametrize("text", ["--5", "-", "", "5-", "٣", "+5", "1e3", "5.0", "9" * 21])
def test_an_int_column_takes_only_an_optional_minus_and_digits(text: str, tmp_path: Path) -> None:
    """Every such text is one typed line (``--5`` passed the old check and then crashed ``int()``); ``-5`` reads."""
    path = tmp_path / "runs.csv"
    path.write_text(f"seed,run,n\n0,r0,{text}\n")
    with pytest.raises(ConfigError, match="an integer"):
        raw.read(path, [_Seed(0)], ["r0"], _Count)
    path.write_text("seed,run,n\n0,r0,-5\n")
    assert raw.read(path, [_Seed(0)], ["r0"], _Count) == {_Seed(0): _Count(-5)}
