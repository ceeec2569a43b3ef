"""Issue 35 item 2: each LoRA mode's κ in the space of the layers' updates — the proven bounds hold against the
search, the mutant wrapper that ignores f is caught, mode ``factors`` is unbounded by an exact construction.

Budgets are small (tens of evaluations on 7 clients, two layers of rank 2): seconds, not a study.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from phalanx import aggregators
from phalanx.aggregators.lora import AdapterUpdates, updates_of
from phalanx.analysis.lora_kappa import (
    MEASURED_MODES,
    factor_constructions,
    lora_kappa,
    proven,
    setting,
    shared_bound,
    shared_scales,
)
from phalanx.errors import ConfigError

N, F = 7, 2
CWTM = aggregators.make("cwtm", f=F)


@pytest.mark.parametrize("mode", ["update", "update-truncated", "shared"])
def test_measured_kappa_never_exceeds_the_proven_one_and_the_mutant_that_ignores_f_does(mode: str) -> None:
    """The proven κ (κ_F for ``shared`` and ``update``, (1 + 2√κ_F)² after the truncation) is not exceeded by the
    certified value the search finds (which reaches the universal f/(n − 2f) at least); the wrapper whose inner
    rule ignores f (cwtm with f = 0: the mean) is flagged above it on the same search."""
    k = lora_kappa(CWTM, mode, n=N, budget=60)
    assert k.proven is not None and not k.above_proven and k.verdict == "certified"
    assert k.lower_bound - 1e-12 <= k.value <= k.proven + k.slack
    s = setting(0)
    mutant = AdapterUpdates(CWTM.with_f(0), s.layout) if mode.startswith("update") else CWTM.with_f(0)
    bad = lora_kappa(CWTM, mode, n=N, budget=60, wrapper=mutant)
    assert bad.above_proven and bad.verdict.startswith("BUG") and bad.value > 1e3 * k.proven


@pytest.mark.parametrize("mode", ["update", "shared"])
def test_measured_epsilon_reaches_cwtms_exact_epsilon_and_a_wrapper_trimming_more_exceeds_it(mode: str) -> None:
    """ε (S = every row) carries over like κ: cwtm's ε = f/(n − f) (Yang, Shi & Li, Theorem 3.6) is attained and not
    exceeded; the mutant wrapper whose inner rule trims f + 1 per side (the median at n = 7) while the wrapper claims
    cwtm's ε is flagged above it."""
    k = lora_kappa(CWTM, mode, n=N, budget=60, quantity="epsilon")
    assert k.proven == pytest.approx(F / (N - F)) and not k.above_proven
    assert k.value == pytest.approx(F / (N - F), rel=1e-9)
    s = setting(0)
    more = CWTM.with_f(F + 1)
    mutant = AdapterUpdates(more, s.layout) if mode == "update" else more
    bad = lora_kappa(CWTM, mode, n=N, budget=60, quantity="epsilon", wrapper=mutant)
    assert bad.above_proven and bad.value > k.proven + 0.1


def test_factor_mode_epsilon_is_unbounded_for_cwtm() -> None:
    k = lora_kappa(CWTM, "factors", n=N, budget=5, quantity="epsilon")
    assert math.isinf(k.value) and k.honest == tuple(range(N))


def test_the_proven_bounds_are_the_rules_kappa_carried_and_the_truncation_lemma() -> None:
    kf = CWTM.kappa(N)
    assert kf is not None
    assert proven(CWTM, "update", N) == proven(CWTM, "shared", N) == kf
    assert proven(CWTM, "update-truncated", N) == pytest.approx((1 + 2 * math.sqrt(kf)) ** 2)
    assert proven(CWTM, "factors", N) is None


