"""Measured (f, κ)-robustness: the lower bound is certified, the mean is unbounded, the robust rules stay between the
universal bound f/(n−2f) and their proven bound, and bad settings are refused before any search."""

from __future__ import annotations

import importlib
import itertools
import math
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from phalanx import aggregators, cli
from phalanx.aggregators.base import Aggregator
from phalanx.aggregators.coordinatewise import CoordinateWiseMedian, CoordinateWiseTrimmedMean
from phalanx.analysis import kappa, proven_upper_bound, robustness_ratio, tension, universal_lower_bound
from phalanx.analysis.kappa import FAR, exact_ratio
from phalanx.errors import ConfigError

EPS = torch.finfo(torch.float64).eps
kappa_module = importlib.import_module("phalanx.analysis.kappa")  # the module (phalanx.analysis.kappa is the function)
PROVEN = ("cwtm", "cwmed", "geomed", "krum", "nnm>cwtm")


def _float_tolerance(est: Any) -> float:
    """What a float64 recomputation of the ratio may differ by: the rule's rounding at the input (``slack``) plus the
    ratio's own, (n + d)·eps relative, with a margin of 16."""
    return est.slack + 16 * (est.n + est.d) * EPS * est.value


@pytest.mark.parametrize("spec", ["cwtm", "krum", "geomed", "nnm>cwtm", "mda"])
def test_the_lower_bound_is_certified(spec: str) -> None:
    rule = aggregators.make(spec, f=2)
    est = kappa(rule, 7, d=3, budget=200, seed=3)
    assert est.input.shape == (7, 3) and est.input.dtype == torch.float64 and len(est.honest) == 7 - 2
    out = aggregators.make(spec, f=2)(est.input)  # a fresh rule: nothing of the search's state
    assert est.exact
    q = exact_ratio(out, est.input, est.honest)
    assert q is not None
    assert est.value <= q and float(q) - est.value <= abs(float(q)) * EPS  # rounded down, by at most one ulp
    assert robustness_ratio(out, est.input, est.honest) == pytest.approx(est.value, rel=0, abs=_float_tolerance(est))
    assert est.value >= max(v for k, v in est.per_family.items() if k != "search") * (1 - 1e-9) - 1e-12


def test_the_universal_construction_by_hand() -> None:
    # f rows at 1, n − f at 0: the trimmed mean gives 0, and S = {the f ones, n − 2f zeros} gives f/(n − 2f).
    n, f = 9, 3
    x = torch.zeros(n, 2, dtype=torch.float64)
    x[:f] = 1.0
    out = aggregators.make("cwtm", f=f)(x)
    assert robustness_ratio(out, x, list(range(n - f))) == pytest.approx(universal_lower_bound(n, f))
    assert robustness_ratio(out, x, list(range(f, n))) == 0.0


@pytest.mark.parametrize("f", [1, 2])
def test_the_mean_is_unbounded(f: int) -> None:
    est = kappa(aggregators.make("mean", f=f), 7, d=3, budget=300, seed=0)
    assert est.unbounded and est.verdict == "unbounded" and est.upper_bound is None
    ratios = [est.by_distance[t] for t in FAR]
    assert all(b > a for a, b in itertools.pairwise(ratios))  # it grows with the distance of the Byzantine point…
    for (t1, r1), (t2, r2) in itertools.pairwise(zip(FAR, ratios)):
        assert r2 / r1 >= 0.5 * (t2 / t1) ** 2  # … as its square: the mean moves by f·t/n
    assert est.value >= ratios[-1] * (1 - 1e-9)


def test_a_robust_rule_saturates_where_the_mean_does_not() -> None:
    est = kappa(aggregators.make("cwtm", f=2), 7, d=3, budget=300, seed=0)
    assert not est.unbounded and est.verdict == "certified"
    ratios = [est.by_distance[t] for t in FAR]
    assert max(ratios) - min(ratios) <= 16 * 7 * EPS * max(ratios)  # far Byzantine rows are trimmed whatever t is


def test_f_zero_is_rounding_for_the_trimmed_mean() -> None:
    est = kappa(aggregators.make("cwtm", f=0), 6, d=2, budget=100)
    assert est.rounding and est.verdict == "rounding" and est.value <= est.slack
    assert est.upper_bound == 0.0 and not est.above_upper


