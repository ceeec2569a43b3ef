"""The attack interface: the context, the registry, and what every vector attack guarantees."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from phalanx import aggregators, attacks
from phalanx.attacks import Attack, AttackContext, DataAttack
from phalanx.errors import ConfigError, InputError

VECTOR = attacks.names("vector")
RANDOM = {name for name in VECTOR if attacks.get_class(name).stochastic}  # declared: they draw from ctx.generator
GARBAGE = {name for name in VECTOR if not attacks.get_class(name).finite}  # declared: NaN or ±Inf on purpose


def _ctx(
    honest: torch.Tensor, b: int, f: int = 2, seed: int = 0, aggregator: Any = "cwtm",
) -> AttackContext:
    agg = aggregators.make(aggregator, f=f) if isinstance(aggregator, str) else aggregator
    return AttackContext(honest, b, f, agg, torch.Generator().manual_seed(seed))


def _honest(h: int, d: int, seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(h, d, generator=g, dtype=torch.float64) + 0.3).to(dtype)


def test_names_and_kinds() -> None:
    """names() splits by what each class is (a DataAttack, or an Attack of vectors) and what it declares (``kind``),
    sorted — derived from the classes, so a new attack needs no edit here (which attacks are built in is the
    catalogue's check, tests/test_catalogue.py); a few anchors of each kind."""
    every = attacks.names()
    data = [n for n in every if issubclass(attacks.get_class(n), DataAttack)]
    vector = [n for n in every if issubclass(attacks.get_class(n), attacks.Attack)]
    assert every == sorted(every) and sorted(data + vector) == every and not set(data) & set(vector)
    assert all(attacks.get_class(n).kind == "data" for n in data)
    assert all(attacks.get_class(n).kind == "vector" for n in vector)
    assert attacks.names("data") == data
    assert attacks.names("vector") == vector
    assert {"labelflip", "backdoor", "honest", "phrase-backdoor"} <= set(data)
    assert {"none", "alie", "signflip", "optimal", "subnormal"} <= set(vector)
    with pytest.raises(ConfigError, match="kind"):
        attacks.names("vectors")


def test_make_returns_the_right_classes() -> None:
    assert isinstance(attacks.make("labelflip"), DataAttack)
    for name in VECTOR:
        a = attacks.make(name)
        assert isinstance(a, Attack)
        assert a.name == name
        assert attacks.get_class(name) is type(a)


def test_unknown_name_suggests_close_matches() -> None:
    with pytest.raises(ConfigError, match="did you mean alie"):
        attacks.make("alei")
    with pytest.raises(ConfigError, match="attack"):
        attacks.make("definitely-not-an-attack")
    with pytest.raises(ConfigError, match="attack"):
        attacks.make(3)  # type: ignore[arg-type]


def test_unknown_parameter_lists_the_accepted_ones() -> None:
    with pytest.raises(ConfigError, match="parameters of alie: z"):
        attacks.make("alie", tau=1.5)
    with pytest.raises(ConfigError, match="parameters of inf: none"):
        attacks.make("inf", scale=2)


@pytest.mark.parametrize(
    "name, params, parameter",
    [
        ("signflip", {"scale": 0}, "scale"),
        ("signflip", {"scale": -1.0}, "scale"),
        ("signflip", {"scale": float("inf")}, "scale"),
        ("signflip", {"scale": True}, "scale"),
        ("ipm", {"epsilon": 0.0}, "epsilon"),
        ("foe", {"epsilon": float("nan")}, "epsilon"),
        ("gaussian", {"sigma": -1.0}, "sigma"),
        ("gaussian", {"mu": float("inf")}, "mu"),
        ("gaussian", {"center": "median"}, "center"),
        ("alie", {"z": float("nan")}, "z"),
        ("alie", {"z": "1.5"}, "z"),
        ("mimic", {"target": -1}, "target"),
        ("mimic", {"target": 1.0}, "target"),
        ("minmax", {"perturbation": "random"}, "perturbation"),
        ("minmax", {"gamma_init": 0.0}, "gamma_init"),
        ("minsum", {"tol": 0.0}, "tol"),
        ("fang", {"b": 1.0}, "b"),
        ("fang", {"b": 0.5}, "b"),
        ("optimal", {"base": "minmax"}, "base"),
        ("optimal", {"max_factor": 0.0}, "max_factor"),
        ("optimal", {"evaluations": 1}, "evaluations"),
        ("optimal", {"evaluations": 10_000}, "evaluations"),
    ],
)
def test_bad_parameters_fail_at_construction(name: str, params: dict[str, Any], parameter: str) -> None:
    with pytest.raises(ConfigError) as info:
        attacks.make(name, **params)
    assert info.value.parameter == parameter
    assert parameter in str(info.value)


@pytest.mark.parametrize("name", attacks.names())
def test_params_round_trip_and_describe(name: str) -> None:
    a = attacks.make(name)
    again = attacks.make(name, **a.params())
    assert again.params() == a.params()
    info = a.describe()
    assert info["name"] == name
    assert info["kind"] in ("vector", "data")
    assert info["reference"] and info["threat"]
    if info["kind"] == "vector":  # needs_aggregator, checked both ways: without the server's rule it runs or refuses
        ctx = AttackContext(_honest(4, 3), 2, 1, None, torch.Generator().manual_seed(0))
        if info["needs_aggregator"]:
            with pytest.raises(ConfigError, match="aggregator"):
                a(ctx)
        else:
            assert a(ctx).shape == (2, 3)
    assert repr(a).startswith(type(a).__name__ + "(")
    assert a.__doc__ and len(a.__doc__) > 100  # formula and paper in the docstring


def test_context_validation() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3)
    with pytest.raises(InputError, match="honest"):
        AttackContext([[1.0]], 1, 0, None, g)  # type: ignore[arg-type]
    for bad in (torch.randn(3), torch.randn(0, 3), torch.randn(3, 0)):
        with pytest.raises(InputError, match="shape"):
            AttackContext(bad, 1, 0, None, g)
    with pytest.raises(InputError, match="floating"):
        AttackContext(torch.ones(3, 2, dtype=torch.int64), 1, 0, None, g)
    for field, kwargs in (
        ("n_byzantine", {"n_byzantine": -1}), ("n_byzantine", {"n_byzantine": 1.0}), ("f", {"f": -2}),
        ("f", {"f": True}), ("round", {"round": -1}),
    ):
        base: dict[str, Any] = {"honest": x, "n_byzantine": 1, "f": 0, "aggregator": None, "generator": g}
        base.update(kwargs)
        with pytest.raises(ConfigError, match=field):
            AttackContext(**base)
    with pytest.raises(ConfigError, match="aggregator"):
        AttackContext(x, 1, 0, "cwtm", g)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="generator"):
        AttackContext(x, 1, 0, None, 0)  # type: ignore[arg-type]
    ctx = AttackContext(x, 3, 1, None, g, round=5)
    assert (ctx.n_honest, ctx.n_byzantine, ctx.n_workers, ctx.dim, ctx.round) == (4, 3, 7, 3, 5)


