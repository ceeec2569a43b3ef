"""Fuzzing the configuration path (issue 14, item 6): random TOML documents and ``--set`` strings go through
``load_toml``, ``apply_overrides``, ``grid.configs`` and ``make_config``.

Property: each step either succeeds or raises :class:`~phalanx.errors.ConfigError` whose message is one line naming
a key — never another exception (a pydantic ``ValidationError``, ``TypeError``, ``KeyError``, ``RecursionError``,
``OverflowError``, a tomllib error, ...). The documents mix the known keys (on top of a valid small config, so that
the later checks are reached too) with unknown ones, and hold every TOML type: integers up to far beyond 64 bits,
floats with ±inf, nan and subnormals, strings with unicode, control characters and ``module:attr`` specs, booleans,
dates and times, nested arrays and inline tables. The tests after the fuzzers pin each failure they found.
"""

from __future__ import annotations

import datetime as dt
import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phalanx.errors import ConfigError, PhalanxError
from phalanx.experiments import grid
from phalanx.experiments.config import RunConfig, apply_overrides, load_toml, make_config

KNOWN = sorted(RunConfig.model_fields)
VALID: dict[str, Any] = {
    "dataset": "digits", "model": "logreg", "workers": 5, "byzantine": 1, "f": 1, "aggregator": "cwtm",
    "attack": "signflip", "rounds": 8, "batch_size": 8, "lr": 0.1, "eval_every": 4, "checkpoint_every": 4, "seed": 2,
}
NAMES = [
    "cwtm", "nnm>cwtm", "krum", "bucketing(s=2)>cwmed", "alie", "none", "optimal", "gossip", "fedavg", "dsgd",
    "digits", "mlp", "logreg", "cnn", "sgd", "adam", "ring", "complete", "iid", "dirichlet", "fedbn", "torchrun",
    "serverless", "nccl", "cosine", "cross_entropy",
]
AWKWARD = [
    "", " ", ">", "nnm>", "cwtm(", "cwtm(f=1e400)", "cc(tau=" + "9" * 400 + ")", "cwtm(f=-1)",
    "krum(f=" + "9" * 30 + ")", "cc(tau=nan)", ".relative:thing", "a\x00b:c", "os:does_not_exist", "math:pi", "x:",
    ":y", "é:ü", "a b:c", "\u2028", "builtins:len", "x" * 300, "/tmp/" + "x" * 300 + "/key.pem",
    "line\nbreak", "tab\there", "nnm>cwtm>mean", "mean(f=1, f=2)",
]

text = st.text(st.characters(exclude_categories=("Cs",)), max_size=10)  # any unicode but lone surrogates
strings = st.one_of(text, st.sampled_from(NAMES + AWKWARD))
ints = st.one_of(
    st.integers(-3, 40), st.integers(-(2**70), 2**70),
    st.sampled_from([2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**30, -(10**30), 10**400]),
)
floats = st.one_of(st.floats(), st.sampled_from([5e-324, -0.0, 1e308, 0.5, 0.999999]))
scalars = st.one_of(ints, floats, strings, st.booleans(), st.datetimes(), st.dates(), st.times())
keys = st.one_of(
    st.sampled_from(KNOWN), text, st.sampled_from(["tie", "a.b", "", " ", "\n", "é", "model_config", "__class__"]),
)
values = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3)),
    max_leaves=6,
)


def _toml_string(s: str) -> str:
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_value(v: Any) -> str:
    """A value as TOML (inline form: arrays and inline tables nest)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v == math.inf else "-inf" if v == -math.inf else repr(v))
    if isinstance(v, str):
        return _toml_string(v)
    if isinstance(v, (dt.datetime, dt.date, dt.time)):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_string(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise AssertionError(type(v))


def toml_document(doc: dict[str, Any]) -> str:
    return "".join(f"{_toml_string(k)} = {toml_value(v)}\n" for k, v in doc.items())


@st.composite
def documents(draw: st.DrawFn) -> str:
    """A TOML document: a valid small config (or nothing) with random keys on top, or raw random text."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(max_size=40))
    base = dict(draw(st.sampled_from([{}, VALID])))
    base.update(draw(st.dictionaries(keys, values, max_size=4)))
    if draw(st.booleans()):  # a grid axis or two
        base.update(draw(st.dictionaries(st.sampled_from([*KNOWN, "tie"]), st.lists(scalars, max_size=3), max_size=2)))
    return toml_document(base)