def test_truncation_lemma_holds_on_random_attacked_clients_per_layer() -> None:
    """‖(B′A′ − BA) − mean_S ΔW‖² ≤ (1 + 2√κ_F)² spread_S per layer, on random clients with f ALIE-like rows — and the
    bound is not vacuous: the truncation moves the update (the residual is positive)."""
    s = setting(1)
    gen = torch.Generator().manual_seed(3)
    bound = proven(CWTM, "update-truncated", N)
    assert bound is not None
    wrapper = AdapterUpdates(CWTM, s.layout)
    for _ in range(5):
        x = torch.randn(N, s.layout.dim, generator=gen, dtype=torch.float64)
        x[N - F:] = x[: N - F].mean(0) + 1.5 * x[: N - F].std(0)
        out = wrapper(x, theta=s.theta)
        assert wrapper.last_residual > 0
        for blk in s.layout.blocks:
            honest = updates_of(x[: N - F], s.theta, blk)
            applied = updates_of(out[None], s.theta, blk)[0]
            spread = float((honest - honest.mean(0)).square().sum(1).mean())
            assert float((applied - honest.mean(0)).square().sum()) <= bound * spread * (1 + 1e-9)


def test_truncation_lemma_needs_the_rank_r_truncation_and_a_rank_below_r_fails_it() -> None:
    """The lemma uses that an honest client's own product BⱼAⱼ has rank ≤ r: with honest clients all sending one
    rank-r adapter (zero spread) the applied update is theirs (error at rounding), while the mutant truncation to rank
    r − 1 leaves a positive error over the zero spread — above any bound."""
    s = setting(2)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(N, s.layout.dim, generator=gen, dtype=torch.float64)
    x[: N - F] = x[0]
    x[N - F:] *= 10.0
    out = AdapterUpdates(CWTM, s.layout)(x, theta=s.theta)
    for blk in s.layout.blocks:
        honest = updates_of(x[:1], s.theta, blk)[0]
        applied = updates_of(out[None], s.theta, blk)[0]
        assert float((applied - honest).norm()) <= 1e-12 * (1 + float(honest.norm()))
        b, a = s.layout.factors(s.theta, blk)
        m = b @ a + CWTM(updates_of(x, s.theta, blk)).view(blk.d_out, blk.d_in)
        u, sig, vh = torch.linalg.svd(m)
        lower = (u[:, : blk.rank - 1] * sig[: blk.rank - 1]) @ vh[: blk.rank - 1] - b @ a  # the mutant: rank r − 1
        assert float((lower.flatten() - honest).norm()) > 1e-3


