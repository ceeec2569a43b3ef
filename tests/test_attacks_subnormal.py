"""The ``subnormal`` attack: what its rows are in every dtype, that a flushing thread cannot turn them into zeros,
that a training run takes it, and the smoke run of ``benchmarks/subnormal_training.py``. Tests never time: the
slowdown the attack aims at is measured by the benchmark (docs/benchmarks.md)."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch

from _scripts import load_script
from phalanx import attacks
from phalanx.aggregators._subnormals import denormals_are_zero
from phalanx.attacks.subnormal import Subnormal
from phalanx.errors import ConfigError

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _ctx(dtype: torch.dtype, b: int = 3, d: int = 4096, seed: int = 0) -> attacks.AttackContext:
    honest = torch.randn(6, d, generator=torch.Generator().manual_seed(99)).to(dtype)
    return attacks.AttackContext(honest=honest, n_byzantine=b, f=b, aggregator=None,
                                 generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_are_subnormals_of_the_dtype_with_both_signs(dtype: torch.dtype) -> None:
    ctx = _ctx(dtype)
    y = attacks.make("subnormal")(ctx)
    tiny = torch.finfo(dtype).tiny
    assert y.shape == (3, 4096) and y.dtype == dtype
    a = y.abs().to(torch.float64)
    assert bool(((a > 0) & (a < tiny)).all())
    assert 0.4 < float((y < 0).to(torch.float64).mean()) < 0.6  # the sign bit is drawn
    assert torch.equal(y, attacks.make("subnormal")(_ctx(dtype))), "the same seed gives the same rows"
    assert not torch.equal(y, attacks.make("subnormal")(_ctx(dtype, seed=1)))
    assert attacks.make("subnormal")(_ctx(dtype, b=0)).shape == (0, 4096)


@pytest.mark.parametrize("dtype", DTYPES)
def test_near_rows_are_normal_and_their_products_with_honest_entries_are_not(dtype: torch.dtype) -> None:
    y = attacks.make("subnormal", values="near")(_ctx(dtype))
    tiny = torch.finfo(dtype).tiny
    a = y.abs().to(torch.float64)
    assert bool(((a >= tiny) & (a <= 2 * tiny)).all())  # normal: a check of the input for subnormals sees none
    product = (y * torch.tensor(0.25, dtype=dtype)).abs().to(torch.float64)
    assert bool(((product > 0) & (product < tiny)).all())  # ... but a product with an entry of 1/4 is subnormal


def _arithmetic_sign(self: Subnormal, ctx: attacks.AttackContext) -> torch.Tensor:
    """Mutant: the sign put on by a multiplication, as a first version might."""
    y = Subnormal._run(self, ctx)
    return y.abs() * torch.where(y < 0, -1.0, 1.0).to(y.dtype)


def _made_on_a_flushing_thread(attack: Subnormal, dtype: torch.dtype) -> torch.Tensor:
    ctx = _ctx(dtype)
    with denormals_are_zero(ctx.honest):
        return attack(ctx)


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64))
def test_the_rows_are_subnormal_even_when_made_on_a_flushing_thread(dtype: torch.dtype) -> None:
    """A Byzantine worker's process may compute with flush-to-zero (a rule's context, a library's setting): the rows
    are built in the integers, so they are the same bits there. Mutant: a sign put on by arithmetic gives zeros."""
    attack = attacks.make("subnormal")
    assert isinstance(attack, Subnormal)
    reference = attack(_ctx(dtype))
    assert torch.equal(_made_on_a_flushing_thread(attack, dtype), reference)
    mutant = Subnormal()
    mutant._run = _arithmetic_sign.__get__(mutant)  # type: ignore[method-assign]
    assert torch.equal(mutant(_ctx(dtype)), reference)  # the same rows where nothing flushes
    with denormals_are_zero(reference):
        flushes = float(torch.tensor([torch.finfo(dtype).tiny / 4], dtype=dtype) * 1.0) == 0.0
    if flushes:  # a CPU with the modes (x86): the mutant's rows are zeros there
        assert bool((_made_on_a_flushing_thread(mutant, dtype) == 0).all())


def test_a_bad_value_kind_is_one_config_error() -> None:
    with pytest.raises(ConfigError, match="values"):
        attacks.make("subnormal", values="tiny")


def test_a_training_run_under_the_attack_keeps_the_flagged_rule_finite() -> None:
    from phalanx.experiments import from_config, make_config
    from phalanx.training.loop import run

    cfg = make_config({
        "dataset": "digits", "model": "mlp", "model_params": {"hidden": [16]}, "workers": 10, "byzantine": 2,
        "f": 2, "aggregator": "krum", "attack": "subnormal", "attack_params": {"values": "near"},
        "partition": "iid", "batch_size": 8, "lr": 0.1, "momentum": 0.9, "seed": 0, "rounds": 3, "eval_every": 3,
    })
    rows = run(from_config(cfg))
    assert [row["round"] for row in rows] == [0, 3]
    assert 0.0 <= rows[-1]["test_accuracy"] <= 1.0 and math.isfinite(rows[-1]["agg_error"])


def test_the_training_benchmark_runs_and_prints_every_rule(capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    bench: Any = load_script("benchmarks/subnormal_training.py", "phalanx_bench_subnormal_training")
    monkeypatch.setattr("sys.argv", ["subnormal_training.py", "--hidden", "8", "--rounds", "1", "--workers", "10",
                                     "--rules", "krum,nnm>cwtm,mean"])
    try:
        bench.main()
    finally:
        from phalanx.attacks.base import Attack

        Attack.__call__ = bench._untimed_call  # type: ignore[method-assign]
    out = capsys.readouterr().out
    assert "d = 610" in out
    for rule, flushes in [("krum", "yes"), ("nnm>cwtm", "yes"), ("mean", "no")]:
        line = next(line for line in out.splitlines() if line.startswith(rule + " "))
        assert line.split()[1] == flushes
        assert len(re.findall(r"\d+\.\d+x", line)) == 4, line
