"""``fangkrum``: Fang et al.'s full-knowledge attack on Krum (USENIX Security 2020, §4) — its rows, its search against
Phalanx's own Krum, the mutants that show the property checks can fail, degenerate inputs and its parameter."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from phalanx import aggregators, attacks
from phalanx.attacks import AttackContext, FangKrum
from phalanx.attacks.fangkrum import fang_krum_bound
from phalanx.errors import ConfigError

H, B, F, D = 16, 4, 4, 50
"""The standard setting: n = 20 workers of which 4 attack, Krum configured for f = 4, d = 50."""


def _honest(h: int = H, d: int = D, seed: int = 0, shift: float = 0.3,
            dtype: torch.dtype = torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(h, d, generator=g, dtype=torch.float64) + shift).to(dtype)


def _ctx(honest: torch.Tensor, b: int = B, f: int = F, seed: int = 0, **kwargs: Any) -> AttackContext:
    return AttackContext(honest, b, f, None, torch.Generator().manual_seed(seed), **kwargs)


def _krum_choice(honest: torch.Tensor, byz: torch.Tensor, f: int) -> int:
    """The row Phalanx's Krum (configured for ``f``) selects from the honest rows followed by the Byzantine ones."""
    x = torch.cat([honest, byz.to(honest.dtype)])
    weights = aggregators.make("krum", f=f).contributions(x)
    return int(torch.argmax(weights))


def _byzantine_selected(honest: torch.Tensor, byz: torch.Tensor, f: int) -> bool:
    """The property: Krum's output is one of the Byzantine rows."""
    return _krum_choice(honest, byz, f) >= honest.shape[0]


def _moves_against_the_mean(honest: torch.Tensor, byz: torch.Tensor, f: int) -> bool:
    """The property: under attack Krum's output has a negative projection on s = sign(ḡ), and a smaller one than
    Krum's output on the honest rows alone."""
    s = torch.sign(honest.double().mean(0))
    krum = aggregators.make("krum", f=f)
    attacked = float(krum(torch.cat([honest, byz.to(honest.dtype)])).double() @ s)
    alone = float(krum(honest).double() @ s)
    return attacked < 0.0 and attacked < alone


def _sent(honest: torch.Tensor, lam: float, b: int = B) -> torch.Tensor:
    """``b`` copies of ``−λ·sign(ḡ)``: the attack's row for a given λ (the mutants' rows)."""
    return (-lam * torch.sign(honest.double().mean(0))).expand(b, -1).to(honest.dtype)


def _lambda_of(honest: torch.Tensor, byz: torch.Tensor) -> float:
    """The λ of rows ``−λ·s`` (read off the rows: −⟨y, s⟩/‖s‖²)."""
    s = torch.sign(honest.double().mean(0))
    return float(-(byz[0].double() @ s) / (s @ s))


def _the_attack_holds(honest: torch.Tensor, byz: torch.Tensor, f: int) -> bool:
    """What the attack claims, checked on its rows and Phalanx's Krum alone: the rows are copies of −λ·s; Krum
    selects one of them; Krum would not select rows twice as far along −s (λ is the largest Krum accepts, up to the
    halving grid's factor 2); the aggregate moves against sign(ḡ)."""
    lam = _lambda_of(honest, byz)
    return (torch.allclose(byz.double(), _sent(honest, lam, byz.shape[0]).double(), rtol=1e-3, atol=1e-12)
            and _byzantine_selected(honest, byz, f)
            and not _byzantine_selected(honest, _sent(honest, 2.0 * lam, byz.shape[0]), f)
            and _moves_against_the_mean(honest, byz, f))