def test_call_needs_a_context() -> None:
    with pytest.raises(InputError, match="AttackContext"):
        attacks.make("signflip")(torch.randn(3, 2))  # type: ignore[arg-type]


@pytest.mark.parametrize("name", VECTOR)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shape_dtype_and_no_side_effects(name: str, dtype: torch.dtype) -> None:
    honest = _honest(9, 6, dtype=dtype)
    before = honest.clone()
    out = attacks.make(name)(_ctx(honest, 3))
    assert out.shape == (3, 6)
    assert out.dtype == dtype and out.device == honest.device
    torch.testing.assert_close(honest, before, rtol=0, atol=0)
    # finite exactly when the attack declares it (read before the fill below, which would make every output finite)
    assert bool(torch.isfinite(out).all()) == (name not in GARBAGE)
    out.fill_(123.0)  # the output never aliases the honest rows
    torch.testing.assert_close(honest, before, rtol=0, atol=0)


@pytest.mark.parametrize("name", VECTOR)
def test_zero_byzantine_gives_zero_rows(name: str) -> None:
    honest = _honest(5, 4)
    out = attacks.make(name)(_ctx(honest, 0, f=1))
    assert out.shape == (0, 4)
    assert out.dtype == honest.dtype


@pytest.mark.parametrize("name", VECTOR)
def test_single_honest_row(name: str) -> None:
    honest = _honest(1, 5)
    agg = aggregators.make("mean", f=0)
    out = attacks.make(name)(_ctx(honest, 2, f=0, aggregator=agg))
    assert out.shape == (2, 5)
    if name not in GARBAGE:
        assert torch.isfinite(out).all()
    if name in ("none", "mimic", "minmax", "minsum"):  # one row: no spread to hide in, nothing else to copy
        torch.testing.assert_close(out, honest.expand(2, -1))
    if name == "alie":  # σ of one row is 0: ALIE sends the row itself
        torch.testing.assert_close(out, honest.expand(2, -1))