OVERRIDE_SAMPLES = [
    "workers", "=", "==", "workers=", "=5", "workers==5", "workers.x=1", "seed.a.b=2", "attack_params.z=1.5",
    "attack_params=[", "aggregator=['cwtm', 'krum']", "model_params={norm = 'fedbn'}", "a.b.c=1", "'workers'=5",
    '"workers"=5', "[workers]=5", "workers=[[[1]]]", "workers=[]", "f=1e400", "lr=nan", "lr=inf", "workers=1_000",
    "tie={rounds = [1, 2]}", "tie=[1]", "attack_params.z=" + "9" * 400, "model_params.hidden=[1, [2]]",
    "dataset= 'quoted' ", "download=yes", "workers=true", "aggregator=nnm>cwtm", "round_timeout=1e-320",
    "seed=-1", "seed=" + "9" * 25, "alpha=1979-05-27", "lr=07:32:00", "\n=1", "a\nb=1", "workers\u2028=1",
]
overrides = st.one_of(
    st.sampled_from(OVERRIDE_SAMPLES),
    st.text(max_size=16),
    st.builds(
        lambda k, v: f"{k}={v}", st.one_of(st.sampled_from(KNOWN), text), st.one_of(text, values.map(toml_value)),
    ),
)


def accepted_or_config_error(fn: Any, *args: Any) -> Any:
    """``fn(*args)``, or None when it raised a ConfigError with a one-line message naming a key; any other
    exception propagates (and fails the test)."""
    try:
        return fn(*args)
    except PhalanxError as exc:
        assert isinstance(exc, ConfigError), repr(exc)
        msg = str(exc)
        assert msg.strip() and len(msg.splitlines()) == 1, repr(msg)
        assert isinstance(exc.parameter, str) and exc.parameter.strip(), repr(msg)
        assert msg.startswith(exc.parameter), repr(msg)
        return None


def _write(folder: str, content: str | bytes) -> Path:
    path = Path(folder) / "config.toml"
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_bytes(content)
    return path


