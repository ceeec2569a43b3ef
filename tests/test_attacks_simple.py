"""Hand-computed cases of the non-adaptive attacks: none, sign flip, IPM/FOE, Gaussian, Inf/NaN, ALIE, mimic,
label flipping."""

from __future__ import annotations

import math

import pytest
import torch

from phalanx import attacks
from phalanx.attacks import ALIE, AttackContext, LabelFlip
from phalanx.attacks.alie import alie_z_max
from phalanx.attacks.mimic import mimic_target
from phalanx.errors import ConfigError, InputError

X = torch.tensor([[0.0, 0.0], [2.0, 4.0], [4.0, 8.0]], dtype=torch.float64)  # mean (2, 4), sample std (2, 4)


def _ctx(honest: torch.Tensor, b: int, seed: int = 0) -> AttackContext:
    return AttackContext(honest, b, 1, None, torch.Generator().manual_seed(seed))


def test_none_replays_honest_rows_cyclically() -> None:
    out = attacks.make("none")(_ctx(X[:2], 5))
    torch.testing.assert_close(out, X[[0, 1, 0, 1, 0]])


def test_signflip() -> None:
    torch.testing.assert_close(attacks.make("signflip")(_ctx(X, 2)), torch.tensor([[-2.0, -4.0]] * 2).double())
    torch.testing.assert_close(attacks.make("signflip", scale=2.5)(_ctx(X, 1)), torch.tensor([[-5.0, -10.0]]).double())


def test_ipm_and_foe_presets() -> None:
    torch.testing.assert_close(attacks.make("ipm")(_ctx(X, 1)), torch.tensor([[-0.2, -0.4]]).double())
    # foe default epsilon = 2 = ByzFL FallOfEmpires(tau=3): (1 - tau) * mean
    torch.testing.assert_close(attacks.make("foe")(_ctx(X, 1)), torch.tensor([[-4.0, -8.0]]).double())
    foe, ipm = attacks.make("foe", epsilon=0.5), attacks.make("ipm", epsilon=0.5)
    torch.testing.assert_close(foe(_ctx(X, 1)), ipm(_ctx(X, 1)))
    assert attacks.make("ipm").params() == {"epsilon": 0.1}
    assert attacks.make("foe").params() == {"epsilon": 2.0}


def test_gaussian_degenerate_and_centred() -> None:
    out = attacks.make("gaussian", sigma=0.0, mu=3.0)(_ctx(X, 2))
    torch.testing.assert_close(out, torch.full((2, 2), 3.0).double())
    out = attacks.make("gaussian", sigma=0.0, mu=1.0, center="mean")(_ctx(X, 1))
    torch.testing.assert_close(out, torch.tensor([[3.0, 5.0]]).double())


def test_gaussian_statistics_and_distinct_rows() -> None:
    honest = torch.zeros(3, 20_000, dtype=torch.float64)
    out = attacks.make("gaussian", sigma=2.0, mu=-1.0)(_ctx(honest, 4, seed=7))
    assert not torch.equal(out[0], out[1])
    assert abs(float(out.mean()) + 1.0) < 0.03
    assert abs(float(out.std()) - 2.0) < 0.03
    # The same seed gives the same draws whatever the dtype of the honest vectors.
    out32 = attacks.make("gaussian", sigma=2.0, mu=-1.0)(_ctx(honest.float(), 4, seed=7))
    torch.testing.assert_close(out32, out.float())


def test_inf_and_nan() -> None:
    assert torch.isposinf(attacks.make("inf")(_ctx(X, 3))).all()
    assert torch.isnan(attacks.make("nan")(_ctx(X, 3))).all()


def test_alie_hand_case() -> None:
    out = attacks.make("alie", z=1.5)(_ctx(X, 2))
    torch.testing.assert_close(out, torch.tensor([[-1.0, -2.0]] * 2).double())  # (2, 4) - 1.5 * (2, 4)
    torch.testing.assert_close(attacks.make("alie", z=0.0)(_ctx(X, 1)), X.mean(0, keepdim=True))


@pytest.mark.parametrize(
    "n, m, p",
    [
        (50, 12, 36 / 50),  # s = 26 - 12 = 14
        (10, 2, 6 / 10),  # s = 6 - 2 = 4
        (20, 4, 13 / 20),  # s = 11 - 4 = 7
        (2, 1, 1 / 2),  # s = 2 - 1 = 1: z = 0
        (10, 6, 9 / 10),  # Byzantine majority: s = 0 -> taken as 1
    ],
)
def test_alie_z_max_follows_the_paper(n: int, m: int, p: float) -> None:
    expected = math.sqrt(2.0) * _erfinv(2.0 * p - 1.0)
    assert alie_z_max(n, m) == pytest.approx(expected, abs=1e-9)