@pytest.mark.parametrize("n, f", [(7, 1), (7, 2), (9, 3)])
@pytest.mark.parametrize("spec", PROVEN)
def test_measured_between_the_universal_and_the_proven_bound(spec: str, n: int, f: int) -> None:
    rule = aggregators.make(spec, f=f)
    est = kappa(rule, n, d=3, budget=250, seed=1)
    upper = proven_upper_bound(rule, n)
    assert upper is not None and est.upper_bound == upper
    assert not est.above_upper and est.value <= upper + est.slack, (spec, n, f, est.value, upper)
    # every (f, κ)-robust rule has κ ≥ f/(n − 2f), and the search reaches it (the construction behind the bound)
    assert est.lower_bound == pytest.approx(f / (n - 2 * f))
    assert est.value >= est.lower_bound - _float_tolerance(est), (spec, n, f, est.value)


def test_equal_honest_rows_do_not_make_an_iterative_rule_unbounded() -> None:
    """Four equal honest rows and three far Byzantine ones: Weiszfeld's geometric median stops within its tolerance of
    them, a positive error over a zero spread. Scored as the search scores it (below the spread floor: 0), not as an
    unbounded κ above the proven 64 (``phalanx tension theory -n 7 --measure`` printed geomed f = 3 "inf")."""
    est = kappa(aggregators.make("geomed", f=3), 7, d=10, budget=30, seed=0)
    assert not est.unbounded and not est.above_upper and math.isfinite(est.value)


def test_known_values() -> None:
    # the trimmed mean meets the universal bound; the median (n = 7, f = 1) pays 0.8 > 1/5 on a line input
    cwtm = kappa(aggregators.make("cwtm", f=2), 7, d=2, budget=200)
    assert cwtm.value == pytest.approx(2 / 3, rel=1e-12)
    med = kappa(aggregators.make("cwmed", f=1), 7, d=2, budget=300)
    assert med.value >= 0.8 - _float_tolerance(med)


def test_nnm_bound_is_the_composition_lemma() -> None:
    n, f = 9, 2
    inner = aggregators.make("cwtm", f=f).kappa(n)
    assert inner is not None
    assert proven_upper_bound(aggregators.make("nnm>cwtm", f=f), n) == pytest.approx(8 * f / (n - f) * (inner + 1))
    assert proven_upper_bound(aggregators.make("nnm(f=1)>cwtm", f=f), n) is None  # the lemma needs NNM's f = f
    assert proven_upper_bound(aggregators.make("mda", f=f), n) is None


class _Overclaiming(CoordinateWiseMedian):
    """The median with a κ far below what it pays: the search must call it out."""

    def kappa(self, n: int) -> float | None:
        return 0.01


def test_a_measured_value_above_the_claimed_bound_is_flagged() -> None:
    est = kappa(_Overclaiming(f=1), 7, d=2, budget=150)
    assert est.above_upper and est.verdict.startswith("BUG")


class _NanOnFarRows(CoordinateWiseTrimmedMean):
    """The trimmed mean (proven κ) with an overflow bug: NaN once a row is far (the reviewer's mutant)."""

    name = "nan-tm"

    def _run(self, x: torch.Tensor, want: bool, **ctx: Any) -> Any:
        out, c = super()._run(x, want, **ctx)
        if float(x.abs().max()) > 1e3:
            out = torch.full_like(out, float("nan"))
        return out, c


def test_a_non_finite_output_of_a_rule_with_a_proven_kappa_is_a_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    """A NaN output gave value = slack = +inf, so ``inf > upper + inf`` was False: 'unbounded', exit 0, for a rule
    that claims a finite κ. It is a bug, named as a non-finite output (not a ratio that grows)."""
    est = kappa(_NanOnFarRows(f=1), 7, d=2, budget=300)
    assert est.upper_bound is not None and math.isfinite(est.upper_bound)
    assert est.above_upper and not est.output_finite and est.verdict == "BUG: non-finite output"
    monkeypatch.setattr(aggregators, "make", lambda spec, f: _NanOnFarRows(f=f))
    res = CliRunner().invoke(cli.app, ["kappa", "nan-tm", "-n", "7", "-f", "1", "-d", "2", "--budget", "300"])
    assert res.exit_code == 1 and "non-finite output" in res.output and "not finite" in res.output, res.output


class _NanEverySecondCall(aggregators.make("cwtm", f=1).__class__):  # type: ignore[misc]
    """cwtm (proven κ) whose every second call returns NaN: the search saw NaN, but the best input called again
    gave a finite output, and the verdict was 'unbounded', exit 0 (a review)."""

    calls = 0

    def _run(self, x: torch.Tensor, want: Any, **ctx: Any) -> Any:
        out, c = super()._run(x, want, **ctx)
        type(self).calls += 1
        return (torch.full_like(out, math.nan) if type(self).calls % 2 == 0 else out), c