def test_shared_mode_ratio_in_the_update_equals_the_ratio_on_b() -> None:
    """A's rows are orthonormal (c = 1), so ‖ΔB A‖ = ‖ΔB‖ row by row: the ratio in ΔW space is the rule's own."""
    a = setting(0).shared_a
    torch.testing.assert_close(a @ a.T, torch.eye(2, dtype=torch.float64), rtol=0, atol=0)
    db = torch.randn(5, 3, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    torch.testing.assert_close((db @ a).flatten(1).norm(dim=1), db.flatten(1).norm(dim=1))


@pytest.mark.parametrize("spec", ["cwtm", "cwmed", "krum"])
def test_factor_mode_is_unbounded_in_the_update_by_an_exact_construction(spec: str) -> None:
    """Clients whose factors differ but whose updates BᵢAᵢ − BA are bit-for-bit equal (zero honest spread): the rule
    on the factors returns factors with another product — a positive error over a zero spread, κ = +∞, certified in
    rational arithmetic. The same clients in mode ``update`` give a ratio of 0: the rule on ΔW returns their ΔW."""
    rule = aggregators.make(spec, f=F)
    k = lora_kappa(rule, "factors", n=N, budget=30)
    assert math.isinf(k.value) and k.verdict == "unbounded" and k.proven is None
    assert k.construction.startswith(("sign", "scale"))
    s = setting(0)
    rows = torch.cat([updates_of(k.input, s.theta, blk) for blk in s.layout.blocks], 1)[list(k.honest)]
    assert bool((rows == rows[0]).all())  # the honest clients' updates are exactly one
    ok = lora_kappa(rule, "update", n=N, budget=30)
    assert ok.value <= (ok.proven or 0.0) + ok.slack


def test_the_factor_constructions_are_exact_one_update() -> None:
    s = setting(0)
    for name, x in factor_constructions(N, F, s, torch.Generator().manual_seed(0)):
        rows = torch.cat([updates_of(x[: N - F], s.theta, blk) for blk in s.layout.blocks], 1)
        assert bool((rows == rows[0]).all()), name


def test_bad_settings_are_one_line_config_errors() -> None:
    with pytest.raises(ConfigError, match="mode"):
        lora_kappa(CWTM, "products")
    with pytest.raises(ConfigError, match="n"):
        lora_kappa(CWTM, "update", n=4)
    with pytest.raises(ConfigError, match="n"):
        lora_kappa(CWTM, "update", n=10**6)
    with pytest.raises(ConfigError, match="budget"):
        lora_kappa(CWTM, "update", budget=0)
    with pytest.raises(ConfigError, match="mode"):
        proven(CWTM, "products", N)
    with pytest.raises(ConfigError, match="quantity"):
        lora_kappa(CWTM, "update", quantity="delta")
    assert set(MEASURED_MODES) == {"factors", "update", "update-truncated", "shared"}


class _NanOnFarRows(type(CWTM)):  # type: ignore[misc]
    """cwtm (proven κ) returning NaN when a row is far: the κ search's hole (value = slack = ∞, ∞ > bound + ∞ False)
    was here too."""

    def _run(self, x: torch.Tensor, want: object, **ctx: object) -> object:
        out, c = super()._run(x, want, **ctx)
        return (torch.full_like(out, math.nan) if float(x.abs().max()) > 1e3 else out), c


def test_a_non_finite_output_where_a_bound_is_proven_is_a_bug() -> None:
    k = lora_kappa(CWTM, "shared", n=N, budget=120, wrapper=_NanOnFarRows(f=F))
    assert k.proven is not None and k.above_proven and k.verdict.startswith("BUG")


def _ratios(x: torch.Tensor, out: torch.Tensor, weights: torch.Tensor) -> list[float]:
    """‖out − x̄_S‖²_w / spread_S,w(x) for every set S of n − f rows, coordinates weighted by ``weights`` (c_b² on
    block b: the update space of a block-wise scaled map; ones: the rule's rows)."""
    n = x.shape[0]
    out_r = []
    for s in itertools.combinations(range(n), n - F):
        xs = x[list(s)]
        m = xs.mean(0)
        out_r.append(float((weights * (out - m) ** 2).sum() / (weights * (xs - m) ** 2).sum(1).mean()))
    return out_r


def test_shared_mode_with_blockwise_scales_carries_kappa_times_the_scale_ratio() -> None:
    """Mode ``shared`` with per-block scales (each layer's A has its own c_l; the head has 1): Krum's ratio on the
    updates is at most its ratio on the rows times max c²/min c² (Phalanx's own statement, lora_kappa's docstring),
    on random inputs and every S. The mutant claim — the ratio (hence κ) unchanged — fails on the reviewer's random
    construction (two one-coordinate blocks, c = (1, 3)) and, at the level of the constant, on the simplex
    construction: Krum's ratio on the updates exceeds its own κ_F = 10."""
    krum = aggregators.make("krum", f=F)
    c = torch.tensor([1.0, 3.0], dtype=torch.float64)
    w = c**2
    factor = float((c.max() / c.min()) ** 2)
    assert shared_bound(1.0, c.tolist(), blockwise=False) == factor
    gen = torch.Generator().manual_seed(0)
    gap = 0.0
    for _ in range(300):
        scale = torch.rand(2, dtype=torch.float64, generator=gen) * 3
        x = torch.randn(N, 2, dtype=torch.float64, generator=gen) * scale
        out = krum(x)
        rb, ru = _ratios(x, out, torch.ones(2, dtype=torch.float64)), _ratios(x, out, w)
        for b, u in zip(rb, ru):
            assert u <= factor * b * (1 + 1e-12) + 1e-300
            gap = max(gap, u / b if b > 0 else 0.0)
    assert gap > 1.5  # the mutant "ratio unchanged on the updates" is false (the reviewer saw up to 4.98 × )

    # the simplex construction: 5 honest rows on a regular simplex of radius 1 in block 1 (4 coordinates), 0 in
    # block 2; 2 Byzantine rows at the honest mean in block 1 and δ in block 2, δ² = 1.8 < 2
    simplex = torch.eye(5, dtype=torch.float64) - 1 / 5
    basis = torch.linalg.svd(simplex)[2][:4]  # the simplex's own 4-dimensional span
    honest = simplex @ basis.T
    honest = honest / honest.norm(dim=1, keepdim=True)
    x = torch.zeros(N, 5, dtype=torch.float64)
    x[:5, :4] = honest
    x[5:, 4] = math.sqrt(1.8)
    out = krum(x)
    assert torch.equal(out, x[5])  # Krum picks a Byzantine row
    w = torch.tensor([1.0] * 4 + [9.0], dtype=torch.float64)
    honest_set = list(itertools.combinations(range(N), N - F)).index((0, 1, 2, 3, 4))
    rb, ru = _ratios(x, out, torch.ones(5, dtype=torch.float64)), _ratios(x, out, w)
    kappa_f = krum.kappa(N)
    assert kappa_f == pytest.approx(10.0)
    assert rb[honest_set] == pytest.approx(1.8) and max(rb) <= kappa_f  # within κ_F on the rows
    assert ru[honest_set] == pytest.approx(16.2) and ru[honest_set] > kappa_f  # the unchanged κ: broken
    assert max(ru) <= shared_bound(kappa_f, [1.0, 3.0], blockwise=False)  # κ_F·9 = 90: holds


def test_shared_mode_with_blockwise_scales_keeps_a_coordinatewise_rules_kappa() -> None:
    """The trimmed mean's inequality holds coordinate by coordinate, so on block-wise scaled updates it keeps its own
    κ_F (shared_bound with blockwise=True) however unequal the scales."""
    gen = torch.Generator().manual_seed(1)
    w = torch.tensor([1.0, 1.0, 1.0, 100.0, 100.0], dtype=torch.float64)  # c = (1, 10) on blocks of 3 and 2
    bound = shared_bound(CWTM.kappa(N), [1.0, 10.0], blockwise=True)
    assert bound == CWTM.kappa(N)
    for _ in range(200):
        x = torch.randn(N, 5, dtype=torch.float64, generator=gen) * torch.rand(5, dtype=torch.float64, generator=gen)
        x[N - F:] = x[: N - F].mean(0) + 5 * torch.randn(F, 5, dtype=torch.float64, generator=gen)
        assert max(_ratios(x, CWTM(x).double(), w)) <= bound


def test_the_shared_models_scales_are_per_layer_and_the_head_is_one() -> None:
    """``phalanx.models.hf`` in mode ``shared`` scales each layer's A by its own c_l (A Aᵀ = c_l² I) and the layer
    applies (α/r)·ΔB A; the head's coordinates are their own update: the scales differ, and shared_bound's factor
    for a rule that is not coordinate-wise is above 1."""
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from phalanx import models

    model = models.make("hf:phalanx-bert-tiny", (16,), 2, generator=torch.Generator().manual_seed(0), r=4,
                        aggregation="shared")
    scales = shared_scales(model)
    lora = {k: v for k, v in scales.items() if ".lora_B." in k}
    head = {k: v for k, v in scales.items() if ".lora_B." not in k}
    assert len(lora) >= 2 and head and set(head.values()) == {1.0}
    assert len({round(v, 6) for v in lora.values()}) > 1  # one c per layer, not one for the model
    assert shared_bound(10.0, list(scales.values()), blockwise=False) > 10.0
    with pytest.raises(ConfigError, match="scales"):
        shared_bound(1.0, [1.0, 0.0], blockwise=False)