@pytest.mark.parametrize("name", VECTOR)
def test_deterministic_given_the_generator(name: str) -> None:
    honest = _honest(8, 7, seed=3)
    a = attacks.make(name)
    out1 = a(_ctx(honest, 3, seed=11))
    out2 = a(_ctx(honest, 3, seed=11))
    assert torch.equal(out1.nan_to_num(), out2.nan_to_num())
    other = a(_ctx(honest, 3, seed=12))
    # another seed: other vectors exactly when the attack declares that it draws (checked both ways)
    assert torch.equal(out1.nan_to_num(), other.nan_to_num()) != (name in RANDOM)


@pytest.mark.parametrize("name", VECTOR)
def test_float32_matches_float64(name: str) -> None:
    honest = _honest(10, 6, seed=5)
    a = attacks.make(name)
    out64 = a(_ctx(honest, 2, seed=1))
    out32 = a(_ctx(honest.float(), 2, seed=1))
    torch.testing.assert_close(out32.double(), out64, rtol=1e-4, atol=1e-4, equal_nan=True)


def test_half_precision_is_computed_in_float32() -> None:
    honest = _honest(6, 4).half()
    out = attacks.make("alie", z=1.0)(_ctx(honest, 2))
    assert out.dtype == torch.float16
    ref = attacks.make("alie", z=1.0)(_ctx(honest.float(), 2))
    torch.testing.assert_close(out.float(), ref, rtol=1e-3, atol=1e-3)


def test_honest_with_grad_is_not_tracked() -> None:
    honest = _honest(6, 4).requires_grad_(True)
    out = attacks.make("signflip")(_ctx(honest, 2))
    assert not out.requires_grad


def test_attacks_survive_robust_aggregation_pipeline() -> None:
    # The vectors are ready to be stacked under the honest ones and aggregated.
    honest = _honest(12, 8)
    rule = aggregators.make("cwtm", f=3)
    for name in VECTOR:
        byz = attacks.make(name)(_ctx(honest, 3, f=3, aggregator=rule))
        out = rule(torch.cat([honest, byz]))
        assert out.shape == (8,) and torch.isfinite(out).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", VECTOR)
def test_cuda_matches_cpu(name: str) -> None:
    honest = _honest(9, 6)
    cpu = attacks.make(name)(_ctx(honest, 3, seed=4))
    gpu = attacks.make(name)(_ctx(honest.cuda(), 3, seed=4))
    assert gpu.device.type == "cuda" and gpu.dtype == honest.dtype
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-6, atol=1e-6, equal_nan=True)