def _erfinv(y: float) -> float:
    # Newton on erf: independent of torch.special.ndtri.
    x = 0.0
    for _ in range(100):
        x -= (math.erf(x) - y) / (2.0 / math.sqrt(math.pi) * math.exp(-x * x))
    return x


def test_alie_z_max_known_values() -> None:
    assert alie_z_max(50, 12) == pytest.approx(0.5828415, abs=1e-6)  # Φ⁻¹(0.72)
    assert alie_z_max(10, 2) == pytest.approx(0.2533471, abs=1e-6)  # Φ⁻¹(0.6)
    with pytest.raises(ValueError):
        alie_z_max(3, 4)


def test_alie_default_z_uses_h_plus_b_workers() -> None:
    honest = torch.randn(16, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    a = ALIE()
    ctx = _ctx(honest, 4)
    z = a.z_for(ctx)
    assert z == alie_z_max(20, 4)
    expected = honest.mean(0) - z * honest.std(0)
    torch.testing.assert_close(a(ctx), expected.expand(4, -1))


def test_mimic_picks_the_row_along_the_top_principal_direction() -> None:
    honest = torch.tensor([[0.0, 0.0], [1.0, 0.0], [-1.0, 0.1], [5.0, 0.1]], dtype=torch.float64)
    # Top principal direction ≈ the x axis; centred x: -1.25, -0.25, -2.25, 3.75 -> row 3.
    assert mimic_target(honest) == 3
    out = attacks.make("mimic")(_ctx(honest, 2))
    torch.testing.assert_close(out, honest[[3, 3]])
    # Sign of the direction does not matter: the largest |projection| wins.
    assert mimic_target(-honest) == 3


def test_mimic_picks_the_largest_absolute_projection_whatever_the_eigenvectors_sign() -> None:
    """On 20 seeded honest sets with one row far out on a lopsided spread, ``i*`` is the row of largest
    |⟨v, x_i − ḡ⟩| with v the top right singular vector of the centred rows (an SVD: independent of the
    eigen-solver's sign). A review's mutant — the signed argmax of the eigenvector — agrees on some sets and not on
    others, depending on the sign the solver returns; the signed choice is the paper's, the absolute one Phalanx's."""
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        honest = torch.randn(7, 5, generator=g, dtype=torch.float64)
        honest[int(torch.randint(7, (1,), generator=g))] += 6.0 * torch.randn(5, generator=g, dtype=torch.float64)
        centred = honest - honest.mean(0)
        v = torch.linalg.svd(centred, full_matrices=False).Vh[0]
        assert mimic_target(honest) == int(torch.argmax((centred @ v).abs())), seed
        assert mimic_target(-honest) == mimic_target(honest), seed


def test_mimic_fixed_target() -> None:
    out = attacks.make("mimic", target=1)(_ctx(X, 2))
    torch.testing.assert_close(out, X[[1, 1]])
    with pytest.raises(ConfigError, match="target"):
        attacks.make("mimic", target=3)(_ctx(X, 1))


def test_mimic_degenerate_rows() -> None:
    assert mimic_target(torch.ones(4, 3)) == 0
    assert mimic_target(torch.ones(1, 3)) == 0


def test_labelflip() -> None:
    flip = LabelFlip()
    x = torch.randn(3, 4)
    y = torch.tensor([0, 3, 9])
    x2, y2 = flip.transform(x, y, 10)
    assert x2 is x
    torch.testing.assert_close(y2, torch.tensor([9, 6, 0]))
    torch.testing.assert_close(y, torch.tensor([0, 3, 9]))  # not modified
    _, y3 = flip.transform(x, y2, 10)
    torch.testing.assert_close(y3, y)  # an involution
    _, yb = flip.transform(x[:2], torch.tensor([0, 1]), 2)
    torch.testing.assert_close(yb, torch.tensor([1, 0]))
    _, ye = flip.transform(x[:0], torch.tensor([], dtype=torch.long), 3)
    assert ye.numel() == 0


def test_labelflip_input_errors() -> None:
    flip = LabelFlip()
    x = torch.randn(3, 4)
    with pytest.raises(InputError, match="labels in"):
        flip.transform(x, torch.tensor([0, 1, 10]), 10)
    with pytest.raises(InputError, match="labels in"):
        flip.transform(x, torch.tensor([0, -1, 2]), 10)
    with pytest.raises(InputError, match="integer"):
        flip.transform(x, torch.tensor([0.0, 1.0, 2.0]), 10)
    with pytest.raises(InputError, match="one label per example"):
        flip.transform(x, torch.tensor([0, 1]), 10)
    with pytest.raises(ConfigError, match="num_classes"):
        flip.transform(x, torch.tensor([0, 1, 2]), 0)
    with pytest.raises(InputError):
        flip.transform([1, 2], torch.tensor([0, 1]), 3)  # type: ignore[arg-type]