# --- its rows --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64], ids=str)
def test_rows_are_b_copies_of_minus_lambda_sign_in_the_honest_dtype(dtype: torch.dtype) -> None:
    honest = _honest(dtype=dtype)
    before = honest.clone()
    attack = FangKrum()
    out = attack(_ctx(honest))
    found, s = attack.search(_ctx(honest))
    assert out.shape == (B, D) and out.dtype == dtype and out.device == honest.device
    assert torch.equal(honest, before)  # the honest rows are not modified
    assert found.accepted and found.lam > 0.0
    assert torch.equal(out, (s * -found.lam).to(dtype).expand(B, -1))  # every row −λ·s, λ exactly as checked
    assert set(s.unique().tolist()) <= {-1.0, 0.0, 1.0}
    out.fill_(7.0)  # the output never aliases the honest rows
    assert torch.equal(honest, before)


def test_the_same_generator_gives_the_same_rows_and_another_changes_nothing() -> None:
    honest = _honest(seed=3)
    attack = attacks.make("fangkrum")
    first, again, other = (attack(_ctx(honest, seed=seed)) for seed in (11, 11, 12))
    assert torch.equal(first, again)
    assert torch.equal(first, other)  # it draws nothing: a function of the honest rows and f alone
    assert not FangKrum.stochastic and not FangKrum.needs_aggregator and FangKrum.finite
    info = attack.describe()
    assert info["name"] == "fangkrum" and info["params"] == {"threshold": 1e-5}
    assert "omniscient" in info["threat"] and "USENIX Security 2020" in info["reference"]


def test_no_byzantine_worker_gives_no_row() -> None:
    out = FangKrum()(_ctx(_honest(), b=0))
    assert out.shape == (0, D)


# --- against Phalanx's Krum ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("shift", [0.0, 0.3, 1.0])
def test_krum_selects_a_byzantine_row_on_the_standard_setting(seed: int, shift: float) -> None:
    """n = 20, f = 4, d = 50 Gaussian honest rows: the row Krum (f = 4) outputs is one of the 4 Byzantine rows, rows
    twice as far along −s would not be, and the aggregate moves against sign(ḡ), below Krum's output on the honest
    rows alone (:func:`_the_attack_holds`)."""
    honest = _honest(seed=seed, shift=shift)
    byz = FangKrum()(_ctx(honest))
    assert _byzantine_selected(honest, byz, F)
    assert _moves_against_the_mean(honest, byz, F)
    assert _the_attack_holds(honest, byz, F)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_krum_selects_a_byzantine_row_in_lower_precision(dtype: torch.dtype) -> None:
    honest = _honest(seed=2, dtype=dtype)
    assert _the_attack_holds(honest, FangKrum()(_ctx(honest)), F)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("shift", [0.0, 0.3, 1.0])
def test_the_checks_reject_their_mutants(seed: int, shift: float) -> None:
    """The property checks are not vacuous: each mutant attack fails one. No search (λ₀, the upper bound, sent as
    is) and twice the λ found (the grid point the search rejected just before): Krum selects an honest row.
    λ = 0 (the zero update): the aggregate does not move against sign(ḡ) (its projection is 0). A search that
    always gives up (λ just below the threshold): Krum would accept twice that λ too, so it is not the largest."""
    honest = _honest(seed=seed, shift=shift)
    found, _ = FangKrum().search(_ctx(honest))
    assert found.accepted and found.evaluations >= 2  # at least one candidate rejected before the one sent
    assert not _byzantine_selected(honest, _sent(honest, found.bound), F)
    assert not _byzantine_selected(honest, _sent(honest, 2.0 * found.lam), F)
    assert not _moves_against_the_mean(honest, _sent(honest, 0.0), F)
    for lam in (found.bound, 2.0 * found.lam, 0.0, 0.9e-5 * found.bound):
        assert not _the_attack_holds(honest, _sent(honest, lam), F), lam
    assert _the_attack_holds(honest, _sent(honest, found.lam), F)  # the attack's own λ, for contrast


@pytest.mark.parametrize("seed", range(4))
def test_lambda_is_the_first_point_of_the_halving_grid_that_krum_accepts(seed: int) -> None:
    honest = _honest(seed=seed, shift=1.0)  # a larger mean: several halvings before Krum accepts
    found, _ = FangKrum().search(_ctx(honest))
    k = found.evaluations - 1
    assert found.lam == found.bound * 2.0 ** -k
    for j in range(k):  # every earlier (larger) candidate: Krum selects an honest row
        assert not _byzantine_selected(honest, _sent(honest, found.bound * 2.0 ** -j), F)


