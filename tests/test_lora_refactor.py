"""Mode ``update``'s re-factorisation: which split of the truncated product the clients restart from
(:func:`phalanx.aggregators.lora.refactor`; docs/lora.md, "Why mode update learned little").

No transformers here: the split is plain linear algebra, and its effect on learning is played on a seeded
federated low-rank regression where every quantity (the target's singular values, the step size, A's start) is
set so that the stability condition of each split can be computed in the test itself."""

from __future__ import annotations

import pytest
import torch

from phalanx import aggregators
from phalanx.aggregators import lora
from phalanx.aggregators.lora import AdapterUpdates, LoraLayout, imbalance, refactor


def test_refactor_is_the_best_rank_r_product_split_with_the_starting_balance() -> None:
    """B′A′ is the rank-r truncated SVD of m (Eckart–Young), and A′A′ᵀ − B′ᵀB′ = c²I: the balance gradient flow
    keeps (the mutant that puts Σ in B alone, A′ = c·Vᵀ, fails the second check)."""
    m = torch.randn(6, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    b2, a2 = refactor(m, 2, scale=0.5)
    u, s, vh = torch.linalg.svd(m)
    torch.testing.assert_close(b2 @ a2, (u[:, :2] * s[:2]) @ vh[:2])
    torch.testing.assert_close(a2 @ a2.T - b2.T @ b2, 0.25 * torch.eye(2, dtype=torch.float64))
    assert imbalance(b2, a2) == pytest.approx(0.5, rel=1e-12)
    # σ ≫ c²: balanced, each side ~ √σ — and no column of B above √σ, no row of A below c
    assert bool((b2.norm(dim=0) <= s[:2].sqrt() * (1 + 1e-12)).all())
    assert bool((a2.norm(dim=1) >= 0.5 * (1 - 1e-12)).all())
    old_b, old_a = u[:, :2] * (s[:2] / 0.5), vh[:2] * 0.5  # the first version's split: same product
    torch.testing.assert_close(old_b @ old_a, b2 @ a2)
    assert float((old_a @ old_a.T - old_b.T @ old_b - 0.25 * torch.eye(2, dtype=torch.float64)).norm()) > 1.0


def test_refactor_of_a_zero_update_is_loras_b_zero_start_and_huge_ones_stay_finite() -> None:
    """σ = 0: A′ = c·Vᵀ (rows of norm c), B′ = 0 — LoRA's start, so a round that changed nothing keeps the
    B = 0 trick. A float32 product of 10³⁸ (a mean under attack that stayed finite) gives finite factors."""
    m = torch.zeros(6, 5)
    b2, a2 = refactor(m, 2, scale=0.3)
    assert float(b2.abs().max()) == 0.0
    torch.testing.assert_close(a2.norm(dim=1), torch.full((2,), 0.3))
    big = torch.zeros(6, 5)
    big[0, 0] = 1e38
    b3, a3 = refactor(big, 2, scale=0.3)
    assert bool(torch.isfinite(b3).all()) and bool(torch.isfinite(a3).all())
    torch.testing.assert_close((b3 @ a3)[0, 0], torch.tensor(1e38), rtol=1e-5, atol=0.0)
    b4, a4 = refactor(torch.zeros(6, 5), 2, scale=0.0)  # c = 0 and σ = 0: nothing to split, no 0/0
    assert float(b4.abs().max()) == 0.0 and float(a4.abs().max()) == 0.0


# --- a seeded federated low-rank regression: clients fit Y = (W★ + Δᵢ) X with LoRA factors by local GD -----------

D_OUT, D_IN, R, N, M, STEPS, LR, ROUNDS, C0 = 8, 6, 2, 6, 64, 5, 0.05, 40, 0.1
SIGMAS = (3.0, 2.0)


def _problem() -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    u, _ = torch.linalg.qr(torch.randn(D_OUT, R, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(D_IN, R, generator=g, dtype=torch.float64))
    target = u @ torch.diag(torch.tensor(SIGMAS, dtype=torch.float64)) @ v.T
    xs, ys = [], []
    for _ in range(N):
        x, _ = torch.linalg.qr(torch.randn(M, D_IN, generator=g, dtype=torch.float64))
        x = x.T * M**0.5  # X Xᵀ / M = I: the loss's curvature in the product is exactly 1
        delta = 0.3 * torch.randn(D_OUT, D_IN, generator=g, dtype=torch.float64)  # client heterogeneity
        xs.append(x)
        ys.append((target + delta) @ x)
    a0, _ = torch.linalg.qr(torch.randn(D_IN, R, generator=g, dtype=torch.float64))
    return xs, ys, C0 * a0.T, torch.zeros(D_OUT, R, dtype=torch.float64)


def _loss(b: torch.Tensor, a: torch.Tensor, xs: list[torch.Tensor], ys: list[torch.Tensor]) -> float:
    return sum(float(((b @ a @ x - y) ** 2).sum()) / (2 * M) for x, y in zip(xs, ys)) / N


def _local(b: torch.Tensor, a: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    for _ in range(STEPS):
        g = (b @ a @ x - y) @ x.T / M
        b, a = b - LR * g @ a.T, a - LR * b.T @ g
    return b, a


def _train(mode: str) -> list[float]:
    xs, ys, a, b = _problem()
    lay = LoraLayout.of(["l.lora_A.default.weight", "l.lora_B.default.weight"], [(R, D_IN), (D_OUT, R)])
    rule = AdapterUpdates(aggregators.make("mean", f=0), lay)
    losses = [_loss(b, a, xs, ys)]
    for _ in range(ROUNDS):
        theta = torch.cat([a.reshape(-1), b.reshape(-1)])
        local = [_local(b, a, x, y) for x, y in zip(xs, ys)]
        rows = torch.stack([theta - torch.cat([ai.reshape(-1), bi.reshape(-1)]) for bi, ai in local])
        new = theta - (rule(rows, theta=theta) if mode == "update" else rows.mean(0))
        b, a = lay.factors(new, lay.blocks[0])
        losses.append(_loss(b, a, xs, ys) if bool(torch.isfinite(new).all()) else float("inf"))
    return losses


def _first_version(m: torch.Tensor, rank: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    u, s, vh = torch.linalg.svd(m, full_matrices=False)
    return u[:, :rank] * (s[:rank] / scale), vh[:rank] * scale


def test_update_mode_with_the_mean_learns_as_factors_do_and_the_first_versions_split_does_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35. The mean of the clients' products is re-factorised; the split decides the next round's step size.
    Local GD on (A, B) is stable while LR·(‖A‖₂² + ‖B‖₂²)·λ ≤ 2 (λ = 1: X Xᵀ/M = I). At the optimum σ₁ = 3:
    the balanced split has ‖A‖₂² + ‖B‖₂² ≤ 2σ₁ + c² ≈ 6, LR·6 = 0.3 (stable); the first version's A′ = c·Vᵀ,
    B′ = UΣ/c has ‖B‖₂² = σ₁²/c² = 900, LR·900 = 45 (unstable long before σ₁ is reached). The best any rank-r
    product can do is computed in closed form (with X Xᵀ/M = I the mean loss is ‖W − T̄‖²/2 plus the clients'
    spread, so the floor is T̄'s tail beyond rank r plus the spread). Claims: factors and update with the mean both
    end within 1 % of that floor after 40 rounds (measured: 0.06 % and 0.17 %; the margin is for the BLAS's
    rounding of 40 rounds, float64); the mutant — the first version's split — diverges (its loss is not below
    its start: measured 10³⁸ after 5 rounds, then inf)."""
    assert LR * (2 * max(SIGMAS) + C0**2) < 2 < LR * max(SIGMAS) ** 2 / C0**2  # the test's premise, computed
    xs, ys, _, _ = _problem()
    targets = [y @ x.T / M for x, y in zip(xs, ys)]
    mean = sum(targets) / N
    tail = torch.linalg.svdvals(mean)[R:]
    floor = float((tail**2).sum()) / 2 + sum(float(((t - mean) ** 2).sum()) for t in targets) / (2 * N)
    factors, update = _train("factors"), _train("update")
    assert factors[0] > 4 * floor  # there is something to learn
    assert factors[-1] <= 1.01 * floor
    assert update[-1] <= 1.01 * floor
    monkeypatch.setattr(lora, "refactor", _first_version)
    monkeypatch.setattr(lora, "imbalance", lambda b, a: float(a.norm()) / a.shape[0] ** 0.5)
    mutant = _train("update")
    assert not mutant[-1] < mutant[0], mutant[-5:]
