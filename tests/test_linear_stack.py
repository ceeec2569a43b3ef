"""The explicit back-propagation of fully connected ReLU stacks: which models take it, and that it computes what
vmap(grad) computes (per-worker gradients, momentum, weight decay) for every shape it accepts."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from phalanx import models
from phalanx.errors import ConfigError
from phalanx.training.linear_stack import LinearStack
from phalanx.training.problem import Problem


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize(
    ("model", "layers"),
    [
        (models.make("logreg", (1, 8, 8), 10), 1),
        (models.make("mlp", (1, 8, 8), 10), 2),
        (models.make("mlp", (3, 4, 4), 5, hidden=[7, 6, 5]), 4),
        (nn.Sequential(nn.Linear(6, 4, bias=False), nn.ReLU(), nn.Linear(4, 3)), 2),  # no Flatten, a bias-free layer
    ],
)
def test_accepted_models(model: nn.Module, layers: int) -> None:
    stack = LinearStack.of(model)
    assert stack is not None and len(stack.layers) == layers


@pytest.mark.parametrize(
    "model",
    [
        models.make("cnn", (1, 8, 8), 10),
        nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.Tanh(), nn.Linear(8, 10)),  # another activation
        nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.ReLU(), nn.Dropout(0.1), nn.Linear(8, 10)),
        nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.ReLU()),  # ends in an activation
        nn.Sequential(nn.Flatten(start_dim=2), nn.Linear(8, 10)),  # flattens something else
        nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.LayerNorm(8), nn.Linear(8, 2)),  # normalisation
        nn.Sequential(nn.Linear(8, 2), nn.ReLU(), nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2), nn.ReLU()),
    ],
)
def test_other_models_go_through_vmap(model: nn.Module) -> None:
    assert LinearStack.of(model) is None
    assert Problem(model).stack is None


def test_shared_layer_goes_through_vmap() -> None:
    shared = nn.Linear(4, 4)
    model = nn.Sequential(shared, nn.ReLU(), shared)  # one parameter set used twice: not the simple form
    assert LinearStack.of(model) is None


def test_per_worker_is_validated() -> None:
    with pytest.raises(ConfigError, match="per_worker"):
        Problem(models.make("logreg", (1, 8, 8), 10), per_worker="loop")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("workers", [1, 2, 7])
@pytest.mark.parametrize(("weight", "decay"), [(1.0, 0.0), (0.1, 0.0), (0.25, 0.01)])
@pytest.mark.parametrize("hidden", [(), (16,), (9, 5)])
def test_equals_vmap(hidden: tuple[int, ...], weight: float, decay: float, workers: int, dtype: torch.dtype) -> None:
    model = models.make("mlp", (1, 6, 6), 4, generator=_gen(1), hidden=list(hidden)).to(dtype)
    fast, ref = Problem(model), Problem(model, per_worker="vmap")
    assert fast.stack is not None and ref.stack is None
    theta = fast.initial_theta() + 0.3 * torch.randn(fast.dim, generator=_gen(2), dtype=dtype)
    xb = torch.randn(workers, 5, 1, 6, 6, generator=_gen(3), dtype=dtype)
    yb = torch.randint(0, 4, (workers, 5), generator=_gen(4))
    start = torch.randn(workers + 2, fast.dim, generator=_gen(5), dtype=dtype)  # rows of a larger buffer
    a, b = start.clone(), start.clone()
    fast.accumulate_grads(theta, xb, yb, a[:workers], weight, decay)
    ref.accumulate_grads(theta, xb, yb, b[:workers], weight, decay)
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    assert torch.allclose(a, b, atol=tol, rtol=0)
    assert torch.equal(a[workers:], start[workers:])  # rows outside the view untouched
    assert torch.allclose(fast.grads(theta, xb, yb), ref.grads(theta, xb, yb), atol=tol, rtol=0)


def test_equals_the_per_worker_loop_with_dead_units_and_ties() -> None:
    """ReLU units at exactly 0 (the subgradient 0, as autograd takes it) and repeated samples."""
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    with torch.no_grad():
        model[0].weight.zero_()  # every hidden pre-activation equals its bias
        model[0].bias.copy_(torch.tensor([0.0, 1.0, -1.0, 0.0]))
    problem = Problem(model)
    theta = problem.initial_theta()
    xb = torch.randn(3, 4, 3, generator=_gen(7))
    xb[:, 1] = xb[:, 0]
    yb = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [0, 1, 0, 1]])
    assert torch.allclose(problem.grads(theta, xb, yb), problem.grads_loop(theta, xb, yb), atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("hidden", [(), (16,), (9, 5)])
def test_grads_each_equals_vmap_with_per_worker_parameters(hidden: tuple[int, ...], workers: int,
                                                           dtype: torch.dtype) -> None:
    """Every worker at its own parameters (federated clients): the explicit path equals vmap(grad) over the stacked
    parameters; the tolerance is a few ulps of the dtype times the size of the products."""
    model = models.make("mlp", (1, 6, 6), 4, generator=_gen(1), hidden=list(hidden)).to(dtype)
    fast, ref = Problem(model), Problem(model, per_worker="vmap")
    thetas = fast.initial_theta() + 0.3 * torch.randn(workers, fast.dim, generator=_gen(2), dtype=dtype)
    xb = torch.randn(workers, 5, 1, 6, 6, generator=_gen(3), dtype=dtype)
    yb = torch.randint(0, 4, (workers, 5), generator=_gen(4))
    got, want = fast.grads_each(thetas, xb, yb), ref.grads_each(thetas, xb, yb)
    tol = 64 * torch.finfo(dtype).eps * float(want.abs().max())
    torch.testing.assert_close(got, want, atol=tol, rtol=0)