def test_a_rule_with_a_proven_kappa_that_is_ever_non_finite_or_unbounded_is_a_bug() -> None:
    est = kappa(_NanEverySecondCall(f=2), 7, d=2, budget=300)
    assert est.above_upper and not est.output_finite and est.verdict == "BUG: non-finite output"


def test_deterministic_for_a_seed() -> None:
    a = kappa(aggregators.make("krum", f=1), 7, d=3, budget=300, seed=5)
    b = kappa(aggregators.make("krum", f=1), 7, d=3, budget=300, seed=5)
    assert a.value == b.value and a.honest == b.honest and a.worst_input == b.worst_input
    assert torch.equal(a.input, b.input) and a.evaluations == b.evaluations == 300


def test_a_stochastic_rule_is_measured_as_a_fixed_function() -> None:
    est = kappa(aggregators.make("bucketing(s=2)>cwtm", f=1), 7, d=2, budget=120, seed=2)
    again = kappa(aggregators.make("bucketing(s=2)>cwtm", f=1), 7, d=2, budget=120, seed=2)
    assert est.value == again.value


@pytest.mark.parametrize("kwargs, key", [
    ({"n": 6, "f": 3}, "f"), ({"n": 7, "f": 4}, "f"), ({"n": 0, "f": 0}, "n"), ({"n": 7, "f": 1, "d": 0}, "d"),
    ({"n": 7, "f": 1, "budget": 0}, "budget"), ({"n": 7, "f": 1, "seed": 1.5}, "seed"), ({"n": 7, "f": -1}, "f"),
])
def test_bad_settings_are_refused_before_any_search(kwargs: dict[str, Any], key: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def no_search(*args: Any, **kw: Any) -> None:
        raise AssertionError("a search started")

    monkeypatch.setattr(kappa_module, "_Search", no_search)
    f = kwargs.pop("f")
    n = kwargs.pop("n")
    rule = aggregators.make("mean", f=0)
    rule.f = f  # what a plug-in rule could hold: kappa() checks it as it checks n
    with pytest.raises(ConfigError, match=rf"^{key}="):
        kappa(rule, n, **kwargs)
    with pytest.raises(ConfigError, match="n=8"):  # below the rule's own requirement
        kappa(aggregators.make("krum", f=3), 8)


def test_universal_lower_bound_validation() -> None:
    assert universal_lower_bound(10, 4) == 2.0 and universal_lower_bound(5, 0) == 0.0
    with pytest.raises(ConfigError, match="f"):
        universal_lower_bound(10, 5)


def test_cli() -> None:
    runner = CliRunner()
    res = runner.invoke(cli.app, ["kappa", "cwtm", "-n", "7", "-f", "2", "-d", "3", "--budget", "150"])
    assert res.exit_code == 0, res.output
    assert "measured κ ≥ 0.6667 (certified); proven κ ≤ 6.667" in res.output and "f/(n−2f) = 0.6667" in res.output
    res = runner.invoke(cli.app, ["kappa", "mean", "-n", "7", "-f", "1", "-d", "2", "--budget", "200"])
    assert res.exit_code == 0 and "measured κ unbounded" in res.output


@pytest.mark.parametrize("argv, line", [
    (["kappa", "cwtm", "-n", "6", "-f", "3"], "f=3 is invalid: allowed 0 <= f < n/2 = 3 (with n = 6)"),
    (["kappa", "cwtm", "-n", "0", "-f", "0"], "n=0 is invalid"),
    (["kappa", "cwtm", "-n", "6", "-d", "0"], "d=0 is invalid"),
    (["kappa", "cwtm", "-n", "6", "--budget", "0"], "budget=0 is invalid"),
    (["kappa", "nope", "-n", "6", "-f", "1"], "aggregator='nope' is invalid"),
])
def test_cli_bad_input_is_one_line(argv: list[str], line: str, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", ["phalanx", *argv])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 2
    out = capsys.readouterr().out
    assert line in out and "Traceback" not in out and len(out.strip().splitlines()) == 1


def test_theory_table_measures_kappa() -> None:
    rows = tension.theory_table(7, ["cwtm", "mean"], measure=True, trials=5, kappa_budget=150, d=2)
    by = {(r.rule, r.f): r for r in rows}
    for f in (1, 2, 3):
        r = by[("cwtm", f)]
        assert r.kappa_bound == pytest.approx(f / (7 - 2 * f))
        assert r.kappa_measured is not None and r.kappa is not None
        assert r.kappa_bound - 1e-12 <= r.kappa_measured <= r.kappa
        assert by[("mean", f)].kappa_unbounded and tension.kappa_cell(by[("mean", f)]) == "unbounded"
    assert tension.kappa_cell(by[("cwtm", 0)]) == "0 (rounding)"
    md = tension.to_markdown(rows, 7)
    assert "| κ (proven) | κ (measured lower bound) |" in md
    assert "| cwtm | 2 | 0.4 | 0.4 | ≥ 0.4 | 0.6667 | 6.667 | ≥ 0.6667 |" in md
    # no 'unbounded' ε for rules whose ε is proven finite: a construction on a line (d = 2) made NaN rows once
    assert "| mean | 1 | 0.1667 | 0 | 0 (rounding) |" in md and "| cwtm | 0 | 0 | 0 | 0 (rounding) |" in md
    assert math.isfinite(by[("cwtm", 3)].kappa_measured or math.inf)


def test_the_budget_bounds_the_work_for_a_large_n() -> None:
    # 1 + the splits of 181 honest rows × 21 distances would be thousands of inputs: only the budget's are made
    est = kappa(aggregators.make("cwtm", f=20), 201, d=2, budget=40)
    assert est.evaluations == 40 and len(est.honest) == 181 and list(est.honest) == sorted(est.honest)
    assert not est.exact or est.n * est.d <= kappa_module.EXACT_MAX
    splits = kappa_module.line_splits(201, 181)
    assert splits[0] == 0 and {1, 180, 181, 20, 161, 90} <= set(splits) and len(splits) <= kappa_module.LINE_SPLITS
    assert kappa_module.line_splits(10, 8) == list(range(9))


def test_a_rule_that_needs_more_than_the_rows_is_noted_not_a_crash() -> None:
    """FLTrust needs the server's reference gradient per call: the theory table says so for its rows and measures
    the others (it stopped the whole `tension theory --measure --rules fltrust,…`)."""
    rows = tension.theory_table(5, ["fltrust", "cwtm"], measure=True, trials=3, kappa_budget=20, d=2)
    assert all(r.note == "not measured: needs reference per call" for r in rows if r.rule == "fltrust")
    assert all(r.kappa_measured is not None for r in rows if r.rule == "cwtm")


def test_a_budget_that_ends_before_the_far_inputs_says_boundedness_was_not_tested() -> None:
    """With 40 evaluations the mean's line reached 10⁴·u on one split only: 'certified ≥ 7.3e7' read as a bounded
    κ. Only splits whose honest rows spread, scored at the last three distances, decide it."""
    small = kappa(aggregators.make("mean", f=3), 10, d=10, budget=40)
    assert not small.unbounded and not small.unbounded_tested
    enough = kappa(aggregators.make("mean", f=3), 10, d=10, budget=80)
    assert enough.unbounded and enough.unbounded_tested
    assert kappa(aggregators.make("cwtm", f=3), 10, d=10, budget=200).unbounded_tested


class _TopTrim(Aggregator):
    """The reviewer's mutant: trims the 2f largest values per coordinate and none of the smallest — unbounded towards
    −u only."""

    name = "toptrim"
    requirement = "n > 2f"

    def min_workers(self) -> int:
        return 2 * self.f + 1

    def _run(self, x: torch.Tensor, want: bool, **ctx: Any) -> Any:
        return x.sort(dim=0).values[: x.shape[0] - 2 * self.f].mean(dim=0), None


def test_a_rule_unbounded_on_one_side_only_is_unbounded() -> None:
    """The far sweep moved the Byzantine point to +t·u only: this rule was 'certified' with unbounded_tested, though a
    row at −10⁶·e₁ gives a ratio of 1.6·10¹¹. Both sides are swept, and boundedness needs both."""
    est = kappa(_TopTrim(f=1), 7, d=2, budget=300)
    assert est.unbounded and est.verdict == "unbounded", (est.verdict, est.value)
    assert est.by_distance[-FAR[-1]] > est.by_distance[-FAR[0]] * 1e7  # it grows as t² on the negative side
    assert kappa_module._growth({("e1", 1, t): 1.0 for t in FAR}, 3) == (False, False)  # one side: not tested