def _pipeline(content: str | bytes, sets: list[str]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        data = accepted_or_config_error(load_toml, _write(folder, content))
    if data is None:
        return
    data = accepted_or_config_error(apply_overrides, data, sets)
    if data is None:
        return
    accepted_or_config_error(make_config, data)
    accepted_or_config_error(grid.configs, data)


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(content=documents(), sets=st.lists(overrides, max_size=3))
def test_random_documents_and_overrides_load_or_fail_in_one_line(content: str, sets: list[str]) -> None:
    _pipeline(content, sets)


@given(sets=st.lists(overrides, min_size=1, max_size=4))
def test_random_overrides_on_a_valid_config(sets: list[str]) -> None:
    data = accepted_or_config_error(apply_overrides, dict(VALID), sets)
    if data is not None:
        accepted_or_config_error(make_config, data)
        accepted_or_config_error(grid.configs, data)


@given(raw=st.binary(max_size=40))
def test_random_bytes(raw: bytes) -> None:
    _pipeline(raw, [])


# ------------------------------------------------------------------------------------- what the fuzzers found


def _config_error(fn: Any, *args: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        fn(*args)
    assert accepted_or_config_error(fn, *args) is None  # and the message is one line naming a key
    return info.value


@pytest.mark.parametrize("content", [
    "workers = " + "[" * 2000 + "]" * 2000,
    "a = " + "{b = " * 2000 + "1" + "}" * 2000,
    "seed = " + "9" * 5000,
], ids=["deep array", "deep inline table", "5000-digit integer"])
def test_a_file_python_cannot_parse_is_a_config_error(content: str, tmp_path: Path) -> None:
    err = _config_error(load_toml, _write(str(tmp_path), content))
    assert err.parameter == "config"


@pytest.mark.parametrize("item", [
    "workers=" + "[" * 2000 + "]" * 2000, "seed=" + "9" * 5000, "attack_params.z=" + "9" * 5000,
    "model_params={a = " + "[" * 2000 + "]" * 2000 + "}",
])
def test_an_override_python_cannot_parse_is_a_config_error(item: str) -> None:
    err = _config_error(apply_overrides, dict(VALID), [item])
    assert err.parameter == item.split("=", 1)[0]


@pytest.mark.parametrize("content", [
    "seed = 9223372036854775808", "workers = -9223372036854775809", "attack_params = {target = 99999999999999999999}",
])
def test_an_integer_beyond_64_bits_is_refused_as_toml_requires(content: str, tmp_path: Path) -> None:
    err = _config_error(load_toml, _write(str(tmp_path), content))
    assert "64 bits" in str(err)
    assert load_toml(_write(str(tmp_path), "seed = 9223372036854775807"))["seed"] == 2**63 - 1


@pytest.mark.parametrize("item", ["workers.x=1", "aggregator.a=1", "attack.b.c=2"])
def test_a_dotted_override_under_a_key_that_is_not_a_table(item: str) -> None:
    err = _config_error(apply_overrides, dict(VALID), [item])
    assert err.parameter == item.split(".")[0]


@pytest.mark.parametrize("key", ["a\nb", "\n", "x\u2028y", "\r", "tab\there", "\x00"])
def test_an_unknown_key_with_a_line_break_gives_one_line(key: str, tmp_path: Path) -> None:
    err = _config_error(make_config, {**VALID, key: 1})
    assert "unknown key" in str(err)
    _config_error(grid.configs, {**VALID, key: []})
    _config_error(make_config, load_toml(_write(str(tmp_path), toml_document({**VALID, key: 1}))))


@pytest.mark.parametrize("field,spec", [
    ("model", ".relative:thing"), ("model", "a\x00b:c"), ("loss", "..x:y"), ("aggregator", ".x:y"),
    ("attack", ".x:y"), ("server_optimizer", ".x:y"), ("aggregator", "builtins:len"), ("attack", "builtins:len"),
])
def test_a_module_spec_that_cannot_be_imported_is_a_config_error(field: str, spec: str) -> None:
    err = _config_error(make_config, {**VALID, field: spec})
    assert err.value == spec


@pytest.mark.parametrize("data", [
    {"aggregator": "cc(tau=" + "9" * 400 + ")"},
    {"attack": "alie", "attack_params": {"z": 10**400}},
    {"attack": "gaussian", "attack_params": {"sigma": -(10**400)}},
    {"lr": 10**400},
    {"server_optimizer_params": {"momentum": 10**400}},
])
def test_an_integer_too_large_for_a_float_is_a_config_error(data: dict[str, Any]) -> None:
    _config_error(make_config, {**VALID, **data})


@pytest.mark.parametrize("key", ["sign_key", "verify_key"])
def test_a_key_file_name_the_file_system_refuses_is_a_config_error(key: str) -> None:
    err = _config_error(make_config, {**VALID, key: "x" * 300})
    assert err.parameter == key


def test_a_config_file_name_the_file_system_refuses_is_a_config_error(tmp_path: Path) -> None:
    err = _config_error(load_toml, tmp_path / ("x" * 300) / "config.toml")
    assert err.parameter == "config"


def test_an_override_value_is_one_value_not_a_document() -> None:
    data = apply_overrides(dict(VALID), ["workers=5\nf = 3", "seed=7 # a comment"])
    assert data["workers"] == "5\nf = 3" and data["f"] == VALID["f"]  # not 5 with f = 3 dropped silently
    assert data["seed"] == 7
    err = _config_error(make_config, data)
    assert err.parameter == "workers"
