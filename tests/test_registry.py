"""make(), names(), the spec parser and chains."""

from __future__ import annotations

import pytest
import torch

from phalanx import aggregators
from phalanx.errors import ConfigError, InputError


def test_names_lists_rules_and_pre() -> None:
    rules = aggregators.names("rule")
    for name in ("mean", "cwmed", "cwtm", "meamed", "geomed", "cc", "signmaj"):
        assert name in rules
    assert set(aggregators.names()) == set(rules) | set(aggregators.names("pre"))
    with pytest.raises(ConfigError, match="kind"):
        aggregators.names("rules")


def test_unknown_name_suggests() -> None:
    with pytest.raises(ConfigError, match="did you mean cwtm"):
        aggregators.make("cwtn", f=1)


def test_parse_spec() -> None:
    assert aggregators.parse_spec("a(x=1, y=2.5, z=true, w=abc)>b") == [
        ("a", {"x": 1, "y": 2.5, "z": True, "w": "abc"}), ("b", {}),
    ]
    for bad in ("", "cwtm(", "a>(x=1)", "cwtm(x)"):
        with pytest.raises(ConfigError):
            aggregators.parse_spec(bad)
    # a comma list is a grid's spelling gone wrong: the error shows the list form (a first-hour review)
    with pytest.raises(ConfigError, match=r"several rules to compare are a list"):
        aggregators.parse_spec("cwtm,krum")
    with pytest.raises(ConfigError) as err:
        aggregators.parse_spec("cwtm(")
    assert "several rules" not in str(err.value)


def test_params_routing_and_errors() -> None:
    rule = aggregators.make("geomed", f=1, tol=1e-3)
    assert rule.params()["tol"] == 1e-3
    assert aggregators.make("geomed(max_iter=7)", f=1).params()["max_iter"] == 7
    with pytest.raises(ConfigError, match="tol"):
        aggregators.make("geomed", f=1, tol=-1)
    with pytest.raises(ConfigError, match="parameters of geomed"):
        aggregators.make("geomed", f=1, bogus=3)
    with pytest.raises(ConfigError, match="f"):
        aggregators.make("cwtm", f=-1)
    with pytest.raises(ConfigError, match="f"):
        aggregators.make("cwtm", f=1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad, match",
    [
        (torch.randn(5), "2-D"),
        (torch.randn(0, 3), "n >= 1"),
        (torch.randn(3, 0), "n >= 1"),
        (torch.ones(3, 2, dtype=torch.int64), "floating"),
        ([[1.0, 2.0]], "torch.Tensor"),
    ],
)
def test_bad_input_is_a_clear_error(bad: object, match: str) -> None:
    with pytest.raises(InputError, match=match):
        aggregators.make("cwtm", f=0)(bad)  # type: ignore[arg-type]


def test_unknown_context_keyword() -> None:
    with pytest.raises(ConfigError, match="context"):
        aggregators.make("cwtm", f=0)(torch.randn(3, 2), reference=torch.zeros(2))


def test_describe() -> None:
    info = aggregators.make("cwtm", f=2).describe(10)
    assert info["epsilon"] == pytest.approx(2 / 8)
    assert "Yin" in info["reference"]
    assert info["requirement"] == "n > 2f"


@pytest.mark.parametrize("name", aggregators.names())
def test_no_rule_claims_an_epsilon_or_kappa_below_its_minimum_n(name: str) -> None:
    """ε and κ are properties of the rule configured for f on n inputs it accepts: below ``min_workers`` the rule
    refuses its input, so neither is defined (an attacker's review found cwmed's ε(4) = 0.33 and geomed's ε(1) = 1
    claimed at f = 2, where κ was already None)."""
    try:
        rule = aggregators.make(name, 2)
    except (ConfigError, TypeError):
        pytest.skip(f"{name} takes no f = 2 without more parameters")
    for n in range(1, rule.min_workers()):
        assert rule.epsilon(n) is None and rule.kappa(n) is None, (name, n)


@pytest.mark.parametrize(("spec", "params", "named"), [
    ("cc(tau=-1)", {}, "aggregator.cc.tau=-1"),
    ("nnm>cc(tau=-1)", {}, "aggregator.cc.tau=-1"),
    ("cc", {"tau": -1.0}, "aggregator.cc.tau=-1.0"),
    ("bucketing(s=0)>cwtm", {}, "aggregator.bucketing.s=0"),
    ("nnm(f=-1)>cwtm", {}, "aggregator.nnm.f=-1"),
])
def test_a_refused_element_parameter_names_its_element(spec: str, params: dict[str, float], named: str) -> None:
    """A value a rule's constructor refuses is named with the element that took it: a bare ``tau=-1`` could be any
    element's parameter, in a chain or in a grid of specs."""
    with pytest.raises(ConfigError) as caught:
        aggregators.make(spec, f=1, **params)
    assert str(caught.value).startswith(f"{named} is invalid: allowed "), str(caught.value)
    assert "\n" not in str(caught.value)