@pytest.mark.parametrize("case", range(24))
def test_the_searchs_krum_choice_is_the_real_krums(case: int) -> None:
    """The search checks each λ on distances computed once (‖xᵢ + λs‖² expanded): whether it accepted agrees with
    Krum run on the stacked rows, for varied h, b, f (f ≠ b included), d and means — accepted and given-up alike."""
    g = torch.Generator().manual_seed(100 + case)
    h = int(torch.randint(5, 15, (), generator=g))
    b = int(torch.randint(1, 5, (), generator=g))
    f = int(torch.randint(0, (h + b - 3) // 2 + 1, (), generator=g))
    d = int(torch.randint(1, 40, (), generator=g))
    shift = [0.0, 0.5, 2.0, 4.0][case % 4]
    honest = _honest(h, d, seed=case, shift=shift, dtype=torch.float32 if case % 3 else torch.float64)
    found, _ = FangKrum().search(_ctx(honest, b=b, f=f))
    byz = FangKrum()(_ctx(honest, b=b, f=f))
    assert _byzantine_selected(honest, byz, f) == found.accepted, (h, b, f, d, shift, found)


def test_a_mean_far_from_the_zero_update_makes_it_give_up_below_the_threshold() -> None:
    """Its rows lie near the zero update (the paper's unchanged global model): honest rows whose mean is large
    against their spread are closer to each other than to it, Krum never selects it, and the search gives up with
    the first λ below the threshold (relative: τ·λ₀) — after ⌊log₂(1/τ)⌋ + 2 evaluations, that λ included."""
    honest = _honest(seed=0, shift=3.0)
    attack = FangKrum()
    found, _ = attack.search(_ctx(honest))
    assert not found.accepted and 0.0 < found.lam < 1e-5 * found.bound <= 2.0 * found.lam
    assert found.evaluations == math.floor(math.log2(1e5)) + 2 == 18
    assert not _byzantine_selected(honest, attack(_ctx(honest)), F)
    coarse, _ = FangKrum(threshold=0.1).search(_ctx(honest))
    assert 0.05 * coarse.bound <= coarse.lam < 0.1 * coarse.bound and coarse.evaluations == 5


def test_the_colluders_search_runs_on_the_rows_they_see() -> None:
    """With ``attack_knowledge = "colluders"`` (the paper's partial knowledge) Krum is evaluated on the colluders' own
    honest rows and the crafted ones: the server's n (``ctx.workers``) changes nothing."""
    own = _honest(h=B, seed=5)
    seen = FangKrum()(_ctx(own, f=2, knowledge="colluders", workers=H + B))
    assert torch.equal(seen, FangKrum()(_ctx(own, f=2)))
    found, _ = FangKrum().search(_ctx(own, f=2))
    assert found.accepted and _byzantine_selected(own, seen, 2)  # Krum on the 2b rows (f = 2: n = 8 > 2f + 2)


# --- the bound -------------------------------------------------------------------------------------------------------


def _bound_by_loops(x: torch.Tensor, c: int) -> float:
    """The paper's bound written out: Γ̃ᵢ the m − c − 2 honest rows nearest to xᵢ, D(wᵢ, w_Re) = ‖xᵢ‖."""
    h, d = x.shape
    m = h + c
    sums = []
    for i in range(h):
        others = sorted(float(torch.linalg.vector_norm(x[j] - x[i])) for j in range(h) if j != i)
        sums.append(sum(others[: max(m - c - 2, 0)]))
    far = max(float(torch.linalg.vector_norm(x[i])) for i in range(h))
    return min(sums) / (max(m - 2 * c - 1, 1) * math.sqrt(d)) + far / math.sqrt(d)


@pytest.mark.parametrize(("h", "c", "d"), [(16, 4, 50), (9, 2, 7), (5, 3, 4), (2, 1, 3), (1, 2, 5), (3, 1, 1)])
def test_the_bound_is_the_papers_upper_bound(h: int, c: int, d: int) -> None:
    """min over honest rows of the summed distances to its h − 2 nearest honest rows over (m − 2c − 1)√d, plus the
    largest honest norm over √d; divisor 1 where m − 2c − 1 ≤ 0 (Phalanx's choice: (5, 3), (1, 2))."""
    x = _honest(h, d, seed=h * d + c)
    assert fang_krum_bound(x, c) == pytest.approx(_bound_by_loops(x, c), rel=1e-12)


# --- degenerate inputs -----------------------------------------------------------------------------------------------


def test_identical_honest_rows_give_finite_rows_and_a_given_up_search() -> None:
    honest = torch.full((8, 6), 0.5, dtype=torch.float64)
    found, s = FangKrum().search(_ctx(honest, b=2, f=2))
    assert not found.accepted and found.lam < 1e-5 * found.bound  # copies of one row score 0: Krum keeps an honest one
    out = FangKrum()(_ctx(honest, b=2, f=2))
    assert torch.isfinite(out).all() and torch.equal(out, (s * -found.lam).expand(2, -1))


def test_zero_honest_rows_have_no_direction_and_send_zeros_without_a_search() -> None:
    honest = torch.zeros(6, 4)
    found, _ = FangKrum().search(_ctx(honest, b=2, f=1))
    assert (found.lam, found.bound, found.accepted, found.evaluations) == (0.0, 0.0, False, 0)
    assert torch.equal(FangKrum()(_ctx(honest, b=2, f=1)), torch.zeros(2, 4))


def test_a_zero_mean_coordinate_gets_zero() -> None:
    honest = torch.tensor([[1.0, 2.0], [-1.0, 0.5], [3.0, 1.0], [-3.0, 1.5], [0.0, 1.0]], dtype=torch.float64)
    out = FangKrum()(_ctx(honest, b=2, f=1))
    assert (out[:, 0] == 0).all() and (out[:, 1] <= 0).all()


@pytest.mark.parametrize(("h", "b", "f", "d"), [(1, 1, 0, 1), (1, 3, 0, 2), (2, 1, 5, 3), (4, 1, 0, 1), (3, 4, 9, 2)])
def test_tiny_shapes_and_an_f_krum_would_refuse_run_to_finite_rows(h: int, b: int, f: int, d: int) -> None:
    """One honest row, d = 1, and n < f + 2 (a Krum the server's rule would refuse: 0 neighbours, its tie-break
    decides) — finite rows, no error."""
    out = FangKrum()(_ctx(_honest(h, d, seed=h + d), b=b, f=f))
    assert out.shape == (b, d) and torch.isfinite(out).all()


@pytest.mark.parametrize(("scale", "dtype"), [(1e30, torch.float32), (1e150, torch.float64), (1e300, torch.float64)])
@pytest.mark.parametrize("threshold", [1e-5, 2.0 ** -10, 0.1])
def test_huge_honest_values_keep_the_search_bounded(scale: float, dtype: torch.dtype, threshold: float) -> None:
    """Huge honest norms and a mean far from the zero update (it gives up): at most ⌈log₂(1/τ)⌉ + 2 Krum checks,
    whatever λ₀ (an absolute τ = 10⁻⁵ made 518 at norms near 10¹⁵⁰, each O(n²))."""
    honest = (_honest(seed=1, shift=3.0) * scale).to(dtype)
    found, _ = FangKrum(threshold).search(_ctx(honest))
    assert not found.accepted and found.bound > scale
    assert 0 < found.evaluations <= math.ceil(math.log2(1.0 / threshold)) + 2
    assert torch.isfinite(FangKrum(threshold)(_ctx(honest))).all()


def test_half_precision_that_would_overflow_is_skipped_not_sent() -> None:
    """A candidate λ beyond float16's range would be sent as ±inf: it is not a candidate (counted, never accepted)."""
    honest = (_honest(h=6, d=3, seed=2, shift=0.0) * 3e4).half()
    found, _ = FangKrum().search(_ctx(honest, b=2, f=1))
    assert found.bound > torch.finfo(torch.float16).max and found.evaluations >= 2  # λ₀ itself was skipped
    assert found.accepted and math.isfinite(found.lam)
    assert torch.isfinite(FangKrum()(_ctx(honest, b=2, f=1))).all()


def test_a_non_finite_honest_row_does_not_raise() -> None:
    honest = _honest(h=6, d=3, seed=4)
    honest[2, 1] = float("inf")
    found, _ = FangKrum().search(_ctx(honest, b=2, f=1))
    assert found.evaluations == 0 and not found.accepted


# --- the review's findings: scale, overflow, ties ---------------------------------------------------------------


@pytest.mark.parametrize("scale", [1e-4, 1e-5, 1e-6, 1e-12, 1e12])
def test_the_attack_is_the_same_at_every_gradient_scale(scale: float) -> None:
    """The threshold is relative to λ₀: the standard setting scaled by c gives λ scaled by c, accepted by Krum (an
    absolute 10⁻⁵ checked nothing at c = 10⁻⁶ and sent λ₀, which Krum rejects, and at c = 10⁻⁵ reported
    ``accepted=False`` for a row Krum selects)."""
    base = _honest()
    reference, _ = FangKrum().search(_ctx(base))
    honest = base * scale
    found, _ = FangKrum().search(_ctx(honest))
    rows = FangKrum()(_ctx(honest))
    assert found.accepted and _byzantine_selected(honest, rows, F)
    assert found.evaluations == reference.evaluations
    assert found.lam == pytest.approx(reference.lam * scale, rel=1e-12)


def test_finite_float64_rows_whose_squares_overflow_are_searched() -> None:
    """Rows of norm ≈ 10¹⁶¹: their squared distances overflow float64 (the server's Krum sees every row as bad and
    keeps row 0), the search's scaled ones do not — a finite λ₀, a search, finite rows, and ``accepted`` what the
    server's Krum does with them (an unscaled bound was ``inf``, and zeros were sent unsearched)."""
    honest = _honest() * 1e160
    found, _ = FangKrum().search(_ctx(honest))
    assert math.isfinite(found.bound) and found.bound == pytest.approx(fang_krum_bound(_honest(), B) * 1e160)
    assert found.evaluations > 0 and found.lam > 0.0
    rows = FangKrum()(_ctx(honest))
    assert torch.isfinite(rows).all() and _byzantine_selected(honest, rows, F) == found.accepted


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_accepted_is_the_servers_choice_on_an_exact_tie(dtype: torch.dtype) -> None:
    """Six identical honest rows and b = h = 6 copies, f = 3: both clusters score the same in exact arithmetic, and
    Krum's index tie-break keeps an honest row. The search's expanded distances round the other way; what it
    reports is what the server's Krum does with the rows sent."""
    g = torch.Generator().manual_seed(4338)
    honest = ((torch.randn(1, 60, generator=g, dtype=torch.float64) + 3.0) * 26572.9).repeat(6, 1).to(dtype)
    found, _ = FangKrum().search(_ctx(honest, b=6, f=3))
    rows = FangKrum()(_ctx(honest, b=6, f=3))
    assert _byzantine_selected(honest, rows, 3) == found.accepted


# --- its parameter ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0.0, -1e-5, float("nan"), float("inf"), True, "1e-5", None])
def test_a_bad_threshold_is_refused_at_construction_in_one_line(value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        attacks.make("fangkrum", threshold=value)
    assert info.value.parameter == "threshold"
    assert "threshold" in str(info.value) and "> 0" in str(info.value) and "\n" not in str(info.value)


def test_an_unknown_parameter_names_the_accepted_one() -> None:
    with pytest.raises(ConfigError, match="parameters of fangkrum: threshold"):
        attacks.make("fangkrum", lam=1.0)
